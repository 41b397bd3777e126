"""The planner: splits a job's budget across its mechanisms and checks each against PyDP.

Computed once, before any data is read, by pipeline-dp's NaiveBudgetAccountant's arithmetic
(`NaiveSplit`: basic composition), or by one pool composed tightly (`core.accounting`); the
result is a `JobPlan` (`core.plan`, which describes the mechanisms). Every mechanism is built
and checked here, so a plan that PyDP cannot carry out is refused before the ledger is charged.

A job of several queries (`plan_job`) splits its one budget across every query's mechanisms
and one selection per group of queries that share partition keys and selection settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dppipeline.core import discrete
from dppipeline.core.accounting import Member, certified_multiplier, discrete_pool_fits
from dppipeline.core.columns import DISTINCT_PREFIX
from dppipeline.core.extremes import EXPONENTIAL, EXTREME_METRICS, gumbel_scale, margin
from dppipeline.core.plan import (
    BRANCHING_FACTOR,
    NOT_ADDITIVE,
    TREE_HEIGHT,
    AggregationParams,
    BudgetPlan,
    JobPlan,
    MechanismBudget,
    QueryPlan,
    SelectionGroup,
    contribution_sensitivities,
    gaussian_delta,
    is_integer_mechanism,
    privacy_units_needed,
)
from dppipeline.errors import SpecError, UsageError
from dppipeline.spec.limits import MIN_EPSILON
from dppipeline.spec.metrics import VARIANCE_METRICS


@dataclass
class Share:
    """One mechanism's request to `NaiveSplit`: its weight, whether it takes part of delta
    (all but Laplace, as pipeline-dp's `MechanismSpec.use_delta`), and its share once split."""

    kind: str  # laplace | gaussian | a partition selection strategy
    weight: float
    name: str
    eps: float = 0
    delta: float = 0

    @property
    def uses_delta(self) -> bool:
        return self.kind != "laplace"


class NaiveSplit:
    """pipeline-dp 0.3.1's `NaiveBudgetAccountant` (basic composition), the same arithmetic in
    the same order, its refusals included: pipeline-dp itself costs 1.3 s of start-up, which
    a Laplace run never needs. tests/dp/exact/test_pipeline_dp_arithmetic.py holds the two equal."""

    def __init__(self, total_epsilon: float, total_delta: float) -> None:
        if total_epsilon <= 0:
            raise ValueError(f"BudgetAccountant: epsilon must be positive, not {total_epsilon}.")
        if total_delta < 0:
            raise ValueError(f"BudgetAccountant: delta must be non-negative, not {total_delta}.")
        if total_delta >= 1:
            raise ValueError(f"BudgetAccountant: delta must be less than 1, not {total_delta}.")
        self._total_epsilon = total_epsilon
        self._total_delta = total_delta
        self._shares: list[Share] = []

    def request_budget(self, kind: str, weight: float = 1, name: str = "") -> Share:
        if kind == "gaussian" and self._total_delta == 0:
            raise ValueError(
                "The Gaussian mechanism requires that the pipeline delta is greater than 0"
            )
        if kind not in ("laplace", "gaussian") and self._total_delta == 0:
            raise ValueError(
                "The private partition selections requires that the pipeline delta is "
                "greater than 0"
            )
        share = Share(kind, weight, name)
        self._shares.append(share)
        return share

    def compute_budgets(self) -> None:
        total_weight_eps: float = 0
        total_weight_delta: float = 0
        for share in self._shares:
            total_weight_eps += share.weight * 1
            if share.uses_delta:
                total_weight_delta += share.weight * 1
        for share in self._shares:
            share.eps = share.delta = 0
            if total_weight_eps:
                share.eps = self._total_epsilon * share.weight / total_weight_eps
            if share.uses_delta and total_weight_delta:
                share.delta = self._total_delta * share.weight / total_weight_delta


def _metric_mechanisms(params: AggregationParams) -> list[tuple[str, float]]:
    """(mechanism name, Linf sensitivity) for each noise mechanism the metrics need."""
    linf = params.max_contributions_per_partition
    metrics = params.metrics
    wanted: list[tuple[str, float]] = []
    variance = any(m in VARIANCE_METRICS for m in metrics)
    centred = "mean" in metrics or variance
    if "count" in metrics or centred:
        wanted.append(("count", float(linf)))
    if centred:
        wanted.append(("centred_sum", params.half_range * linf))
    elif "sum" in metrics:
        assert params.min_value is not None and params.max_value is not None
        wanted.append(("sum", max(abs(params.min_value), abs(params.max_value)) * linf))
    if variance:
        wanted.append(("centred_sum_of_squares", params.half_range**2 / 2 * linf))
    if params.percentiles:
        wanted.append(("percentile", float(linf)))
    for metric in params.extremes:
        wanted.append((metric, float(linf)))
    if "privacy_id_count" in metrics:
        wanted.append(("privacy_id_count", 1.0))
    # count_distinct: a unit's <= Linf kept rows in a partition hold <= Linf distinct values, and
    # removing them removes at most those: |change| <= Linf, as count
    # (docs/explanation/count_distinct.md).
    wanted += [(f"{DISTINCT_PREFIX}{column}", float(linf)) for column in params.distinct_columns]
    return wanted


_Queries = Sequence[tuple[str, AggregationParams, float]]  # (name, params, weight)
_GroupKey = tuple[tuple[str, ...], str, int | None]  # key columns, strategy, pre_threshold


def _selection_groups(queries: _Queries) -> dict[_GroupKey, list[str]]:
    """Private queries by (key columns, strategy, pre_threshold), in spec order."""
    groups: dict[_GroupKey, list[str]] = {}
    for name, params, _ in queries:
        if not params.public_partitions:
            group = (params.key_columns, params.selection_strategy, params.pre_threshold)
            groups.setdefault(group, []).append(name)
    return groups


def plan_job(
    queries: _Queries,
    epsilon: float,
    delta: float,
    *,
    prefix_names: bool = True,
    accounting: str = "basic",
) -> JobPlan:
    """Splits (epsilon, delta) across all queries' mechanisms and selections with one
    `NaiveSplit` (pipeline-dp's NaiveBudgetAccountant). A query's metric mechanisms share
    its `budget_weight` equally, so queries get budget in proportion to their weights; a
    selection weighs as much as one mechanism of the heaviest query using it (for one query:
    all mechanisms and its selection get equal shares, as pipeline-dp's own DPEngine splits).

    `queries`: (name, params, weight). With `prefix_names`, mechanisms are named
    `<query>.<mechanism>` for the accountant (a single-query job keeps the plain names).

    Under `pld` or `zcdp` accounting every mechanism's share (each metric mechanism
    requested as a Gaussian, so that the pool gets its share of delta whatever the noise)
    goes into one pool composed tightly (`core.accounting`): the noise mechanisms, the
    quantile trees, max and min, and the selections (`_pool_member`).
    """
    shares = _request_shares(queries, epsilon, delta, prefix_names, tight=accounting != "basic")
    multiplier: float | None = None
    certified_by: str | None = None
    if accounting != "basic":  # one pool, composed tightly
        multiplier, certified_by = _pool_multiplier(
            accounting, shares.pool_members(), shares.accountant_specs()
        )
    budgets_of = shares.metric_budgets(multiplier)
    if multiplier is not None and any(b.discrete for bs in budgets_of.values() for b in bs):
        multiplier, budgets_of = _discrete_pool(
            accounting, multiplier, shares.metric_budgets, shares.selection_budgets
        )
    selections = shares.selection_groups(multiplier)
    plans = _query_plans(queries, budgets_of, selections, prefix_names)
    return JobPlan(
        epsilon, delta, tuple(plans), tuple(selections), accounting, multiplier, certified_by
    )


@dataclass(frozen=True)
class _MetricShare:
    """One metric mechanism as requested from the accountant (its share set once computed)."""

    mechanism: str
    kind: str
    linf: float
    spec: Share


@dataclass(frozen=True)
class _SelectionShare:
    """One selection group as requested from the accountant."""

    keys: tuple[str, ...]
    strategy: str
    pre_threshold: int | None
    members: tuple[str, ...]
    weight: float  # as much as one mechanism of its heaviest member
    spec: Share


@dataclass(frozen=True)
class _Shares:
    """The accountant's split of a job's budget, from which budgets at a multiplier are built
    (None: basic composition's own shares)."""

    queries: _Queries
    metrics: dict[str, list[_MetricShare]]
    unit_weight: dict[str, float]  # the weight of each of a query's mechanisms
    selections: dict[str, _SelectionShare]
    prefix_names: bool

    def params(self, name: str) -> AggregationParams:
        return next(params for query, params, _ in self.queries if query == name)

    def pool_members(self) -> list[Member]:
        """Every mechanism of the job as the tight pool composes it (`_pool_member`)."""
        pool = [
            _pool_member(share.mechanism, share.kind, self.unit_weight[name], self.params(name))
            for name, shares in self.metrics.items()
            for share in shares
        ]
        pool += [
            _pool_member("partition_selection", b.kind, self.selections[g].weight, None, b)
            for g, b in self.selection_budgets(None).items()
        ]
        return pool

    def accountant_specs(self) -> list[Share]:
        """The accountant's basic shares, whose sum is the pool's budget."""
        specs = [share.spec for shares in self.metrics.values() for share in shares]
        return specs + [selection.spec for selection in self.selections.values()]

    def metric_budgets(self, m: float | None) -> dict[str, list[MechanismBudget]]:
        """Every query's metric mechanisms, at pool multiplier `m` (None: basic shares)."""
        return {
            name: [
                _metric_budget(
                    params, share.mechanism, share.kind, share.linf, share.spec,
                    where=_Where(name if self.prefix_names else None),
                    multiplier=None if m is None else m / self.unit_weight[name],
                )
                for share in self.metrics[name]
            ]
            for name, params, _ in self.queries
        }  # fmt: skip

    def selection_budgets(self, m: float | None) -> dict[str, MechanismBudget]:
        """Every selection group's mechanism, at pool multiplier `m` (None: basic shares)."""
        budgets = {}
        for group_name, selection in self.selections.items():
            share = selection.spec.delta or 0.0
            budgets[group_name] = MechanismBudget(
                name="partition_selection",
                kind=selection.strategy,
                epsilon=selection.spec.eps,
                delta=share,
                l0_sensitivity=max(
                    self.params(member).max_partitions_contributed for member in selection.members
                ),
                linf_sensitivity=1.0,
                noise_stddev=None,
                noise_multiplier=None if m is None else m / selection.weight,
                threshold_delta=None if m is None else _threshold_delta(selection.strategy, share),
            )
        return budgets

    def selection_groups(self, m: float | None) -> list[SelectionGroup]:
        budgets = self.selection_budgets(m)
        return [
            SelectionGroup(name, s.keys, s.members, budgets[name], s.pre_threshold)
            for name, s in self.selections.items()
        ]


def _request_shares(
    queries: _Queries, epsilon: float, delta: float, prefix_names: bool, *, tight: bool
) -> _Shares:
    """Asks one accountant for every query's metric mechanisms, then one selection per group
    of private queries (`_selection_groups`), and computes the shares."""
    accountant = NaiveSplit(total_epsilon=epsilon, total_delta=delta)

    def label(owner: str, mechanism: str) -> str:
        return f"{owner}.{mechanism}" if prefix_names else mechanism

    metrics: dict[str, list[_MetricShare]] = {}
    unit_weight: dict[str, float] = {}
    for name, params, weight in queries:
        mechanisms = _metric_mechanisms(params)
        unit_weight[name] = weight / len(mechanisms)
        metrics[name] = [
            _MetricShare(
                mechanism,
                _kind(params, mechanism),
                linf,
                accountant.request_budget(
                    _requested_type(params, mechanism, tight),
                    weight=unit_weight[name],
                    name=label(name, mechanism),
                ),
            )
            for mechanism, linf in mechanisms
        ]
    selections: dict[str, _SelectionShare] = {}
    for (keys, strategy, pre_threshold), members in _selection_groups(queries).items():
        group_name = ",".join(keys) if prefix_names else "partition_selection"
        if group_name in selections:  # same keys, other settings: keep names unique
            group_name = f"{group_name}#{len(selections) + 1}"
        weight = max(unit_weight[m] for m in members)
        spec = accountant.request_budget(
            strategy,
            weight=weight,
            name=label("partition_selection", group_name) if prefix_names else group_name,
        )
        selections[group_name] = _SelectionShare(
            keys, strategy, pre_threshold, tuple(members), weight, spec
        )
    accountant.compute_budgets()
    return _Shares(queries, metrics, unit_weight, selections, prefix_names)


def _query_plans(
    queries: _Queries,
    budgets_of: dict[str, list[MechanismBudget]],
    selections: Sequence[SelectionGroup],
    prefix_names: bool,
) -> list[QueryPlan]:
    """Each query's plan: its metric mechanisms and its group's selection, checked sound."""
    group_of = {member: group for group in selections for member in group.queries}
    plans = []
    for name, params, weight in queries:
        budgets = budgets_of[name]
        group = group_of.get(name)
        if group is not None:
            budgets.append(group.mechanism)
        eps = math.fsum(m.epsilon for m in budgets)
        dlt = math.fsum(m.delta for m in budgets)
        plan = BudgetPlan(epsilon=eps, delta=dlt, params=params, mechanisms=tuple(budgets))
        _check_selection_is_sound(plan, _Where(name if prefix_names else None))
        plans.append(QueryPlan(name, weight, plan, None if group is None else group.name))
    return plans


def _kind(params: AggregationParams, mechanism: str) -> str:
    """A mechanism's kind: the job's noise, or `exponential` for max and min."""
    return EXPONENTIAL if mechanism in EXTREME_METRICS else params.noise


def _requested_type(params: AggregationParams, mechanism: str, tight: bool) -> str:
    """The noise type a mechanism asks pipeline-dp's accountant for: its delta share follows.
    Under basic composition max and min are pure epsilon-DP, so Laplace (no delta); under
    tight accounting every metric mechanism asks as a Gaussian (the pool, which holds them
    all, gets the job's delta)."""
    if tight:
        return "gaussian"
    return "laplace" if mechanism in EXTREME_METRICS else params.noise


def _threshold_delta(strategy: str, share: float) -> float:
    """The delta a pooled selection's threshold spends: half its share for Gaussian
    thresholding (PyDP splits a selection's delta evenly between its noise and its threshold;
    the noise's half goes back to the pool), all of it otherwise (Laplace noise needs none;
    truncated geometric spends its delta on keeping one-unit partitions)."""
    return share / 2 if strategy == "gaussian_thresholding" else share


def _pool_member(
    mechanism: str,
    kind: str,
    weight: float,
    params: AggregationParams | None,
    selection: MechanismBudget | None = None,
) -> Member:
    """How a mechanism composes in the pool (`accounting.Member`): noise mechanisms and the
    quantile tree (one Laplace or Gaussian over all its nodes: PyDP calibrates it for L0 x
    its height partitions of Linf) by their noise; max and min as pure epsilon-DP draws over
    the L0 partitions a unit reaches; Laplace and Gaussian thresholding as their noise on a
    partition's unit count (L1 = L0, L2 = sqrt(L0)) plus their threshold's delta; truncated
    geometric as (epsilon / L0, delta')-DP per partition (PyDP's calibration), i.e. L0
    randomized responses plus its delta (the (epsilon, delta) pair's privacy loss is a
    randomized response's, infinite with probability delta)."""
    if selection is not None:
        assert selection.epsilon > 0
        delta = _threshold_delta(kind, selection.delta)
        if kind == "truncated_geometric":
            return Member("pure", weight, selection.l0_sensitivity, delta)
        noise = "gaussian" if kind == "gaussian_thresholding" else "laplace"
        return Member(noise, weight, 1, delta)
    if mechanism in EXTREME_METRICS:
        assert params is not None
        return Member("exponential", weight, params.quantile_tree_bounds[0])
    return Member(kind, weight)


def _pool_multiplier(
    accounting: str, pool: list[Member], shares: list[Share]
) -> tuple[float | None, str | None]:
    """(m, the accountant that proved it): the base noise multiplier of the pool, whose
    mechanisms, with multipliers m / weight, compose to at most the sum of their basic
    shares (the job's budget). (None, None) for a job without mechanisms."""
    if not pool:
        return None, None
    epsilon = math.fsum(spec.eps for spec in shares)
    delta = math.fsum(spec.delta or 0.0 for spec in shares)
    try:
        return certified_multiplier(accounting, pool, epsilon, delta)
    except ValueError:
        raise SpecError(
            "budget.epsilon",
            f"no noise meets epsilon {epsilon:.3g}, delta {delta:.3g} for the job's "
            f"{len(pool)} mechanisms under {accounting} accounting",
        ) from None


def _discrete_pool(
    accounting: str,
    multiplier: float,
    metric_budgets: Callable[[float | None], dict[str, list[MechanismBudget]]],
    selection_budgets: Callable[[float | None], dict[str, MechanismBudget]],
) -> tuple[float, dict[str, list[MechanismBudget]]]:
    """The pool's multiplier, raised (geometric bisection to 0.1%) until its discrete
    mechanisms, composed as what they are (`accounting.discrete_pool_fits`), meet the pool's
    budget: the search chose it for continuous noise, whose privacy loss is not the same."""

    def pool(m: float) -> list[MechanismBudget]:
        metrics = [b for bs in metric_budgets(m).values() for b in bs]
        return metrics + list(selection_budgets(m).values())

    first = pool(multiplier)
    epsilon = math.fsum(b.epsilon for b in first)
    delta = math.fsum(b.delta for b in first)

    def fits(m: float) -> bool:
        return discrete_pool_fits(accounting, pool(m), epsilon, delta)

    low, high = multiplier, multiplier
    while not fits(high):
        low, high = high, high * 1.25
        if high > 64 * multiplier:
            raise SpecError(
                "count_noise",
                f"no discrete noise meets epsilon {epsilon:.3g}, delta {delta:.3g} under "
                f"{accounting} accounting; use count_noise: continuous",
            )
    while high / low > 1.001:
        mid = math.sqrt(low * high)
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high, metric_budgets(high)


def _metric_budget(
    params: AggregationParams,
    name: str,
    kind: str,
    linf: float,
    spec: Share,
    *,
    where: _Where,
    multiplier: float | None = None,
) -> MechanismBudget:
    l1, l2 = contribution_sensitivities(params, name, linf)
    budget = MechanismBudget(
        name=name,
        kind=kind,
        epsilon=spec.eps,
        delta=spec.delta or 0.0,
        l0_sensitivity=(
            params.quantile_tree_bounds[0]
            if name in ("percentile", *EXTREME_METRICS)
            else params.max_partitions_contributed
        ),
        linf_sensitivity=linf,
        noise_stddev=None,
        noise_multiplier=multiplier,
        l1=l1,
        l2=l2,
    )
    if params.count_noise == "discrete" and is_integer_mechanism(name):
        return _discrete_budget(budget, where)
    if multiplier is not None and name not in NOT_ADDITIVE:
        return MechanismBudget(**{**budget.__dict__, "noise_stddev": _tight_std(budget, where)})
    if multiplier is None:
        _check_epsilon_share(budget, where)
    if name == "percentile":
        _check_percentile(params, budget, where)
    if name in EXTREME_METRICS:
        return _extreme_budget(budget, where)
    if name in NOT_ADDITIVE:
        return budget
    return MechanismBudget(**{**budget.__dict__, "noise_stddev": _checked_std(budget, where)})


# --- what PyDP can do: every mechanism is built and checked when the plan is made ------------
#
# Found by trying PyDP 1.1.5 (the spec's static limits keep most of these out of reach):
# - every mechanism refuses an epsilon below 2^-50;
# - Gaussian noise above an epsilon of ln(DBL_MAX) ~ 709.78 gets sigma 2.2e-308 (no noise at
#   all), and at tiny epsilon with a tiny delta a sigma below the one its delta needs;
# - Laplace refuses an L1 sensitivity near 1e307, Gaussian hangs on an L2 one near 5e307;
# - the quantile tree multiplies L0 by its height (4) in a C++ int: L0 > 536,870,911 fails;
# - truncated geometric selection above an epsilon of ~709.78 says NaN for the probability of
#   keeping a one-unit partition, and keeps none (never more than delta allows).


@dataclass(frozen=True)
class _Where:
    """Names the spec fields at fault in a plan error (a query's, in a multi-query job)."""

    query: str | None

    def field(self, name: str) -> str:
        return (
            name
            if self.query is None or name.startswith("budget.")
            else (f"queries.{self.query}.{name}")
        )

    def owner(self) -> str:
        return f" of query {self.query}" if self.query is not None else ""

    def mechanism(self, budget: MechanismBudget) -> str:
        return f"the {budget.name} mechanism{self.owner()}"

    def epsilon_advice(self) -> str:
        if self.query is None:
            return "raise budget.epsilon"
        return f"raise budget.epsilon or queries.{self.query}.budget_weight"


def _check_epsilon_share(budget: MechanismBudget, where: _Where) -> None:
    if not budget.epsilon >= MIN_EPSILON:
        raise SpecError(
            "budget.epsilon",
            f"gives {where.mechanism(budget)} an epsilon of {budget.epsilon:.3g}, below "
            f"PyDP's smallest, 2^-50 (~{MIN_EPSILON:.2g}); {where.epsilon_advice()}",
        )


def _checked_std(budget: MechanismBudget, where: _Where) -> float:
    """The std of the mechanism PyDP builds, refused unless finite, positive and (Gaussian)
    large enough for the mechanism's delta by the analytic formula (Balle and Wang 2018)."""
    try:
        std = float(budget.build_additive().std)
    except (RuntimeError, TypeError, ValueError, OverflowError):
        raise SpecError(
            where.field("bounds"),
            f"PyDP refuses {where.mechanism(budget)} (L0 {budget.l0_sensitivity}, Linf "
            f"sensitivity {budget.linf_sensitivity:g}, epsilon {budget.epsilon:g}); narrow "
            "the bounds or lower L0 or Linf",
        ) from None
    if not (math.isfinite(std) and std > 0):
        raise SpecError(
            "budget.epsilon",
            f"gives {where.mechanism(budget)} a noise std of {std:g}; PyDP cannot add such "
            "noise: change budget.epsilon or the bounds",
        )
    if budget.kind == "gaussian":
        l2 = budget.l2_sensitivity
        actual = gaussian_delta(std, budget.epsilon, l2)
        if not actual <= budget.delta * (1 + 1e-6):
            advice = (
                "lower budget.epsilon or use laplace noise"
                if budget.epsilon > 1
                else "raise budget.epsilon or budget.delta"
            )
            raise SpecError(
                "budget.epsilon",
                f"PyDP's Gaussian noise for {where.mechanism(budget)} at epsilon "
                f"{budget.epsilon:.3g}, delta {budget.delta:.3g} has sigma {std:.3g}, which "
                f"only gives delta {actual:.3g} (outside PyDP's numerical range); {advice}",
            )
    return std


def _tight_std(budget: MechanismBudget, where: _Where) -> float:
    """The std of the mechanism PyDP builds from the composition's multiplier; refused unless
    it is the planned one (PyDP's Gaussian from a std, and Laplace from a scale, are exact)."""
    assert budget.noise_multiplier is not None
    sensitivity = budget.l2_sensitivity if budget.kind == "gaussian" else budget.l1_sensitivity
    planned = (
        budget.noise_multiplier * sensitivity * (1 if budget.kind == "gaussian" else math.sqrt(2))
    )
    try:
        std = float(budget.build_additive().std)
    except (RuntimeError, TypeError, ValueError, OverflowError):
        std = math.nan
    if not (math.isfinite(std) and std > 0 and math.isclose(std, planned, rel_tol=1e-9)):
        raise SpecError(
            where.field("bounds"),
            f"PyDP cannot add the noise planned for {where.mechanism(budget)} (std "
            f"{planned:.3g}, L0 {budget.l0_sensitivity}, Linf sensitivity "
            f"{budget.linf_sensitivity:g}); narrow the bounds or lower L0 or Linf",
        )
    return std


def _discrete_budget(budget: MechanismBudget, where: _Where) -> MechanismBudget:
    """The discrete mechanism's scale: under tight accounting the pool's multiplier times the
    sensitivity (its privacy checked by `_discrete_pool`); under basic composition discrete
    Laplace t = L1 / epsilon (epsilon-DP for an integer L1) and the smallest discrete Gaussian
    sigma whose zCDP (CKS20) converts to the mechanism's (epsilon, delta)."""
    l1, l2 = budget.l1_sensitivity, budget.l2_sensitivity
    if not float(l1).is_integer():
        raise SpecError(
            where.field("bounds"),
            f"{where.mechanism(budget)} has L1 sensitivity {l1:g}; discrete noise needs an "
            "integer one",
        )
    if budget.noise_multiplier is not None:
        scale = budget.noise_multiplier * (l2 if budget.kind == "gaussian" else l1)
    else:
        _check_epsilon_share(budget, where)
        if budget.kind == "laplace":
            scale = l1 / budget.epsilon
        else:
            scale = discrete.gaussian_sigma(budget.epsilon, budget.delta, l2)
    kind = f"discrete_{budget.kind}"
    if not (math.isfinite(scale) and 0 < scale <= discrete.MAX_SCALE):
        raise SpecError(
            "budget.epsilon",
            f"gives {where.mechanism(budget)} a discrete noise scale of {scale:.3g}, outside "
            f"(0, {discrete.MAX_SCALE:.0e}]; change budget.epsilon or the bounds",
        )
    std = math.sqrt(discrete.discrete_variance(kind, scale))
    return MechanismBudget(
        **{**budget.__dict__, "discrete": True, "noise_scale": scale, "noise_stddev": std}
    )


# Largest margin m accepted for max and min: scores stay exact in int64 (and far beyond any
# partition's rows: such a mechanism would only ever answer near the bound).
MAX_MARGIN = 2**52


def _extreme_budget(budget: MechanismBudget, where: _Where) -> MechanismBudget:
    """Max or min: the Gumbel scale 2 L0 Linf / epsilon in rows (`core.extremes`), refused
    when not finite. L0 and Linf are the quantile trees' (1, K) under max_contributions K:
    a unit's k_i rows in partition i cost e k_i / K there, at most e in all."""
    epsilon = budget.epsilon if budget.noise_multiplier is None else 1 / budget.noise_multiplier
    scale = gumbel_scale(budget.l0_sensitivity, budget.linf_sensitivity, epsilon)
    if not (math.isfinite(scale) and scale > 0 and margin(scale) <= MAX_MARGIN):
        raise SpecError(
            "budget.epsilon",
            f"gives {where.mechanism(budget)} a noise scale of {scale:.3g} rows; raise "
            "budget.epsilon or lower the bounds",
        )
    return MechanismBudget(**{**budget.__dict__, "noise_scale": scale})


# How much more Gaussian noise than planned PyDP may add where it calibrates from (epsilon,
# delta) (its sigma search rounds up; measured within 0.2%).
PYDP_SIGMA_SLACK = 0.01


def _check_pydp_gaussian(budget: MechanismBudget, l2_sensitivity: float, where: _Where) -> None:
    """A pooled Gaussian that PyDP calibrates itself (quantile tree, Gaussian thresholding):
    the sigma PyDP finds for `calibration()` must be at least the planned multiplier x L2
    (the pool composed that one) and within PYDP_SIGMA_SLACK of it."""
    from pydp.algorithms.numerical_mechanisms import GaussianMechanism  # noqa: PLC0415

    assert budget.noise_multiplier is not None
    planned = budget.noise_multiplier * l2_sensitivity
    try:
        epsilon, delta = budget.calibration()
        if budget.name == "partition_selection":
            delta /= 2  # PyDP's Gaussian thresholding: half to the noise
        std = float(GaussianMechanism(epsilon, delta, l2_sensitivity).std)
    except (RuntimeError, TypeError, ValueError, OverflowError):
        std = math.nan
    if not planned <= std <= planned * (1 + PYDP_SIGMA_SLACK):
        raise SpecError(
            "budget.epsilon",
            f"PyDP cannot calibrate the Gaussian noise planned for {where.mechanism(budget)} "
            f"(sigma {planned:.3g}); use laplace noise or accounting: basic",
        )


def _check_percentile(params: AggregationParams, budget: MechanismBudget, where: _Where) -> None:
    """PyDP's quantile tree takes L0 times its height as a C++ int; a dry run (no data, noise
    drawn and thrown away) shows it accepts the rest."""
    limit = (2**31 - 1) // TREE_HEIGHT
    tree_l0, tree_linf = params.quantile_tree_bounds
    if budget.pooled and budget.kind == "gaussian":
        _check_pydp_gaussian(budget, math.sqrt(tree_l0 * TREE_HEIGHT) * tree_linf, where)
    if tree_l0 > limit:
        raise SpecError(
            where.field("bounds.max_partitions_contributed"),
            f"must be at most {limit:,} with percentile metrics (PyDP's quantile tree "
            f"multiplies it by its height, {TREE_HEIGHT}, in a C++ int), got "
            f"{params.max_partitions_contributed:,}",
        )
    assert params.min_value is not None and params.max_value is not None
    from pipeline_dp import dp_computations  # noqa: PLC0415 (percentiles only: 1.3 s of start-up)
    from pydp.algorithms.quantile_tree import QuantileTree  # noqa: PLC0415

    try:
        tree = QuantileTree(params.min_value, params.max_value, TREE_HEIGHT, BRANCHING_FACTOR)
        found = dp_computations.compute_dp_quantiles(
            tree,
            budget.build_spec(),
            [0.5],
            tree_l0,
            tree_linf,
        )
    except (RuntimeError, TypeError, ValueError, OverflowError):
        found = [math.nan]
    if not all(math.isfinite(q) for q in found):
        raise SpecError(
            "budget.epsilon",
            f"PyDP cannot compute percentiles with {where.mechanism(budget)} at epsilon "
            f"{budget.epsilon:.3g} and bounds [{params.min_value:g}, {params.max_value:g}]",
        )


def plan_budget(
    params: AggregationParams, epsilon: float, delta: float, accounting: str = "basic"
) -> BudgetPlan:
    """Splits (epsilon, delta) across one query's mechanisms (see `plan_job`)."""
    job = plan_job(
        [("query", params, 1.0)], epsilon, delta, prefix_names=False, accounting=accounting
    )
    return job.queries[0].plan


def _check_selection_is_sound(plan: BudgetPlan, where: _Where) -> None:
    """Refuses a selection whose PyDP strategy would release a one-unit partition with
    probability above its delta: PyDP's Gaussian thresholding does so at large epsilon (seen
    with epsilon >= 1000, delta 1e-6: probability 0.5), and Laplace thresholding at 1e300,
    which would void the guarantee. Truncated geometric's NaN (epsilon above ~709.78) is
    sound: it then never keeps a one-unit partition (0 of 20,000 tries at 710 to 1e7)."""
    selection = plan.selection
    if selection is None:
        return
    _check_epsilon_share(selection, where)
    p_one = selection.build_selection(plan.params.pre_threshold).probability_of_keep(1)
    nan_is_sound = math.isnan(p_one) and selection.kind == "truncated_geometric"
    allowed = selection.delta
    if selection.pooled:
        # the pool added the threshold's delta: one-unit partitions among L0 released
        assert selection.threshold_delta is not None
        allowed = selection.threshold_delta
        p_one = -math.expm1(selection.l0_sensitivity * math.log1p(-p_one))
        if selection.kind == "gaussian_thresholding":
            _check_pydp_gaussian(selection, math.sqrt(selection.l0_sensitivity), where)
    if not (p_one <= allowed * (1 + 1e-9) or nan_is_sound):
        raise UsageError(
            f"partition_selection.strategy: {selection.kind} at epsilon={selection.epsilon:g} "
            f"releases a partition of one privacy unit with probability {p_one:.3g} > delta "
            f"{selection.delta:g} (numerical limit of the PyDP strategy); lower epsilon or use "
            "truncated_geometric"
        )
    try:
        privacy_units_needed(plan, 0.95)
    except ValueError:
        raise SpecError(
            "budget.epsilon",
            f"gives the partition selection{where.owner()} an epsilon of "
            f"{selection.epsilon:.3g}: a partition would need more than 2^40 privacy units to "
            "be released with probability 95%, so none would be; raise budget.epsilon or "
            "give public partitions",
        ) from None
