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
    """Exact aggregates per partition after bounding (codes index into the key values)."""

    key_codes: np.ndarray
    privacy_id_count: np.ndarray
    count: np.ndarray
    sum: np.ndarray
    sum_squares: np.ndarray | None = None
    values: list[np.ndarray] | None = None


@dataclass(frozen=True)
class ContributionSample:
    """What bounding kept: row indices, and the partition of every kept (unit, partition) pair."""

    rows: np.ndarray
    pair_key_codes: np.ndarray


def dense_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes 0..m-1, the value of each code). Integer ids in a compact range map by offset,
    with no hashing (codes of absent values simply stay unused); anything else is factorized."""
    if len(values) and np.issubdtype(values.dtype, np.integer):
        low, high = int(values.min()), int(values.max())
        if high - low < max(4 * len(values), 1 << 16):
            codes = values.astype(np.int64) - low
            return codes, np.arange(low, high + 1, dtype=values.dtype)
    codes, uniques = pd.factorize(values)
    return codes.astype(np.int64), np.asarray(uniques)


def _first_k_per_group(sorted_group: np.ndarray, k: int) -> np.ndarray:
    """Mask of the first k entries of each run of equal values in a sorted array."""
    keep = np.ones(len(sorted_group), dtype=bool)
    if len(sorted_group) > k:
        keep[k:] = sorted_group[k:] != sorted_group[:-k]
    return keep


def sample_per_group(
    group: np.ndarray, k: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """A uniform random sample of min(n, k) entries of each group.

    Returns the sampled entries' positions and their groups, both in ascending group order.
    Every entry gets a distinct random rank (a random permutation); (group, rank) is packed
    into one int64 and value-sorted, which is several times faster than an argsort, and only
    the sampled entries' ranks are decoded back to positions.
    """
    n = len(group)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    group = group.astype(np.int64, copy=False)
    rank = rng.permutation(n)
    rank_bits = max(int(n - 1).bit_length(), 1)
    if max(int(group.max()).bit_length(), 1) + rank_bits > 63:
        order = np.lexsort((rank, group))  # too wide to pack: the slow, general path
        sorted_group = group[order]
        keep = _first_k_per_group(sorted_group, k)
        return order[keep], sorted_group[keep]
    packed = np.sort((group << rank_bits) | rank)
    sorted_group = packed >> rank_bits
    keep = _first_k_per_group(sorted_group, k)
    position_of_rank = np.empty(n, dtype=np.int64)
    position_of_rank[rank] = np.arange(n, dtype=np.int64)
    return position_of_rank[packed[keep] & ((1 << rank_bits) - 1)], sorted_group[keep]


def sample_contributions(
    privacy_codes: np.ndarray,
    key_codes: np.ndarray,
    *,
    n_keys: int,
    max_partitions_contributed: int,
    max_contributions_per_partition: int,
    rng: np.random.Generator,
) -> ContributionSample:
    """Keeps <= Linf rows per (privacy unit, partition) and <= L0 partitions per privacy unit,
    each sampled uniformly; a partition counts once for L0 whatever its number of rows.

    Args: dense int64 codes of the privacy unit and of the partition key (0..n_keys-1).
    """
    # Linf: rows per (privacy unit, partition) pair.
    pair = privacy_codes.astype(np.int64) * n_keys + key_codes.astype(np.int64)
    rows, pair_of_row = sample_per_group(pair, max_contributions_per_partition, rng)
    # (pair) in ascending order, and the pair index of every kept row
    is_start = np.ones(len(rows), dtype=bool)
    is_start[1:] = pair_of_row[1:] != pair_of_row[:-1]
    pair_ids = pair_of_row[is_start]
    pair_index_of_row = np.cumsum(is_start) - 1
    # L0: pairs per privacy unit.
    chosen_pairs, _ = sample_per_group(pair_ids // n_keys, max_partitions_contributed, rng)
    chosen = np.zeros(len(pair_ids), dtype=bool)
    chosen[chosen_pairs] = True
    return ContributionSample(
        rows=rows[chosen[pair_index_of_row]],
        pair_key_codes=pair_ids[chosen] % n_keys,
    )


def aggregate_per_partition(
    sample: ContributionSample,
    key_codes: np.ndarray,
    values: np.ndarray | None,
    n_keys: int,
    *,
    sum_squares: bool = False,
    keep_values: bool = False,
) -> BoundedAggregates:
    """privacy_id_count, count and sum (optionally the sum of squares and the kept values
    themselves) of the kept rows, for partitions with any kept row."""
    kept_keys = key_codes[sample.rows]
    privacy_id_count = np.bincount(sample.pair_key_codes, minlength=n_keys)
    count = np.bincount(kept_keys, minlength=n_keys)
    kept_values = np.zeros(len(kept_keys)) if values is None else values[sample.rows]
    total = np.bincount(kept_keys, weights=kept_values, minlength=n_keys)
    present = np.flatnonzero(privacy_id_count)
    squares = None
    if sum_squares:
        squares = np.bincount(kept_keys, weights=kept_values**2, minlength=n_keys)[present]
    grouped = None
    if keep_values:
        order = np.argsort(kept_keys, kind="stable")
        by_key = np.split(kept_values[order], np.cumsum(count)[:-1])
        grouped = [by_key[code] for code in present]
    return BoundedAggregates(
        key_codes=present,
        privacy_id_count=privacy_id_count[present].astype(np.int64),
        count=count[present].astype(np.int64),
        sum=total[present].astype(np.float64),
        sum_squares=squares,
        values=grouped,
    )


def aggregates_table(bounded: BoundedAggregates, keys: pd.DataFrame) -> pd.DataFrame:
    """The engine-neutral aggregate table `core.release` takes; `keys` row i is key code i."""
    frame = keys.iloc[bounded.key_codes].reset_index(drop=True)
    frame["privacy_id_count"] = bounded.privacy_id_count
    frame["count"] = bounded.count
    frame["sum"] = bounded.sum
    if bounded.sum_squares is not None:
        frame["sum_squares"] = bounded.sum_squares
    if bounded.values is not None:
        frame["values"] = bounded.values
    return frame


def aggregates_frame(
    bounded: BoundedAggregates, key_column: str, key_values: np.ndarray | pd.Index
) -> pd.DataFrame:
    """`aggregates_table` for one key column whose code i has value key_values[i]."""
    return aggregates_table(bounded, pd.DataFrame({key_column: np.asarray(key_values)}))


def bottom_k_per_group(group: np.ndarray, priority: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k lowest-priority entries of each group (all of a smaller group).

    With independent uniform priorities this is a uniform sample of min(n, k) entries per
    group, and it composes: the bottom k of a union is the bottom k of the parts' bottom k.
    That is what lets a Beam combiner sample before the shuffle, one bundle at a time.
    """
    order = np.lexsort((priority, group))
    return order[_first_k_per_group(group[order], k)]


def stable_shard(values: np.ndarray, shards: int) -> np.ndarray:
    """Shard number of each value, the same in every process (Python's `hash` of a str is
    salted per process, so it cannot route rows between workers)."""
    return (pd.util.hash_array(np.asarray(values)) % np.uint64(shards)).astype(np.int64)
