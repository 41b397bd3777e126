"""`bounds.max_contributions` K: at most K rows per privacy unit across all its partitions
(Tumult's MaxRowsPerID, PipelineDP's max_contributions), instead of the L0 x Linf pair.

What is checked: the spec (mutually exclusive kinds, no job default leaking across kinds); the
sample (exactly sum_u min(n_u, K) rows, uniform over a unit's rows whatever their partitions,
more rows than any L0 x Linf pair of the same product); the sensitivities the plan uses and
the noise it states (formula; statistical tier under basic + Laplace and zCDP + Gaussian);
every engine against a pandas oracle of the same rule and, at a huge epsilon, the truth; and
neighbouring inputs: removing one unit moves the bounded aggregates by at most the stated
L1 and L2 sensitivities, on every engine.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm
from support.data import release_small, terminal_truth

from dppipeline.core.events import mechanism_event
from dppipeline.core.mechanisms import release_partitions
from dppipeline.core.plan import AggregationParams, gaussian_delta
from dppipeline.core.planner import plan_budget
from dppipeline.core.tasks import plan_tasks
from dppipeline.engines.kernel.bounding import sample_contributions
from dppipeline.engines.kernel.polars_tasks import aggregate_task
from dppipeline.engines.kernel.sampling import (
    SamplingKeys,
    new_salt,
    pair_priorities,
    partition_seeds,
    row_priorities,
)
from dppipeline.errors import SpecError
from dppipeline.lifecycle.runner import make_plan
from dppipeline.spec.model import build_spec

FAILURE_RATE = 1e-6
Z_1E6 = float(norm.isf(FAILURE_RATE / 2))
KEY, UNIT = "TERMINAL_ID", "CUSTOMER_ID"
SALT = new_salt(18)
BASE = {"input.path": "unused", "output": "unused", "metrics": ["count"]}


# ---------------------------------------------------------------------------------------------
# Spec


def spec_of(raw: dict, **overrides):
    return build_spec(raw, {**BASE, **overrides})


@pytest.mark.parametrize("other", ["max_partitions_contributed", "max_contributions_per_partition"])
def test_max_contributions_excludes_the_l0_linf_pair(other):
    with pytest.raises(SpecError) as error:
        spec_of({"bounds": {"max_contributions": 5, other: 2}})
    assert error.value.field == "bounds.max_contributions"
    assert f"must not be set with bounds.{other}" in error.value.rule


@pytest.mark.parametrize("bad", [0, -1, 2**31, 1.5, "many"])
def test_max_contributions_is_a_positive_c_int(bad):
    with pytest.raises(SpecError) as error:
        spec_of({"bounds": {"max_contributions": bad}})
    assert error.value.field == "bounds.max_contributions"


def test_job_defaults_do_not_leak_across_bound_kinds():
    """A query that sets one kind takes none of the job's other kind; one that sets neither
    takes the job's bounds; min/max values are inherited whatever the kind."""
    job = {
        "bounds": {"max_partitions_contributed": 3, "max_contributions_per_partition": 2,
                   "min_value": 0, "max_value": 10},
        "queries": [
            {"name": "total", "bounds": {"max_contributions": 7}},
            {"name": "pair"},
        ],
    }  # fmt: skip
    spec = spec_of(job)
    total, pair = spec.query("total").bounds, spec.query("pair").bounds
    assert (total.max_contributions, total.max_value) == (7, 10)
    assert "max_partitions_contributed" not in total.model_fields_set
    assert (pair.max_contributions, pair.max_partitions_contributed) == (None, 3)
    job = {
        "bounds": {"max_contributions": 7, "min_value": 0, "max_value": 10},
        "queries": [
            {"name": "pair", "bounds": {"max_partitions_contributed": 3,
                                        "max_contributions_per_partition": 1}},
            {"name": "total"},
        ],
    }  # fmt: skip
    spec = spec_of(job)
    assert spec.query("pair").bounds.max_contributions is None
    assert spec.query("pair").bounds.max_partitions_contributed == 3
    assert spec.query("total").bounds.max_contributions == 7


def test_a_flag_of_one_kind_replaces_the_files_other_kind():
    raw = {"bounds": {"max_partitions_contributed": 3, "max_contributions_per_partition": 2}}
    spec = spec_of(raw, **{"bounds.max_contributions": 6})
    bounds = spec.queries[0].bounds
    assert bounds.max_contributions == 6 and bounds.model_fields_set.isdisjoint(
        {"max_partitions_contributed", "max_contributions_per_partition"}
    )
    flags = {"bounds.max_partitions_contributed": 2, "bounds.max_contributions_per_partition": 1}
    spec = spec_of({"bounds": {"max_contributions": 6}}, **flags)
    assert spec.queries[0].bounds.max_contributions is None


def test_cli_flag_and_plan_output(tmp_path, capsys):
    from dppipeline.cli.main import main

    code = main(
        ["plan", "--max-contributions", "4", "--min-value", "0", "--max-value", "10",
         "--metrics", "count,privacy_id_count", "--public-partitions", "1..5"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "max_contributions=4 rows per privacy unit" in out
    assert "count L1=4 L2=4" in out and "privacy_id_count L1=4 L2=2" in out


# ---------------------------------------------------------------------------------------------
# The sample


def sample(unit, key, *, n_keys, salt, k=None, l0=1, linf=1, values=None):
    """`sample_contributions` with the engines' priorities (one file, rows by position)."""
    keys = SamplingKeys.from_salt(salt)
    seeds = partition_seeds(keys, pd.DataFrame({"k": np.arange(n_keys)}), ["int64"])
    return sample_contributions(
        np.asarray(unit, dtype=np.int64),
        np.asarray(key, dtype=np.int64),
        n_keys=n_keys,
        max_partitions_contributed=l0,
        max_contributions_per_partition=linf,
        row_priority=row_priorities(
            keys, [""], np.zeros(len(unit), np.int64), np.arange(len(unit))
        ),
        pair_priority=lambda units, codes: pair_priorities(seeds[codes], units, "int64"),
        values=values,
        max_contributions=k,
    )


def known_counts(seed: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unit, key, n_u): 600 customers, each with a known number of rows (1 to 40, heavy-
    tailed as card data is) spread over 1 to 8 of 30 terminals, unevenly, rows interleaved."""
    rng = np.random.default_rng(seed)
    n_u = np.minimum(rng.geometric(0.08, size=600), 40)
    units, keys = [], []
    for u, n in enumerate(n_u):
        terminals = rng.choice(30, size=rng.integers(1, 9), replace=False)
        weights = rng.dirichlet(np.ones(len(terminals)))
        units += [u] * int(n)
        keys += rng.choice(terminals, size=int(n), p=weights).tolist()
    order = rng.permutation(len(units))
    return np.array(units)[order], np.array(keys)[order], n_u


def test_keeps_exactly_min_rows_k_per_unit_more_than_any_pair_of_that_product():
    """K = 12 keeps sum_u min(n_u, K) rows, the formula of Tumult's MaxRowsPerID(12) (it
    truncates each unit to K rows), so the same share; every L0 x Linf pair with L0 Linf = 12
    keeps fewer on this data (a unit's rows are uneven across its terminals)."""
    unit, key, n_u = known_counts()
    k = 12
    kept = sample(unit, key, n_keys=30, salt=SALT, k=k)
    per_unit = np.bincount(unit[kept.rows], minlength=len(n_u))
    np.testing.assert_array_equal(per_unit, np.minimum(n_u, k))
    max_rows_per_id = int(np.minimum(n_u, k).sum())  # Tumult MaxRowsPerID(K)'s kept rows
    assert len(kept.rows) == max_rows_per_id
    # The kept pairs are exactly those the kept rows fall in (privacy_id_count's input).
    pairs = set(zip(unit[kept.rows].tolist(), key[kept.rows].tolist(), strict=True))
    assert len(pairs) == len(kept.pair_key_codes)
    assert Counter(k for _, k in pairs) == Counter(kept.pair_key_codes.tolist())
    shares = {}
    for l0, linf in [(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)]:
        pair_kept = len(sample(unit, key, n_keys=30, salt=SALT, l0=l0, linf=linf).rows)
        assert pair_kept < max_rows_per_id, (l0, linf)
        shares[(l0, linf)] = pair_kept / len(unit)
    assert max(shares.values()) < max_rows_per_id / len(unit)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4)), max_size=80),
    st.integers(1, 6),
    st.integers(0, 2**32),
)
def test_property_each_unit_keeps_its_k_lowest_priority_rows(rows, k, seed):
    """Whatever the rows: each unit keeps exactly its min(n_u, K) rows of lowest priority, and
    the kept pairs are exactly the (unit, partition) pairs of kept rows."""
    unit = np.array([r[0] for r in rows], dtype=np.int64)
    key = np.array([r[1] for r in rows], dtype=np.int64)
    salt = new_salt(seed)
    kept = sample(unit, key, n_keys=5, salt=salt, k=k)
    priority = row_priorities(
        SamplingKeys.from_salt(salt), [""], np.zeros(len(unit), np.int64), np.arange(len(unit))
    )
    expected = set()
    for u in np.unique(unit):
        mine = np.flatnonzero(unit == u)
        expected |= set(mine[np.argsort(priority[mine], kind="stable")][:k].tolist())
    assert set(kept.rows.tolist()) == expected
    pairs = Counter(k for _, k in {(unit[i], key[i]) for i in expected})
    assert Counter(kept.pair_key_codes.tolist()) == pairs


def test_the_sample_is_uniform_over_a_units_rows_whatever_their_partitions():
    """3,000 units, each with 1 row at terminal 0, 6 at terminal 1 and 1 at terminal 2; K = 3:
    each of the 8 rows is kept with probability 3/8 (binomial, Bonferroni over 8 rows), so a
    terminal's expected share is proportional to its rows: 1/8, 6/8, 1/8 of K. Failure rate
    1e-6. Sampling per partition (Linf = K) would keep the singletons always."""
    units, k = 3000, 3
    layout = np.array([0, 1, 1, 1, 1, 1, 1, 2])
    unit = np.repeat(np.arange(units), len(layout))
    key = np.tile(layout, units)
    kept = sample(unit, key, n_keys=3, salt=new_salt(), k=k).rows
    assert len(kept) == units * k
    hits = np.bincount(kept % len(layout), minlength=len(layout))
    p = k / len(layout)
    tolerance = float(norm.isf(FAILURE_RATE / len(layout) / 2)) * math.sqrt(p * (1 - p) / units)
    assert np.all(np.abs(hits / units - p) <= tolerance), hits / units


# ---------------------------------------------------------------------------------------------
# Sensitivities and the noise the plan states


def params_for(noise: str, k: int = 4, keyed: bool = True, **more) -> AggregationParams:
    return AggregationParams(
        metrics=more.pop("metrics", ("count", "sum", "privacy_id_count")),
        noise=noise,
        max_partitions_contributed=k if keyed else 1,
        max_contributions_per_partition=k,
        min_value=-20.0,
        max_value=50.0,
        public_partitions=more.pop("public", True),
        key_columns=("TERMINAL_ID",) if keyed else (),
        max_contributions=k,
        **more,
    )


EXPECTED = {  # (L1, L2) for K = 4, values in [-20, 50]
    "count": (4.0, 4.0),
    "sum": (200.0, 200.0),
    "privacy_id_count": (4.0, 2.0),
}


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_basic_accounting_noise_is_the_formula(noise):
    """Laplace: std = sqrt(2) L1 / epsilon. Gaussian: the std PyDP calibrates for L2 = K (not
    sqrt(K) K, nor sqrt(K)) meets its delta exactly (Balle-Wang), and count / privacy_id_count
    stds are in the ratio of their L2, K / sqrt(K). The ledger event carries std / L."""
    plan = plan_budget(params_for(noise), 1.0, 1e-6)
    for name, (l1, l2) in EXPECTED.items():
        m = plan.mechanism(name)
        assert (m.l1_sensitivity, m.l2_sensitivity) == (l1, l2), name
        assert m.to_dict()["l1_sensitivity"] == l1 and m.to_dict()["l2_sensitivity"] == l2
        assert m.noise_stddev is not None
        if noise == "laplace":
            assert m.noise_stddev == pytest.approx(math.sqrt(2) * l1 / m.epsilon, rel=1e-9)
            event_multiplier = m.noise_stddev / (math.sqrt(2) * l1)
        else:
            actual = gaussian_delta(m.noise_stddev, m.epsilon, l2)  # PyDP: within 1% of delta
            assert 0.98 * m.delta <= actual <= m.delta * (1 + 1e-6), (name, actual)
            event_multiplier = m.noise_stddev / l2
        assert mechanism_event(m).noise_multiplier == pytest.approx(event_multiplier)
    if noise == "gaussian":
        ratio = (
            plan.mechanism("count").noise_stddev / plan.mechanism("privacy_id_count").noise_stddev
        )
        assert ratio == pytest.approx(2.0, rel=1e-3)  # K / sqrt(K), K = 4


@pytest.mark.parametrize(("accounting", "noise"), [("zcdp", "gaussian"), ("pld", "laplace")])
def test_tight_accounting_noise_is_multiplier_times_sensitivity(accounting, noise):
    plan = plan_budget(params_for(noise), 1.0, 1e-6, accounting)
    for name, (l1, l2) in EXPECTED.items():
        m = plan.mechanism(name)
        assert m.noise_multiplier is not None
        expected = m.noise_multiplier * (l2 if noise == "gaussian" else math.sqrt(2) * l1)
        assert m.noise_stddev == pytest.approx(expected, rel=1e-9), name
        assert mechanism_event(m).noise_multiplier == m.noise_multiplier


def test_selection_percentiles_and_global_totals():
    """Private selection: a unit reaches at most K partitions (L0 = K). Percentile trees are
    calibrated for (L0, Linf) = (1, K). A global total: one partition, privacy_id_count
    sensitivity 1, count K."""
    plan = plan_budget(
        params_for("laplace", metrics=("count", "percentile(50)"), public=False), 1.0, 1e-6
    )
    assert plan.selection is not None and plan.selection.l0_sensitivity == 4
    assert plan.params.quantile_tree_bounds == (1, 4)
    assert plan.mechanism("percentile").l0_sensitivity == 1
    total = plan_budget(params_for("laplace", keyed=False), 1.0, 1e-6)
    assert total.mechanism("privacy_id_count").l1_sensitivity == 1.0
    assert total.mechanism("count").l1_sensitivity == 4.0


def test_the_spec_reaches_the_plan_and_the_tasks():
    bounds = {"max_contributions": 5, "min_value": 0, "max_value": 10}
    spec = spec_of({"bounds": bounds}, **{"partition_selection.public_partitions": "1..3"})
    plan = make_plan(spec)
    params = plan.queries[0].plan.params
    assert (params.max_contributions, params.max_partitions_contributed) == (5, 5)
    task = plan_tasks(spec, plan, []).tasks[0]
    assert (task.max_contributions, task.max_partitions_contributed) == (5, 5)
    assert task.max_contributions_per_partition == 5


@pytest.mark.parametrize(("accounting", "noise"), [("basic", "laplace"), ("zcdp", "gaussian")])
@pytest.mark.parametrize("metric", ["count", "privacy_id_count"])
def test_statistical_tier_the_noise_is_the_planned_one(accounting, noise, metric):
    """Variance of (released - exact) over 20,000 partitions against the std from the formula
    (basic Laplace: sqrt(2) L1 / epsilon; zCDP: multiplier x L2); tolerance from the sample
    variance's std, sigma^2 sqrt((kurtosis - 1) / n), failure rate 1e-6."""
    n = 20000
    plan = plan_budget(params_for(noise), 1.0, 1e-6, accounting)
    m = plan.mechanism(metric)
    l1, l2 = EXPECTED[metric]
    sigma = math.sqrt(2) * l1 / m.epsilon if accounting == "basic" else m.noise_multiplier * l2
    exact = pd.DataFrame(
        [(k, 7, 20, 123.0) for k in range(n)], columns=[KEY, "privacy_id_count", "count", "sum"]
    )
    draws = release_partitions(exact, [KEY], plan)[metric].to_numpy() - exact[metric].to_numpy()
    kurtosis = 6.0 if noise == "laplace" else 3.0
    ratio = float(np.var(draws)) / sigma**2
    assert abs(ratio - 1) <= Z_1E6 * math.sqrt((kurtosis - 1) / n), ratio


# ---------------------------------------------------------------------------------------------
# Engines: the same rule everywhere, and the sensitivity on neighbouring inputs

TARGET = 99
K = 4


def job_task(k: int = K):
    spec = spec_of({}, **{
        "metrics": ["count", "sum", "privacy_id_count"], "bounds.max_contributions": k,
        "bounds.min_value": 0.0, "bounds.max_value": 100.0,
        "partition_selection.public_partitions": "1..5",
    })  # fmt: skip
    plan = make_plan(spec)
    return plan.queries[0].plan, plan_tasks(spec, plan, []).tasks[0]


def rows_with_identity(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.reset_index(drop=True).assign(
        _source_file="day.parquet", _row=np.arange(1, len(frame) + 1)
    )


def mixed_rows(seed: int = 7) -> pd.DataFrame:
    """40 customers with 1 to 12 rows over 1 to 5 terminals (many above K), interleaved."""
    rng = np.random.default_rng(seed)
    rows = []
    for customer in range(40):
        terminals = rng.choice(np.arange(1, 6), size=rng.integers(1, 6), replace=False)
        for _ in range(int(rng.integers(1, 13))):
            rows.append((customer, int(rng.choice(terminals)), float(rng.uniform(-10, 120))))
    frame = pd.DataFrame(rows, columns=[UNIT, KEY, "TX_AMOUNT"])
    return rows_with_identity(frame.iloc[rng.permutation(len(frame))])


def neighbours() -> tuple[pd.DataFrame, pd.DataFrame]:
    """(D, D'): customers within K rows in all, and in D only the target with 5 rows worth 150
    at each of terminals 1..3, interleaved in the same file."""
    rng = np.random.default_rng(5)
    rows = []
    for customer in range(1, 12):
        for _ in range(int(rng.integers(1, K + 1))):
            rows.append((customer, int(rng.integers(1, 4)), float(rng.uniform(0, 100))))
    rows += [(TARGET, terminal, 150.0) for terminal in (1, 2, 3) for _ in range(5)]
    frame = pd.DataFrame(rows, columns=[UNIT, KEY, "TX_AMOUNT"])
    frame = frame.iloc[rng.permutation(len(frame))]
    return rows_with_identity(frame), rows_with_identity(frame[frame[UNIT] != TARGET])


def oracle(rows: pd.DataFrame, k: int) -> pd.DataFrame:
    """The rule in pandas: per customer the k rows of lowest (priority, clipped value), the
    priority xxhash64(linf secret, file, row) as `sampling` defines it."""
    keys = SamplingKeys.from_salt(SALT)
    frame = rows.assign(
        _value=rows["TX_AMOUNT"].clip(0.0, 100.0),
        _priority=row_priorities(keys, ["day.parquet"], np.zeros(len(rows), np.int64),
                                 rows["_row"].to_numpy()),
    )  # fmt: skip
    kept = frame.sort_values(["_priority", "_value"]).groupby(UNIT).head(k)
    return (
        kept.groupby(KEY)
        .agg(privacy_id_count=(UNIT, "nunique"), count=(UNIT, "size"), sum=("_value", "sum"))
        .reset_index()
    )


def bound_local(rows: pd.DataFrame, task) -> pd.DataFrame:
    frame = pl.from_pandas(rows).with_columns(pl.col("_source_file").cast(pl.Enum(["day.parquet"])))
    exact = aggregate_task(frame, task, UNIT, SamplingKeys.from_salt(SALT))
    return exact.sort_values(KEY, ignore_index=True)


def bound_spark(rows: pd.DataFrame, task, spark) -> pd.DataFrame:
    from dppipeline.engines.spark.aggregate import bound_and_aggregate, to_aggregates_frame

    exact = bound_and_aggregate(spark.createDataFrame(rows).repartition(3), task, UNIT, SALT)
    return to_aggregates_frame(exact.toPandas(), task).sort_values(KEY, ignore_index=True)


def bound_beam(inputs: list[pd.DataFrame], task, folder) -> list[pd.DataFrame]:
    """BoundContributions + AggregatePerPartition of each input in one pipeline (bundles of
    7 rows); results come back through files (the matcher runs on a pickled copy)."""
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that

    from dppipeline.engines.beam.bound import BoundContributions
    from dppipeline.engines.beam.shard_release import AggregatePerPartition

    targets = [folder / f"beam-{i}.parquet" for i in range(len(inputs))]

    def keeper(target):
        def keep(parts):
            pd.concat([p for _, p in parts]).to_parquet(target)

        return keep

    with TestPipeline() as pipeline:
        for i, rows in enumerate(inputs):
            frame = pl.from_pandas(rows.drop(columns=["_source_file"]))
            elements = [("day.parquet", frame.slice(j, 7)) for j in range(0, frame.height, 7)]
            aggregates = (
                pipeline
                | f"Create{i}" >> beam.Create(elements, reshuffle=False)
                | f"Bound{i}" >> BoundContributions(task, UNIT, 2, 2, SALT)
                | f"Aggregate{i}" >> AggregatePerPartition(task)
            )
            assert_that(aggregates, keeper(targets[i]), label=f"Keep{i}")
    return [pd.read_parquet(t).sort_values(KEY, ignore_index=True) for t in targets]


COLUMNS = ["privacy_id_count", "count", "sum"]


def bounded_on(engine: str, inputs: list[pd.DataFrame], task, request, tmp_path):
    if engine == "spark":
        spark = request.getfixturevalue("spark")
        return [bound_spark(rows, task, spark) for rows in inputs]
    if engine == "beam":
        return bound_beam(inputs, task, tmp_path)
    return [bound_local(rows, task) for rows in inputs]


@pytest.mark.parametrize("engine", ["local", "spark", "beam"])
def test_every_engine_keeps_the_rule_and_bounds_a_unit_to_its_sensitivity(
    engine, request, tmp_path
):
    """Exact tier: each engine's bounded aggregates equal the pandas oracle of the rule (mixed
    data, most customers above K). Neighbours: D and D' (D' without the target, whose 15
    rows span 3 terminals) differ by exactly the target's K kept rows: count shifts sum to K
    (L1 = K, L2 <= K), sum shifts to 100 K, privacy_id_count in at most K partitions."""
    _, task = job_task()
    mixed = mixed_rows()
    d, d_prime = neighbours()
    got_mixed, got_d, got_d_prime = bounded_on(engine, [mixed, d, d_prime], task, request, tmp_path)
    for got, rows in ((got_mixed, mixed), (got_d, d), (got_d_prime, d_prime)):
        truth = oracle(rows, K).sort_values(KEY, ignore_index=True)
        assert got[KEY].astype(int).tolist() == truth[KEY].tolist()
        np.testing.assert_allclose(got[COLUMNS].to_numpy(float), truth[COLUMNS].to_numpy(float))
    a, b = (
        f.set_index(KEY)[COLUMNS].reindex([1, 2, 3], fill_value=0) for f in (got_d, got_d_prime)
    )
    shift = (a - b).astype(float)
    count, total, units = shift["count"], shift["sum"], shift["privacy_id_count"]
    assert count.min() >= 0 and count.sum() == K and math.hypot(*count) <= K
    np.testing.assert_allclose(total.sum(), 100.0 * K)
    assert units.isin([0, 1]).all() and 1 <= units.sum() <= min(K, 3)
    assert ((count > 0) == (units > 0)).all()


@pytest.mark.parametrize("engine", ["local", "spark", "beam"])
def test_exact_tier_of_a_release_at_huge_epsilon(small_inputs, tmp_path, engine, request):
    """The whole run on each engine, K at least every customer's rows, epsilon 1e7: the
    release equals the truth (within Z(1e-6) noise stds, which are tiny); the mean is the
    true mean, and the median from the quantile trees (calibrated for L0 = 1, Linf = K) lies
    between each terminal's 30th and 70th percentiles."""
    if engine == "spark":
        request.getfixturevalue("spark")
    rows = pl.read_parquet(sorted(small_inputs["parquet"].glob("*/*.parquet")))
    most = int(rows.group_by(UNIT).len().get_column("len").max())
    overrides = {
        "bounds.max_partitions_contributed": None,  # release_small's pair, unset
        "bounds.max_contributions_per_partition": None,
        "bounds.max_contributions": most,
        "budget.epsilon": 1e7,
        "metrics": ["count", "sum", "mean", "privacy_id_count", "percentile(50)"],
    }
    released, manifest = release_small(small_inputs, tmp_path, engine, **overrides)
    query = manifest["queries"]["terminal_stats"]
    assert query["bounds"]["max_contributions"] == most
    assert query["budget_split"]["count"]["l2_sensitivity"] == most
    truth = terminal_truth(rows, 0.0, 150.0)
    merged = released.merge(truth, on=KEY, suffixes=("", "_true"))
    # Laplace noise (the default): P(|X| > t) = exp(-t * sqrt(2) / std), so t below fails
    # with probability FAILURE_RATE over all 3 x partitions values (a normal quantile here
    # gave 5.8 std, which Laplace noise exceeds about 4% of the runs).
    z = math.log(3 * len(merged) / FAILURE_RATE) / math.sqrt(2)
    for metric in ("count", "sum", "privacy_id_count"):
        std = query["metrics"][metric]["noise_stddev"]
        assert std < (1.0 if metric != "sum" else 200.0), (metric, std)
        assert np.all(np.abs(merged[metric] - merged[f"{metric}_true"]) <= z * std), metric
    np.testing.assert_allclose(merged["mean"], merged["sum_true"] / merged["count_true"], rtol=1e-3)
    clipped = rows.with_columns(pl.col("TX_AMOUNT").clip(0.0, 150.0))
    spread = clipped.group_by(KEY).agg(
        pl.col("TX_AMOUNT").quantile(0.3).alias("low"),
        pl.col("TX_AMOUNT").quantile(0.7).alias("high"),
    )
    medians = merged.merge(spread.to_pandas(), on=KEY)
    assert len(medians) == len(merged) > 0
    column = next(c for c in released.columns if c.startswith("percentile"))
    leaf = 150.0 / 16**4  # the tree's resolution: height 4, branching 16
    outside = ~medians[column].between(medians["low"] - 2 * leaf, medians["high"] + 2 * leaf)
    assert not outside.any(), medians[outside]


def test_on_generated_data_the_share_kept_is_max_rows_per_ids(small_inputs):
    """The generated transactions (conftest's small set): the local engine's bounded count
    with K = 6 is sum_u min(n_u, K) from the customers' known row counts, Tumult's
    MaxRowsPerID(6) share, and above every L0 x Linf pair of product 6."""
    rows = pl.read_parquet(sorted(small_inputs["parquet"].glob("*/*.parquet")))
    n_u = rows.group_by(UNIT).len().get_column("len").to_numpy()
    keys = SamplingKeys.from_salt(SALT)

    def kept(**bounds) -> int:
        spec = spec_of({}, **{f"bounds.{k}": v for k, v in bounds.items()})
        task = plan_tasks(spec, make_plan(spec), []).tasks[0]
        return int(aggregate_task(rows, task, UNIT, keys)["count"].sum())

    total = kept(max_contributions=6)
    assert total == int(np.minimum(n_u, 6).sum()) and total < rows.height
    for l0, linf in [(1, 6), (2, 3), (3, 2), (6, 1)]:
        assert kept(max_partitions_contributed=l0, max_contributions_per_partition=linf) < total
