"""`count_distinct(COLUMN)` (issue 20): distinct non-null COLUMN values among a partition's kept
rows, noised like count (docs/explanation/count_distinct.md).

Tiers: exact at a huge epsilon on every engine against pandas (bounds that keep every row), and
with bounds that bind (engines agree with each other under one salt; a unique column counts
the kept rows); statistical (the released noise has the manifest's std, tolerance from the
sample variance's distribution, failure rate 1e-6); noise present. The sensitivity the plan
states is checked against the local engine's aggregation on neighbouring inputs (hypothesis).
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import norm
from support.data import START
from support.engines import engine_named

from dppipeline.cli.main import main
from dppipeline.core.plan import AggregationParams
from dppipeline.core.planner import plan_budget
from dppipeline.core.tasks import AggregationTask, KeyColumn, check_query_columns
from dppipeline.engines.kernel.polars_read import ROW, SOURCE
from dppipeline.engines.kernel.polars_tasks import aggregate_task
from dppipeline.engines.kernel.sampling import SamplingKeys, new_salt
from dppipeline.errors import SpecError, UsageError
from dppipeline.lifecycle.runner import run_job
from dppipeline.spec.metrics import metric_column, parse_metric
from dppipeline.spec.model import build_spec

DISTINCT_TX = "count_distinct(TRANSACTION_ID)"
DISTINCT_TIME = "count_distinct(TX_DATETIME)"
DISTINCT_TERMINAL = "count_distinct(TERMINAL_ID)"
LOOSE = {"max_partitions_contributed": 50, "max_contributions_per_partition": 100}
TIGHT = {"max_partitions_contributed": 2, "max_contributions_per_partition": 2}
ONE = {"max_partitions_contributed": 1, "max_contributions_per_partition": 1}
ONE_FLAGS = {f"bounds.{name}": value for name, value in ONE.items()}
TERMINALS = "0..59"  # 50 terminals with data, 10 empty
Z = float(norm.isf(0.5e-6))  # two-sided failure rate 1e-6


def queries(bounds_tight: dict) -> list[dict]:
    """Per terminal (unique and near-unique columns) and per day (terminals: values shared
    by many customers), with bounds that keep everything and with bounds that bind."""
    return [
        {
            "name": "per_terminal",
            "metrics": ["count", DISTINCT_TX, DISTINCT_TIME, "privacy_id_count"],
            "bounds": LOOSE,
            "partition_selection": {"public_partitions": TERMINALS},
        },
        {
            "name": "per_day",
            "partition_by": ["day"],
            "metrics": ["count", DISTINCT_TERMINAL],
            "bounds": LOOSE,
            "partition_selection": {"public_partitions": "input_range"},
        },
        {
            "name": "tight_terminal",
            "metrics": ["count", DISTINCT_TX, DISTINCT_TIME],
            "bounds": bounds_tight,
            "partition_selection": {"public_partitions": TERMINALS},
        },
        {
            "name": "tight_day",
            "partition_by": ["day"],
            "metrics": ["count", DISTINCT_TERMINAL],
            "bounds": {"max_partitions_contributed": 1, "max_contributions_per_partition": 3},
            "partition_selection": {"public_partitions": "input_range"},
        },
    ]


def run(inputs: Path, out: Path, engine, epsilon: float, seed: int | None = None, **extra):
    raw = {
        "name": "distinct",
        "budget": {"epsilon": epsilon, "delta": 1e-6},
        "input": {"path": str(inputs), "format": "parquet"},
        "output": str(out),
        "queries": queries(TIGHT),
        **extra,
    }
    result = run_job(build_spec(raw), engine, echo=lambda _: None, seed=seed)
    manifest = result.manifest.model_dump(mode="json", exclude_unset=True)
    released = {}
    for name in manifest["queries"]:
        frame = pd.read_parquet(result.output / name)
        key = "TERMINAL_ID" if "TERMINAL_ID" in frame else "day"
        released[name] = frame.sort_values(key, ignore_index=True)
    return released, manifest


@pytest.fixture(scope="module")
def exact_runs(small_inputs, tmp_path_factory, request):
    """One exact run per engine (all four queries in one job), the same salt for all."""
    out = tmp_path_factory.mktemp("distinct")
    return {
        name: run(small_inputs["parquet"], out / name, engine_named(name, request), 1e9, seed=7)
        for name in ("local", "spark", "beam")
    }


# --- spec ------------------------------------------------------------------------------------


def test_the_metric_parses_to_one_canonical_form_and_column():
    assert parse_metric(" count_distinct( TERMINAL_ID ) ") == "count_distinct(TERMINAL_ID)"
    assert metric_column("count_distinct(TX_DATETIME)") == "count_distinct_TX_DATETIME"
    spec = build_spec({}, {"metrics": f"count,{DISTINCT_TX},{DISTINCT_TIME}", **ONE_FLAGS})
    assert spec.queries[0].metrics == ("count", DISTINCT_TX, DISTINCT_TIME)
    for bad in ("count_distinct()", "count_distinct(1X)", "count_distinct(A, B)"):
        with pytest.raises(SpecError, match=r"count_distinct\(COLUMN\)"):
            parse_metric(bad)
    with pytest.raises(SpecError, match="twice"):
        build_spec({}, {"metrics": [DISTINCT_TX, " count_distinct(TRANSACTION_ID)"], **ONE_FLAGS})


def test_the_privacy_unit_and_unknown_columns_are_refused_in_one_line():
    with pytest.raises(UsageError, match="counts privacy units: use privacy_id_count"):
        build_spec({}, {"metrics": ["count_distinct(CUSTOMER_ID)"], **ONE_FLAGS})
    with pytest.raises(UsageError, match="'MERCHANT' is not an input column"):
        build_spec({}, {"metrics": ["count_distinct(MERCHANT)"], **ONE_FLAGS})
    check_query_columns(build_spec({}, {"metrics": [DISTINCT_TX, DISTINCT_TERMINAL], **ONE_FLAGS}))


# --- sensitivity and noise plan ----------------------------------------------------------------


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
@pytest.mark.parametrize("count_noise", ["continuous", "discrete"])
def test_each_distinct_metric_is_a_count_mechanism_with_its_own_share(noise, count_noise):
    """Sensitivities L1 = L0 Linf, L2 = sqrt(L0) Linf, Linf = Linf: count's, and so its std."""
    params = AggregationParams(
        metrics=("count", DISTINCT_TX, DISTINCT_TIME),
        noise=noise,
        max_partitions_contributed=4,
        max_contributions_per_partition=3,
        min_value=None,
        max_value=None,
        public_partitions=True,
        count_noise=count_noise,
    )
    plan = plan_budget(params, 1.5, 1e-6)
    names = [m.name for m in plan.mechanisms]
    assert names == ["count", "count_distinct_TRANSACTION_ID", "count_distinct_TX_DATETIME"]
    count = plan.mechanism("count")
    for name in names[1:]:
        m = plan.mechanism(name)
        assert (m.l0_sensitivity, m.linf_sensitivity) == (4, 3)
        assert (m.l1_sensitivity, m.l2_sensitivity) == (12, 2 * 3)
        assert math.isclose(m.epsilon, 0.5) and m.discrete == (count_noise == "discrete")
        assert m.noise_stddev == count.noise_stddev
    if noise == "laplace" and count_noise == "continuous":  # b = L1 / epsilon, std = sqrt(2) b
        assert math.isclose(plan.metric_noise_stddev(DISTINCT_TX), math.sqrt(2) * 12 / 0.5)


def test_under_max_contributions_the_sensitivity_is_counts():
    spec = build_spec({}, {"metrics": [DISTINCT_TX], "bounds.max_contributions": 5,
                           "partition_selection.public_partitions": "1..3"})  # fmt: skip
    params = AggregationParams.from_query(spec.queries[0], "gaussian", count_noise="continuous")
    m = plan_budget(params, 1.0, 1e-6).mechanism("count_distinct_TRANSACTION_ID")
    assert (m.l1_sensitivity, m.l2_sensitivity) == (5, 5)


# --- neighbouring inputs: the local engine's aggregation against the plan's sensitivity -------

UNIT = "CUSTOMER_ID"


def neighbour_task(l0: int, linf: int, total: int | None) -> AggregationTask:
    return AggregationTask(
        name="q",
        filter=None,
        keys=(KeyColumn("TERMINAL_ID"),),
        value="TX_AMOUNT",
        clip=None,
        max_partitions_contributed=total or l0,
        max_contributions_per_partition=total or linf,
        max_contributions=total,
        distinct=("TRANSACTION_ID",),
    )


def distinct_by_key(rows: pd.DataFrame, task: AggregationTask, salt: bytes) -> pd.Series:
    frame = pl.from_pandas(rows)
    exact = aggregate_task(frame, task, UNIT, SamplingKeys.from_salt(salt))
    return exact.set_index("TERMINAL_ID")["count_distinct_TRANSACTION_ID"]


tables = st.lists(
    st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 5)), min_size=1, max_size=40
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=tables,
    removed=st.integers(0, 4),
    l0=st.integers(1, 3),
    linf=st.integers(1, 3),
    total=st.none() | st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_property_removing_one_customer_moves_distinct_counts_within_the_sensitivity(
    rows, removed, l0, linf, total, seed
):
    """Rows (customer, terminal, value) with stable identities (file, row), so every other
    customer keeps the same rows under one salt. Removing a customer only removes values: each
    partition's count drops by 0..Linf, in at most L0 partitions, and the change's L1 and L2
    norms stay within what the plan's mechanism is calibrated for (under max_contributions K:
    K in all)."""
    table = pd.DataFrame(rows, columns=[UNIT, "TERMINAL_ID", "TRANSACTION_ID"]).astype("int64")
    table["TX_AMOUNT"] = 1.0
    table[SOURCE] = "f"
    table[ROW] = np.arange(len(table), dtype=np.int64)
    task = neighbour_task(l0, linf, total)
    salt = new_salt(seed)
    before = distinct_by_key(table, task, salt)
    after = distinct_by_key(table[table[UNIT] != removed], task, salt)
    change = before.sub(after, fill_value=0).to_numpy()
    assert (change >= 0).all(), change  # removing rows never adds a value
    params = AggregationParams(
        metrics=("count_distinct(TRANSACTION_ID)",),
        noise="laplace",
        max_partitions_contributed=task.max_partitions_contributed,
        max_contributions_per_partition=task.max_contributions_per_partition,
        min_value=None,
        max_value=None,
        public_partitions=True,
        max_contributions=total,
        count_noise="continuous",
    )
    m = plan_budget(params, 1.0, 0.0).mechanism("count_distinct_TRANSACTION_ID")
    assert change.max(initial=0) <= m.linf_sensitivity
    assert (change > 0).sum() <= m.l0_sensitivity
    assert change.sum() <= m.l1_sensitivity
    assert math.sqrt((change**2).sum()) <= m.l2_sensitivity + 1e-12
    if total is None:
        assert change.max(initial=0) <= linf and (change > 0).sum() <= l0
    else:
        assert change.sum() <= total


# --- exact tier -------------------------------------------------------------------------------


def with_day(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.assign(day=rows["TX_DATETIME"].dt.date)


@pytest.mark.spark  # exact_runs runs every engine, whatever the parameter
@pytest.mark.beam
@pytest.mark.parametrize("engine", ["local", "spark", "beam"])
def test_exact_at_a_huge_epsilon_equals_pandas_when_bounds_keep_every_row(
    small_inputs, exact_runs, engine
):
    released, manifest = exact_runs[engine]
    rows = with_day(pd.read_parquet(small_inputs["parquet"]))
    truth = rows.groupby("TERMINAL_ID").agg(
        tx=("TRANSACTION_ID", "nunique"), time=("TX_DATETIME", "nunique")
    )
    got = released["per_terminal"].set_index("TERMINAL_ID")
    assert len(got) == 60
    expected = truth.reindex(got.index, fill_value=0)
    np.testing.assert_array_equal(got["count_distinct_TRANSACTION_ID"], expected["tx"])
    np.testing.assert_array_equal(got["count_distinct_TX_DATETIME"], expected["time"])
    assert list(got.columns) == [
        "count", "privacy_id_count", "count_distinct_TRANSACTION_ID", "count_distinct_TX_DATETIME",
    ]  # fmt: skip
    assert got["count_distinct_TRANSACTION_ID"].dtype == np.int64  # discrete noise: integers
    # Terminals per day: every value shared by many customers.
    per_day = released["per_day"].set_index("day")
    terminals = rows.groupby("day")["TERMINAL_ID"].nunique()
    assert list(per_day.index) == [START + dt.timedelta(days=d) for d in range(3)]
    np.testing.assert_array_equal(per_day["count_distinct_TERMINAL_ID"], terminals.to_numpy())
    entry = manifest["queries"]["per_terminal"]["metrics"][DISTINCT_TX]
    assert entry["column"] == "count_distinct_TRANSACTION_ID"
    assert entry["mechanisms"] == ["count_distinct_TRANSACTION_ID"]
    split = manifest["queries"]["per_terminal"]["budget_split"]["count_distinct_TRANSACTION_ID"]
    assert (split["l0_sensitivity"], split["linf_sensitivity"]) == (50, 100)


@pytest.mark.spark  # exact_runs runs every engine, whatever the parameter
@pytest.mark.beam
def test_exact_with_binding_bounds_engines_agree_and_count_only_kept_rows(exact_runs, small_inputs):
    """L0 = 2, Linf = 2 keep far fewer rows than there are: the distinct count is of the kept
    rows (a unique id counts them exactly), at most the count, the same on every engine given
    one salt."""
    rows = pd.read_parquet(small_inputs["parquet"])
    all_ids = rows.groupby("TERMINAL_ID")["TRANSACTION_ID"].nunique()
    local = exact_runs["local"][0]
    for name in ("tight_terminal", "tight_day"):
        for engine in ("spark", "beam"):
            pd.testing.assert_frame_equal(exact_runs[engine][0][name], local[name])
    tight = local["tight_terminal"].set_index("TERMINAL_ID")
    np.testing.assert_array_equal(tight["count_distinct_TRANSACTION_ID"], tight["count"])
    assert (tight["count_distinct_TX_DATETIME"] <= tight["count"]).all()
    assert tight["count"].sum() < 0.5 * len(rows)  # the bounds bind
    before_bounding = all_ids.reindex(tight.index, fill_value=0)
    assert (tight["count_distinct_TRANSACTION_ID"] < before_bounding).any()
    day = local["tight_day"]
    assert (day["count_distinct_TERMINAL_ID"] <= day["count"]).all()
    assert (day["count_distinct_TERMINAL_ID"] < day["count"]).any()  # values shared


# --- statistical tier and noise present --------------------------------------------------------


@pytest.mark.parametrize(
    ("noise", "count_noise", "kurtosis"),
    [("laplace", "continuous", 6.0), ("gaussian", "discrete", 3.0)],
)
def test_noise_has_the_manifests_std(small_inputs, tmp_path, noise, count_noise, kurtosis):
    """2,000 public terminals (1,950 empty: noise on zeros), two distinct metrics, one run on
    the local engine: 4,000 draws of released - exact. The mean square over std^2 has standard
    deviation sqrt((kurtosis - 1) / n) (6 for Laplace, 3 for Gaussian; their discrete versions
    at these scales within 1e-6); tolerance Z of those, failure rate 1e-6. Noise present: the
    values are not the exact ones and have the release's type."""
    raw = {
        "name": "noisy",
        "budget": {"epsilon": 1.0, "delta": 1e-6},
        "noise": noise,
        "count_noise": count_noise,
        "input": {"path": str(small_inputs["parquet"]), "format": "parquet"},
        "output": str(tmp_path / "out"),
        "metrics": [DISTINCT_TX, DISTINCT_TIME],
        "bounds": {"max_partitions_contributed": 50, "max_contributions_per_partition": 100},
        "partition_selection": {"public_partitions": "0..1999"},
    }
    result = run_job(build_spec(raw), "local", echo=lambda _: None)
    released = pd.read_parquet(result.output / "noisy").set_index("TERMINAL_ID").sort_index()
    manifest = result.manifest.model_dump(mode="json", exclude_unset=True)
    rows = pd.read_parquet(small_inputs["parquet"])
    draws = []
    for metric, column in ((DISTINCT_TX, "TRANSACTION_ID"), (DISTINCT_TIME, "TX_DATETIME")):
        exact = rows.groupby("TERMINAL_ID")[column].nunique().reindex(released.index, fill_value=0)
        noisy = released[metric_column(metric)]
        assert noisy.dtype == (np.int64 if count_noise == "discrete" else np.float64)
        noise_drawn = (noisy - exact).to_numpy(dtype=np.float64)
        assert (noise_drawn != 0).mean() > 0.99  # noise present
        std = manifest["queries"]["noisy"]["metrics"][metric]["noise_stddev"]
        draws.append(noise_drawn / std)
    z = np.concatenate(draws)
    ratio = float(np.mean(z**2))
    assert abs(ratio - 1) <= Z * math.sqrt((kurtosis - 1) / len(z)), ratio


def test_release_passes_check_release_and_shows_in_plan(small_inputs, tmp_path, capsys):
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    common = ["--metrics", f"count,{DISTINCT_TX},{DISTINCT_TERMINAL}", "--public-partitions",
              "0..59", "--epsilon", "1", "--confidence-intervals", "--max-partitions-contributed",
              "1", "--max-contributions-per-partition", "1"]  # fmt: skip
    assert main(["plan", *common]) == 0
    text = capsys.readouterr().out
    assert "count_distinct_TRANSACTION_ID" in text and f"{DISTINCT_TERMINAL} std" in text
    out = tmp_path / "rel"
    inputs = ["--input", str(small_inputs["parquet"]), "--output", str(out)]
    assert main(["run", *common, *inputs, "--ledger", ledger]) == 0
    capsys.readouterr()
    assert main(["check-release", str(out), "--ledger", ledger]) == 0
    assert "valid release" in capsys.readouterr().out
    released = pd.read_parquet(out / "terminal_stats")
    low, high = "count_distinct_TERMINAL_ID_ci_low", "count_distinct_TERMINAL_ID_ci_high"
    assert list(released.columns)[-6:] == [
        "count_distinct_TRANSACTION_ID", "count_distinct_TRANSACTION_ID_ci_low",
        "count_distinct_TRANSACTION_ID_ci_high", "count_distinct_TERMINAL_ID", low, high,
    ]  # fmt: skip
    assert (released[low] < released["count_distinct_TERMINAL_ID"]).all()


def test_nulls_are_not_values_and_each_partition_counts_its_own():
    from dppipeline.engines.kernel.bounding import distinct_values

    keys = np.array([0, 0, 1, 1, 1, 2])
    values = np.array([7, None, 7, 8, 8, None], dtype=object)
    sets = distinct_values(keys, values, np.array([0, 1, 2]), 3)
    assert [sorted(s) for s in sets] == [[7], [7, 8], []]
    floats = distinct_values(np.zeros(3, np.int64), np.array([1.5, np.nan, 1.5]), np.array([0]), 1)
    assert [list(s) for s in floats] == [[1.5]]


def test_evaluate_measures_bounding_and_noise_of_distinct_counts(small_inputs, tmp_path):
    """`evaluate`: the raw truth is pandas' nunique; with L0 = Linf = 1 bounding drops rows, and
    a unique id's distinct count loses exactly what the count loses; the expected noise is
    count's."""
    from dppipeline.analysis.evaluate import evaluate

    raw = {
        "metrics": ["count", DISTINCT_TX],
        "budget": {"epsilon": 1.0, "delta": 1e-6},
        "bounds": ONE,
        "partition_selection": {"public_partitions": TERMINALS},
        "input": {"path": str(small_inputs["parquet"]), "format": "parquet"},
    }
    result = evaluate(build_spec(raw), tmp_path / "ev", epsilons=[1.0], repeats=1,
                      progress=lambda _: None)  # fmt: skip
    table = result.table.set_index(["metric", "stat"])["value"]
    for stat in ("bounding_median_abs_error", "bounding_mean_abs_error", "noise_median_abs"):
        assert table[(DISTINCT_TX, stat)] == table[("count", stat)], stat
    assert table[(DISTINCT_TX, "bounding_mean_abs_error")] > 5  # the bounds bind


@pytest.mark.spark  # exact_runs runs every engine, whatever the parameter
@pytest.mark.beam
def test_spark_release_on_the_executors_gives_the_driver_values(
    small_inputs, tmp_path, spark, monkeypatch, exact_runs
):
    """Above DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS the release runs in mapInArrow: the same
    exact distinct counts (a one-query job, which that path serves)."""
    monkeypatch.setenv("DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS", "0")
    raw = {
        "name": "per_terminal",
        "budget": {"epsilon": 1e9, "delta": 1e-6},
        "input": {"path": str(small_inputs["parquet"]), "format": "parquet"},
        "output": str(tmp_path / "out"),
        **{k: v for k, v in queries(TIGHT)[0].items() if k != "name"},
    }
    result = run_job(build_spec(raw), "spark", echo=lambda _: None, seed=7)
    released = pd.read_parquet(result.output / "per_terminal").sort_values("TERMINAL_ID")
    pd.testing.assert_frame_equal(
        released.reset_index(drop=True), exact_runs["local"][0]["per_terminal"]
    )
