"""Several queries in one job, on every engine: filters, time buckets, global totals,
multi-column keys, key products and ranges, shared private selection.

Exact tier: a hand-made input, bounds loose enough that nothing is sampled or clipped, and an
epsilon so large that the noise is far below the tolerances (computed from the manifest's
noise standard deviations: 8 sigma, a failure rate below 1e-14 per value). The truth is
computed here with pandas, independently of the engines.
"""

from __future__ import annotations

import datetime as dt
import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_daily_parquet

from dppipeline.orchestration.runner import make_plan, run_job
from dppipeline.spec.model import build_spec, load_spec

START = dt.datetime(2026, 1, 26)  # a Monday; the data spans two month boundaries
N_DAYS = 40
EPSILON = 1e12
# |noise| <= SIGMAS std fails with probability 1e-9 per value for Laplace noise (the heaviest
# tails here: P(|X| > t std) = exp(-t sqrt(2))); 8 std gave 1.2e-5 per value.
SIGMAS = math.log(1e9) / math.sqrt(2)


@pytest.fixture(scope="module")
def transactions(tmp_path_factory) -> tuple[object, pd.DataFrame]:
    """(input folder, the rows): 60 customers, terminals 1..5, 40 days, amounts in (1, 500)."""
    rng = np.random.default_rng(7)
    n = 3000
    rows = pd.DataFrame(
        {
            "TRANSACTION_ID": np.arange(n, dtype=np.int64),
            "TX_DATETIME": START + pd.to_timedelta(rng.integers(0, N_DAYS * 86400, n), unit="s"),
            "CUSTOMER_ID": rng.integers(1, 61, n).astype(np.int64),
            "TERMINAL_ID": rng.integers(1, 6, n).astype(np.int64),
            "TX_AMOUNT": np.round(rng.uniform(1, 500, n), 2),
        }
    )
    rows["TX_DATETIME"] = rows["TX_DATETIME"].astype("datetime64[us]")
    root = write_daily_parquet(rows, tmp_path_factory.mktemp("queries") / "in")
    return root, rows


LOOSE = {
    "max_partitions_contributed": 1000,
    "max_contributions_per_partition": 1000,
    "min_value": 0.0,
    "max_value": 1000.0,
}

QUERIES = [
    {
        "name": "by_terminal_filtered",
        "filter": "TX_AMOUNT >= 25 and TERMINAL_ID in 1..3",
        "partition_by": ["TERMINAL_ID"],
        "metrics": ["count", "sum", "mean", "privacy_id_count"],
        "partition_selection": {"public_partitions": "1..4"},  # 4: listed, no rows
    },
    {
        "name": "by_day",
        "partition_by": ["day"],
        "metrics": ["count", "sum"],
        "partition_selection": {"public_partitions": {"day": "input_range"}},
    },
    {
        "name": "by_week",
        "partition_by": ["week"],
        "metrics": ["count"],
        "partition_selection": {"public_partitions": {"week": "input_range"}},
    },
    {
        "name": "by_terminal_month",
        "filter": "TERMINAL_ID != 2",
        "partition_by": ["TERMINAL_ID", "month"],
        "metrics": ["count", "privacy_id_count"],
        "partition_selection": {
            "public_partitions": {"TERMINAL_ID": [1, 2, 3, 4, 5, 6], "month": "input_range"}
        },
    },
    {
        "name": "totals",
        "partition_by": [],
        "metrics": ["count", "sum", "mean", "variance", "privacy_id_count"],
    },
    {
        "name": "small_or_terminal_5",
        "filter": "TX_AMOUNT < 10 or (TERMINAL_ID = 5 and not TX_AMOUNT between 100 and 400)",
        "partition_by": [],
        "metrics": ["count"],
    },
    {
        "name": "percentiles",
        "partition_by": ["TERMINAL_ID"],
        "metrics": ["percentile(50)", "percentile(90)", "percentile(100)"],
        "partition_selection": {"public_partitions": "1..5"},
    },
    {
        "name": "private_count",
        "partition_by": ["TERMINAL_ID"],
        "metrics": ["count"],
    },
    {
        "name": "private_customers_big",
        "filter": "TX_AMOUNT > 250",
        "partition_by": ["TERMINAL_ID"],
        "metrics": ["privacy_id_count"],
    },
]


def job_spec(root, out, **extra):
    raw = {
        "name": "exact_queries",
        "budget": {"epsilon": EPSILON, "delta": 1e-6},
        "bounds": LOOSE,
        "input": {"path": str(root)},
        "output": str(out),
        "queries": QUERIES,
    }
    raw.update(extra)
    return build_spec(raw)


def truth_by(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    grouped = rows.groupby(keys) if keys else rows.groupby(lambda _: 0)
    out = grouped.agg(
        count=("TX_AMOUNT", "size"),
        sum=("TX_AMOUNT", "sum"),
        privacy_id_count=("CUSTOMER_ID", "nunique"),
    )
    out["mean"] = out["sum"] / out["count"]
    return out


def with_buckets(rows: pd.DataFrame) -> pd.DataFrame:
    moment = rows["TX_DATETIME"]
    rows = rows.copy()
    rows["day"] = moment.dt.date
    rows["week"] = (moment.dt.normalize() - pd.to_timedelta(moment.dt.weekday, unit="D")).dt.date
    rows["month"] = moment.dt.strftime("%Y-%m")
    return rows


def tolerance(manifest: dict, query: str, metric: str) -> float:
    std = manifest["queries"][query]["metrics"][metric]["noise_stddev"]
    return SIGMAS * std + 1e-6


def test_every_query_equals_the_truth(transactions, tmp_path, engine):
    root, rows = transactions
    rows = with_buckets(rows)
    result = run_job(job_spec(root, tmp_path / "release"), engine, echo=lambda _: None, seed=1)
    manifest = result.manifest.model_dump(mode="json", exclude_unset=True)
    assert sorted(p.name for p in result.output.iterdir()) == sorted(
        [q["name"] for q in QUERIES] + ["manifest.json"]
    )

    def released(name):
        return pd.read_parquet(result.output / name)

    def check(frame, expected, query, metrics):
        for metric in metrics:
            if metric == "mean":  # a ratio: bounded by the count's and sum's noise
                assert np.allclose(frame[metric], expected[metric], rtol=1e-6, atol=1e-6)
                continue
            tol = tolerance(manifest, query, metric)
            assert np.abs(frame[metric].to_numpy() - expected[metric].to_numpy()).max() <= tol

    # Filter + integer range of public keys; key 4 is listed but has no row: zero + noise.
    out = released("by_terminal_filtered").sort_values("TERMINAL_ID")
    assert out["TERMINAL_ID"].tolist() == [1, 2, 3, 4]
    kept = rows[(rows.TX_AMOUNT >= 25) & rows.TERMINAL_ID.between(1, 3)]
    expected = truth_by(kept, ["TERMINAL_ID"]).reindex([1, 2, 3, 4], fill_value=0)
    check(out.iloc[:3], expected.iloc[:3], "by_terminal_filtered", ["count", "sum", "mean"])
    check(out, expected, "by_terminal_filtered", ["count", "privacy_id_count"])
    assert list(out.columns) == ["TERMINAL_ID", "count", "sum", "mean", "privacy_id_count"]

    # Time buckets: every day / Monday-week of the input range, dates as date32.
    days = sorted(rows["day"].unique())
    out = released("by_day").sort_values("day")
    assert out["day"].tolist() == days
    check(out, truth_by(rows, ["day"]).reindex(days), "by_day", ["count", "sum"])
    assert (
        pq.read_schema(next((result.output / "by_day").glob("*.parquet"))).field("day").type
        == pa.date32()
    )
    weeks = sorted(rows["week"].unique())
    out = released("by_week").sort_values("week")
    assert out["week"].tolist() == weeks and all(w.weekday() == 0 for w in weeks)
    check(out, truth_by(rows, ["week"]).reindex(weeks), "by_week", ["count"])

    # Two key columns, a product of a list and a bucket range; terminal 2 filtered out and 6
    # never seen: both released as noise on zero.
    out = released("by_terminal_month").sort_values(["TERMINAL_ID", "month"])
    months = sorted(rows["month"].unique())
    assert months == ["2026-01", "2026-02", "2026-03"]
    index = pd.MultiIndex.from_product([[1, 2, 3, 4, 5, 6], months])
    assert list(zip(out.TERMINAL_ID, out.month, strict=True)) == list(index)
    expected = truth_by(rows[rows.TERMINAL_ID != 2], ["TERMINAL_ID", "month"]).reindex(
        index, fill_value=0
    )
    check(out, expected, "by_terminal_month", ["count", "privacy_id_count"])

    # Global totals: one row, no key column; variance is the population variance.
    out = released("totals")
    assert len(out) == 1 and "TERMINAL_ID" not in out
    expected = truth_by(rows, [])
    check(out, expected, "totals", ["count", "sum", "mean", "privacy_id_count"])
    assert out["variance"].iloc[0] == pytest.approx(rows.TX_AMOUNT.var(ddof=0), rel=1e-6)
    out = released("small_or_terminal_5")
    kept = rows[
        (rows.TX_AMOUNT < 10) | ((rows.TERMINAL_ID == 5) & ~rows.TX_AMOUNT.between(100, 400))
    ]
    check(out, truth_by(kept, []), "small_or_terminal_5", ["count"])

    # Percentiles: PyDP's quantile tree at a huge epsilon lands on the true quantile, up to
    # its rank discretisation (one row either side) and two leaf widths of 1000 / 65536;
    # percentile(100) is the 99.5th percentile (PyDP clamps the rank).
    out = released("percentiles").sort_values("TERMINAL_ID")
    assert list(out.columns) == ["TERMINAL_ID", "percentile_50", "percentile_90", "percentile_100"]
    leaf = 1000 / 65536
    for terminal, values in rows.groupby("TERMINAL_ID")["TX_AMOUNT"]:
        ranked = np.sort(values.to_numpy())
        row = out[terminal == out.TERMINAL_ID].iloc[0]
        for column, q in (
            ("percentile_50", 0.5),
            ("percentile_90", 0.9),
            ("percentile_100", 0.995),
        ):
            rank = q * (len(ranked) - 1)
            low = ranked[max(0, math.floor(rank) - 1)] - 2 * leaf
            high = ranked[min(len(ranked) - 1, math.ceil(rank) + 1)] + 2 * leaf
            assert low <= row[column] <= high, (terminal, column, row[column], low, high)

    # Shared private selection: different filters, one selection; both queries release the
    # same keys (every terminal: each has dozens of customers), values are each query's own.
    count = released("private_count").sort_values("TERMINAL_ID")
    big = released("private_customers_big").sort_values("TERMINAL_ID")
    assert count.TERMINAL_ID.tolist() == big.TERMINAL_ID.tolist() == [1, 2, 3, 4, 5]
    check(count, truth_by(rows, ["TERMINAL_ID"]), "private_count", ["count"])
    expected = truth_by(rows[rows.TX_AMOUNT > 250], ["TERMINAL_ID"])
    check(big, expected, "private_customers_big", ["privacy_id_count"])
    selection = manifest["queries"]["private_count"]["partition_selection"]
    assert selection["shared_with"] == ["private_customers_big"]
    assert list(manifest["selections"]) == ["TERMINAL_ID"]


def test_budget_split_sums_to_the_total(transactions, tmp_path):
    root, _ = transactions
    spec = job_spec(root, tmp_path / "r", budget={"epsilon": 3.0, "delta": 1e-6})
    plan = make_plan(spec)
    eps, delta = plan.total_spent()
    assert math.isclose(eps, 3.0, rel_tol=1e-12) and math.isclose(delta, 1e-6, rel_tol=1e-12)
    shares = [q.spent()[0] for q in plan.queries]
    # Equal weights: every query gets the same share; the one selection gets one mechanism's.
    assert max(shares) == pytest.approx(min(shares), rel=1e-12)
    assert all(m.delta == 0 for q in plan.queries for m in q.own_mechanisms())
    assert [g.mechanism.delta for g in plan.selections] == [pytest.approx(1e-6)]


def test_budget_weights_scale_query_shares(transactions, tmp_path):
    root, _ = transactions
    queries = [
        {**QUERIES[1], "budget_weight": 3},
        {**QUERIES[4]},
    ]
    spec = job_spec(root, tmp_path / "r", queries=queries)
    by_day, totals = make_plan(spec).queries
    assert by_day.spent()[0] / totals.spent()[0] == pytest.approx(3.0)
    assert by_day.spent()[0] + totals.spent()[0] == pytest.approx(EPSILON)


def test_the_bank_partner_config_plans_and_names_every_query():
    spec = load_spec("jobs/configs/bank_partner_release.yaml")
    plan = make_plan(spec)
    assert [q.name for q in plan.queries] == [q.name for q in spec.queries]
    assert plan.total_spent()[0] == pytest.approx(spec.budget.epsilon)
    month_queries = ["total_per_month", "customers_per_month"]
    assert [list(g.queries) for g in plan.selections] == [month_queries]


@pytest.mark.parametrize(
    ("filter_text", "message"),
    [
        ("TX_AMOUNT >= ", "queries.q.filter: expected a value after '>=' at position"),
        ("TX_AMONT > 3", "queries.q.filter: unknown column 'TX_AMONT' at position 1"),
        ("TERMINAL_ID in 5..1", "queries.q.filter:"),
        ("TX_AMOUNT > 3 and", "queries.q.filter:"),
    ],
)
def test_a_bad_filter_names_the_query_and_position(tmp_path, filter_text, message):
    from dppipeline.errors import SpecError

    queries = [{"name": "q", "filter": filter_text, "partition_by": [], "metrics": ["count"]}]
    with pytest.raises(SpecError) as error:
        build_spec({"queries": queries, "input": {"path": str(tmp_path)}})
    assert message in str(error.value)
    assert "position" in str(error.value)
    assert "\n" not in str(error.value)


def test_cli_run_of_a_multi_query_job_writes_every_dataset(transactions, tmp_path, capsys):
    from dppipeline.commands.cli import main

    root, _ = transactions
    config = tmp_path / "job.json"  # YAML is a superset of JSON
    config.write_text(
        json.dumps(
            {
                "name": "two",
                "budget": {"epsilon": 2.0},
                "bounds": LOOSE,
                "queries": [QUERIES[0], QUERIES[4]],
            }
        )
    )
    out = tmp_path / "release"
    code = main(
        ["run", "--config", str(config), "--input", str(root), "--output", str(out), "--no-ledger"]
    )
    assert code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["queries"]) == {"by_terminal_filtered", "totals"}
    assert manifest["queries"]["totals"]["partition_selection"]["type"] == "global"
    assert main(["check-release", str(out), "--no-ledger"]) == 0
    assert "2 dataset(s)" in capsys.readouterr().out


@pytest.mark.usefixtures("spark")
def test_spark_executor_release_of_a_multi_key_query(transactions, tmp_path, monkeypatch):
    """Above the driver limit the release runs in mapInPandas: composite date keys, empty
    public partitions (no kept values) and percentiles go through it, equal to the truth."""
    from dppipeline.commands.check_release import check_release

    monkeypatch.setenv("DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS", "10")
    root, rows = transactions
    rows = with_buckets(rows)
    query = {
        "name": "per_terminal_day",
        "partition_by": ["TERMINAL_ID", "day"],
        "metrics": ["count", "percentile(50)"],
        "partition_selection": {"public_partitions": {"TERMINAL_ID": "1..6", "day": "input_range"}},
    }
    spec = job_spec(root, tmp_path / "release", queries=[query], confidence_intervals=True)
    result = run_job(spec, "spark", echo=lambda _: None)
    assert "1 dataset(s)" in check_release(result.output, None)
    out = pd.read_parquet(result.output / "per_terminal_day")
    days = sorted(rows["day"].unique())
    assert len(out) == 6 * len(days)
    index = pd.MultiIndex.from_product([range(1, 7), days])
    expected = truth_by(rows, ["TERMINAL_ID", "day"]).reindex(index, fill_value=0)
    out = out.set_index(["TERMINAL_ID", "day"]).loc[index]
    tol = tolerance(
        result.manifest.model_dump(mode="json", exclude_unset=True), "per_terminal_day", "count"
    )
    assert np.abs(out["count"].to_numpy() - expected["count"].to_numpy()).max() <= tol
    assert out["percentile_50"].between(0, 1000).all()
    assert (out["count_ci_low"] <= out["count"]).all()
