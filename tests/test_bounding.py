"""Contribution bounding: the invariants (property tests) and the uniformity of the sampling."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from dppipeline.engines.bounding import aggregate_per_partition, sample_contributions

rows_strategy = st.lists(
    st.tuples(st.integers(0, 6), st.integers(0, 5), st.floats(-5, 5)), min_size=0, max_size=120
)


def run_sample(rows, l0, linf, seed=0):
    unit = np.array([r[0] for r in rows], dtype=np.int64)
    key = np.array([r[1] for r in rows], dtype=np.int64)
    sample = sample_contributions(
        unit,
        key,
        n_keys=6,
        max_partitions_contributed=l0,
        max_contributions_per_partition=linf,
        rng=np.random.default_rng(seed),
    )
    return unit, key, sample


@settings(max_examples=300, deadline=None)
@given(rows=rows_strategy, l0=st.integers(1, 4), linf=st.integers(1, 4), seed=st.integers(0, 99))
def test_bounding_invariants(rows, l0, linf, seed):
    unit, key, sample = run_sample(rows, l0, linf, seed)
    kept = sample.rows
    assert len(set(kept.tolist())) == len(kept), "a row kept twice"
    per_pair = Counter(zip(unit[kept].tolist(), key[kept].tolist(), strict=True))
    per_unit = Counter(u for u, _ in per_pair)
    # At most Linf rows per (unit, partition); at most L0 partitions per unit.
    assert all(n <= linf for n in per_pair.values())
    assert all(n <= l0 for n in per_unit.values())
    # Bounding drops only what it must: min(rows, Linf) per kept pair, min(pairs, L0) per unit.
    all_pairs = Counter(zip(unit.tolist(), key.tolist(), strict=True))
    for pair, n in per_pair.items():
        assert n == min(all_pairs[pair], linf)
    units_pairs = Counter(u for u, _ in all_pairs)
    for u, n in units_pairs.items():
        assert per_unit[u] == min(n, l0)
    # The pairs reported for privacy_id_count are exactly the kept pairs' partitions.
    assert sorted(sample.pair_key_codes.tolist()) == sorted(k for _, k in per_pair)


@settings(max_examples=200, deadline=None)
@given(rows=rows_strategy, l0=st.integers(1, 4), linf=st.integers(1, 4))
def test_aggregates_are_sums_over_kept_rows(rows, l0, linf):
    unit, key, sample = run_sample(rows, l0, linf)
    values = np.array([r[2] for r in rows], dtype=np.float64)
    agg = aggregate_per_partition(sample, key, values, n_keys=6)
    frame = pd.DataFrame({"u": unit[sample.rows], "k": key[sample.rows], "v": values[sample.rows]})
    expected = frame.groupby("k").agg(n=("v", "size"), s=("v", "sum"), p=("u", "nunique"))
    assert agg.key_codes.tolist() == expected.index.tolist()
    assert agg.count.tolist() == expected["n"].tolist()
    assert agg.privacy_id_count.tolist() == expected["p"].tolist()
    np.testing.assert_allclose(agg.sum, expected["s"].to_numpy(), atol=1e-9)


def test_loose_bounds_keep_everything():
    rng = np.random.default_rng(1)
    unit, key = rng.integers(0, 50, 2000), rng.integers(0, 6, 2000)
    sample = sample_contributions(
        unit,
        key,
        n_keys=6,
        max_partitions_contributed=6,
        max_contributions_per_partition=2000,
        rng=rng,
    )
    assert sorted(sample.rows.tolist()) == list(range(2000))


def _inclusion_tolerance(p: float, draws: int, cells: int, failure_rate: float = 1e-6) -> float:
    """Half-width for an inclusion frequency: binomial std times the two-sided normal quantile
    at failure_rate / cells (Bonferroni over all cells checked)."""
    from scipy.stats import norm

    z = norm.isf(failure_rate / cells / 2)
    return z * math.sqrt(p * (1 - p) / draws)


def test_linf_sampling_is_uniform_over_rows():
    """One unit, one partition, 8 rows, Linf=3: every row kept with probability 3/8."""
    draws, n, linf = 4000, 8, 3
    unit, key = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    rng = np.random.default_rng(7)
    hits = np.zeros(n)
    pairs_seen = Counter()
    for _ in range(draws):
        kept = sample_contributions(
            unit,
            key,
            n_keys=1,
            max_partitions_contributed=1,
            max_contributions_per_partition=linf,
            rng=rng,
        ).rows
        hits[kept] += 1
        pairs_seen[tuple(sorted(kept.tolist()))] += 1
    p = linf / n
    tolerance = _inclusion_tolerance(p, draws, cells=n)
    assert np.all(np.abs(hits / draws - p) <= tolerance), hits / draws
    # All C(8,3) = 56 subsets occur (each has probability 1/56 per draw; missing one in 4000
    # draws has probability < 56 * (55/56)^4000 ~ 1e-29).
    assert len(pairs_seen) == math.comb(n, linf)


def test_l0_sampling_is_uniform_over_partitions_not_rows():
    """A unit with 1 row in partition 0 and 20 rows in partition 1..4: L0=2 keeps each
    partition with probability 2/5, whatever its row count."""
    draws = 4000
    key = np.array([0] + [1] * 20 + [2] + [3] + [4], dtype=np.int64)
    unit = np.zeros(len(key), dtype=np.int64)
    rng = np.random.default_rng(11)
    hits = np.zeros(5)
    for _ in range(draws):
        sample = sample_contributions(
            unit,
            key,
            n_keys=5,
            max_partitions_contributed=2,
            max_contributions_per_partition=100,
            rng=rng,
        )
        hits[sample.pair_key_codes] += 1
    p = 2 / 5
    assert np.all(np.abs(hits / draws - p) <= _inclusion_tolerance(p, draws, cells=5)), hits
