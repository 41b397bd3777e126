"""Contribution bounding and per-partition aggregation on numpy arrays, without a per-row loop.

Uniform sampling by sorting: every row gets a random tie-breaker, rows are sorted by
(group, tie-breaker), and a row is kept when it is among the first `limit` of its group. In a
sorted array that test is one vectorised comparison: row i has rank >= limit exactly when row
i - limit is in the same group. Each subset of a group's rows of size min(n, limit) is then
equally likely, which is what the sensitivity analysis assumes.

This sampling uses ordinary randomness: it bounds sensitivity, it is not the privacy mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class BoundedAggregates:
    """Exact aggregates per partition after bounding (codes index into `keys`)."""

    key_codes: np.ndarray
    privacy_id_count: np.ndarray
    count: np.ndarray
    sum: np.ndarray


def _sorted_with_random_ties(group: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Permutation sorting `group` ascending, ties in uniformly random order."""
    n = len(group)
    max_group = int(group.max()) if n else 0
    random_bits = 63 - max(max_group.bit_length(), 1)
    if random_bits >= 24:
        # One int64 sort: group in the high bits, random tie-breaker in the low bits.
        tie = rng.integers(0, 1 << random_bits, size=n, dtype=np.int64)
        return np.argsort((group << random_bits) | tie, kind="quicksort")
    tie = rng.random(n)
    return np.lexsort((tie, group))


def _first_k_per_group(sorted_group: np.ndarray, k: int) -> np.ndarray:
    """Mask of the first k entries of each run of equal values in a sorted array."""
    keep = np.ones(len(sorted_group), dtype=bool)
    if len(sorted_group) > k:
        keep[k:] = sorted_group[k:] != sorted_group[:-k]
    return keep


def bound_contributions(
    privacy_codes: np.ndarray,
    key_codes: np.ndarray,
    values: np.ndarray | None,
    *,
    n_keys: int,
    max_partitions_contributed: int,
    max_contributions_per_partition: int,
    rng: np.random.Generator,
) -> BoundedAggregates:
    """Keeps <= Linf rows per (privacy unit, partition) and <= L0 partitions per privacy unit,
    sampled uniformly, then aggregates per partition.

    Args: dense int64 codes for the privacy unit and the partition key (0..n_keys-1), and the
    already clipped values (None when only counts are needed).
    """
    if values is None:
        values = np.zeros(len(key_codes), dtype=np.float64)
    # Linf: rows per (privacy unit, partition) pair.
    pair = privacy_codes.astype(np.int64) * n_keys + key_codes.astype(np.int64)
    order = _sorted_with_random_ties(pair, rng)
    pair_sorted = pair[order]
    kept = _first_k_per_group(pair_sorted, max_contributions_per_partition)
    pair_kept = pair_sorted[kept]
    value_kept = values[order][kept]
    # (pair) -> count, sum of its kept rows
    starts = np.flatnonzero(np.r_[True, pair_kept[1:] != pair_kept[:-1]])
    pair_ids = pair_kept[starts]
    pair_count = np.diff(np.r_[starts, len(pair_kept)])
    pair_sum = np.add.reduceat(value_kept, starts) if len(starts) else np.zeros(0)
    # L0: partitions per privacy unit, each pair counted once whatever its row count.
    pair_privacy = pair_ids // n_keys
    order = _sorted_with_random_ties(pair_privacy, rng)
    kept = _first_k_per_group(pair_privacy[order], max_partitions_contributed)
    chosen = order[kept]
    chosen_keys = pair_ids[chosen] % n_keys
    # (partition) -> privacy_id_count, count, sum
    privacy_id_count = np.bincount(chosen_keys, minlength=n_keys)
    count = np.bincount(chosen_keys, weights=pair_count[chosen], minlength=n_keys)
    total = np.bincount(chosen_keys, weights=pair_sum[chosen], minlength=n_keys)
    present = np.flatnonzero(privacy_id_count)
    return BoundedAggregates(
        key_codes=present,
        privacy_id_count=privacy_id_count[present].astype(np.int64),
        count=count[present].astype(np.int64),
        sum=total[present],
    )


def aggregates_frame(
    bounded: BoundedAggregates, key_column: str, key_values: np.ndarray | pd.Index
) -> pd.DataFrame:
    """The engine-neutral aggregate table `core.release` takes."""
    return pd.DataFrame(
        {
            key_column: np.asarray(key_values)[bounded.key_codes],
            "privacy_id_count": bounded.privacy_id_count,
            "count": bounded.count,
            "sum": bounded.sum,
        }
    )
