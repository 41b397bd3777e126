"""Several queries in one job, on every engine: filters, time buckets, global totals,
multi-column keys, key products and ranges, shared private selection, and every metric.

Exact tier: a hand-made input, bounds loose enough that nothing is sampled or clipped, and an
epsilon so large that the noise is far below the tolerances, under each accounting (`basic`
with Laplace noise; `pld` and `zcdp` with Gaussian noise). The truth is computed here with
pandas, independently of the engines. Tolerances come from each mechanism's noise as the
manifest states it (std, or for discrete noise its scale) with tails that hold for the
distribution drawn, failure rate 1e-9 per value; mean, variance and stddev get the interval
of their formula over the noise boxes of the sums they are computed from.

Private selection (every strategy, with and without pre_threshold): a second job on an input
where each customer visits one terminal, so that the keys with enough customers are known.

Noise present: at epsilon 1 under pld and zcdp two releases differ, and the selections drawn
from the plan keep a partition at their 50% size with the planned probability.
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
from support.data import with_ids_and_times, write_daily_parquet

from dppipeline.errors import SpecError
from dppipeline.lifecycle.runner import make_plan, run_job
from dppipeline.spec.model import build_spec, load_spec

START = dt.datetime(2026, 1, 26)  # a Monday; the data spans two month boundaries
N_DAYS = 40
EPSILON = 1e12
FAILURE_RATE = 1e-9  # per value: with a few hundred values, below 1e-6 per test
ACCOUNTINGS = {
    "basic": {},  # laplace, as the job's default
    "pld": {"accounting": "pld", "noise": "gaussian"},
    "zcdp": {"accounting": "zcdp", "noise": "gaussian"},
}
# At EPSILON the tight pool's Gaussian percentiles are refused: PyDP calibrates the quantile
# tree from (epsilon, delta), and its Gaussian sigma search returns ~0 past a per-mechanism
# epsilon of a few hundred. The exact tier of every query runs the tight pools with Laplace
# noise (continuous counts: no discrete noise fits 1e12 either).
EXACT_ACCOUNTINGS = {
    "basic": {},
    "pld": {"accounting": "pld", "noise": "laplace", "count_noise": "continuous"},
    "zcdp": {"accounting": "zcdp", "noise": "laplace", "count_noise": "continuous"},
}


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
    {
        "name": "spread_by_day",
        "partition_by": ["day"],
        "metrics": ["count", "stddev", "max", "min", "count_distinct(TERMINAL_ID)"],
        "partition_selection": {"public_partitions": {"day": "input_range"}},
        # still loose (asserted), but L0 x Linf 1,000 x smaller than LOOSE: under pld and zcdp
        # at a huge epsilon the multiplier stays near 1e-5, and the sum of squares' noise
        # (1.25e8 Linf sensitivity) would make stddev a few percent off
        "bounds": {"max_partitions_contributed": 40, "max_contributions_per_partition": 10},
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


def mechanism_tolerance(manifest: dict, query: str, mechanism: str) -> float:
    """|noise| bound of one mechanism, exceeded with probability FAILURE_RATE.

    Continuous: Laplace tails from the std, P(|X| > t) = exp(-t sqrt(2) / std), which bound
    a Gaussian of the same std too. Discrete (OpenDP, `noise_scale` s): discrete Laplace,
    P(|X| >= k) <= 2 exp(-k / s); discrete Gaussian, sub-Gaussian with variance proxy s^2
    (Canonne, Kamath, Steinke 2020), P(|X| >= k) <= 2 exp(-k^2 / (2 s^2)). The std of a
    discrete mechanism at a small scale is far below s, and its tails are not Laplace's of
    that std (at std 0.57, P(|X| > 14.6 std) is 1.3e-8, not 1e-9): hence the scale.
    """
    entry = manifest["queries"][query]["budget_split"][mechanism]
    if entry["mechanism"] == "discrete_laplace":
        return entry["noise_scale"] * math.log(2 / FAILURE_RATE)
    if entry["mechanism"] == "discrete_gaussian":
        return entry["noise_scale"] * math.sqrt(2 * math.log(2 / FAILURE_RATE))
    assert entry["mechanism"] in ("laplace", "gaussian"), entry
    return entry["noise_stddev"] * math.log(1 / FAILURE_RATE) / math.sqrt(2) + 1e-9


def tolerance(manifest: dict, query: str, metric: str) -> float:
    """|released - exact| bound of an additive metric (count, sum, privacy_id_count,
    count_distinct(COLUMN)); a sum released with mean is centred sum + mid * count."""
    split = manifest["queries"][query]["budget_split"]
    if metric == "sum" and "centred_sum" in split:
        mid = (LOOSE["min_value"] + LOOSE["max_value"]) / 2
        return mechanism_tolerance(manifest, query, "centred_sum") + mid * mechanism_tolerance(
            manifest, query, "count"
        )
    name = metric.replace("(", "_").rstrip(")")  # count_distinct(C) -> count_distinct_C
    return mechanism_tolerance(manifest, query, name)


def box(centre: np.ndarray, width: float) -> tuple[np.ndarray, np.ndarray]:
    """[centre - width, centre + width], widened by float rounding (engines sum in their own
    order)."""
    width = width + 1e-9 * (1 + np.abs(centre))
    return centre - width, centre + width


def ratio_range(top: tuple, bottom: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Range of top / max(1, bottom) over two boxes (bottom's low end >= 1 here): at corners,
    the ratio being monotone in each argument."""
    corners = [t / np.maximum(1.0, b) for t in top for b in bottom]
    return np.minimum.reduce(corners), np.maximum.reduce(corners)


def mean_variance_ranges(
    manifest: dict, query: str, values: pd.Series
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{mean, variance, stddev: (low, high)} per partition of kept `values` (a Series of
    arrays): each formula of `core.mechanisms.noise_partitions`, evaluated over the boxes in
    which the noisy count, centred sum and centred sum of squares lie."""
    low, high = LOOSE["min_value"], LOOSE["max_value"]
    mid, r2 = (low + high) / 2, ((high - low) / 2) ** 2
    count = values.map(len).to_numpy(dtype=np.float64)
    centred = values.map(lambda v: np.sum(v - mid)).to_numpy()
    squares = values.map(lambda v: np.sum((v - mid) ** 2 - r2 / 2)).to_numpy()
    counts = box(count, mechanism_tolerance(manifest, query, "count"))
    assert (counts[0] >= 1).all()
    mean_low, mean_high = ratio_range(
        box(centred, mechanism_tolerance(manifest, query, "centred_sum")), counts
    )
    ranges = {"mean": (np.clip(mid + mean_low, low, high), np.clip(mid + mean_high, low, high))}
    split = manifest["queries"][query]["budget_split"]
    if "centred_sum_of_squares" in split:
        tol = mechanism_tolerance(manifest, query, "centred_sum_of_squares")
        sq_low, sq_high = ratio_range(box(squares, tol), counts)
        straddles = (mean_low <= 0) & (mean_high >= 0)
        mean_sq_low = np.where(straddles, 0.0, np.minimum(mean_low**2, mean_high**2))
        mean_sq_high = np.maximum(mean_low**2, mean_high**2)
        variance = (
            np.clip(sq_low + r2 / 2 - mean_sq_high, 0, r2),
            np.clip(sq_high + r2 / 2 - mean_sq_low, 0, r2),
        )
        ranges["variance"] = variance
        ranges["stddev"] = (np.sqrt(variance[0]), np.sqrt(variance[1]))
    return ranges


def extreme_candidates(values: np.ndarray, metric: str, margin: int) -> np.ndarray:
    """The grid candidates of highest score -|rows beyond c - m| (`core.extremes`, scored
    here independently): at a huge epsilon the exponential mechanism draws one of them."""
    grid = np.linspace(LOOSE["min_value"], LOOSE["max_value"], 1024)
    ordered = np.sort(values)
    if metric == "max":
        beyond = len(ordered) - np.searchsorted(ordered, grid, side="left")
    else:
        beyond = np.searchsorted(ordered, grid, side="right")
    score = -np.abs(beyond - margin)
    best: np.ndarray = grid[score == score.max()]
    return best


@pytest.mark.parametrize("accounting", list(ACCOUNTINGS))
def test_every_query_equals_the_truth(transactions, tmp_path, engine, accounting):
    root, rows = transactions
    rows = with_buckets(rows)
    if accounting != "basic":  # Gaussian noise in the pool: refused, naming the percentile
        with pytest.raises(SpecError, match=r"PyDP cannot calibrate .* percentile mechanism"):
            make_plan(job_spec(root, tmp_path / "release", **ACCOUNTINGS[accounting]))
    spec = job_spec(root, tmp_path / "release", **EXACT_ACCOUNTINGS[accounting])
    result = run_job(spec, engine, echo=lambda _: None, seed=1)
    manifest = result.manifest.model_dump(mode="json", exclude_unset=True)
    assert sorted(p.name for p in result.output.iterdir()) == sorted(
        [q["name"] for q in QUERIES] + ["manifest.json"]
    )

    def released(name):
        return pd.read_parquet(result.output / name)

    assert accounting in manifest["accountant"]
    assert (manifest.get("noise_multiplier") is None) == (accounting == "basic")

    def check(frame, expected, query, metrics, kept=None):
        """Additive metrics within their tolerance; mean and variance (from the kept values
        of each partition, `kept`) within their formula's range."""
        for metric in metrics:
            released = frame[metric].to_numpy()
            if metric in ("mean", "variance", "stddev"):
                low, high = mean_variance_ranges(manifest, query, kept)[metric]
                assert ((low <= released) & (released <= high)).all(), (query, metric)
                continue
            tol = tolerance(manifest, query, metric)
            error = np.abs(released - expected[metric].to_numpy()).max()
            assert error <= tol, (query, metric, error, tol)

    # Filter + integer range of public keys; key 4 is listed but has no row: zero + noise.
    out = released("by_terminal_filtered").sort_values("TERMINAL_ID")
    assert out["TERMINAL_ID"].tolist() == [1, 2, 3, 4]
    kept = rows[(rows.TX_AMOUNT >= 25) & rows.TERMINAL_ID.between(1, 3)]
    expected = truth_by(kept, ["TERMINAL_ID"]).reindex([1, 2, 3, 4], fill_value=0)
    values = kept.groupby("TERMINAL_ID")["TX_AMOUNT"].agg(np.array)
    check(out.iloc[:3], expected.iloc[:3], "by_terminal_filtered", ["count", "sum", "mean"], values)
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
    totals = pd.Series([rows.TX_AMOUNT.to_numpy()])
    check(out, expected, "totals", ["count", "sum", "mean", "privacy_id_count", "variance"], totals)
    assert rows.TX_AMOUNT.var(ddof=0) == pytest.approx(
        np.mean(mean_variance_ranges(manifest, "totals", totals)["variance"]), rel=1e-3
    )  # the range is around pandas' population variance
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
    # stddev, max, min and count_distinct per day. Max and min: at a huge epsilon (Gumbel noise
    # far below one row, margin m = 1) a candidate of highest score; count_distinct: count's.
    out = released("spread_by_day").sort_values("day")
    assert out["day"].tolist() == days
    assert list(out.columns) == [
        "day", "count", "stddev", "max", "min", "count_distinct_TERMINAL_ID"
    ]  # fmt: skip
    values = rows.groupby("day")["TX_AMOUNT"].agg(np.array).reindex(days)
    expected = truth_by(rows, ["day"]).reindex(days)
    expected["count_distinct(TERMINAL_ID)"] = rows.groupby("day").TERMINAL_ID.nunique()
    out = out.rename(columns={"count_distinct_TERMINAL_ID": "count_distinct(TERMINAL_ID)"})
    check(out, expected, "spread_by_day", ["count", "count_distinct(TERMINAL_ID)"])
    check(out, expected, "spread_by_day", ["stddev"], values)
    assert np.allclose(out["stddev"], values.map(np.std), rtol=1e-3)  # not a vacuous range
    assert manifest["queries"]["spread_by_day"]["budget_split"]["count"]["l0_sensitivity"] == 40
    per_unit_day = rows.groupby(["CUSTOMER_ID", "day"]).size()
    assert per_unit_day.max() <= 10 and rows.day.nunique() <= 40  # the bounds keep every row
    metrics = manifest["queries"]["spread_by_day"]["metrics"]
    for metric in ("max", "min"):
        margin = metrics[metric]["exponential_mechanism"]["margin_m"]
        assert margin == 1
        for day, released_value in zip(out["day"], out[metric], strict=True):
            assert released_value in extreme_candidates(values[day], metric, margin), (day, metric)

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
    # the amount bands are public by their edges: the plan names no key file and no selection
    from dppipeline.reports.plan_text import render_plan

    text = render_plan(spec, plan).split("query transactions_per_amount_band")[1]
    assert "partition selection: none (bucket keys: every bucket" in text
    assert "None" not in text


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

    queries = [
        {
            "name": "q",
            "filter": filter_text,
            "partition_by": [],
            "metrics": ["count"],
            "bounds": {"max_contributions_per_partition": 1},  # a global total: Linf only
        }
    ]
    with pytest.raises(SpecError) as error:
        build_spec({"queries": queries, "input": {"path": str(tmp_path)}})
    assert message in str(error.value)
    assert "position" in str(error.value)
    assert "\n" not in str(error.value)


def test_cli_run_of_a_multi_query_job_writes_every_dataset(transactions, tmp_path, capsys):
    from dppipeline.cli.main import main

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
    """Above the driver limit the release runs in mapInArrow: composite date keys, empty
    public partitions (no kept values) and percentiles go through it, equal to the truth."""
    from dppipeline.reports.check_release import check_release

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
    lines: list[str] = []
    result = run_job(spec, "spark", echo=lines.append)
    assert "1 dataset(s)" in check_release(result.output, None)
    # where it released depends on the data (the partitions' number): no line says it
    assert any("releasing" in line for line in lines), lines
    assert not [line for line in lines if "executors" in line or "driver" in line]
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


# --- private selection: every strategy releases exactly the keys with enough customers ---------

# Customers per terminal; each customer visits one terminal only, so L0 = 1 keeps every row.
CUSTOMERS_PER_TERMINAL = {1: 1, 2: 2, 3: 3, 4: 4, 5: 1, 6: 7}
SELECTION_BOUNDS = {
    "max_partitions_contributed": 1,
    "max_contributions_per_partition": 3,
    "min_value": 0.0,
    "max_value": 100.0,
}
SELECTION_QUERIES = [
    {
        "name": "geometric",
        "metrics": ["count", "privacy_id_count"],
        "partition_selection": {"strategy": "truncated_geometric"},
    },
    {
        "name": "laplace_pre_threshold",
        "metrics": ["sum"],
        "partition_selection": {"strategy": "laplace_thresholding", "pre_threshold": 3},
    },
    {
        "name": "gaussian",
        "metrics": ["count"],
        "partition_selection": {"strategy": "gaussian_thresholding"},
        # half a share: in the tight pool PyDP's Gaussian is calibrated at about 400 (its
        # sigma search fails past about 800), the others stay sharp enough to keep 2 units
        "budget_weight": 0.5,
    },
]
# PyDP's Gaussian thresholding keeps a one-unit partition with probability 0.5 from a
# per-partition epsilon of about 750 (the job refuses it, test_budget.py), so it cannot run at a
# huge epsilon: 3,000 gives each selection 333 to 667 under basic (L0 = 1; 24 to 410 in the
# tight pool), where a partition of one unit is kept with probability at most delta and one of
# two units with probability 1 - 1e-9 at least (`expected_keys` checks both).
SELECTION_EPSILON = 3000.0


@pytest.fixture(scope="module")
def few_customers(tmp_path_factory) -> tuple[object, pd.DataFrame]:
    """(input folder, the rows): terminals with 1 to 7 customers, 1 to 3 rows each."""
    rng = np.random.default_rng(11)
    frames, customer = [], 0
    for terminal, customers in CUSTOMERS_PER_TERMINAL.items():
        for _ in range(customers):
            customer += 1
            n = int(rng.integers(1, 4))
            frames.append(
                pd.DataFrame(
                    {
                        "CUSTOMER_ID": np.full(n, customer, dtype=np.int64),
                        "TERMINAL_ID": np.full(n, terminal, dtype=np.int64),
                        "TX_AMOUNT": np.round(rng.uniform(1, 100, n), 2),
                    }
                )
            )
    rows = with_ids_and_times(pd.concat(frames, ignore_index=True), rng, START, days=2)
    root = write_daily_parquet(rows, tmp_path_factory.mktemp("selection") / "in")
    return root, rows


def selection_spec(root, out, accounting: str, epsilon: float):
    return job_spec(
        root,
        out,
        name="selections",
        budget={"epsilon": epsilon, "delta": 1e-6},
        bounds=SELECTION_BOUNDS,
        queries=[{**q, "partition_by": ["TERMINAL_ID"]} for q in SELECTION_QUERIES],
        **ACCOUNTINGS[accounting],
    )


def expected_keys(plan, query: str) -> list[int]:
    """The terminals the query's selection keeps with probability >= 1 - 1e-9, after checking
    that every other one is kept with probability <= 1e-6: the release is then this set but
    with probability below 6e-6 per query (six terminals)."""
    group = next(g for g in plan.selections if query in g.queries)
    strategy = group.mechanism.build_selection(group.pre_threshold)
    kept = []
    for terminal, customers in CUSTOMERS_PER_TERMINAL.items():
        p = strategy.probability_of_keep(customers)
        assert p >= 1 - 1e-9 or p <= 1e-6, (query, customers, p)
        if p >= 1 - 1e-9:
            kept.append(terminal)
    return kept


@pytest.mark.parametrize("accounting", ["pld", "zcdp"])
def test_every_selection_keeps_the_keys_with_enough_customers(
    few_customers, tmp_path, engine, accounting
):
    """Three selection groups on the same key, one per strategy: each releases exactly the
    terminals with enough customers, and each released value is its query's truth."""
    root, rows = few_customers
    spec = selection_spec(root, tmp_path / "release", accounting, SELECTION_EPSILON)
    plan = make_plan(spec)
    assert [g.mechanism.kind for g in plan.selections] == [
        "truncated_geometric", "laplace_thresholding", "gaussian_thresholding"
    ]  # fmt: skip
    # One unit is not enough for any strategy; two are, unless pre_threshold asks for 3 (then
    # the strategy sees units - 2: four units are needed).
    enough = {1: [2, 3, 4, 6], 2: [4, 6]}
    assert expected_keys(plan, "geometric") == expected_keys(plan, "gaussian") == enough[1]
    assert expected_keys(plan, "laplace_pre_threshold") == enough[2]

    result = run_job(spec, engine, echo=lambda _: None, seed=1)
    manifest = result.manifest.model_dump(mode="json", exclude_unset=True)
    assert accounting in manifest["accountant"]
    truth = truth_by(rows, ["TERMINAL_ID"])
    for query in SELECTION_QUERIES:
        name = query["name"]
        out = pd.read_parquet(result.output / name).sort_values("TERMINAL_ID")
        keys = expected_keys(plan, name)
        assert out.TERMINAL_ID.tolist() == keys, name
        for metric in query["metrics"]:
            error = np.abs(out[metric].to_numpy() - truth.loc[keys, metric].to_numpy()).max()
            assert error <= tolerance(manifest, name, metric), (name, metric, error)
    assert len(manifest["selections"]) == 3


# --- noise present ----------------------------------------------------------------------------


HALF_RANGE = (LOOSE["max_value"] - LOOSE["min_value"]) / 2
CLAMPED = {  # the post-processed ratios and their clamps (core.mechanisms.noise_partitions)
    "mean": [LOOSE["min_value"], LOOSE["max_value"]],
    "variance": [0.0, HALF_RANGE**2],
    "stddev": [0.0, HALF_RANGE],
}


@pytest.mark.slow
@pytest.mark.parametrize("accounting", ["pld", "zcdp"])
def test_noise_present_under_tight_accounting(transactions, tmp_path, accounting):
    """At epsilon 1 two releases of the job differ in every released metric of every
    public-key query (the private ones release no key at this budget: ~60 customers a
    terminal against the hundreds the plan says are needed, so only a subset is asserted).

    Integer noise repeats a value with probability P(0) <= 1 / (sqrt(2 pi) s - 1) (discrete
    Gaussian of scale s): a column whose repeat bound is above 1e-9 is asserted different
    only as part of its query's row set; the test's failure rate, the sum of those bounds
    (3e-5: single counts of scale ~1e4), is asserted below 1e-4."""
    root, _ = transactions
    releases = []
    for run in range(2):
        spec = job_spec(
            root, tmp_path / f"release{run}", budget={"epsilon": 1.0, "delta": 1e-6},
            **ACCOUNTINGS[accounting],
        )  # fmt: skip
        result = run_job(spec, "local", echo=lambda _: None, seed=1)  # same sampling salt
        releases.append(result.output)
    manifest = result.manifest.model_dump(mode="json", exclude_unset=True)
    assert manifest["noise_multiplier"] > 1  # epsilon 1 over ~30 mechanisms
    failure_rate = 0.0

    def repeat_bound(name: str, column: str, rows: int) -> float:
        """Bound on P(the column is equal in both runs): 1 for a clamped ratio, 0 for other
        continuous noise."""
        if column in CLAMPED:
            return 1.0
        entry = manifest["queries"][name]["budget_split"].get(column)
        if entry is None or not entry["mechanism"].startswith("discrete"):
            return 0.0
        assert entry["mechanism"] == "discrete_gaussian"
        bound: float = min(1.0, 1 / (math.sqrt(2 * math.pi) * entry["noise_scale"] - 1)) ** rows
        return bound

    for query in QUERIES:
        name = query["name"]
        first, second = (pd.read_parquet(out / name) for out in releases)
        if query["partition_by"] and "partition_selection" not in query:  # private
            assert set(first.TERMINAL_ID) <= {1, 2, 3, 4, 5}
            continue
        keys = list(query["partition_by"])
        first, second = (f.sort_values(keys, ignore_index=True) for f in (first, second))
        assert first[keys].equals(second[keys])
        repeats = {c: repeat_bound(name, c, len(first)) for c in first.columns.difference(keys)}
        if any(1e-9 < bound < 1 for bound in repeats.values()):
            assert not first.equals(second), name
            failure_rate += math.prod(repeats.values())
        for column in first.columns.difference(keys):
            if repeats[column] > 1e-9:
                continue
            if column in CLAMPED:
                # the sums' noise (std ~2.7e7 for the centred sum over LOOSE bounds) swamps
                # the ratio, often clamped: a value may repeat only as a clamp bound
                same = first[column] == second[column]
                assert np.isin(first[column][same], CLAMPED[column]).all(), (name, column)
                continue
            assert not np.array_equal(first[column], second[column]), (name, column)
    assert failure_rate < 1e-4, failure_rate


@pytest.mark.parametrize("accounting", ["pld", "zcdp"])
def test_selection_noise_present_under_tight_accounting(accounting):
    """At epsilon 1 each selection strategy keeps a partition of the size it needs for a 50%
    chance (`privacy_units_needed`) with PyDP's probability for it: 4,000 draws through the
    release's own selection, within a normal approximation of the binomial at failure rate
    1e-6; neither always nor never."""
    from scipy.stats import norm

    from dppipeline.core.mechanisms import select_with
    from dppipeline.core.plan import privacy_units_needed

    plan = make_plan(selection_spec(".", "release", accounting, 1.0))
    draws = 4000
    for group in plan.selections:
        units = privacy_units_needed(plan.query(group.queries[0]).plan, 0.5)
        assert units is not None and units > 2
        p = group.mechanism.build_selection(group.pre_threshold).probability_of_keep(units)
        assert 0.5 <= p < 0.6
        kept = int(select_with(np.full(draws, units), group.mechanism, group.pre_threshold).sum())
        spread = float(norm.isf(0.5e-6)) * math.sqrt(draws * p * (1 - p))
        assert abs(kept - draws * p) <= spread, (group.mechanism.kind, kept, draws * p)
