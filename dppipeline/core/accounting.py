"""Tight accounting: one noise multiplier for all of a job's mechanisms, found by composing
them with Google's dp_accounting (privacy loss distributions, or Rényi DP for zCDP).

Under basic composition every mechanism gets its share of (epsilon, delta) and the shares add
up. Under `pld` and `zcdp` every mechanism joins one pool whose budget is the sum of their
basic shares (the job's); mechanism
i gets noise multiplier m / w_i (dp_accounting's convention: std / L2 sensitivity for
Gaussian, scale b / L1 sensitivity for Laplace, b = std / sqrt(2)), w_i its budget weight,
and m is the smallest multiplier, binary-searched, for which the composition of all of them
meets the pool's (epsilon, delta). Composing k Gaussians costs
about sqrt(k) of one where basic composition costs k, which is where the accuracy is.

The other mechanisms (`Member`): a percentile's quantile tree is one Laplace or Gaussian over
all its nodes (PyDP: L0 x height partitions of Linf); max and min are pure epsilon-DP
exponential mechanisms per partition (PLD: the randomized-response pair; zCDP: bounded range,
e^2 / 8); Laplace / Gaussian thresholding is its noise on the unit count plus the threshold's
delta (the probability a one-unit partition is released, over L0); truncated geometric is
(epsilon / L0, delta')-DP per partition, i.e. L0 randomized responses plus its delta. PyDP
calibrates the tree and the selections from (epsilon, delta) only: `MechanismBudget.
calibration` picks the pair whose noise is the pool's (Laplace exactly; Gaussian at least,
within 1%, checked). None is left to basic composition today. `zcdp` composes with
dp_accounting's RDP accountant, which for Gaussian noise is zCDP composition with a tighter
conversion to (epsilon, delta).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # imported when a job uses tight accounting (the CLI skips it otherwise)
    import dp_accounting
    from dp_accounting import dp_event
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    from dppipeline.core.plan import MechanismBudget

from dppipeline.core import events
from dppipeline.core.events import PLD_DISCRETIZATION

ACCOUNTINGS = ("basic", "pld", "zcdp")
# Rényi orders: dp_accounting's defaults (up to 1024) floor epsilon at about 0.006 for delta
# 1e-6; larger orders let RDP certify small budgets without astronomic noise.
RDP_ORDERS = ("default", *(2.0**k for k in range(11, 21)))
_RELATIVE_PRECISION = 1e-4  # the binary search stops when hi / lo < 1 + this


def accountant(accounting: str, epsilon: float = 1.0) -> dp_accounting.PrivacyAccountant:
    """A fresh accountant; `epsilon`, the budget it will be held to, sizes PLD's grid."""
    from dp_accounting import pld, rdp  # noqa: PLC0415 (see the imports above)

    if accounting == "pld":  # the search's grid: relative to the epsilon at every scale
        return pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION * epsilon)
    if accounting == "zcdp":
        from dp_accounting.rdp import rdp_privacy_accountant  # noqa: PLC0415

        orders = [*rdp_privacy_accountant.DEFAULT_RDP_ORDERS, *RDP_ORDERS[1:]]
        return rdp.RdpAccountant(orders=orders)
    raise ValueError(f"no tight accountant for {accounting!r}")


class Member(NamedTuple):
    """One mechanism of the pool. With the pool's base multiplier m it runs at multiplier
    mu = m / weight: Gaussian or Laplace noise of multiplier mu; `exponential` (max, min) and
    `pure` (truncated geometric selection) at epsilon 1 / mu in all, 1 / (mu x partitions) per
    partition, each partition's draw independent. `delta`: what the mechanism spends outside
    its noise (a selection's threshold), added to the composition's delta."""

    kind: str  # gaussian | laplace | exponential | pure
    weight: float
    partitions: int = 1
    delta: float = 0.0


def member_event(member: Member, multiplier: float) -> dp_event.DpEvent:
    """The Rényi-DP description (dp_accounting's RDP accountant) of `member` run at noise
    multiplier `multiplier`. A pure epsilon-DP draw (per partition e = 1 / (multiplier x
    partitions)) is e^2 / 2-zCDP (Bun and Steinke 2016, Proposition 3.3); the exponential
    mechanism is e-bounded-range, hence e^2 / 8-zCDP (Cesar and Rogers 2021, Lemma 3.2; its
    Gumbel scale is 2 Linf / e and one unit moves every score by at most Linf, so the log
    ratio of its output probabilities spans at most e)."""
    from dp_accounting import dp_event  # noqa: PLC0415 (see the imports above)

    if member.kind == "gaussian":
        return dp_event.GaussianDpEvent(multiplier)
    if member.kind == "laplace":
        return dp_event.LaplaceDpEvent(multiplier)
    per_partition = 1 / (multiplier * member.partitions)
    factor = 8 if member.kind == "exponential" else 2
    return dp_event.ZCDpEvent(member.partitions * per_partition**2 / factor)


def member_pld(
    member: Member, multiplier: float, count: int, interval: float
) -> PrivacyLossDistribution:
    """The privacy loss distribution of `count` runs of `member` at `multiplier`: Gaussian
    and Laplace as dp_accounting's PLD accountant builds them; a pure e-DP draw by
    `from_privacy_parameters(e, 0)`, the dominating pair of every e-DP mechanism (binary
    randomized response; Kairouz, Oh and Viswanath 2015), which dp_accounting's
    RandomizedResponseDpEvent would be were it not defined for replace-one neighbours only."""
    from dp_accounting.pld import common  # noqa: PLC0415 (see the imports above)
    from dp_accounting.pld import privacy_loss_distribution as pld  # noqa: PLC0415

    if member.kind == "gaussian":  # k Gaussians of one multiplier: one of multiplier / sqrt k
        return pld.from_gaussian_mechanism(
            standard_deviation=multiplier / math.sqrt(count),
            value_discretization_interval=interval,
        )
    if member.kind == "laplace":
        one = pld.from_laplace_mechanism(
            parameter=multiplier, value_discretization_interval=interval
        )
        return one.self_compose(count) if count > 1 else one
    per_partition = 1 / (multiplier * member.partitions)
    one = pld.from_privacy_parameters(
        common.DifferentialPrivacyParameters(per_partition, 0.0),
        value_discretization_interval=interval,
    )
    runs = count * member.partitions
    return one.self_compose(runs) if runs > 1 else one


def _grouped(mechanisms: Sequence[tuple[Member, float]]) -> Counter[tuple[Member, float]]:
    """Identical (member, multiplier) pairs counted once, weights dropped."""
    return Counter((Member(m.kind, 1.0, m.partitions), mu) for m, mu in mechanisms)


def composed_event(mechanisms: Sequence[tuple[Member, float]]) -> dp_event.DpEvent:
    """The RDP DpEvent of (member, noise multiplier) mechanisms run on the same data."""
    from dp_accounting import dp_event  # noqa: PLC0415 (see the imports above)

    parts: list[dp_event.DpEvent] = []
    for (member, multiplier), count in _grouped(mechanisms).items():
        event = member_event(member, multiplier)
        parts.append(event if count == 1 else dp_event.SelfComposedDpEvent(event, count))
    return dp_event.ComposedDpEvent(parts)


def pool_epsilon(
    accounting: str, mechanisms: Sequence[tuple[Member, float]], delta: float, scale: float = 1.0
) -> float:
    """Epsilon at `delta` of running all `mechanisms` ((member, noise multiplier)) together,
    the members' own deltas not included: what the multiplier search tests, by `accounting`'s
    own accountant (a recorded release's events compose by `events.composed_epsilon`).
    `scale`: the epsilon expected (sizes PLD's grid, relative to it at every scale: the
    search's cost grows with epsilon / interval, at epsilon 1e4 and 1e-3 one took minutes)."""
    if accounting == "pld":
        interval = PLD_DISCRETIZATION * scale
        total: PrivacyLossDistribution | None = None
        for (member, multiplier), count in _grouped(mechanisms).items():
            one = member_pld(member, multiplier, count, interval)
            total = one if total is None else total.compose(one)
        assert total is not None
        return float(total.get_epsilon_for_delta(delta))
    book = accountant(accounting, scale)
    book.compose(composed_event(mechanisms))
    return float(book.get_epsilon(delta))


def budget_member(budget: MechanismBudget) -> Member:
    """The pool member a planned, pooled mechanism is, with weight 1 (its multiplier is its
    own): see `planner._pool_member` for why each kind composes so."""
    if budget.name == "partition_selection":
        assert budget.threshold_delta is not None
        if budget.kind == "truncated_geometric":
            return Member("pure", 1.0, budget.l0_sensitivity, budget.threshold_delta)
        noise = "gaussian" if budget.kind == "gaussian_thresholding" else "laplace"
        return Member(noise, 1.0, 1, budget.threshold_delta)
    if budget.kind == "exponential":
        return Member("exponential", 1.0, budget.l0_sensitivity)
    return Member(budget.kind, 1.0)


def fixed_delta(mechanisms: Sequence[Member | tuple[str, float]]) -> float:
    """What the pool's members spend outside their noise (the selections' thresholds)."""
    return math.fsum(Member(*m).delta for m in mechanisms)


def smallest_multiplier(
    accounting: str,
    mechanisms: Sequence[Member | tuple[str, float]],
    epsilon: float,
    delta: float,
) -> float:
    """The smallest m such that `mechanisms` (members, or (kind, weight)) with noise
    multipliers m / weight compose to at most (epsilon, delta); returned from the safe side of
    the search."""
    return certified_multiplier(accounting, mechanisms, epsilon, delta)[0]


def certified_multiplier(
    accounting: str,
    mechanisms: Sequence[Member | tuple[str, float]],
    epsilon: float,
    delta: float,
) -> tuple[float, str]:
    """(m, the accountant that proved it): PLD's search starts from RDP's multiplier, which
    fits under RDP; where PLD cannot show any multiplier fits (a delta below its tail mass,
    an overflow at astronomic epsilon), RDP's stands, certified by RDP.

    The members' own deltas (thresholds) are taken from `delta` first: a mechanism that is
    its noise except on an event of probability d (a one-unit partition crossing the
    threshold) is dominated by its noise composed with a (0, d) pair, whose hockey-stick
    divergence is d + (1 - d) x the noise's, below the noise's + d."""
    members = [Member(*m) for m in mechanisms]
    noise_delta = delta - fixed_delta(members)
    if not noise_delta > 0:
        raise ValueError("the thresholds' deltas leave no delta for the noise")

    def fits(m: float) -> bool:
        chosen = [(member, m / member.weight) for member in members]
        return pool_epsilon(accounting, chosen, noise_delta, epsilon) <= epsilon

    if accounting == "pld":
        high = smallest_multiplier("zcdp", members, epsilon, delta)
        try:
            if not fits(high):
                return high, "zcdp"
            low = high / 2
            while fits(low):
                high, low = low, low / 2
            return _search(fits, low, high), "pld"
        except (OverflowError, FloatingPointError):  # PLD's grid at astronomic epsilon
            return high, "zcdp"
    high = 1.0
    while not fits(high):
        high *= 2
        if high > 1e12:
            raise ValueError("no noise multiplier meets the budget")
    low = high / 2
    while fits(low):
        high, low = low, low / 2
        if low < 1e-12:
            return high, accounting
    return _search(fits, low, high), accounting


def _search(fits: Callable[[float], bool], low: float, high: float) -> float:
    """Geometric bisection between a multiplier that may not fit and one that does."""
    if fits(low):
        return low
    while high / low > 1 + _RELATIVE_PRECISION:
        mid = math.sqrt(low * high)
        if fits(mid):
            high = mid
        else:
            low = mid
    return high


def discrete_pool_fits(
    accounting: str, pool: Sequence[MechanismBudget], epsilon: float, delta: float
) -> bool:
    """Whether a pool with discrete mechanisms composes to at most (epsilon, delta), each
    mechanism accounted as what it is, by either of two sound proofs: the ledger's privacy
    loss distributions (`core.events`: discrete Laplace and discrete Gaussian exactly), or
    Rényi DP (a discrete Gaussian as a Gaussian of the same sigma: the same RDP curve, CKS20
    Theorem 14; a discrete Laplace by its pure epsilon, epsilon^2 / 2-zCDP, loose). pld tries
    PLD first; zcdp tries RDP first, then PLD (a discrete Laplace has no tight RDP here).
    Last, for a pool of Laplace noise only, basic composition of their pure epsilons (what
    remains at epsilons PLD cannot grid). The pool's other mechanisms (selections, quantile
    trees, max and min) compose as in the search (`budget_member`)."""
    order = (_pld_fits, _rdp_fits) if accounting == "pld" else (_rdp_fits, _pld_fits)
    return any(fits(pool, epsilon, delta) for fits in (*order, _pure_fits))


def _pure_fits(pool: Sequence[MechanismBudget], epsilon: float, delta: float) -> bool:
    if any(b.kind != "laplace" or b.name in ("percentile", "partition_selection") for b in pool):
        return False
    own = []
    for b in pool:
        scale = b.noise_scale if b.discrete else (b.noise_multiplier or 0.0) * b.l1_sensitivity
        assert scale is not None and scale > 0
        own.append(b.l1_sensitivity / scale)
    return math.fsum(own) <= epsilon


def _pld_fits(pool: Sequence[MechanismBudget], epsilon: float, delta: float) -> bool:
    found = events.composed_epsilon(
        (e for b in pool for e in events.mechanism_events(b)), delta, epsilon
    )
    return found is not None and found <= epsilon


def _rdp_fits(pool: Sequence[MechanismBudget], epsilon: float, delta: float) -> bool:
    from dp_accounting import dp_event  # noqa: PLC0415 (see the imports above)

    rdp_events: list[dp_event.DpEvent] = []
    for b in pool:
        assert b.noise_multiplier is not None
        if not b.discrete:
            member = budget_member(b)
            delta -= member.delta
            rdp_events.append(member_event(member, b.noise_multiplier))
        elif b.kind == "gaussian":
            assert b.noise_scale is not None
            rdp_events.append(dp_event.GaussianDpEvent(b.noise_scale / b.l2_sensitivity))
        else:
            assert b.noise_scale is not None
            rdp_events.append(dp_event.ZCDpEvent((b.l1_sensitivity / b.noise_scale) ** 2 / 2))
    if not delta > 0:
        return False
    book = accountant("zcdp", epsilon)
    book.compose(dp_event.ComposedDpEvent(rdp_events))
    return float(book.get_epsilon(delta)) <= epsilon
