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
- `privacy_id_count`: noisy number of distinct privacy units.
- `partition_selection`: private selection only (public partitions spend nothing on it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pipeline_dp
from pipeline_dp import budget_accounting, dp_computations
from pipeline_dp import partition_selection as pdp_partition_selection
from pipeline_dp.aggregate_params import MechanismType

from dppipeline.errors import UsageError
from dppipeline.spec import JobSpec

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
# z such that P(|N(0,1)| <= z) = 0.95; Laplace intervals use the exact quantile instead.
_Z95 = 1.959963984540054


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

    @classmethod
    def from_spec(cls, spec: JobSpec) -> AggregationParams:
        return cls(
            metrics=spec.metrics,
            noise=spec.noise,
            max_partitions_contributed=spec.bounds.max_partitions_contributed,
            max_contributions_per_partition=spec.bounds.max_contributions_per_partition,
            min_value=spec.bounds.min_value,
            max_value=spec.bounds.max_value,
            public_partitions=spec.partition_selection.is_public,
            selection_strategy=spec.partition_selection.strategy,
            pre_threshold=spec.partition_selection.pre_threshold,
        )

    @property
    def midpoint(self) -> float:
        assert self.min_value is not None and self.max_value is not None
        return (self.min_value + self.max_value) / 2

    def clip(self, value: float) -> float:
        assert self.min_value is not None and self.max_value is not None
        return min(max(value, self.min_value), self.max_value)


@dataclass(frozen=True)
class MechanismBudget:
    """One mechanism's share of the budget and the noise it adds."""

    name: str
    kind: str  # laplace | gaussian | truncated_geometric | laplace_thresholding | ...
    epsilon: float
    delta: float
    l0_sensitivity: int
    linf_sensitivity: float
    noise_stddev: float | None  # None for partition selection

    def build_additive(self) -> dp_computations.AdditiveMechanism:
        """The secure PyDP mechanism (Laplace or Gaussian) this budget describes."""
        spec = budget_accounting.MechanismSpec(_NOISE_TYPES[self.kind], name=self.name)
        spec.set_eps_delta(self.epsilon, self.delta)
        sensitivities = dp_computations.Sensitivities(
            l0=self.l0_sensitivity, linf=self.linf_sensitivity
        )
        return dp_computations.create_additive_mechanism(spec, sensitivities)

    def build_selection(self, pre_threshold: int | None):
        """The PyDP partition selection strategy this budget describes."""
        return pdp_partition_selection.create_partition_selection_strategy(
            _SELECTION_STRATEGIES[self.kind],
            self.epsilon,
            self.delta,
            self.l0_sensitivity,
            pre_threshold,
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "mechanism": self.kind,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "l0_sensitivity": self.l0_sensitivity,
            "linf_sensitivity": self.linf_sensitivity,
            "noise_stddev": self.noise_stddev,
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
        """Standard deviation of (released - exact bounded value); None for mean (a ratio)."""
        if metric == "mean":
            return None
        if metric == "sum" and self.has("centred_sum"):
            count_std = self.mechanism("count").noise_stddev or 0.0
            centred_std = self.mechanism("centred_sum").noise_stddev or 0.0
            return math.hypot(centred_std, self.params.midpoint * count_std)
        return self.mechanism(metric).noise_stddev

    def metric_ci95_half_width(self, metric: str) -> float | None:
        """Half-width of the 95% interval of the noise on one released value (exact)."""
        if metric == "mean":
            return None
        if metric == "sum" and self.has("centred_sum"):
            # A sum of two independent noises: the normal approximation is documented as such.
            std = self.metric_noise_stddev("sum")
            return None if std is None else _Z95 * std
        m = self.mechanism(metric)
        assert m.noise_stddev is not None
        if m.kind == "laplace":
            b = m.noise_stddev / math.sqrt(2)
            return -b * math.log(0.05)  # P(|Lap(b)| > w) = exp(-w/b)
        return _Z95 * m.noise_stddev

    def total_spent(self) -> tuple[float, float]:
        return (
            math.fsum(m.epsilon for m in self.mechanisms),
            math.fsum(m.delta for m in self.mechanisms),
        )


def _metric_mechanisms(params: AggregationParams) -> list[tuple[str, float]]:
    """(mechanism name, Linf sensitivity) for each noise mechanism the metrics need."""
    linf = params.max_contributions_per_partition
    wanted: list[tuple[str, float]] = []
    if "count" in params.metrics or "mean" in params.metrics:
        wanted.append(("count", float(linf)))
    if "mean" in params.metrics:
        assert params.min_value is not None and params.max_value is not None
        wanted.append(("centred_sum", (params.max_value - params.min_value) / 2 * linf))
    elif "sum" in params.metrics:
        assert params.min_value is not None and params.max_value is not None
        wanted.append(("sum", max(abs(params.min_value), abs(params.max_value)) * linf))
    if "privacy_id_count" in params.metrics:
        wanted.append(("privacy_id_count", 1.0))
    return wanted


def plan_budget(params: AggregationParams, epsilon: float, delta: float) -> BudgetPlan:
    """Splits (epsilon, delta) across the mechanisms with pipeline-dp's accountant."""
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=delta)
    requested: list[tuple[str, str, float, budget_accounting.MechanismSpec]] = []
    for name, linf in _metric_mechanisms(params):
        spec = accountant.request_budget(_NOISE_TYPES[params.noise], name=name)
        requested.append((name, params.noise, linf, spec))
    if not params.public_partitions:
        kind = params.selection_strategy
        spec = accountant.request_budget(_SELECTION_TYPES[kind], name="partition_selection")
        requested.append(("partition_selection", kind, 1.0, spec))
    accountant.compute_budgets()

    l0 = params.max_partitions_contributed
    mechanisms = []
    for name, kind, linf, spec in requested:
        budget = MechanismBudget(
            name=name,
            kind=kind,
            epsilon=spec.eps,
            delta=spec.delta or 0.0,
            l0_sensitivity=l0,
            linf_sensitivity=linf,
            noise_stddev=None,
        )
        if name != "partition_selection":
            std = budget.build_additive().std
            budget = MechanismBudget(**{**budget.__dict__, "noise_stddev": float(std)})
        mechanisms.append(budget)
    plan = BudgetPlan(epsilon=epsilon, delta=delta, params=params, mechanisms=tuple(mechanisms))
    _check_selection_is_sound(plan)
    return plan


def _check_selection_is_sound(plan: BudgetPlan) -> None:
    """Refuses a selection whose PyDP strategy would release a one-unit partition with
    probability above its delta: PyDP's Gaussian thresholding does so at large epsilon (seen
    with epsilon >= 1000, delta 1e-6: probability 0.5), which would void the guarantee."""
    selection = plan.selection
    if selection is None:
        return
    p_one = selection.build_selection(plan.params.pre_threshold).probability_of_keep(1)
    if p_one > selection.delta * (1 + 1e-9):
        raise UsageError(
            f"partition_selection.strategy: {selection.kind} at epsilon={selection.epsilon:g} "
            f"releases a partition of one privacy unit with probability {p_one:.3g} > delta "
            f"{selection.delta:g} (numerical limit of the PyDP strategy); lower epsilon or use "
            "truncated_geometric"
        )


def privacy_units_needed(plan: BudgetPlan, probability: float) -> int | None:
    """Fewest privacy units a partition needs to be released with at least `probability`.

    None under public partitions (every listed key is released whatever its size).
    """
    selection = plan.selection
    if selection is None:
        return None
    strategy = selection.build_selection(plan.params.pre_threshold)
    low, high = 1, 1
    while strategy.probability_of_keep(high) < probability:
        low, high = high, high * 2
        if high > 1 << 40:
            raise ValueError("no partition size reaches that release probability")
    while low < high:
        mid = (low + high) // 2
        if strategy.probability_of_keep(mid) >= probability:
            high = mid
        else:
            low = mid + 1
    return high
