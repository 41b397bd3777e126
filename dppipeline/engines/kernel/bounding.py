"""Contribution bounding and per-partition aggregation on numpy arrays, without a per-row loop.

Sampling by priorities: Linf keeps, per (privacy unit, partition) pair, the
`max_contributions_per_partition` rows of lowest priority, a keyed hash of the run's secret salt
and the row's identity (`_source_file`, `_row`); L0 keeps, per privacy unit, the
`max_partitions_contributed` pairs of lowest keyed hash of (salt, partition key, unit). The
priorities are deterministic (`sampling`), so a retried or recomputed task keeps the same rows,
and a run is reproducible given its salt; to anyone without the salt they are independent and
uniform, so each subset of min(n, limit) entries of a group is equally likely. Bottom-k also
composes (the bottom k of a union is the bottom k of the parts' bottom k), which lets Beam sample
before its shuffle. Only groups with more entries than their limit are sorted.

`max_contributions` K (a bound on a unit's total rows, Tumult's MaxRowsPerID) keeps instead,
per privacy unit, the K rows of lowest Linf priority across all its partitions: a uniform
sample of min(n_u, K) of its n_u rows, by the same keyed hash; its partitions are those its
kept rows fall in (at most K).

Why this is sound: the sensitivity analysis needs each unit's kept rows to depend only on that
unit's own rows and on randomness independent of the data (here the salt). L0 priorities depend
on (salt, key, unit) alone, exactly so. A row's `_row` can shift when another unit's rows leave
the same file, but the priorities of distinct identities under a fresh secret salt are, to
anyone without it, independent uniforms whatever the identities are, so the joint law of every
other unit's sample is the same with or without any one unit. That is the role a PRNG's
unpredictable state played before: sampling is not the privacy mechanism (the noise is), and a
fast non-cryptographic hash serves as well as numpy's generator did, provided the salt is
secret and new each run (never logged, never in the manifest or a Spark plan).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import polars as pl

from dppipeline.core.columns import CENTRED_SQUARES, DISTINCT_PREFIX

DISTINCT_VALUES_PREFIX = "_distinct_values_"  # its value sets, before Beam merges them


@dataclass(frozen=True)
class BoundedAggregates:
    """Exact aggregates per partition after bounding (codes index into the key values)."""

    key_codes: np.ndarray
    privacy_id_count: np.ndarray
    count: np.ndarray
    sum: np.ndarray
    centred_squares: np.ndarray | None = None  # sum of (x - mid)^2, mid the bounds' midpoint
    values: list[np.ndarray] | None = None
    # count_distinct(COLUMN): per column, the distinct non-null values of the kept rows of
    # each partition (Beam merges them across shards), in `key_codes` order.
    distinct: dict[str, list[np.ndarray]] = field(default_factory=dict)


@dataclass(frozen=True)
class ContributionSample:
    """What bounding kept: row indices, and the partition of every kept (unit, partition) pair.
    Scaled Linf bounding keeps every row of a kept pair, and says which pair (an index into
    `pair_key_codes`) each kept row belongs to and how many rows each pair has."""

    rows: np.ndarray
    pair_key_codes: np.ndarray
    row_pair: np.ndarray | None = None  # scaled: the kept pair of each kept row
    pair_rows: np.ndarray | None = None  # scaled: rows of each kept pair
    linf: int = 0  # scaled: max_contributions_per_partition


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


def bottom_k_per_group(
    group: np.ndarray, priority: np.ndarray, k: int, tiebreak: np.ndarray | None = None
) -> np.ndarray:
    """Positions (ascending) of the k lowest-priority entries of each group (all of a group of
    at most k). `tiebreak` (e.g. the value) settles equal priorities, which only a 64-bit hash
    collision gives, the same way whatever order the entries come in."""
    if len(group) <= k:
        return np.arange(len(group))
    codes, _ = pd.factorize(group)
    return bottom_k_codes(codes, priority, k, tiebreak)


def bottom_k_codes(
    codes: np.ndarray, priority: np.ndarray, k: int, tiebreak: np.ndarray | None
) -> np.ndarray:
    """`bottom_k_per_group` for non-negative group codes small enough to bincount; only the
    entries of groups larger than k are ranked.

    Fast path: each candidate's group code and the top bits of its priority are packed into
    one uint64 (signed priority order kept); a value sort (Polars' radix sort, several times
    faster than numpy's sort, argsort or lexsort) gives each group's k-th smallest packed
    key, and an entry is kept when its key is at most that. Equal packed keys (top bits tie:
    a hash collision, or too many groups to leave enough bits) take the exact lexsort by
    (group, priority, tiebreak).
    """
    if len(codes) <= k:
        return np.arange(len(codes))
    counts = np.bincount(codes)
    heavy = counts[codes] > k
    if not heavy.any():
        return np.arange(len(codes))
    keep = ~heavy
    candidates = np.flatnonzero(heavy)
    group, rank = codes[candidates], priority[candidates]
    group_bits = max(int(group.max()).bit_length(), 1)
    if group_bits <= 40:
        shift = np.uint64(64 - group_bits)
        ordered = rank.view(np.uint64) ^ np.uint64(1 << 63)  # signed order as unsigned
        packed = (group.astype(np.uint64) << shift) | (ordered >> (np.uint64(64) - shift))
        ranked = pl.Series(packed).sort().to_numpy()  # Polars' radix sort: ~4x numpy's
        if not np.any(ranked[1:] == ranked[:-1]):
            large = counts > k
            sizes = counts[large]  # candidate groups, in ascending code order
            threshold = np.zeros(len(counts), dtype=np.uint64)
            threshold[large] = ranked[np.cumsum(sizes) - sizes + k - 1]
            keep[candidates] = packed <= threshold[group]
            return np.flatnonzero(keep)
    keys = (rank, group) if tiebreak is None else (tiebreak[candidates], rank, group)
    order = candidates[np.lexsort(keys)]
    keep[order[_first_k_per_group(codes[order], k)]] = True
    return np.flatnonzero(keep)


PairPriority = Callable[[np.ndarray, np.ndarray], np.ndarray]


def sample_contributions(
    privacy_codes: np.ndarray,
    key_codes: np.ndarray,
    *,
    n_keys: int,
    max_partitions_contributed: int,
    max_contributions_per_partition: int,
    row_priority: np.ndarray,
    pair_priority: PairPriority,
    values: np.ndarray | None = None,
    max_contributions: int | None = None,
    scaled: bool = False,
    row_counts: np.ndarray | None = None,
) -> ContributionSample:
    """Keeps <= Linf rows per (privacy unit, partition) and <= L0 partitions per privacy unit,
    those of lowest priority; a partition counts once for L0 whatever its number of rows.
    With `max_contributions` K: the K rows of lowest priority per privacy unit instead.
    `scaled`: every row of the kept pairs, for `aggregate_per_partition` to scale each pair's
    aggregates to Linf rows (`bounds.linf_bounding: scale`) instead of sampling its rows;
    `row_counts`: the rows each entry stands for when entries are partial pairs (scaled only).

    Args: dense int64 codes of the privacy unit and of the partition key (0..n_keys-1); each
    row's Linf priority; `pair_priority(unit codes, key codes)`, the L0 priority of pairs;
    `values` break priority ties (rows with equal value are interchangeable).
    """
    pair = privacy_codes.astype(np.int64) * n_keys + key_codes.astype(np.int64)
    if max_contributions is not None:
        rows = bottom_k_codes(
            privacy_codes.astype(np.int64), row_priority, max_contributions, values
        )
        return ContributionSample(rows=rows, pair_key_codes=np.unique(pair[rows]) % n_keys)
    pair_of_row, pair_ids = pd.factorize(pair)
    # Linf: rows per (privacy unit, partition) pair (scaled: all, each pair scaled later).
    rows = (
        np.arange(len(pair))
        if scaled
        else bottom_k_codes(pair_of_row, row_priority, max_contributions_per_partition, values)
    )
    # (pair) -> its unit and partition; L0: pairs per privacy unit (each pair keeps a row).
    pair_units, pair_keys = pair_ids // n_keys, pair_ids % n_keys
    chosen_pairs = bottom_k_codes(
        pair_units, pair_priority(pair_units, pair_keys), max_partitions_contributed, pair_keys
    )
    chosen = np.zeros(len(pair_ids), dtype=bool)
    chosen[chosen_pairs] = True
    kept = rows[chosen[pair_of_row[rows]]]
    if not scaled:
        return ContributionSample(rows=kept, pair_key_codes=pair_keys[chosen_pairs])
    position = np.full(len(pair_ids), -1, dtype=np.int64)
    position[chosen_pairs] = np.arange(len(chosen_pairs))
    row_pair = position[pair_of_row[kept]]
    return ContributionSample(
        rows=kept,
        pair_key_codes=pair_keys[chosen_pairs],
        row_pair=row_pair,
        pair_rows=np.bincount(
            row_pair,
            weights=None if row_counts is None else row_counts[kept],
            minlength=len(chosen_pairs),
        ).astype(np.int64),
        linf=max_contributions_per_partition,
    )


def aggregate_per_partition(
    sample: ContributionSample,
    key_codes: np.ndarray,
    values: np.ndarray | None,
    n_keys: int,
    *,
    sum_squares: bool = False,
    keep_values: bool = False,
    distinct: Sequence[tuple[str, np.ndarray]] = (),
    centre: float = 0.0,
    deviations: tuple[np.ndarray, np.ndarray | None] | None = None,
) -> BoundedAggregates:
    """privacy_id_count, count and sum (optionally the sum of squares, the kept values
    themselves and, per (column, its value of every row) in `distinct`, each partition's
    distinct non-null values) of the kept rows, for partitions with any kept row.
    The sum of squares is of deviations from `centre`, the bounds' midpoint (what the
    variance needs, without the cancellation of sums of x^2). Scaled samples: `deviations`,
    for entries that are partial pairs (`pair_partials`), their sums of (x - centre) and of
    (x - centre)^2."""
    if sample.row_pair is not None:
        if keep_values or distinct:
            raise ValueError("scaled Linf bounding keeps no rows: no values, no distinct sets")
        if deviations is None:
            rows = np.zeros(len(sample.rows)) if values is None else values[sample.rows] - centre
            kept: tuple[np.ndarray, np.ndarray | None] = (rows, rows**2 if sum_squares else None)
        else:
            first, second = deviations
            kept = (first[sample.rows], None if second is None else second[sample.rows])
        return _aggregate_scaled_pairs(sample, n_keys, centre, kept)
    kept_keys = key_codes[sample.rows]
    privacy_id_count = np.bincount(sample.pair_key_codes, minlength=n_keys)
    count = np.bincount(kept_keys, minlength=n_keys)
    kept_values = np.zeros(len(kept_keys)) if values is None else values[sample.rows]
    total = np.bincount(kept_keys, weights=kept_values, minlength=n_keys)
    present = np.flatnonzero(privacy_id_count)
    squares = None
    if sum_squares:
        squared = (kept_values - centre) ** 2
        squares = np.bincount(kept_keys, weights=squared, minlength=n_keys)[present]
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
        centred_squares=squares,
        values=grouped,
        distinct={
            column: distinct_values(kept_keys, column_values[sample.rows], present, n_keys)
            for column, column_values in distinct
        },
    )


def _aggregate_scaled_pairs(
    sample: ContributionSample,
    n_keys: int,
    centre: float,
    deviations: tuple[np.ndarray, np.ndarray | None],
) -> BoundedAggregates:
    """Scaled Linf bounding: a kept pair of c rows counts n = min(c, Linf) and adds its
    clipped sum (and sum of squares) scaled by min(1, Linf / c), so that it adds at most what
    Linf of its rows could (docs/explanation/bounding.md); partitions then add up their pairs.

    A pair's rows are summed as deviations from the bounds' midpoint m, then scaled: the sum
    is S = d + m n from d = sum (x - m), the centred squares q = sum (x - m)^2 as they are.
    Summing c raw values first would leave one unit a rounding error that grows with c.
    `deviations`: per kept entry, (x - m) and, for the variance only, (x - m)^2."""
    assert sample.row_pair is not None and sample.pair_rows is not None
    n_pairs = len(sample.pair_key_codes)
    rows_per_pair = sample.pair_rows
    scale = np.minimum(1.0, sample.linf / rows_per_pair)
    kept = np.minimum(rows_per_pair, sample.linf).astype(np.float64)

    def per_pair(per_entry: np.ndarray) -> np.ndarray:
        return np.bincount(sample.row_pair, weights=per_entry, minlength=n_pairs) * scale

    def per_partition(pair_totals: np.ndarray) -> np.ndarray:
        return np.bincount(sample.pair_key_codes, weights=pair_totals, minlength=n_keys)

    first, second = deviations
    d = per_pair(first)
    privacy_id_count = np.bincount(sample.pair_key_codes, minlength=n_keys)
    present = np.flatnonzero(privacy_id_count)
    squares = None if second is None else per_partition(per_pair(second))[present]
    return BoundedAggregates(
        key_codes=present,
        privacy_id_count=privacy_id_count[present].astype(np.int64),
        count=np.rint(per_partition(kept)[present]).astype(np.int64),
        sum=per_partition(d + centre * kept)[present],
        centred_squares=squares,
    )


def distinct_values(
    key_codes: np.ndarray, values: np.ndarray, present: np.ndarray, n_keys: int
) -> list[np.ndarray]:
    """Per partition code in `present`, the distinct non-null values among `values` (one per
    kept row, `key_codes` its partition). Null, None and NaN are not values (pandas'
    factorize gives them code -1)."""
    codes, uniques = pd.factorize(values)
    listed = codes >= 0
    n_values = max(len(uniques), 1)
    pairs = np.unique(key_codes[listed].astype(np.int64) * n_values + codes[listed])
    pair_keys, pair_values = pairs // n_values, pairs % n_values
    counts = np.bincount(pair_keys, minlength=n_keys)
    by_key = np.split(np.asarray(uniques)[pair_values], np.cumsum(counts)[:-1])
    return [by_key[code] for code in present]


def aggregates_table(
    bounded: BoundedAggregates, keys: pd.DataFrame, *, distinct_sets: bool = False
) -> pd.DataFrame:
    """The engine-neutral aggregate table `core.mechanisms` takes; `keys` row i is key code i.
    `distinct_sets`: each count_distinct column as its value sets (`_distinct_values_C`),
    not their sizes (`count_distinct_C`)."""
    frame = keys.iloc[bounded.key_codes].reset_index(drop=True)
    frame["privacy_id_count"] = bounded.privacy_id_count
    frame["count"] = bounded.count
    frame["sum"] = bounded.sum
    if bounded.centred_squares is not None:
        frame[CENTRED_SQUARES] = bounded.centred_squares
    if bounded.values is not None:
        frame["values"] = bounded.values
    for column, sets in bounded.distinct.items():
        if distinct_sets:  # Beam's partial aggregates: merged across unit shards
            frame[DISTINCT_VALUES_PREFIX + column] = sets
        else:
            frame[DISTINCT_PREFIX + column] = np.fromiter(
                (len(s) for s in sets), dtype=np.int64, count=len(sets)
            )
    return frame


def aggregates_frame(
    bounded: BoundedAggregates,
    key_column: str,
    key_values: np.ndarray | pd.Index,
    *,
    distinct_sets: bool = False,
) -> pd.DataFrame:
    """`aggregates_table` for one key column whose code i has value key_values[i]."""
    return aggregates_table(
        bounded, pd.DataFrame({key_column: np.asarray(key_values)}), distinct_sets=distinct_sets
    )


def stable_shard(values: np.ndarray, shards: int) -> np.ndarray:
    """Shard number of each value, the same in every process (Python's `hash` of a str is
    salted per process, so it cannot route rows between workers)."""
    return (pd.util.hash_array(np.asarray(values)) % np.uint64(shards)).astype(np.int64)
