"""A release's privacy events: what the ledger stores per release and composes across them.

A release is the composition of its mechanisms. Each additive mechanism (count, sums,
privacy_id_count) is recorded by its noise multiplier (dp_accounting's convention: std / L2
sensitivity for Gaussian, scale / L1 for Laplace), which is what a privacy loss distribution
needs to compose it exactly; a mechanism without such an analysis here (partition selection,
percentiles) is recorded by its own (epsilon, delta) guarantee, whose privacy loss
distribution dominates any mechanism with that guarantee (dp_accounting's
`from_privacy_parameters`). Releases recorded before events existed count as one such
(epsilon, delta) event each.

Composing events with dp_accounting's PLD code is sound for any mix (every event has a
pessimistic PLD) and never worse than summing: the ledger takes the smaller of the two. Why
PLD for the ledger whatever each job's `accounting`: it is the tightest of dp_accounting's
accountants and the only one that takes all three kinds; a job certified by RDP composes as
well (its Gaussians are Gaussians).

Discrete noise on counts (`core.discrete`) is recorded by its scale and integer sensitivity,
since its privacy loss depends on both, not on their ratio alone: discrete Laplace (scale t,
L1 sensitivity) by dp_accounting's discrete Laplace PLD; discrete Gaussian (sigma, L0, Linf)
as L0 one-dimensional discrete Gaussians of sensitivity Linf (the coordinates' noises are
independent). A discrete Gaussian whose sigma is too large for its PLD (its support is
enumerated: 2 s at sigma 1e5), or whose L2 sensitivity is not sqrt(L0) Linf, is recorded by
the (epsilon, delta) its zCDP gives at its planned delta (CKS20), which is sound.

The stored form is JSON: `{"format": 1, "events": [{"kind": "gaussian", "noise_multiplier":
2.5, "count": 36}, {"kind": "approx_dp", "epsilon": 0.1, "delta": 1e-08, "count": 12}]}`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # dp_accounting's PLD is imported only when a composition is computed
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    from dppipeline.core.plan import JobPlan, MechanismBudget

EVENT_FORMAT = 1
ADDITIVE_KINDS = ("gaussian", "laplace")
DISCRETE_KINDS = ("discrete_laplace", "discrete_gaussian")
# Largest discrete Gaussian sigma composed by its own PLD (0.2 s at 1e4).
MAX_DISCRETE_GAUSSIAN_PLD_SIGMA = 2e4
# PLD's value discretization per unit of epsilon, for every privacy loss distribution the
# product builds (the ledger's `composed_epsilon` and the tight pool's search,
# `accounting.pool_epsilon`). The estimate is pessimistic whatever the interval: each
# composition step rounds up by at most one. 1e-3 kept a year of the bank's nightly events
# (13,140 Gaussians, 4,380 selections) within 0.2% of 1e-5's result, in 0.03 s where 1e-5 took
# 4 s; a grid coarser than the target loses the accuracy PLD is for (at epsilon 1e-3, 3x).
PLD_DISCRETIZATION = 1e-3
# Above this epsilon the ledger sums: no one caps a scope there, and PLD grids of mechanisms
# with astronomic budgets (test jobs at epsilon 1e6) would not fit in memory.
MAX_COMPOSED_EPSILON = 64.0


@dataclass(frozen=True, order=True)
class PrivacyEvent:
    """One kind of mechanism a release ran, `count` times."""

    kind: Literal["gaussian", "laplace", "approx_dp", "discrete_laplace", "discrete_gaussian"]
    noise_multiplier: float | None = None  # additive kinds
    epsilon: float | None = None  # approx_dp: the mechanism's own guarantee
    delta: float | None = None
    count: int = 1
    # discrete kinds: the scale (t or sigma); discrete_laplace: L1 in linf with l0 = 1
    noise_scale: float | None = None
    l0: int | None = None
    linf: int | None = None

    def key(self) -> _Key:
        """What identifies the mechanism, whatever the count."""
        return (
            self.kind,
            self.noise_multiplier,
            self.epsilon,
            self.delta,
            self.noise_scale,
            self.l0,
            self.linf,
        )

    def to_dict(self) -> dict[str, object]:
        fields: dict[str, object]
        if self.kind in ADDITIVE_KINDS:
            fields = {"noise_multiplier": self.noise_multiplier}
        elif self.kind in DISCRETE_KINDS:
            fields = {"noise_scale": self.noise_scale, "l0": self.l0, "linf": self.linf}
        else:
            fields = {"epsilon": self.epsilon, "delta": self.delta}
        return {"kind": self.kind, **fields, "count": self.count}

    @staticmethod
    def from_dict(data: dict[str, object]) -> PrivacyEvent:
        kind = data["kind"]
        count = int(data.get("count", 1))  # type: ignore[call-overload]
        if kind in ADDITIVE_KINDS:
            multiplier = float(data["noise_multiplier"])  # type: ignore[arg-type]
            if not (math.isfinite(multiplier) and multiplier > 0 and count >= 1):
                raise ValueError(f"bad {kind} event {data}")
            return PrivacyEvent(kind, noise_multiplier=multiplier, count=count)  # type: ignore[arg-type]
        if kind in DISCRETE_KINDS:
            scale = float(data["noise_scale"])  # type: ignore[arg-type]
            l0, linf = int(data["l0"]), int(data["linf"])  # type: ignore[call-overload]
            if not (math.isfinite(scale) and scale > 0 and l0 >= 1 and linf >= 1 and count >= 1):
                raise ValueError(f"bad {kind} event {data}")
            return PrivacyEvent(kind, noise_scale=scale, l0=l0, linf=linf, count=count)  # type: ignore[arg-type]
        if kind == "approx_dp":
            eps, delta = float(data["epsilon"]), float(data["delta"])  # type: ignore[arg-type]
            if not (eps >= 0 and 0 <= delta <= 1 and count >= 1):
                raise ValueError(f"bad approx_dp event {data}")
            return PrivacyEvent("approx_dp", epsilon=eps, delta=delta, count=count)
        raise ValueError(f"unknown event kind {kind!r}")


def approx_dp(epsilon: float, delta: float, count: int = 1) -> PrivacyEvent:
    return PrivacyEvent("approx_dp", epsilon=epsilon, delta=delta, count=count)


def merged(events: Iterable[PrivacyEvent]) -> tuple[PrivacyEvent, ...]:
    """The same events with identical mechanisms counted once each (sorted): what makes a
    year of nightly releases one self-composition per mechanism."""
    counts: Counter[_Key] = Counter()
    for event in events:
        counts[event.key()] += event.count
    return tuple(
        PrivacyEvent(kind, multiplier, eps, delta, n, scale, l0, linf)  # type: ignore[arg-type]
        for (kind, multiplier, eps, delta, scale, l0, linf), n in sorted(counts.items(), key=_order)
    )


_Key = tuple[str, float | None, float | None, float | None, float | None, int | None, int | None]


def _order(item: tuple[_Key, int]) -> tuple[str, float, float, float, float, int, int]:
    (kind, multiplier, eps, delta, scale, l0, linf), _ = item
    return kind, multiplier or 0.0, eps or 0.0, delta or 0.0, scale or 0.0, l0 or 0, linf or 0


def to_json(events: Iterable[PrivacyEvent]) -> str:
    return json.dumps(
        {"format": EVENT_FORMAT, "events": [e.to_dict() for e in merged(events)]},
        sort_keys=True,
    )


def from_json(text: str) -> tuple[PrivacyEvent, ...]:
    """The events of a stored release; ValueError when the text is not what `to_json` writes."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != EVENT_FORMAT:
        raise ValueError(f"unknown privacy event format {str(data)[:80]}")
    return merged(PrivacyEvent.from_dict(e) for e in data["events"])


def mechanism_events(budget: MechanismBudget) -> tuple[PrivacyEvent, ...]:
    """A planned mechanism as the ledger composes it (`mechanism_event`), and a mechanism of
    the tight pool as the pool's search composed it (`accounting.budget_member`): a quantile
    tree by its noise multiplier; max or min as L0 pure-DP draws of epsilon 1 / (multiplier
    L0); a thresholding selection as its noise plus (0, threshold delta), and truncated
    geometric as L0 pure-DP draws of epsilon 1 / (multiplier L0) plus (0, its delta): an
    (epsilon, delta) pair's privacy loss is a randomized response's, infinite with
    probability delta, and the L0 partitions' infinities add up to PyDP's delta."""
    mu = budget.noise_multiplier
    if mu is None or budget.discrete or budget.name not in _POOLED_ONLY:
        return (mechanism_event(budget),)
    if budget.kind == "exponential":
        l0 = budget.l0_sensitivity
        return (approx_dp(1 / (mu * l0), 0.0, count=l0),)
    if budget.name == "percentile":
        return (PrivacyEvent(budget.kind, noise_multiplier=mu),)  # type: ignore[arg-type]
    threshold = approx_dp(0.0, budget.threshold_delta or 0.0)
    if budget.kind == "truncated_geometric":
        l0 = budget.l0_sensitivity
        return approx_dp(1 / (mu * l0), 0.0, count=l0), threshold
    noise = "gaussian" if budget.kind == "gaussian_thresholding" else "laplace"
    return PrivacyEvent(noise, noise_multiplier=mu), threshold  # type: ignore[arg-type]


# Mechanisms that are not additive noise but join the tight pool (`mechanism_events`).
_POOLED_ONLY = ("percentile", "max", "min", "partition_selection")


def mechanism_event(budget: MechanismBudget) -> PrivacyEvent:
    """A planned mechanism as the ledger composes it: additive noise by its multiplier (the
    tight pool's, or the one PyDP's calibration gives under basic composition), anything else
    by its (epsilon, delta) share; discrete noise by its scale and sensitivity."""
    if budget.discrete:
        return _discrete_event(budget)
    if budget.kind not in ADDITIVE_KINDS or budget.noise_stddev is None:
        return approx_dp(budget.epsilon, budget.delta)
    multiplier = budget.noise_multiplier
    if multiplier is None:
        if budget.kind == "gaussian":
            multiplier = budget.noise_stddev / budget.l2_sensitivity
        else:  # Laplace: std = sqrt(2) * scale
            multiplier = budget.noise_stddev / (math.sqrt(2) * budget.l1_sensitivity)
    return PrivacyEvent(budget.kind, noise_multiplier=multiplier)  # type: ignore[arg-type]


def _discrete_event(budget: MechanismBudget) -> PrivacyEvent:
    from dppipeline.core import discrete  # noqa: PLC0415 (numpy only, but keep events light)

    scale = budget.noise_scale
    assert scale is not None
    if budget.kind == "laplace":
        l1 = round(budget.l1_sensitivity)
        return PrivacyEvent("discrete_laplace", noise_scale=scale, l0=1, linf=l1)
    l0, linf = budget.l0_sensitivity, budget.linf_sensitivity
    structured = float(linf).is_integer() and math.isclose(
        budget.l2_sensitivity, math.sqrt(l0) * linf, rel_tol=1e-12
    )
    if structured and scale <= MAX_DISCRETE_GAUSSIAN_PLD_SIGMA:
        return PrivacyEvent("discrete_gaussian", noise_scale=scale, l0=l0, linf=round(linf))
    rho = budget.l2_sensitivity**2 / (2 * scale**2)
    delta = budget.delta if budget.delta > 0 else 1e-12
    return approx_dp(discrete.zcdp_epsilon(rho, delta), delta)


def release_events(plan: JobPlan) -> tuple[PrivacyEvent, ...]:
    """Every mechanism of a job's release: each query's own mechanisms and each selection
    (a selection shared by several queries runs once)."""
    mechanisms = [m for q in plan.queries for m in q.own_mechanisms()]
    mechanisms += [g.mechanism for g in plan.selections]
    return merged(e for m in mechanisms for e in mechanism_events(m))


def composed_epsilon(events: Iterable[PrivacyEvent], delta: float, scale: float) -> float | None:
    """Epsilon at `delta` of all `events` composed, by dp_accounting's pessimistic PLDs;
    None when it cannot be computed (a delta below what the events already spend, a grid
    out of range). `scale`: the epsilon expected (sizes the grid)."""
    events = merged(events)
    if not events or not 0 < scale <= MAX_COMPOSED_EPSILON:
        return None
    interval = PLD_DISCRETIZATION * min(1.0, scale)  # absolute up to epsilon 1
    try:
        total: PrivacyLossDistribution | None = None
        for event in events:
            pld = _pld(dataclasses.replace(event, count=1), interval)
            if event.count > 1:
                pld = pld.self_compose(event.count)
            total = pld if total is None else total.compose(pld)
        assert total is not None
        epsilon = float(total.get_epsilon_for_delta(delta))
    except (ValueError, OverflowError, FloatingPointError, MemoryError):
        return None
    return epsilon if math.isfinite(epsilon) else None


@functools.lru_cache(maxsize=64)
def _pld(event: PrivacyEvent, interval: float) -> PrivacyLossDistribution:
    """One `event` mechanism's PLD (its count is left to the caller). Cached: every admission
    of a scope composes the same few mechanisms again, with new counts; dp_accounting's PLDs
    are not changed by composing them, so a cached one gives the same bits."""
    from dp_accounting.pld import common  # noqa: PLC0415 (see the imports above)
    from dp_accounting.pld import privacy_loss_distribution as pld  # noqa: PLC0415

    if event.kind == "gaussian":
        return pld.from_gaussian_mechanism(
            standard_deviation=event.noise_multiplier,
            sensitivity=1.0,
            value_discretization_interval=interval,
        )
    if event.kind == "discrete_laplace":
        assert event.noise_scale is not None and event.linf is not None
        return pld.from_discrete_laplace_mechanism(
            parameter=1 / event.noise_scale,
            sensitivity=event.linf,
            value_discretization_interval=interval,
        )
    if event.kind == "discrete_gaussian":
        assert event.noise_scale is not None and event.linf is not None and event.l0
        one = pld.from_discrete_gaussian_mechanism(
            event.noise_scale, sensitivity=event.linf, value_discretization_interval=interval
        )
        return one.self_compose(event.l0) if event.l0 > 1 else one
    if event.kind == "laplace":
        return pld.from_laplace_mechanism(
            parameter=event.noise_multiplier,
            sensitivity=1.0,
            value_discretization_interval=interval,
        )
    assert event.epsilon is not None and event.delta is not None
    return pld.from_privacy_parameters(
        common.DifferentialPrivacyParameters(event.epsilon, event.delta),
        value_discretization_interval=interval,
    )
