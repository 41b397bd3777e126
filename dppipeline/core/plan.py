"""The plan's values: which mechanisms a release uses, the (epsilon, delta) each gets, its noise.

Made once, before any data is read, by the planner (`core.planner`). A plan (`BudgetPlan`,
`JobPlan`) is a plain picklable value: engines ship it to their workers, which rebuild the
secure PyDP mechanisms from it (`core.mechanisms`).

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
  at most Linf kept rows in a partition add at most Linf new values:
  docs/explanation/count_distinct.md).
  With `count_noise: discrete` (the spec's default) the counts (`count`, `privacy_id_count`,
  `count_distinct_COLUMN`) draw
  integer noise from OpenDP's discrete Laplace or Gaussian (`core.discrete`), mean's
  denominator included: the same mechanism, the same budget.
- `partition_selection`: private selection only (public partitions spend nothing on it).

A job of several queries (`JobPlan`) splits its one budget across every query's mechanisms
and one selection per group of queries that share partition keys and selection settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dppipeline.core.columns import DISTINCT_PREFIX
from dppipeline.core.extremes import EXTREME_METRICS
from dppipeline.spec.metrics import VARIANCE_METRICS, distinct_columns, metric_column, percentile_of
from dppipeline.spec.model import QuerySpec

if TYPE_CHECKING:  # pipeline-dp is imported where a mechanism needs it (1.3 s of start-up)
    from pipeline_dp import budget_accounting, dp_computations
    from pydp.algorithms.numerical_mechanisms import LaplaceMechanism as PyDPLaplace
    from pydp.algorithms.partition_selection import PartitionSelectionStrategy


# PyDP's QuantileTree, with pipeline-dp's shape: 16^4 = 65,536 leaves over [min, max].
TREE_HEIGHT, BRANCHING_FACTOR = 4, 16


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
        rows would (docs/explanation/max_contributions.md)."""
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
        from pipeline_dp import budget_accounting  # noqa: PLC0415 (see the imports above)
        from pipeline_dp.aggregate_params import MechanismType  # noqa: PLC0415

        kind = {"laplace": MechanismType.LAPLACE, "gaussian": MechanismType.GAUSSIAN}[self.kind]
        spec = budget_accounting.MechanismSpec(kind, name=self.name)
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

    def build_additive(self) -> dp_computations.AdditiveMechanism | LaplaceNoise:
        """The secure PyDP mechanism (Laplace or Gaussian) this budget describes. Laplace:
        PyDP's mechanism built with pipeline-dp's arithmetic (`LaplaceNoise`), so that a
        Laplace release does not import pipeline-dp; Gaussian: pipeline-dp's calibration."""
        if self.kind == "laplace":
            return LaplaceNoise.of(self)
        from pipeline_dp import dp_computations  # noqa: PLC0415 (see the imports above)

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
        import pipeline_dp  # noqa: PLC0415 (see the imports above)
        from pipeline_dp import partition_selection  # noqa: PLC0415

        epsilon, delta = self.calibration()
        strategy = pipeline_dp.PartitionSelectionStrategy[self.kind.upper()]
        return partition_selection.create_partition_selection_strategy(
            strategy, epsilon, delta, self.l0_sensitivity, pre_threshold
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


class LaplaceNoise:
    """PyDP's Laplace mechanism exactly as pipeline-dp 0.3.1 builds and calls it
    (`dp_computations.create_additive_mechanism`, `LaplaceMechanism`, `add_noise`): the same
    PyDP object from the same (epsilon, L1), so the same noise and std, without importing
    pipeline-dp (apache_beam and scipy with it). tests/dp/exact/test_pipeline_dp_arithmetic.py holds
    the two equal."""

    def __init__(self, mechanism: PyDPLaplace) -> None:
        self._mechanism = mechanism

    @classmethod
    def of(cls, budget: MechanismBudget) -> LaplaceNoise:
        """pipeline-dp's arithmetic: basic shares from (epsilon, L1), with its check that L0
        and Linf (or L1 and L2) are positive; pooled ones from the std sqrt(2) m L1 (scale
        b = std / sqrt(2), epsilon 1 / b)."""
        from pydp.algorithms.numerical_mechanisms import LaplaceMechanism  # noqa: PLC0415

        l1 = budget.l1_sensitivity
        if budget.noise_multiplier is not None:
            b = math.sqrt(2) * budget.noise_multiplier / math.sqrt(2)
            return cls(LaplaceMechanism(epsilon=1 / b, sensitivity=l1))
        given = (
            (budget.l0_sensitivity, budget.linf_sensitivity)
            if budget.l1 is None and budget.l2 is None
            else (budget.l1_sensitivity, budget.l2_sensitivity)
        )
        if any(value <= 0 for value in given):
            raise ValueError(f"sensitivities must be positive, got {given}")
        return cls(LaplaceMechanism(epsilon=budget.calibration()[0], sensitivity=l1))

    @property
    def std(self) -> float:
        return float(self._mechanism.diversity * math.sqrt(2))

    def add_noise(self, value: float) -> float:
        return float(self._mechanism.add_noise(1.0 * value))

    def add_noise_all(self, values: np.ndarray) -> np.ndarray:
        """`add_noise` on each value in order (the same draws), PyDP called without a Python
        wrapper per value (a bank job noises 200,000 values at 20M rows)."""
        floats = np.asarray(values, dtype=np.float64).tolist()
        return np.fromiter(map(self._mechanism.add_noise, floats), np.float64, len(floats))


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
