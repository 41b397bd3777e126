"""Per-partition aggregates in, selected and noised rows out: the only place noise is drawn.

Every engine calls these functions on exact, already bounded aggregates, one row per partition
with the key columns and `AGGREGATE_COLUMNS` (plus `centred_squares` for variance, `values`, the
kept values, for percentiles, and `count_distinct_COLUMN`, the exact number of distinct non-null
COLUMN values among the kept rows, for each count_distinct(COLUMN)). Partitions are independent
of each other here, so any batching (Spark `mapInArrow`, a Beam DoFn, one local call) gives the
same distribution. Noise and
selection come from PyDP's secure mechanisms, rebuilt from the plan; integer noise on counts
(`count_noise: discrete`) from OpenDP's (`core.discrete`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from dppipeline.core.columns import (
    AGGREGATE_COLUMNS,
    AGGREGATE_DTYPES,
    CENTRED_SQUARES,
    DISTINCT_PREFIX,
    VALUES,
    value_arrays,
)
from dppipeline.core.discrete import add_discrete_noise
from dppipeline.core.extremes import release_extremes
from dppipeline.core.intervals import (
    has_interval,
    mean_interval,
    metric_half_width,
    variance_interval,
)
from dppipeline.core.plan import (
    BRANCHING_FACTOR,
    DISCRETE_METRICS,
    TREE_HEIGHT,
    AggregationParams,
    BudgetPlan,
    JobPlan,
    LaplaceNoise,
    MechanismBudget,
)
from dppipeline.spec.metrics import (
    VARIANCE_METRICS,
    distinct_column_of,
    metric_column,
    percentile_of,
)
from dppipeline.spec.schema import release_schema

# Release column order (also the order in schemas/terminal_stats.json); percentiles sit
# between variance and privacy_id_count (then max, min), count_distinct columns after
# privacy_id_count, each in the order the spec lists them.
METRIC_ORDER = (
    "count", "sum", "mean", "variance", "stddev", "percentile", "max", "min", "privacy_id_count",
    "count_distinct",
)  # fmt: skip


def ordered_metrics(metrics: Sequence[str]) -> list[str]:
    """The metrics in release column order."""
    rank = {name: i for i, name in enumerate(METRIC_ORDER)}

    def kind(metric: str) -> str:
        if percentile_of(metric) is not None:
            return "percentile"
        return "count_distinct" if distinct_column_of(metric) is not None else metric

    return sorted(metrics, key=lambda m: rank[kind(m)])


def distinct_aggregate(column: str) -> str:
    """The exact aggregate (and release column) of count_distinct(column)."""
    return f"{DISTINCT_PREFIX}{column}"


def required_columns(params: AggregationParams) -> tuple[str, ...]:
    """The exact aggregates a release of these metrics reads."""
    columns = list(AGGREGATE_COLUMNS)
    if any(m in VARIANCE_METRICS for m in params.metrics):
        columns.append(CENTRED_SQUARES)
    if params.keeps_values:
        columns.append(VALUES)
    columns += [distinct_aggregate(c) for c in params.distinct_columns]
    return tuple(columns)


def with_required_columns(aggregates: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Every required aggregate present and typed, zero (or no kept value) where missing: a
    partition without rows, or a task that matched none, releases noise on zeros like any
    other, never a crash, whatever the engine handed over."""
    out = aggregates.copy()
    for column in columns:
        if column == VALUES:
            out[VALUES] = value_arrays(out[VALUES]) if VALUES in out else [np.zeros(0)] * len(out)
        elif column in out:
            out[column] = out[column].fillna(0)
        else:
            out[column] = np.zeros(len(out))
    for column, dtype in AGGREGATE_DTYPES.items():
        out[column] = out[column].astype(dtype)
    for column in (c for c in columns if c.startswith(DISTINCT_PREFIX)):
        out[column] = out[column].astype("int64")
    if CENTRED_SQUARES in out:
        out[CENTRED_SQUARES] = out[CENTRED_SQUARES].astype("float64")
    return out


def add_empty_public_partitions(
    aggregates: pd.DataFrame,
    key_columns: Sequence[str],
    public_keys: pd.DataFrame | None,
    columns: Sequence[str] = AGGREGATE_COLUMNS,
) -> pd.DataFrame:
    """Aligns aggregates to a known key set (public keys, or keys a selection released):
    listed keys without rows get zeros in every required column, and keys not listed are
    dropped. With no key columns (a global total) the key set is the one empty key."""
    keys = list(key_columns)
    if not keys:
        # The one empty key; a zero-length key list (a Beam shard without it) has none.
        present = public_keys is None or len(public_keys) > 0
        merged = aggregates.head(1 if present else 0).reset_index(drop=True)
        if merged.empty and present:
            merged = pd.DataFrame(index=range(1))
    else:
        assert public_keys is not None
        merged = public_keys[keys].merge(aggregates, on=keys, how="left")
    return with_required_columns(merged, columns)


def select_with(
    privacy_id_count: np.ndarray, selection: MechanismBudget | None, pre_threshold: int | None
) -> np.ndarray:
    """Boolean mask of partitions kept by a private selection (all True without one)."""
    if selection is None:
        return np.ones(len(privacy_id_count), dtype=bool)
    strategy = selection.build_selection(pre_threshold)
    return np.fromiter(
        (strategy.should_keep(int(n)) for n in privacy_id_count),
        dtype=bool,
        count=len(privacy_id_count),
    )


def select_partitions(privacy_id_count: np.ndarray, plan: BudgetPlan) -> np.ndarray:
    """Boolean mask of partitions kept by the plan's own selection (all True if public)."""
    return select_with(privacy_id_count, plan.selection, plan.params.pre_threshold)


def _noised(plan: BudgetPlan, name: str, exact: np.ndarray) -> np.ndarray:
    """Adds the named mechanism's noise to each value: one call into PyDP's C++ per value,
    or, for discrete noise, one call into OpenDP for all (integers out)."""
    mechanism = plan.mechanism(name)
    if mechanism.discrete:
        assert mechanism.noise_scale is not None
        return add_discrete_noise(mechanism.mechanism, mechanism.noise_scale, exact)
    additive = mechanism.build_additive()
    if isinstance(additive, LaplaceNoise):
        return additive.add_noise_all(exact)
    add_noise = additive.add_noise
    return np.fromiter((add_noise(float(x)) for x in exact), dtype=np.float64, count=len(exact))


def _percentiles(plan: BudgetPlan, values: Sequence[np.ndarray]) -> np.ndarray:
    """One PyDP QuantileTree per partition answers all its percentiles at one cost.

    Returns an array (partitions x percentiles). PyDP clamps the rank to [0.005, 0.995], so
    percentile(100) is the 99.5th percentile (and, measured, lands near the upper bound on
    skewed data): `max` (`core.extremes`) is the DP maximum.
    """
    from pipeline_dp import dp_computations  # noqa: PLC0415 (percentiles only: 1.3 s of start-up)
    from pydp.algorithms.quantile_tree import QuantileTree  # noqa: PLC0415

    params = plan.params
    spec = plan.mechanism("percentile").build_spec()
    quantiles = [p / 100 for p in params.percentiles]
    out = np.empty((len(values), len(quantiles)))
    for row, kept in enumerate(values):
        tree = QuantileTree(params.min_value, params.max_value, TREE_HEIGHT, BRANCHING_FACTOR)
        for value in np.asarray(kept, dtype=np.float64).tolist():
            tree.add_entry(value)
        out[row] = dp_computations.compute_dp_quantiles(
            tree,
            spec,
            quantiles,
            *params.quantile_tree_bounds,
        )
    return out


def centred_squares_term(exact: pd.DataFrame, params: AggregationParams) -> np.ndarray:
    """Per partition, sum over kept rows of ((x - mid)^2 - r^2/2): what the
    `centred_sum_of_squares` mechanism noises. Each row adds a term in [-r^2/2, r^2/2], its
    sensitivity. The engines sum (x - mid)^2 themselves: computed here from sums of x and
    x^2, the difference of numbers near mid^2 x count left rounding errors beyond r^2/2 once
    the bounds lay far from zero for their width (docs/explanation/bounding.md)."""
    r2 = params.half_range**2
    count = exact["count"].to_numpy(dtype=np.float64)
    squares = exact[CENTRED_SQUARES].to_numpy(dtype=np.float64)
    centred: np.ndarray = squares - r2 / 2 * count
    return centred


def noise_partitions(
    exact: pd.DataFrame, key_columns: Sequence[str], plan: BudgetPlan
) -> pd.DataFrame:
    """Noise on every row of `exact` (partitions already chosen); key columns + metrics.

    Post-processing (free under DP), with mid the midpoint and r the half-range of the bounds:
    mean = mid + noisy centred sum / max(1, noisy count), clamped to [min, max]; sum under mean
    = noisy centred sum + mid * noisy count; variance = noisy centred sum of squares /
    max(1, noisy count) + r^2/2 - (centred mean)^2, clamped to [0, r^2]; stddev = its square
    root. Counts are not clamped at zero, so every released count and sum stays unbiased.
    """
    params = plan.params
    exact = with_required_columns(exact, required_columns(params))
    out = exact[list(key_columns)].reset_index(drop=True)
    count = exact["count"].to_numpy(dtype=np.float64)
    total = exact["sum"].to_numpy(dtype=np.float64)

    values: dict[str, np.ndarray] = {}
    if plan.has("count"):
        values["count"] = _noised(plan, "count", exact["count"].to_numpy())
    if plan.has("centred_sum"):
        mid = params.midpoint
        denominator = np.maximum(1.0, values["count"].astype(np.float64))
        noisy_centred = _noised(plan, "centred_sum", total - mid * count)
        values["_centred_sum"] = noisy_centred
        centred_mean = noisy_centred / denominator
        values["sum"] = noisy_centred + mid * values["count"].astype(np.float64)
        values["mean"] = np.clip(mid + centred_mean, params.min_value, params.max_value)
        if plan.has("centred_sum_of_squares"):
            r2 = params.half_range**2
            noisy = _noised(plan, "centred_sum_of_squares", centred_squares_term(exact, params))
            values["_centred_squares"] = noisy
            variance = noisy / denominator + r2 / 2 - centred_mean**2
            values["variance"] = np.clip(variance, 0.0, r2)
            values["stddev"] = np.sqrt(values["variance"])  # post-processing
    elif plan.has("sum"):
        values["sum"] = _noised(plan, "sum", total)
    if plan.has("percentile"):
        table = _percentiles(plan, list(exact[VALUES]))
        for i, metric in enumerate(m for m in params.metrics if percentile_of(m) is not None):
            values[metric] = table[:, i]
    for metric in params.extremes:
        mechanism = plan.mechanism(metric)
        assert mechanism.noise_scale is not None
        assert params.min_value is not None and params.max_value is not None
        values[metric] = release_extremes(
            list(exact[VALUES]), metric, params.min_value, params.max_value, mechanism.noise_scale
        )
    if plan.has("privacy_id_count"):
        values["privacy_id_count"] = _noised(
            plan, "privacy_id_count", exact["privacy_id_count"].to_numpy()
        )
    for column in params.distinct_columns:
        name = distinct_aggregate(column)
        values[f"count_distinct({column})"] = _noised(plan, name, exact[name].to_numpy())
    for metric in ordered_metrics(params.metrics):
        out[metric_column(metric)] = values[metric]
    if params.confidence_intervals:
        _add_intervals(out, plan, values)
    return out


def _add_intervals(out: pd.DataFrame, plan: BudgetPlan, values: dict[str, np.ndarray]) -> None:
    """`<metric>_ci_low/_ci_high` beside each metric that has one (see `core.intervals`)."""
    for metric in (m for m in plan.params.metrics if has_interval(m)):
        if metric == "mean":
            low, high = mean_interval(plan, values["count"], values["_centred_sum"])
        elif metric in ("variance", "stddev"):
            low, high = variance_interval(
                plan, values["count"], values["_centred_sum"], values["_centred_squares"]
            )
            if metric == "stddev":
                low, high = np.sqrt(low), np.sqrt(high)
        else:
            width = metric_half_width(plan, metric)
            assert width is not None
            centre = values[metric]
            if centre.dtype.kind == "i":  # integer noise: an integer interval
                low, high = centre - int(width), centre + int(width)
            else:
                low, high = centre - width, centre + width
        column = metric_column(metric)
        out[f"{column}_ci_low"], out[f"{column}_ci_high"] = low, high


def release_partitions(
    aggregates: pd.DataFrame, key_columns: Sequence[str], plan: BudgetPlan
) -> pd.DataFrame:
    """One query with its own selection: selects partitions, then adds noise."""
    kept = aggregates.loc[select_partitions(aggregates["privacy_id_count"].to_numpy(), plan)]
    return noise_partitions(kept, key_columns, plan)


def release_public(
    aggregates: pd.DataFrame,
    key_columns: Sequence[str],
    plan: BudgetPlan,
    public_keys: pd.DataFrame | None,
) -> pd.DataFrame:
    """A public-partition query (or a global total): every listed key, noise on each."""
    aligned = add_empty_public_partitions(
        aggregates, key_columns, public_keys, required_columns(plan.params)
    )
    return noise_partitions(aligned, key_columns, plan)


def release_selection_group(
    plan: JobPlan,
    group_name: str,
    selection_aggregates: pd.DataFrame,
    query_aggregates: Mapping[str, pd.DataFrame],
) -> dict[str, pd.DataFrame]:
    """One private selection on `selection_aggregates` (bounded privacy_id_count per key),
    whose released keys every member query then uses like public keys."""
    group = plan.selection_group(group_name)
    keys = list(group.key_columns)
    mask = select_with(
        selection_aggregates["privacy_id_count"].to_numpy(), group.mechanism, group.pre_threshold
    )
    kept = selection_aggregates.loc[mask, keys].reset_index(drop=True)
    return {
        name: release_public(query_aggregates[name], keys, plan.query(name).plan, kept)
        for name in group.queries
    }


def release_columns(metrics: Sequence[str], intervals: bool = False) -> list[str]:
    """Metric columns in release order, each followed by its interval columns if any."""
    columns = []
    for metric in ordered_metrics(metrics):
        column = metric_column(metric)
        columns.append(column)
        if intervals and has_interval(metric):
            columns += [f"{column}_ci_low", f"{column}_ci_high"]
    return columns


def release_arrow_schema(
    key_columns: Sequence[tuple[str, pa.DataType]],
    metrics: Sequence[str],
    intervals: bool = False,
    integer_counts: bool = False,
) -> pa.Schema:
    """The release's schema: key columns (name, type; `KeyColumn.arrow_type`), then the
    metric columns in order. `integer_counts`: count and privacy_id_count as int64 (discrete
    noise), not float64."""
    schema = release_schema(list(key_columns), release_columns(metrics, intervals))
    if integer_counts:  # integer values and their integer intervals
        for name in schema.names:
            base = name.removesuffix("_ci_low").removesuffix("_ci_high")
            if base in DISCRETE_METRICS or base.startswith(DISTINCT_PREFIX):
                i = schema.get_field_index(name)
                schema = schema.set(i, schema.field(i).with_type(pa.int64()))
    return schema


def to_release_table(
    released: pd.DataFrame,
    key_columns: Sequence[tuple[str, pa.DataType]],
    metrics: Sequence[str],
    intervals: bool = False,
    integer_counts: bool = False,
) -> pa.Table:
    schema = release_arrow_schema(key_columns, metrics, intervals, integer_counts)
    return pa.Table.from_pandas(released[schema.names], schema=schema, preserve_index=False)
