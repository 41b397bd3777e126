"""Contribution bounding: the invariants (property tests), the keyed-hash priorities (xxHash's
XXH64, as Spark computes it), determinism given the salt whatever the row order, and the
uniformity of the sampling across privacy units."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2, norm

from dppipeline.engines.kernel.bounding import (
    aggregate_per_partition,
    bottom_k_per_group,
    sample_contributions,
)
from dppipeline.engines.kernel.sampling import (
    SamplingKeys,
    hash_ints,
    hash_longs,
    hash_texts,
    new_salt,
    pair_priorities,
    partition_seeds,
    row_priorities,
)

FAILURE_RATE = 1e-6

rows_strategy = st.lists(
    st.tuples(st.integers(0, 6), st.integers(0, 5), st.floats(-5, 5)), min_size=0, max_size=120
)


def sample(unit, key, *, n_keys, l0, linf, salt, rows=None, files=None, values=None):
    """`sample_contributions` with the engines' priorities: rows identified by (file, row)
    (default: one file, numbered by position), units and keys as int64 values."""
    keys = SamplingKeys.from_salt(salt)
    rows = np.arange(len(unit)) if rows is None else rows
    file_codes, names = pd.factorize(np.zeros(len(unit)) if files is None else files)
    seeds = partition_seeds(keys, pd.DataFrame({"k": np.arange(n_keys)}), ["int64"])
    return sample_contributions(
        np.asarray(unit, dtype=np.int64),
        np.asarray(key, dtype=np.int64),
        n_keys=n_keys,
        max_partitions_contributed=l0,
        max_contributions_per_partition=linf,
        row_priority=row_priorities(keys, [str(n) for n in names], file_codes, rows),
        pair_priority=lambda units, codes: pair_priorities(seeds[codes], units, "int64"),
        values=values,
    )


def run_sample(rows, l0, linf, seed=0):
    unit = np.array([r[0] for r in rows], dtype=np.int64)
    key = np.array([r[1] for r in rows], dtype=np.int64)
    kept = sample(unit, key, n_keys=6, l0=l0, linf=linf, salt=new_salt(seed))
    return unit, key, kept


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


@pytest.mark.slow
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
    kept = sample(unit, key, n_keys=6, l0=6, linf=2000, salt=new_salt())
    assert sorted(kept.rows.tolist()) == list(range(2000))


@settings(max_examples=100, deadline=None)
@given(
    group=st.lists(st.integers(0, 4), max_size=60),
    k=st.integers(1, 5),
    seed=st.integers(0, 2**32),
)
def test_bottom_k_keeps_the_lowest_priorities_of_each_group(group, k, seed):
    group = np.array(group, dtype=np.int64)
    priority = np.random.default_rng(seed).permutation(len(group))
    kept = bottom_k_per_group(group, priority, k)
    expected = sorted(
        i
        for g in set(group.tolist())
        for i in sorted(np.flatnonzero(group == g), key=priority.__getitem__)[:k]
    )
    assert kept.tolist() == expected


# ---------------------------------------------------------------------------------------------
# The keyed hash


def test_priorities_are_xxh64_as_the_reference_library_computes_it():
    """8- and 4-byte inputs (numpy, vectorised) against the xxHash library, and the published
    XXH64 test vector for the empty input."""
    rng = np.random.default_rng(3)
    values = rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64)
    seeds = rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64)

    def reference(data: bytes, seed) -> int:
        return xxhash.xxh64_intdigest(data, int(np.int64(seed).view(np.uint64)))

    longs = hash_longs(values, seeds).view(np.uint64)
    assert longs.tolist() == [
        reference(int(v).to_bytes(8, "little", signed=True), s)
        for v, s in zip(values, seeds, strict=True)
    ]
    ints = hash_ints(values.astype(np.int32), seeds).view(np.uint64)
    assert ints.tolist() == [
        reference(int(v).to_bytes(4, "little", signed=True), s)
        for v, s in zip(values.astype(np.int32), seeds, strict=True)
    ]
    assert int(hash_texts([""], 0).view(np.uint64)[0]) == 0xEF46DB3751D8E999


def test_salt_keys_are_hidden_and_salts_are_fresh():
    keys = SamplingKeys.from_salt(new_salt())
    assert str(keys.linf) not in repr(keys) and str(keys.l0) not in repr(keys)
    assert new_salt() != new_salt() and len(new_salt()) == 16
    assert new_salt(5) == new_salt(5) != new_salt(6)


def test_same_salt_keeps_the_same_rows_whatever_their_order():
    """What a Spark retry or a Beam re-bundling changes is the order rows arrive in: with the
    same salt the kept rows (by identity) do not change; with another salt they do."""
    rng = np.random.default_rng(4)
    n = 20_000
    unit, key = rng.integers(0, 300, n), rng.integers(0, 40, n)
    files, rows = rng.choice(["a.parquet", "b.parquet"], n), np.arange(n)
    salt = new_salt()

    def kept_identities(order, salt):
        out = sample(
            unit[order], key[order], n_keys=40, l0=3, linf=2, salt=salt,
            rows=rows[order], files=files[order],
        )  # fmt: skip
        return set(zip(files[order][out.rows], rows[order][out.rows], strict=True))

    first = kept_identities(np.arange(n), salt)
    assert kept_identities(rng.permutation(n), salt) == first
    assert kept_identities(np.arange(n), new_salt()) != first


# ---------------------------------------------------------------------------------------------
# Uniformity: with one salt, the samples of different privacy units are independent draws


def _inclusion_tolerance(p: float, draws: int, cells: int, failure_rate: float) -> float:
    """Half-width for an inclusion frequency: binomial std times the two-sided normal quantile
    at failure_rate / cells (Bonferroni over all cells checked)."""
    return float(norm.isf(failure_rate / cells / 2)) * math.sqrt(p * (1 - p) / draws)


def test_linf_sampling_is_uniform_over_rows():
    """4,000 units, each with 8 rows at its own partition, Linf=3: each of a unit's rows is kept
    with probability 3/8 (per-row binomial test), and each of the C(8,3) = 56 subsets with
    probability 1/56 (chi-square); failure rate 1e-6 in all."""
    units, n, linf = 4000, 8, 3
    unit = np.repeat(np.arange(units), n)
    kept = sample(unit, unit, n_keys=units, l0=1, linf=linf, salt=new_salt()).rows
    position = kept % n  # which of its unit's rows
    hits = np.bincount(position, minlength=n)
    p = linf / n
    tolerance = _inclusion_tolerance(p, units, cells=n, failure_rate=FAILURE_RATE / 2)
    assert np.all(np.abs(hits / units - p) <= tolerance), hits / units
    subsets = Counter(tuple(s) for s in np.sort(position.reshape(units, linf), axis=1).tolist())
    cells = math.comb(n, linf)
    observed = np.array([subsets.get(s, 0) for s in _subsets(n, linf)])
    statistic = float(np.sum((observed - units / cells) ** 2 / (units / cells)))
    assert statistic <= chi2.isf(FAILURE_RATE / 2, cells - 1), statistic


def _subsets(n: int, k: int) -> list[tuple[int, ...]]:
    from itertools import combinations

    return list(combinations(range(n), k))


def test_l0_sampling_is_uniform_over_partitions_not_rows():
    """4,000 units, each with 1 row in partition 0, 20 rows in partition 1 and 1 row in each of
    partitions 2..4: L0=2 keeps each partition with probability 2/5, whatever its row count
    (binomial per partition, Bonferroni over 5, failure rate 1e-6)."""
    units = 4000
    per_unit = np.array([0] + [1] * 20 + [2, 3, 4], dtype=np.int64)
    key = np.tile(per_unit, units)
    unit = np.repeat(np.arange(units), len(per_unit))
    kept = sample(unit, key, n_keys=5, l0=2, linf=100, salt=new_salt())
    hits = np.bincount(kept.pair_key_codes, minlength=5)
    assert hits.sum() == 2 * units
    p = 2 / 5
    tolerance = _inclusion_tolerance(p, units, cells=5, failure_rate=FAILURE_RATE)
    assert np.all(np.abs(hits / units - p) <= tolerance), hits / units
