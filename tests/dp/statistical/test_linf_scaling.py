"""`bounds.linf_bounding: scale`: a (privacy unit, partition) pair of c rows counts min(c, Linf)
and adds its clipped sums times min(1, Linf / c), instead of Linf sampled rows.

What is checked: the spec (refused with the metrics that need kept rows and with
max_contributions; inherited from the job; the CLI flag; the task and the manifest); every
engine against a pandas oracle of the rule, with and without L0 sampling (the same pairs kept
on every engine); neighbouring inputs: removing one unit moves each partition by at most Linf
rows and Linf x the clipping bound, as sampling would; the statistical tier: the scaled sum is
the mean of the sampled sums over fresh salts; and a whole run on each engine at a huge
epsilon against the truth computed from the files.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import polars as pl
import pytest
from scipy.stats import norm
from support.data import release_small
from test_max_contributions import (
    KEY,
    SALT,
    UNIT,
    bound_beam,
    bound_local,
    bound_spark,
    rows_with_identity,
    spec_of,
)

from dppipeline.core.tasks import plan_tasks
from dppipeline.engines.kernel.bounding import aggregate_per_partition, sample_contributions
from dppipeline.engines.kernel.sampling import SamplingKeys, new_salt, row_priorities
from dppipeline.errors import SpecError
from dppipeline.lifecycle.runner import make_plan

LINF = 3
LOW, HIGH = 0.0, 100.0
HALF = (HIGH - LOW) / 2  # r: a row's deviation from the midpoint is at most this
FAILURE_RATE = 1e-6
ONE = {"max_partitions_contributed": 1, "max_contributions_per_partition": 1}  # as once implied

# ---------------------------------------------------------------------------------------------
# Spec


@pytest.mark.parametrize("metric", ["percentile(50)", "max", "min", "count_distinct(TX_ID)"])
def test_scale_is_refused_with_metrics_of_the_kept_rows(metric):
    raw = {
        "bounds": {"linf_bounding": "scale", "min_value": 0, "max_value": 10},
        "queries": [{"name": "q", "metrics": ["count", metric]}],
    }
    with pytest.raises(SpecError) as error:
        spec_of(raw)
    assert error.value.field == "queries.q.bounds.linf_bounding"
    assert "needs the kept rows" in error.value.rule


def test_a_query_bounding_total_rows_takes_not_the_jobs_scaling():
    """The job scales pairs; a query with max_contributions takes none of the job's L0/Linf
    kind of bounds, linf_bounding included (it would be refused with it)."""
    raw = {
        "bounds": {
            "linf_bounding": "scale",
            "max_partitions_contributed": 1,
            "max_contributions_per_partition": 3,
        },
        "queries": [{"name": "total", "bounds": {"max_contributions": 4}}, {"name": "pair"}],
    }
    spec = spec_of(raw)
    assert spec.query("total").bounds.linf_bounding == "sample"
    assert spec.query("pair").bounds.linf_bounding == "scale"


def test_scale_is_refused_with_max_contributions():
    with pytest.raises(SpecError) as error:
        spec_of({"bounds": {"linf_bounding": "scale", "max_contributions": 4}})
    assert error.value.field == "bounds.linf_bounding"
    assert "use sample with it" in error.value.rule


def test_the_job_default_reaches_queries_tasks_and_the_manifest_field():
    raw = {
        "bounds": {"linf_bounding": "scale", "min_value": 0, "max_value": 10, **ONE},
        "queries": [
            {"name": "scaled", "metrics": ["count", "sum", "mean", "variance"]},
            {"name": "sampled", "metrics": ["percentile(50)"],
             "bounds": {"linf_bounding": "sample"}},
        ],
    }  # fmt: skip
    spec = spec_of(raw)
    tasks = {t.name: t for t in plan_tasks(spec, make_plan(spec), []).tasks}
    assert tasks["scaled"].scaled and tasks["scaled"].sum_squares
    assert not tasks["sampled"].scaled
    flagged = spec_of({"bounds": ONE}, **{"bounds.linf_bounding": "scale"})
    assert flagged.queries[0].bounds.linf_bounding == "scale"


def test_cli_flag(capsys):
    """The flag reaches the spec: `scale` with a percentile is the spec's one-line error."""
    from dppipeline.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--linf-bounding", "trim", "--public-partitions", "1..5"])
    assert exit_.value.code == 2
    assert "invalid choice: 'trim'" in capsys.readouterr().err
    code = main(
        ["plan", "--linf-bounding", "scale", "--metrics", "count,percentile(50)",
         "--min-value", "0", "--max-value", "10", "--public-partitions", "1..5"]
    )  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--linf-bounding (bounds.linf_bounding): scale keeps no rows" in err
    assert len(err.splitlines()) == 1
    code = main(
        ["plan", "--linf-bounding", "scale", "--metrics", "count", "--public-partitions", "1..5",
         "--max-partitions-contributed", "1", "--max-contributions-per-partition", "1"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "Linf (max_contributions_per_partition)=1 (scaled pairs)" in out


# ---------------------------------------------------------------------------------------------
# The rule on every engine


def task_of(l0: int, metrics=("count", "sum", "privacy_id_count", "variance")):
    spec = spec_of({}, **{
        "metrics": list(metrics), "bounds.linf_bounding": "scale",
        "bounds.max_partitions_contributed": l0,
        "bounds.max_contributions_per_partition": LINF,
        "bounds.min_value": LOW, "bounds.max_value": HIGH,
        "partition_selection.public_partitions": "1..5",
    })  # fmt: skip
    return plan_tasks(spec, make_plan(spec), []).tasks[0]


def mixed_rows(seed: int = 11) -> pd.DataFrame:
    """30 customers, 1 to 4 terminals each, 1 to 9 rows per terminal (most pairs above Linf),
    values from -20 to 130 (some clipped), interleaved."""
    rng = np.random.default_rng(seed)
    rows = [
        (customer, int(terminal), float(rng.uniform(-20, 130)))
        for customer in range(30)
        for terminal in rng.choice(np.arange(1, 6), size=rng.integers(1, 5), replace=False)
        for _ in range(int(rng.integers(1, 10)))
    ]
    frame = pd.DataFrame(rows, columns=[UNIT, KEY, "TX_AMOUNT"])
    return rows_with_identity(frame.iloc[rng.permutation(len(frame))])


def oracle(rows: pd.DataFrame) -> pd.DataFrame:
    """The rule in pandas, every pair kept (L0 at least every customer's terminals)."""
    value = rows["TX_AMOUNT"].clip(LOW, HIGH)
    pairs = (
        rows.assign(_v=value, _v2=(value - (LOW + HIGH) / 2) ** 2)
        .groupby([UNIT, KEY])
        .agg(c=("_v", "size"), s=("_v", "sum"), s2=("_v2", "sum"))
        .reset_index()
    )
    scale = np.minimum(1.0, LINF / pairs["c"])
    pairs = pairs.assign(
        count=np.minimum(pairs["c"], LINF),
        sum=pairs["s"] * scale,
        centred_squares=pairs["s2"] * scale,
    )
    return (
        pairs.groupby(KEY)
        .agg(privacy_id_count=(UNIT, "size"), count=("count", "sum"), sum=("sum", "sum"),
             centred_squares=("centred_squares", "sum"))
        .reset_index()
    )  # fmt: skip


COLUMNS = ["privacy_id_count", "count", "sum", "centred_squares"]


def bounded_on(engine, inputs, task, request, tmp_path) -> list[pd.DataFrame]:
    if engine == "spark":
        spark = request.getfixturevalue("spark")
        return [bound_spark(rows, task, spark) for rows in inputs]
    if engine == "beam":
        tmp_path.mkdir()
        return bound_beam(inputs, task, tmp_path)
    return [bound_local(rows, task) for rows in inputs]


TARGET = 99


def neighbours() -> tuple[pd.DataFrame, pd.DataFrame]:
    """(D, D'): D' = mixed rows; D adds the target with 7 rows worth 150 (clipped to 100) at
    each of terminals 1..3, in the same file."""
    base = mixed_rows(12).drop(columns=["_source_file", "_row"])
    target = pd.DataFrame(
        [(TARGET, t, 150.0) for t in (1, 2, 3) for _ in range(7)], columns=[UNIT, KEY, "TX_AMOUNT"]
    )
    d = pd.concat([base, target]).sample(frac=1.0, random_state=3)
    return rows_with_identity(d), rows_with_identity(d[d[UNIT] != TARGET])


@pytest.mark.parametrize("engine", ["local", "spark", "beam"])
def test_every_engine_scales_pairs_by_the_rule(engine, request, tmp_path):
    """Exact tier: with L0 = 5 (every pair kept) each engine equals the pandas oracle; with
    L0 = 2 its counts stay within the oracle's (a subset of pairs) and every engine keeps the
    same pairs (checked against local). Neighbours (L0 = 5): the target's three pairs of 7
    rows move count by exactly Linf and sum by exactly 100 Linf in each of terminals 1..3."""
    rows = mixed_rows()
    d, d_prime = neighbours()
    wide, sampled = task_of(5), task_of(2)
    got = bounded_on(engine, [rows, d, d_prime], wide, request, tmp_path / "wide")
    for frame, source in zip(got, (rows, d, d_prime), strict=True):
        truth = oracle(source).sort_values(KEY, ignore_index=True)
        assert frame[KEY].astype(int).tolist() == truth[KEY].tolist()
        np.testing.assert_allclose(frame[COLUMNS].to_numpy(float), truth[COLUMNS].to_numpy(float))
    a, b = (f.set_index(KEY)[COLUMNS].reindex(range(1, 6), fill_value=0) for f in got[1:])
    shift = (a - b).astype(float)
    assert shift["count"].tolist() == [LINF] * 3 + [0, 0]
    # Spark adds a partition's pairs in any order: float sums differ in the last bits.
    np.testing.assert_allclose(shift["sum"], [HIGH * LINF] * 3 + [0, 0], atol=1e-6)
    np.testing.assert_allclose(shift["centred_squares"], [HALF**2 * LINF] * 3 + [0, 0], atol=1e-4)
    (fewer,) = bounded_on(engine, [rows], sampled, request, tmp_path / "l0")
    truth = oracle(rows).set_index(KEY)
    assert (fewer.set_index(KEY)["count"] <= truth["count"].reindex(fewer[KEY])).all()
    assert fewer["privacy_id_count"].sum() < truth["privacy_id_count"].sum()
    if engine != "local":
        local = bound_local(rows, sampled)
        pd.testing.assert_frame_equal(
            fewer[[KEY, *COLUMNS]].astype(float), local[[KEY, *COLUMNS]].astype(float)
        )


def test_each_unit_moves_a_partition_by_at_most_linf_rows_whatever_its_rows():
    """Neighbours on the numpy path, 200 random targets: removing one unit (1 to 40 rows per
    pair, values anywhere) moves each partition's count by at most Linf, its sum by at most
    Linf x max(|low|, |high|) and its centred sum of squares by at most Linf x r^2."""
    rng = np.random.default_rng(0)
    keys = SamplingKeys.from_salt(SALT)
    base = mixed_rows(21)
    for trial in range(200):
        sizes = rng.integers(1, 41, size=3)
        target = pd.DataFrame(
            {UNIT: TARGET, KEY: np.repeat([1, 2, 3], sizes),
             "TX_AMOUNT": rng.uniform(-1e3, 1e3, size=sizes.sum())}
        )  # fmt: skip
        d = rows_with_identity(pd.concat([base.drop(columns=["_source_file", "_row"]), target]))
        d_prime = d[d[UNIT] != TARGET]
        a, b = (aggregated(frame, keys) for frame in (d, d_prime))
        shift = (a - b).abs()
        assert (shift["count"] <= LINF).all(), trial
        assert (shift["sum"] <= LINF * max(abs(LOW), abs(HIGH)) * (1 + 1e-12)).all(), trial
        bound = LINF * HALF**2 * (1 + 1e-12)
        assert (shift["centred_squares"] <= bound).all(), trial


def aggregated(rows: pd.DataFrame, keys: SamplingKeys, *, scaled: bool = True) -> pd.DataFrame:
    """Scaled (or sampled) bounded aggregates of terminals 1..5 on the numpy path, L0 = 5."""
    units, _ = pd.factorize(rows[UNIT])
    terminal = rows[KEY].to_numpy() - 1
    values = rows["TX_AMOUNT"].clip(LOW, HIGH).to_numpy()
    priority = row_priorities(keys, ["f"], np.zeros(len(rows), np.int64), rows["_row"].to_numpy())
    sample = sample_contributions(
        units.astype(np.int64), terminal, n_keys=5, max_partitions_contributed=5,
        max_contributions_per_partition=LINF, row_priority=priority,
        pair_priority=lambda u, k: u.astype(np.int64) * 5 + k, values=values, scaled=scaled,
    )  # fmt: skip
    bounded = aggregate_per_partition(
        sample, terminal, values, 5, sum_squares=True, centre=(LOW + HIGH) / 2
    )
    frame = pd.DataFrame(
        {"count": bounded.count, "sum": bounded.sum, "centred_squares": bounded.centred_squares},
        index=bounded.key_codes,
    )
    return frame.reindex(range(5), fill_value=0).astype(float)


def test_statistical_tier_the_scaled_sum_is_the_mean_of_the_sampled_ones():
    """Sampling Linf of a pair's c rows uniformly adds Linf/c of its sum in expectation; the
    scaled sum is that expectation with no sampling variance. Over 400 fresh salts the mean
    of the sampled per-partition sums is within Z(1e-6) standard errors of the scaled sum
    (the standard error from the 400 draws themselves), and the scaled sum never varies."""
    rows = mixed_rows(5)
    scaled = aggregated(rows, SamplingKeys.from_salt(new_salt(1)))
    again = aggregated(rows, SamplingKeys.from_salt(new_salt(2)))
    pd.testing.assert_frame_equal(scaled, again)
    draws = np.array(
        [
            aggregated(rows, SamplingKeys.from_salt(new_salt(100 + i)), scaled=False)["sum"]
            for i in range(400)
        ]
    )
    z = float(norm.isf(FAILURE_RATE / 2 / 5))  # five partitions
    se = draws.std(axis=0, ddof=1) / math.sqrt(len(draws))
    assert (se > 0).all()  # sampling does vary: heavy pairs exist
    assert np.all(np.abs(draws.mean(axis=0) - scaled["sum"].to_numpy()) <= z * se)


# ---------------------------------------------------------------------------------------------
# A whole run


@pytest.mark.parametrize("engine", ["local", "spark", "beam"])
def test_a_run_at_huge_epsilon_releases_the_scaled_truth(small_inputs, tmp_path, engine, request):
    """`dppipeline run` semantics on each engine (release_small: L0 50 keeps every pair),
    Linf 2, epsilon 1e7: count and sum equal the rule computed from the files within
    Z(1e-6) noise stds; the manifest says the bounding."""
    if engine == "spark":
        request.getfixturevalue("spark")
    overrides = {
        "bounds.max_contributions_per_partition": 2,
        "bounds.linf_bounding": "scale",
        "budget.epsilon": 1e7,
    }
    released, manifest = release_small(small_inputs, tmp_path, engine, **overrides)
    query = manifest["queries"]["terminal_stats"]
    assert query["bounds"]["linf_bounding"] == "scale"
    rows = pl.read_parquet(sorted(small_inputs["parquet"].glob("*/*.parquet"))).to_pandas()
    value = rows["TX_AMOUNT"].clip(0.0, 150.0)
    pairs = rows.assign(_v=value).groupby([UNIT, KEY])["_v"].agg(["size", "sum"]).reset_index()
    assert pairs["size"].max() > 2  # the rule is exercised
    pairs["count"] = np.minimum(pairs["size"], 2)
    pairs["scaled"] = pairs["sum"] * np.minimum(1.0, 2 / pairs["size"])
    truth = pairs.groupby(KEY).agg(count=("count", "sum"), sum=("scaled", "sum")).reset_index()
    merged = released.merge(truth, on=KEY, suffixes=("", "_true"))
    assert len(merged) == len(truth) > 0
    z = math.log(2 * len(merged) / FAILURE_RATE) / math.sqrt(2)  # Laplace tails
    for metric in ("count", "sum"):
        std = query["metrics"][metric]["noise_stddev"]
        assert np.all(np.abs(merged[metric] - merged[f"{metric}_true"]) <= z * std), metric


# ---------------------------------------------------------------------------------------------
# Rounding: bounds far from zero for their width (the spec allows them: within +-1e15, at
# least 1e-100 wide). The release centres the variance's sums, Q - 2 m S + m^2 n: a difference
# of numbers near m^2 n. Summing a heavy pair's raw values first left one unit a rounding error
# growing with its rows (an audit found 20x the sensitivity at 1e5 rows); scaled pairs sum
# deviations from m instead.

FAR = (1e7, 1e7 + 1.0)
HEAVY_ROWS = 100_000


class _Bounds:
    midpoint = (FAR[0] + FAR[1]) / 2
    half_range = (FAR[1] - FAR[0]) / 2


FAR_SENSITIVITY = _Bounds.half_range**2 / 2  # centred_sum_of_squares, Linf = 1


def one_heavy_unit() -> pd.DataFrame:
    """One customer with HEAVY_ROWS rows in one terminal, values within FAR."""
    values = np.random.default_rng(5).uniform(*FAR, HEAVY_ROWS)
    return rows_with_identity(pd.DataFrame({UNIT: 1, KEY: 1, "TX_AMOUNT": values}))


def far_task(scaled: bool):
    spec = spec_of({}, **{
        "metrics": ["count", "variance"], "bounds.linf_bounding": "scale" if scaled else "sample",
        "bounds.max_partitions_contributed": 1, "bounds.max_contributions_per_partition": 1,
        "bounds.min_value": FAR[0], "bounds.max_value": FAR[1],
        "partition_selection.public_partitions": "1..5",
    })  # fmt: skip
    return plan_tasks(spec, make_plan(spec), []).tasks[0]


@pytest.mark.parametrize("engine", ["local", "spark"])
@pytest.mark.parametrize("scaled", [False, True], ids=["sampled", "scaled"])
def test_one_unit_moves_the_centred_squares_by_at_most_their_sensitivity(engine, scaled, request):
    """The centred sum of squares the release noises, of a partition holding only one unit,
    is that unit's whole contribution: within r^2/2 x Linf (to 1e-6), sampled or scaled."""
    from dppipeline.core.mechanisms import centred_squares_term

    rows, task = one_heavy_unit(), far_task(scaled)
    if engine == "spark":
        exact = bound_spark(rows, task, request.getfixturevalue("spark"))
    else:
        exact = bound_local(rows, task)
    assert exact["count"].tolist() == [1]
    term = float(centred_squares_term(exact, _Bounds())[0])  # type: ignore[arg-type]
    assert abs(term) <= FAR_SENSITIVITY * (1 + 1e-6)


def test_spark_multi_query_path_scales_pairs_as_the_one_query_path(spark):
    """A job of several queries bounds rows `shuffled_by_unit` (by_unit=True): its scaled
    pairs equal the oracle (L0 = 5) and the local engine's (L0 = 2)."""
    from dppipeline.engines.spark.aggregate import bound_and_aggregate, to_aggregates_frame
    from dppipeline.engines.spark.bound import shuffled_by_unit

    rows = mixed_rows()
    shuffled = shuffled_by_unit(spark.createDataFrame(rows).repartition(3), UNIT, SALT)
    for l0 in (5, 2):
        task = task_of(l0)
        exact = bound_and_aggregate(shuffled, task, UNIT, SALT, by_unit=True)
        got = to_aggregates_frame(exact.toPandas(), task).sort_values(KEY, ignore_index=True)
        want = oracle(rows) if l0 == 5 else bound_local(rows, task)
        want = want.sort_values(KEY, ignore_index=True)
        np.testing.assert_allclose(got[COLUMNS].to_numpy(float), want[COLUMNS].to_numpy(float))
