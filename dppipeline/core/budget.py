"""The budget split: which mechanisms a release uses, the (epsilon, delta) each gets, its noise.

Computed once, before any data is read, by pipeline-dp's NaiveBudgetAccountant (basic
composition). The result, a `BudgetPlan`, is a plain picklable value: engines ship it to their
workers, which rebuild the secure PyDP mechanisms from it (`release.py`).

Mechanisms, following pipeline-dp's own layout so that its DPEngine is a faithful oracle:

- `count`: the noisy row count; also the denominator of mean when mean is asked for.
- `centred_sum`: sum of (value - midpoint) when mean is asked for; sum is then derived as
  centred_sum + midpoint * count (post-processing: no extra budget, and lower noise than a
  third mechanism).
- `sum`: the noisy sum when sum is asked for without mean.
- `centred_sum_of_squares`: sum of ((value - midpoint)^2 - r^2/2), r = (max - min)/2, when
  variance is asked for. Our own calibration: one row moves it by at most r^2/2. (pipeline-dp
  0.3.1's VARIANCE noises the un-centred sum of (value - midpoint)^2 as if it were centred on
  the middle of [min^2, max^2]: for [-10, 10] it uses sensitivity 50 where one row moves it
  by 100, half the noise needed; for ranges away from zero it over-calibrates instead.)
- `percentile`: one PyDP QuantileTree per partition answers all of a query's percentiles.
- `max`, `min`: an exponential mechanism per partition over a public grid (`core.extremes`),
  pure epsilon-DP: requested as Laplace so that no delta is spent on it.
- `privacy_id_count`: noisy number of distinct privacy units.
- `count_distinct_COLUMN`: noisy number of distinct non-null COLUMN values among the kept rows,
  one mechanism per `count_distinct(COLUMN)` metric, with the sensitivities of `count` (a unit's
  at most Linf kept rows in a partition add at most Linf new values: docs/count_distinct.md).
  With `count_noise: discrete` (the spec's default) the counts (`count`, `privacy_id_count`,
  `count_distinct_COLUMN`) draw
  integer noise from OpenDP's discrete Laplace or Gaussian (`core.discrete`), mean's
  denominator included: the same mechanism, the same budget.
- `partition_selection`: private selection only (public partitions spend nothing on it).

A job of several queries (`plan_job`) splits its one budget across every query's mechanisms
and one selection per group of queries that share partition keys and selection settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pipeline_dp
from pipeline_dp import budget_accounting, dp_computations
from pipeline_dp import partition_selection as pdp_partition_selection
from pipeline_dp.aggregate_params import MechanismType
from pydp.algorithms.partition_selection import PartitionSelectionStrategy
from pydp.algorithms.quantile_tree import QuantileTree

from dppipeline.core import discrete
from dppipeline.core.accounting import Member, certified_multiplier, discrete_pool_fits
from dppipeline.core.columns import DISTINCT_PREFIX
from dppipeline.core.extremes import EXPONENTIAL, EXTREME_METRICS, gumbel_scale, margin
from dppipeline.errors import SpecError, UsageError
from dppipeline.spec.limits import MIN_EPSILON
from dppipeline.spec.metrics import VARIANCE_METRICS, distinct_columns, metric_column, percentile_of
from dppipeline.spec.model import QuerySpec

_NOISE_TYPES = {
    "laplace": MechanismType.LAPLACE,
    "gaussian": MechanismType.GAUSSIAN,
}
_SELECTION_TYPES = {
    "truncated_geometric": MechanismType.TRUNCATED_GEOMETRIC,
    "laplace_thresholding": MechanismType.LAPLACE_THRESHOLDING,
    "gaussian_thresholding": MechanismType.GAUSSIAN_THRESHOLDING,
}
_SELECTION_STRATEGIES = {
    "truncated_geometric": pipeline_dp.PartitionSelectionStrategy.TRUNCATED_GEOMETRIC,
    "laplace_thresholding": pipeline_dp.PartitionSelectionStrategy.LAPLACE_THRESHOLDING,
    "gaussian_thresholding": pipeline_dp.PartitionSelectionStrategy.GAUSSIAN_THRESHOLDING,
}


@dataclass(frozen=True)
class AggregationParams:
    """The engine-neutral description of what is released and how it is bounded."""

    metrics: tuple[str, ...]
    noise: str
    max_partitions_contributed: int
    max_contributions_per_partition: int
    min_value: float | None
    max_value: float | None
    public_partitions: bool
    selection_strategy: str = "truncated_geometric"
    pre_threshold: int | None = None
    key_columns: tuple[str, ...] = ()
    confidence_intervals: bool = False
    # K: rows per unit across all partitions (`bounds.max_contributions`). Then L0 holds the
    # partitions a unit can reach (K; 1 for a global total) and Linf holds K, so code that
    # reads only L0 x Linf stays sound; the noise uses `contribution_sensitivities`.
    max_contributions: int | None = None
    count_noise: str = "continuous"  # discrete: integer noise on counts (`core.discrete`)

    @classmethod
    def from_query(
        cls,
        query: QuerySpec,
        noise: str,
        confidence_intervals: bool = False,
        count_noise: str = "continuous",
    ) -> AggregationParams:
        """A global total (no key) has one partition: each unit contributes to it alone."""
        total = query.bounds.max_contributions
        l0, linf = query.pair_bounds if total is None else (total, total)
        return cls(
            metrics=query.metrics,
            noise=noise,
            max_partitions_contributed=l0 if query.partition_by else 1,
            max_contributions_per_partition=linf,
            max_contributions=total,
            min_value=query.bounds.min_value,
            max_value=query.bounds.max_value,
            public_partitions=query.is_public,
            selection_strategy=query.partition_selection.strategy,
            pre_threshold=query.partition_selection.pre_threshold,
            key_columns=tuple(query.key_names),
            confidence_intervals=confidence_intervals,
            count_noise=count_noise,
        )

    @property
    def quantile_tree_bounds(self) -> tuple[int, int]:
        """(L0, Linf) PyDP's per-partition quantile trees are calibrated for. Under
        max_contributions K: (1, K), sound because every tree's nodes get noise of the same
        scale and a unit's rows change all trees together by at most what one partition of K
        rows would (docs/max_contributions.md)."""
        if self.max_contributions is not None:
            return 1, self.max_contributions
        return self.max_partitions_contributed, self.max_contributions_per_partition

    @property
    def midpoint(self) -> float:
        assert self.min_value is not None and self.max_value is not None
        return (self.min_value + self.max_value) / 2

    @property
    def half_range(self) -> float:
        """r = (max - min) / 2: the largest |value - midpoint| after clipping."""
        assert self.min_value is not None and self.max_value is not None
        return (self.max_value - self.min_value) / 2

    @property
    def percentiles(self) -> tuple[float, ...]:
        return tuple(p for m in self.metrics if (p := percentile_of(m)) is not None)

    @property
    def distinct_columns(self) -> tuple[str, ...]:
        """The input columns of the count_distinct metrics, in the spec's order."""
        return distinct_columns(self.metrics)

    @property
    def extremes(self) -> tuple[str, ...]:
        """The query's `max` / `min` metrics."""
        return tuple(m for m in self.metrics if m in EXTREME_METRICS)

    @property
    def keeps_values(self) -> bool:
        """Whether the release reads each partition's kept values (percentiles, max, min)."""
        return bool(self.percentiles or self.extremes)

    def clip(self, value: float) -> float:
        assert self.min_value is not None and self.max_value is not None
        return min(max(value, self.min_value), self.max_value)


@dataclass(frozen=True)
class MechanismBudget:
    """One mechanism's share of the budget and the noise it adds."""

    name: str
    kind: str  # laplace | gaussian | exponential | truncated_geometric | ...
    epsilon: float
    delta: float
    l0_sensitivity: int
    linf_sensitivity: float
    noise_stddev: float | None  # None for partition selection
    # Tight accounting (`core.accounting`): the noise multiplier the composition chose, std / L2
    # for Gaussian, scale b / L1 (= std / (sqrt(2) L1)) for Laplace, as dp_accounting's events
    # define it; epsilon and delta are then the mechanism's attributed share of the pool, not
    # its own guarantee. None under basic composition.
    noise_multiplier: float | None = None
    # Explicit L1 / L2 sensitivities where L0 x Linf does not describe the bound (under
    # `max_contributions`); None: derived from L0 and Linf.
    l1: float | None = None
    l2: float | None = None
    # Discrete noise (`core.discrete`): `kind` stays the family (laplace | gaussian) and
    # noise_scale is the discrete Laplace's scale t or the discrete Gaussian's sigma. For
    # `exponential` (max, min), the Gumbel scale in rows (`core.extremes`).
    discrete: bool = False
    noise_scale: float | None = None
    # Tight accounting, a private selection in the pool: the delta its threshold spends (a
    # one-unit partition released), outside its noise; None otherwise.
    threshold_delta: float | None = None

    @property
    def pooled(self) -> bool:
        """Whether the mechanism is in the tight pool (else: its basic (epsilon, delta))."""
        return self.noise_multiplier is not None

    @property
    def mechanism(self) -> str:
        """The mechanism's name in plans and manifests: kind, or discrete_<kind>."""
        return f"discrete_{self.kind}" if self.discrete else self.kind

    @property
    def l1_sensitivity(self) -> float:
        if self.l1 is not None:
            return self.l1
        return self.l0_sensitivity * self.linf_sensitivity

    @property
    def l2_sensitivity(self) -> float:
        if self.l2 is not None:
            return self.l2
        return math.sqrt(self.l0_sensitivity) * self.linf_sensitivity

    def build_spec(self) -> budget_accounting.MechanismSpec:
        """pipeline-dp's description of this noise mechanism, its budget set: for a pooled
        percentile the (epsilon, delta) PyDP's quantile tree turns into its multiplier."""
        spec = budget_accounting.MechanismSpec(_NOISE_TYPES[self.kind], name=self.name)
        spec.set_eps_delta(*self.calibration())
        return spec

    def calibration(self) -> tuple[float, float]:
        """The (epsilon, delta) PyDP is asked for. Under basic composition the share itself.
        In the pool, PyDP calibrates from (epsilon, delta) only, so: Laplace (the tree, the
        thresholding's noise) b = L1 / epsilon exactly at epsilon = 1 / multiplier; truncated
        geometric epsilon = 1 / multiplier, its delta the threshold's; Gaussian, the epsilon
        at which a Gaussian of this multiplier just misses the delta asked for, so the sigma
        PyDP finds for it is above the planned one (checked by `pyd_gaussian_std`)."""
        mu = self.noise_multiplier
        if mu is None:
            return self.epsilon, self.delta
        if self.name == "partition_selection":
            assert self.threshold_delta is not None
            if self.kind == "gaussian_thresholding":  # PyDP: half the delta to the noise
                return gaussian_epsilon_below(mu, self.threshold_delta), 2 * self.threshold_delta
            return 1 / mu, self.threshold_delta
        if self.kind == "gaussian":
            return gaussian_epsilon_below(mu, self.delta), self.delta
        return 1 / mu, 0.0

    def build_additive(self) -> dp_computations.AdditiveMechanism:
        """The secure PyDP mechanism (Laplace or Gaussian) this budget describes."""
        if self.noise_multiplier is not None:
            if self.kind == "gaussian":
                return dp_computations.GaussianMechanism.create_from_std_deviation(
                    self.noise_multiplier, self.l2_sensitivity
                )
            return dp_computations.LaplaceMechanism.create_from_std_deviation(
                math.sqrt(2) * self.noise_multiplier, self.l1_sensitivity
            )
        spec = self.build_spec()
        sensitivities = (
            dp_computations.Sensitivities(l0=self.l0_sensitivity, linf=self.linf_sensitivity)
            if self.l1 is None and self.l2 is None
            else dp_computations.Sensitivities(l1=self.l1_sensitivity, l2=self.l2_sensitivity)
        )
        return dp_computations.create_additive_mechanism(spec, sensitivities)

    def build_selection(self, pre_threshold: int | None) -> PartitionSelectionStrategy:
        """The PyDP partition selection strategy this budget describes."""
        epsilon, delta = self.calibration()
        return pdp_partition_selection.create_partition_selection_strategy(
            _SELECTION_STRATEGIES[self.kind], epsilon, delta, self.l0_sensitivity, pre_threshold
        )

    def to_dict(self) -> dict[str, object]:
        tight = {} if self.noise_multiplier is None else {"noise_multiplier": self.noise_multiplier}
        if self.l1 is not None or self.l2 is not None:
            tight |= {"l1_sensitivity": self.l1_sensitivity, "l2_sensitivity": self.l2_sensitivity}
        scale = {} if self.noise_scale is None else {"noise_scale": self.noise_scale}
        if self.threshold_delta is not None:
            scale["threshold_delta"] = self.threshold_delta
        return {
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "l0_sensitivity": self.l0_sensitivity,
            "linf_sensitivity": self.linf_sensitivity,
            "noise_stddev": self.noise_stddev,
            **tight,
            **scale,
        }


@dataclass(frozen=True)
class BudgetPlan:
    """The whole split: every mechanism, and each released metric's noise."""

    epsilon: float
    delta: float
    params: AggregationParams
    mechanisms: tuple[MechanismBudget, ...]

    def mechanism(self, name: str) -> MechanismBudget:
        for m in self.mechanisms:
            if m.name == name:
                return m
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return any(m.name == name for m in self.mechanisms)

    @property
    def selection(self) -> MechanismBudget | None:
        return self.mechanism("partition_selection") if self.has("partition_selection") else None

    def metric_noise_stddev(self, metric: str) -> float | None:
        """Standard deviation of (released - exact bounded value); None for mean and variance
        (ratios), percentiles, max and min (not additive noise)."""
        if (
            metric in ("mean", *VARIANCE_METRICS, *EXTREME_METRICS)
            or percentile_of(metric) is not None
        ):
            return None
        if metric == "sum" and self.has("centred_sum"):
            count_std = self.mechanism("count").noise_stddev or 0.0
            centred_std = self.mechanism("centred_sum").noise_stddev or 0.0
            return math.hypot(centred_std, self.params.midpoint * count_std)
        return self.mechanism(metric_column(metric)).noise_stddev

    def total_spent(self) -> tuple[float, float]:
        return (
            math.fsum(m.epsilon for m in self.mechanisms),
            math.fsum(m.delta for m in self.mechanisms),
        )


# Mechanisms whose output is not value + additive noise (no noise_stddev).
NOT_ADDITIVE = ("partition_selection", "percentile", *EXTREME_METRICS)
# Integer-valued mechanisms that `count_noise: discrete` noises with integers (and each
# `count_distinct_COLUMN`: see `is_integer_mechanism`).
DISCRETE_METRICS = ("count", "privacy_id_count")


def is_integer_mechanism(name: str) -> bool:
    """A count whose exact value is an integer: discrete noise keeps it one."""
    return name in DISCRETE_METRICS or name.startswith(DISTINCT_PREFIX)


def contribution_sensitivities(
    params: AggregationParams, mechanism: str, linf: float
) -> tuple[float | None, float | None]:
    """(L1, L2) of a noise mechanism under max_contributions K (else None, None: L0 and Linf).

    `linf` is the mechanism's sensitivity at Linf = K, i.e. K x its per-row sensitivity c.
    A unit's K rows may all land in one partition, so for count, count_distinct (each kept
    row adds at most one distinct value) and the sums L1 = L2 = K c
    (sqrt(L0) x Linf would overstate L2 K^1.5 c). privacy_id_count: a unit adds 1 to each of
    at most L0 partitions (K, or 1 for a global total): L1 = L0, L2 = sqrt(L0)."""
    if params.max_contributions is None or mechanism in NOT_ADDITIVE:
        return None, None
    if mechanism == "privacy_id_count":
        l0 = params.max_partitions_contributed
        return float(l0), math.sqrt(l0)
    return linf, linf


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
    # removing them removes at most those: |change| <= Linf, as count (docs/count_distinct.md).
    wanted += [(f"{DISTINCT_PREFIX}{column}", float(linf)) for column in params.distinct_columns]
    return wanted


@dataclass(frozen=True)
class QueryPlan:
    """One query's share: its metric mechanisms (and its group's selection, if private)."""

    name: str
    weight: float
    plan: BudgetPlan
    selection_group: str | None  # None: public partitions (or a global total)

    def own_mechanisms(self) -> tuple[MechanismBudget, ...]:
        return tuple(m for m in self.plan.mechanisms if m.name != "partition_selection")

    def spent(self) -> tuple[float, float]:
        """The query's own spend, without the (possibly shared) selection."""
        own = self.own_mechanisms()
        return math.fsum(m.epsilon for m in own), math.fsum(m.delta for m in own)


@dataclass(frozen=True)
class SelectionGroup:
    """Private queries with the same keys and selection settings: one partition selection,
    its released keys used by every member (post-processing, no extra budget)."""

    name: str
    key_columns: tuple[str, ...]
    queries: tuple[str, ...]
    mechanism: MechanismBudget
    pre_threshold: int | None


@dataclass(frozen=True)
class JobPlan:
    """A whole job's split: every query's mechanisms and every selection, one accountant."""

    epsilon: float
    delta: float
    queries: tuple[QueryPlan, ...]
    selections: tuple[SelectionGroup, ...]
    accounting: str = "basic"  # basic | pld | zcdp (`core.accounting`)
    noise_multiplier: float | None = None  # tight accounting: the pool's base multiplier m
    certified_by: str | None = None  # the accountant that proved m (zcdp where PLD cannot)

    def additive_mechanisms(self) -> list[MechanismBudget]:
        """Every noise mechanism of every query (the pool tight accounting composes)."""
        return [m for q in self.queries for m in q.own_mechanisms() if m.name not in NOT_ADDITIVE]

    def query(self, name: str) -> QueryPlan:
        for q in self.queries:
            if q.name == name:
                return q
        raise KeyError(name)

    def selection_group(self, name: str) -> SelectionGroup:
        for g in self.selections:
            if g.name == name:
                return g
        raise KeyError(name)

    def total_spent(self) -> tuple[float, float]:
        """Every mechanism counted once (a shared selection too), by basic composition."""
        parts = [q.spent() for q in self.queries]
        parts += [(g.mechanism.epsilon, g.mechanism.delta) for g in self.selections]
        return math.fsum(e for e, _ in parts), math.fsum(d for _, d in parts)


_GroupKey = tuple[tuple[str, ...], str, int | None]  # key columns, strategy, pre_threshold


def _selection_groups(
    queries: Sequence[tuple[str, AggregationParams, float]],
) -> dict[_GroupKey, list[str]]:
    """Private queries by (key columns, strategy, pre_threshold), in spec order."""
    groups: dict[_GroupKey, list[str]] = {}
    for name, params, _ in queries:
        if not params.public_partitions:
            group = (params.key_columns, params.selection_strategy, params.pre_threshold)
            groups.setdefault(group, []).append(name)
    return groups


def plan_job(
    queries: Sequence[tuple[str, AggregationParams, float]],
    epsilon: float,
    delta: float,
    *,
    prefix_names: bool = True,
    accounting: str = "basic",
) -> JobPlan:
    """Splits (epsilon, delta) across all queries' mechanisms and selections with one
    pipeline-dp NaiveBudgetAccountant. A query's metric mechanisms share its `budget_weight`
    equally, so queries get budget in proportion to their weights; a selection weighs as
    much as one mechanism of the heaviest query using it (for one query: all mechanisms and
    its selection get equal shares, as pipeline-dp's own DPEngine splits).

    `queries`: (name, params, weight). With `prefix_names`, mechanisms are named
    `<query>.<mechanism>` for the accountant (a single-query job keeps the plain names).

    Under `pld` or `zcdp` accounting every mechanism's share (each metric mechanism
    requested as a Gaussian, so that the pool gets its share of delta whatever the noise)
    goes into one pool composed tightly (`core.accounting`): the noise mechanisms, the
    quantile trees, max and min, and the selections (`_pool_member`).
    """
    tight = accounting != "basic"
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=delta)
    by_name = {name: (params, weight) for name, params, weight in queries}

    def label(owner: str, mechanism: str) -> str:
        return f"{owner}.{mechanism}" if prefix_names else mechanism

    requested: dict[str, list[tuple[str, str, float, budget_accounting.MechanismSpec]]] = {}
    unit_weight: dict[str, float] = {}  # the weight of each of a query's mechanisms
    for name, params, weight in queries:
        mechanisms = _metric_mechanisms(params)
        unit_weight[name] = weight / len(mechanisms)
        requested[name] = [
            (
                mechanism,
                _kind(params, mechanism),
                linf,
                accountant.request_budget(
                    _NOISE_TYPES[_requested_type(params, mechanism, tight)],
                    weight=unit_weight[name],
                    name=label(name, mechanism),
                ),
            )
            for mechanism, linf in mechanisms
        ]
    group_specs: dict[
        str, tuple[tuple[str, ...], str, int | None, list[str], budget_accounting.MechanismSpec]
    ] = {}
    for (keys, strategy, pre_threshold), members in _selection_groups(queries).items():
        group_name = ",".join(keys) if prefix_names else "partition_selection"
        if group_name in group_specs:  # same keys, other settings: keep names unique
            group_name = f"{group_name}#{len(group_specs) + 1}"
        weight = max(unit_weight[m] for m in members)
        spec = accountant.request_budget(
            _SELECTION_TYPES[strategy],
            weight=weight,
            name=label("partition_selection", group_name) if prefix_names else group_name,
        )
        group_specs[group_name] = (keys, strategy, pre_threshold, members, spec)
    accountant.compute_budgets()
    group_weight = {g: max(unit_weight[m] for m in spec[3]) for g, spec in group_specs.items()}

    def selection_budgets(m: float | None) -> dict[str, MechanismBudget]:
        budgets = {}
        for group_name, (_, strategy, _, members, spec) in group_specs.items():
            share = spec.delta or 0.0
            budgets[group_name] = MechanismBudget(
                name="partition_selection",
                kind=strategy,
                epsilon=spec.eps,
                delta=share,
                l0_sensitivity=max(by_name[m][0].max_partitions_contributed for m in members),
                linf_sensitivity=1.0,
                noise_stddev=None,
                noise_multiplier=None if m is None else m / group_weight[group_name],
                threshold_delta=None if m is None else _threshold_delta(strategy, share),
            )
        return budgets

    pool = [
        _pool_member(mechanism, kind, unit_weight[name], by_name[name][0])
        for name, mechanisms in requested.items()
        for mechanism, kind, _, _ in mechanisms
    ]
    pool += [
        _pool_member("partition_selection", b.kind, group_weight[g], None, b)
        for g, b in selection_budgets(None).items()
    ]
    shares = [spec for mechanisms in requested.values() for *_, spec in mechanisms]
    shares += [spec for *_, spec in group_specs.values()]
    multiplier, certified_by = _pool_multiplier(accounting, pool, shares) if tight else (None, None)

    def metric_budgets(m: float | None) -> dict[str, list[MechanismBudget]]:
        return {
            name: [
                _metric_budget(
                    params, mechanism, kind, linf, spec,
                    where=_Where(name if prefix_names else None),
                    multiplier=None if m is None else m / unit_weight[name],
                )
                for mechanism, kind, linf, spec in requested[name]
            ]
            for name, params, _ in queries
        }  # fmt: skip

    budgets_of = metric_budgets(multiplier)
    if multiplier is not None and any(b.discrete for bs in budgets_of.values() for b in bs):
        multiplier, budgets_of = _discrete_pool(
            accounting, multiplier, metric_budgets, selection_budgets
        )
    selections = []
    selection_of: dict[str, tuple[str, MechanismBudget]] = {}
    for group_name, mechanism in selection_budgets(multiplier).items():
        keys, _, pre_threshold, members, _ = group_specs[group_name]
        selections.append(
            SelectionGroup(group_name, keys, tuple(members), mechanism, pre_threshold)
        )
        for member in members:
            selection_of[member] = (group_name, mechanism)

    plans = []
    for name, params, weight in queries:
        where = _Where(name if prefix_names else None)
        budgets = budgets_of[name]
        group = selection_of.get(name)
        if group is not None:
            budgets.append(group[1])
        eps = math.fsum(m.epsilon for m in budgets)
        dlt = math.fsum(m.delta for m in budgets)
        plan = BudgetPlan(epsilon=eps, delta=dlt, params=params, mechanisms=tuple(budgets))
        _check_selection_is_sound(plan, where)
        plans.append(QueryPlan(name, weight, plan, None if group is None else group[0]))
    return JobPlan(
        epsilon, delta, tuple(plans), tuple(selections), accounting, multiplier, certified_by
    )


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
    accounting: str, pool: list[Member], shares: list[budget_accounting.MechanismSpec]
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
    spec: budget_accounting.MechanismSpec,
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


def gaussian_delta(sigma: float, epsilon: float, l2_sensitivity: float) -> float:
    """The exact delta of the Gaussian mechanism at (sigma, epsilon): Balle and Wang (2018),
    Theorem 8, in log space so that neither term overflows."""
    from scipy.special import log_ndtr  # noqa: PLC0415 (0.2 s of start-up: Gaussian only)

    a = l2_sensitivity / (2 * sigma)
    b = epsilon * sigma / l2_sensitivity
    first = float(log_ndtr(a - b))
    second = epsilon + float(log_ndtr(-a - b))
    return 0.0 if second >= first else math.exp(first) * -math.expm1(second - first)


def gaussian_epsilon_below(multiplier: float, delta: float) -> float:
    """An epsilon at which the Gaussian mechanism of `multiplier` (std / L2) is NOT
    (epsilon, delta)-DP, within 1e-9 of the smallest at which it is: every sigma that is
    (epsilon, delta)-DP there, PyDP's included, is above multiplier x L2."""
    if gaussian_delta(multiplier, 0.0, 1.0) <= delta:
        raise ValueError("a Gaussian of that multiplier meets delta at epsilon 0")
    low, high = 0.0, 1.0
    while gaussian_delta(multiplier, high, 1.0) > delta:
        low, high = high, high * 2
    while high - low > 1e-9 * high:
        mid = (low + high) / 2
        low, high = (low, mid) if gaussian_delta(multiplier, mid, 1.0) <= delta else (mid, high)
    return low


def _check_percentile(params: AggregationParams, budget: MechanismBudget, where: _Where) -> None:
    """PyDP's quantile tree takes L0 times its height as a C++ int; a dry run (no data, noise
    drawn and thrown away) shows it accepts the rest."""
    from dppipeline.core.release import BRANCHING_FACTOR, TREE_HEIGHT  # noqa: PLC0415 (cycle)

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


def privacy_units_needed(plan: BudgetPlan, probability: float) -> int | None:
    """Fewest privacy units a partition needs to be released with at least `probability`.

    None under public partitions (every listed key is released whatever its size).
    """
    selection = plan.selection
    if selection is None:
        return None
    strategy = selection.build_selection(plan.params.pre_threshold)

    def keep(units: int) -> float:
        p = strategy.probability_of_keep(units)
        return 0.0 if math.isnan(p) else p  # NaN: truncated geometric keeps none (see above)

    low, high = 1, 1
    while keep(high) < probability:
        low, high = high, high * 2
        if high > 1 << 40:
            raise ValueError("no partition size reaches that release probability")
    while low < high:
        mid = (low + high) // 2
        if keep(mid) >= probability:
            high = mid
        else:
            low = mid + 1
    return high
