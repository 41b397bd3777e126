"""Per-partition aggregates in, selected and noised rows out: the only place noise is drawn.

Every engine calls `release_partitions` on batches of exact, already bounded aggregates, one row
per partition with the columns of `AGGREGATE_COLUMNS`. Partitions are independent of each other
here, so any batching (Spark `mapInPandas`, a Beam DoFn, one local call) gives the same
distribution. Noise and selection come from PyDP's secure mechanisms, rebuilt from the plan.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from dppipeline.core.budget import BudgetPlan
from dppipeline.schemas import release_schema, transactions_schema

# Exact, bounded aggregates per partition that engines hand to the release.
AGGREGATE_COLUMNS = ("privacy_id_count", "count", "sum")
# Release column order (also the order in schemas/terminal_stats.json).
METRIC_ORDER = ("count", "sum", "mean", "privacy_id_count")


def add_empty_public_partitions(
    aggregates: pd.DataFrame, key_columns: Sequence[str], public_keys: pd.DataFrame
) -> pd.DataFrame:
    """Aligns aggregates to the public key list: listed keys without rows get zeros, and keys
    not listed are dropped (engines should already have filtered them before bounding)."""
    merged = public_keys[list(key_columns)].merge(aggregates, on=list(key_columns), how="left")
    for column in AGGREGATE_COLUMNS:
        if column in merged:
            merged[column] = merged[column].fillna(0)
    merged["privacy_id_count"] = merged["privacy_id_count"].astype("int64")
    merged["count"] = merged["count"].astype("int64")
    merged["sum"] = merged["sum"].astype("float64")
    return merged


def select_partitions(privacy_id_count: np.ndarray, plan: BudgetPlan) -> np.ndarray:
    """Boolean mask of partitions kept by private selection (all True for public partitions)."""
    selection = plan.selection
    if selection is None:
        return np.ones(len(privacy_id_count), dtype=bool)
    strategy = selection.build_selection(plan.params.pre_threshold)
    return np.fromiter(
        (strategy.should_keep(int(n)) for n in privacy_id_count),
        dtype=bool,
        count=len(privacy_id_count),
    )


def _noised(plan: BudgetPlan, name: str, exact: np.ndarray) -> np.ndarray:
    """Adds the named mechanism's noise to each value: one call into PyDP's C++ per value."""
    add_noise = plan.mechanism(name).build_additive().add_noise
    return np.fromiter((add_noise(float(x)) for x in exact), dtype=np.float64, count=len(exact))


def release_partitions(
    aggregates: pd.DataFrame, key_columns: Sequence[str], plan: BudgetPlan
) -> pd.DataFrame:
    """Selects partitions and adds noise; returns key columns plus the requested metrics.

    Post-processing (free under DP): mean = midpoint + noisy centred sum / max(1, noisy count),
    clamped to [min_value, max_value]; sum under mean = noisy centred sum + midpoint * noisy
    count. Counts are not clamped at zero, so every released value stays unbiased.
    """
    params = plan.params
    kept = aggregates.loc[select_partitions(aggregates["privacy_id_count"].to_numpy(), plan)]
    out = kept[list(key_columns)].reset_index(drop=True)
    count = kept["count"].to_numpy(dtype=np.float64)
    total = kept["sum"].to_numpy(dtype=np.float64)

    values: dict[str, np.ndarray] = {}
    if plan.has("count"):
        values["count"] = _noised(plan, "count", count)
    if plan.has("centred_sum"):
        mid = params.midpoint
        noisy_centred = _noised(plan, "centred_sum", total - mid * count)
        noisy_count = values["count"]
        values["sum"] = noisy_centred + mid * noisy_count
        mean = mid + noisy_centred / np.maximum(1.0, noisy_count)
        values["mean"] = np.clip(mean, params.min_value, params.max_value)
    elif plan.has("sum"):
        values["sum"] = _noised(plan, "sum", total)
    if plan.has("privacy_id_count"):
        values["privacy_id_count"] = _noised(
            plan, "privacy_id_count", kept["privacy_id_count"].to_numpy(dtype=np.float64)
        )
    for metric in METRIC_ORDER:
        if metric in params.metrics:
            out[metric] = values[metric]
    return out


def release_arrow_schema(key: str, metrics: Sequence[str]) -> pa.Schema:
    """The release's schema: the key under its input name and type, then requested metrics."""
    key_type = transactions_schema().field(key).arrow_type
    return release_schema([(key, key_type)], list(metrics))


def to_release_table(released: pd.DataFrame, key: str, metrics: Sequence[str]) -> pa.Table:
    schema = release_arrow_schema(key, metrics)
    return pa.Table.from_pandas(released[schema.names], schema=schema, preserve_index=False)
