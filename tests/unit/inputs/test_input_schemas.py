"""Any table a bank has (issue 20): input schemas as data, derived keys, the `files` layout.

The book's scenarios (`jobs/configs/book_scenarios.yaml`) over the book's one-file CSV, and a
non-book card table (`jobs/configs/card_payments.yaml`) with a string and a bucketed key, run
on every engine at a huge epsilon and equal a pandas truth computed from the files as
written (tier 1: noise off in effect, bounding loose enough to keep every row). The rules
around them (schema errors, the period filter, time keys, buckets) are checked as a user
meets them: the spec as written, the CLI.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support import REPO as ROOT
from support.cli import run_cli as cli

from dppipeline.core.extremes import candidates
from dppipeline.errors import InputError, SpecError
from dppipeline.lifecycle.runner import run_job
from dppipeline.spec.hashing import spec_hash
from dppipeline.spec.loader import load_raw
from dppipeline.spec.model import build_spec
from dppipeline.synthetic.transactions import generate

START = dt.date(2026, 1, 1)
DAYS = 6
HUGE = {  # basic + Laplace: noise 1/epsilon (zCDP's Gaussian shrinks as 1/sqrt(epsilon))
    "accounting": "basic",
    "noise": "laplace",
    "budget.epsilon": 1e12,
    "bounds.max_partitions_contributed": 200,  # no customer reaches either bound: every row
    "bounds.max_contributions_per_partition": 200,  # is kept, so the truth is a group-by
}
# |released - truth| <= SIGMAS noise std fails with probability 1e-9 per value under Laplace
# noise (P(|X| > t std) = exp(-t sqrt(2))): about 1e-6 over a test's values.
SIGMAS = math.log(1e9) / math.sqrt(2)


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> Path:
    """The book's layout: one `book_transactions.csv` with the handbook's nine columns,
    a day more than the job's period (rows after it must not count)."""
    out = tmp_path_factory.mktemp("book")
    summary = generate(
        out, fmt="csv", customers=300, terminals=120, days=DAYS + 1, start_date=START,
        tx_per_day=1500, seed=3, table="book_transactions", single_file=True,
    )  # fmt: skip
    return summary.files[0]


@pytest.fixture(scope="module")
def cards(tmp_path_factory) -> Path:
    """Card payments, one CSV a day (the daily layout, detected without input.format)."""
    out = tmp_path_factory.mktemp("cards")
    generate(
        out, fmt="csv", customers=300, terminals=80, days=DAYS, start_date=START,
        tx_per_day=1500, seed=4, table="card_payments",
    )  # fmt: skip
    return out


def released(output: Path, name: str, keys: list[str]) -> pd.DataFrame:
    frame = pd.read_parquet(output / name)
    return frame.sort_values(keys, ignore_index=True) if keys else frame


def noise_std(manifest: dict, query: str, metric: str) -> float:
    return manifest["queries"][query]["metrics"][metric]["noise_stddev"]


def book_truth(path: Path) -> pd.DataFrame:
    rows = pd.read_csv(path, parse_dates=["TX_DATETIME"])
    end = pd.Timestamp(START + dt.timedelta(days=DAYS))
    assert (rows["TX_DATETIME"] >= end).any()  # the file holds rows after the period
    rows = rows[rows["TX_DATETIME"] < end].copy()
    rows["day"] = rows["TX_DATETIME"].dt.date
    rows["month"] = rows["TX_DATETIME"].dt.strftime("%Y-%m")
    rows["clipped"] = rows["TX_AMOUNT"].clip(0, 250)
    return rows


def test_the_book_scenarios_equal_the_truth_on_every_engine(book, tmp_path, engine):
    spec = build_spec(
        load_raw(ROOT / "jobs/configs/book_scenarios.yaml"),
        {
            **HUGE,
            "input.path": str(book),
            "input.end_date": START + dt.timedelta(days=DAYS - 1),
            "output": str(tmp_path / "release"),
        },
    )
    result = run_job(spec, engine, echo=lambda _: None, seed=1)
    manifest = result.manifest.model_dump(mode="json", exclude_unset=True)
    out = result.output
    rows = book_truth(book)
    terminals = rows[rows["TERMINAL_ID"].between(1, 100)]

    mean = released(out, "mean_per_terminal", ["TERMINAL_ID"])
    assert mean["TERMINAL_ID"].tolist() == list(range(1, 101))
    truth = terminals.groupby("TERMINAL_ID")["clipped"].mean()
    got = mean.set_index("TERMINAL_ID")["mean"].loc[truth.index]
    np.testing.assert_allclose(got, truth, atol=1e-3)  # noise std below 1e-4 here

    # max at a huge epsilon (margin m = 1): a grid candidate with as close to one kept row at
    # or above it as any candidate has (ties among such candidates are drawn at random)
    largest = released(out, "max_per_terminal", ["TERMINAL_ID"]).set_index("TERMINAL_ID")["max"]
    grid = candidates(0.0, 250.0)
    assert set(largest) <= set(grid)
    for terminal, values in terminals.groupby("TERMINAL_ID")["clipped"]:
        above = (values.to_numpy()[None, :] >= grid[:, None]).sum(axis=1)
        got = int((values >= largest[terminal]).sum())
        assert abs(got - 1) == np.abs(above - 1).min(), terminal

    (spending,) = released(out, "customers_spending_25_or_more", [])["privacy_id_count"]
    assert spending == rows.loc[rows["TX_AMOUNT"] >= 25, "CUSTOMER_ID"].nunique()

    for bucket in ("day", "month"):
        query = f"sum_per_terminal_per_{bucket}"
        got = released(out, query, ["TERMINAL_ID", bucket]).set_index(["TERMINAL_ID", bucket])
        buckets = sorted(rows[bucket].unique())
        assert len(got) == 100 * len(buckets)  # every public (terminal, bucket), empty ones too
        truth = terminals.groupby(["TERMINAL_ID", bucket])["clipped"].sum()
        full = truth.reindex(got.index, fill_value=0.0)
        tolerance = SIGMAS * noise_std(manifest, query, "sum") + 1e-6
        assert np.abs(got["sum"] - full).max() <= tolerance

    amounts = released(out, "counts_by_amount", ["TX_AMOUNT_bucket"])
    edges = pd.cut(rows["TX_AMOUNT"], [0, 25, 50, math.inf], right=False)
    truth = edges.value_counts().sort_index()
    assert amounts["TX_AMOUNT_bucket"].tolist() == ["[0, 25)", "[25, 50)", "[50, inf)"]
    assert amounts["count"].tolist() == truth.tolist()

    counts = released(out, "count_per_terminal", ["TERMINAL_ID"]).set_index("TERMINAL_ID")
    assert counts.index.tolist() == list(range(1, 10000))
    truth = rows.groupby("TERMINAL_ID").size().reindex(counts.index, fill_value=0)
    assert (counts["count"] == truth).all()

    assert manifest["input"] == {
        "format": "csv",
        "start_date": "2026-01-01",
        "end_date": "2026-01-06",
        "files": 1,
    }
    keys = manifest["queries"]["counts_by_amount"]["key_types"]
    assert keys == {"TX_AMOUNT_bucket": "string"}


def card_truth(folder: Path) -> pd.DataFrame:
    rows = pd.concat(pd.read_csv(p, parse_dates=["PAID_AT"]) for p in sorted(folder.glob("*.csv")))
    rows["month"] = rows["PAID_AT"].dt.strftime("%Y-%m")
    return rows


def test_a_card_table_with_string_and_bucket_keys_runs_on_every_engine(cards, tmp_path, engine):
    spec = build_spec(
        load_raw(ROOT / "jobs/configs/card_payments.yaml"),
        {**HUGE, "input.path": str(cards), "output": str(tmp_path / "release")},
    )
    from dppipeline.inputs.files import with_detected_layout

    spec = with_detected_layout(spec)  # a folder of YYYY-MM-DD.csv: csv, as the CLI detects
    result = run_job(spec, engine, echo=lambda _: None, seed=2)
    manifest = result.manifest.model_dump(mode="json", exclude_unset=True)
    rows = card_truth(cards)

    category = released(result.output, "by_category", ["MERCHANT_CATEGORY"])
    truth = rows.groupby("MERCHANT_CATEGORY").agg(
        count=("AMOUNT", "size"), sum=("AMOUNT", lambda v: v.clip(0, 250).sum())
    )
    got = category.set_index("MERCHANT_CATEGORY").loc[truth.index]
    assert len(category) == 8 and (got["count"] == truth["count"]).all()
    tolerance = SIGMAS * noise_std(manifest, "by_category", "sum") + 1e-6
    assert np.abs(got["sum"] - truth["sum"]).max() <= tolerance

    mixed = released(result.output, "by_country_and_amount", ["COUNTRY", "AMOUNT_bucket"])
    labels = pd.cut(rows["AMOUNT"], [0, 20, 50, 100, math.inf], right=False, labels=[
        "[0, 20)", "[20, 50)", "[50, 100)", "[100, inf)"
    ])  # fmt: skip
    truth = (
        rows.assign(AMOUNT_bucket=labels.astype(str)).groupby(["COUNTRY", "AMOUNT_bucket"]).size()
    )
    got = mixed.set_index(["COUNTRY", "AMOUNT_bucket"])["count"]
    assert set(got.index) <= set(truth.index)  # private selection: keys from the data only
    assert len(got) >= 0.9 * len(truth)  # thousands of cards per key: nearly all selected
    assert (got == truth.loc[got.index]).all()

    online = released(result.output, "online_by_month", ["CHANNEL", "month"])
    assert online[["CHANNEL", "month"]].values.tolist() == [["online", "2026-01"]]
    assert online["count"].tolist() == [(rows["CHANNEL"] == "online").sum()]
    assert manifest["queries"]["by_category"]["key_types"] == {"MERCHANT_CATEGORY": "string"}


# ---------------------------------------------------------------------------------------------
# The rules, as a user meets them


def spec_of(**fields) -> object:
    base = {
        "bounds": {
            "min_value": 0,
            "max_value": 100,
            "max_partitions_contributed": 1,
            "max_contributions_per_partition": 1,
        },
        "metrics": ["count"],
    }
    return build_spec({**base, **fields})


@pytest.mark.parametrize(
    ("fields", "field", "rule"),
    [
        ({"input": {"schema": "payments"}}, "input.schema", "must be one of transactions"),
        (
            {"input": {"schema": [{"name": "A", "type": "decimal"}]}},
            "input.schema",
            "column A must have one of the types int64, float64, string, timestamp[us]",
        ),
        (
            {"input": {"schema": [{"name": "A", "type": "int64"}, {"name": "A", "type": "int64"}]}},
            "input.schema",
            "column A is listed twice",
        ),
        ({"input": {"schema": "card_payments"}}, "privacy_unit", "CUSTOMER_ID is not in"),
        ({"input": {"time_column": "TX_AMOUNT"}}, "input.time_column", "must be a timestamp"),
        ({"input": {"layout": "files"}}, "input.start_date", "needs start_date and end_date"),
        ({"partition_key": "TX_AMOUNT"}, "partition_by", "cut a number into buckets"),
        ({"filter": "TX_FRAUD = 1"}, "filter", "unknown column 'TX_FRAUD'"),
        (
            {
                "queries": [
                    {"name": "q", "partition_by": [{"bucket": "TX_AMOUNT", "edges": [5, 5]}]}
                ]
            },
            "queries.q.partition_by",
            "edges must increase",
        ),
        (
            {"queries": [{"name": "q", "partition_by": [{"bucket": "TERMINAL_ID"}]}]},
            "queries.q.partition_by",
            "a derived key is {bucket: COLUMN, edges:",
        ),
        (
            {
                "input": {
                    "schema": [
                        {"name": "CUSTOMER_ID", "type": "int64"},
                        {"name": "SHOP", "type": "string"},
                    ]
                },
                "partition_key": "SHOP",
                "queries": [{"name": "q", "partition_by": ["SHOP", "month"]}],
            },
            "queries.q.partition_by",
            "time key month needs a time column",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_broken_rule_names_the_field(fields, field, rule):
    with pytest.raises(SpecError) as info:
        spec_of(**fields)
    assert info.value.field == field, info.value
    assert rule in info.value.rule, info.value


def test_an_inline_schema_reads_any_columns(tmp_path, engine):
    """A table the product has never seen, described in the spec, read end to end on every
    engine: string privacy unit, string key, an int64 bucket key, a second timestamp as the
    time column, a nullable filter column (a blank is null: SQL's `null = 'web'` keeps no row)."""
    rows = pd.DataFrame({
        "channel": ["web", "web", None, "web", "shop", "web", "web"],
        "account": ["a", "b", "c", "a", "b", "c", "d"],
        "branch": ["x", "x", "y", "y", "x", "y", "y"],
        "age": [17, 30, 45, 17, 30, 65, 70],
        "opened": ["2026-02-01 10:00:00"] * 7,
        "booked": ["2026-03-01 10:00:00", "2026-03-01 11:30:00", "2026-03-02 09:00:00",
                   "2026-03-02 23:59:59", "2026-03-03 00:00:00", "2026-03-01 08:00:00",
                   "2026-04-01 00:00:00"],
    })  # fmt: skip
    path = tmp_path / "accounts.csv"
    rows.to_csv(path, index=False)
    schema = [
        {"name": "channel", "type": "string", "nullable": True},
        {"name": "account", "type": "string"},
        {"name": "branch", "type": "string"},
        {"name": "age", "type": "int64"},
        {"name": "opened", "type": "timestamp[us]", "role": "event_time"},
        {"name": "booked", "type": "timestamp[us]"},
    ]
    spec = spec_of(
        name="accounts",
        privacy_unit="account",
        input={
            "path": str(path), "schema": schema, "time_column": "booked", "layout": "files",
            "start_date": "2026-03-01", "end_date": "2026-03-02",
        },
        budget={"epsilon": 1e12, "delta": 1e-6},
        bounds={"max_partitions_contributed": 100, "max_contributions_per_partition": 100},
        queries=[
            {"name": "by_branch_day", "partition_by": ["branch", "day"],
             "partition_selection": {"public_partitions": {"branch": ["x", "y"],
                                                           "day": "input_range"}}},
            {"name": "by_age", "partition_by": [{"bucket": "age", "edges": [18.5, 65]}]},
            {"name": "web", "partition_by": [], "filter": "channel = 'web'"},
        ],
        output=str(tmp_path / "release"),
    )  # fmt: skip
    result = run_job(spec, engine, echo=lambda _: None)
    by_day = released(result.output, "by_branch_day", ["branch", "day"])
    assert by_day.values.tolist() == [
        ["x", dt.date(2026, 3, 1), 2],
        ["x", dt.date(2026, 3, 2), 0],
        ["y", dt.date(2026, 3, 1), 1],
        ["y", dt.date(2026, 3, 2), 2],
    ]  # March 3 and April 1 are outside the period; `opened` is not the time column
    ages = released(result.output, "by_age", ["age_bucket"])
    # in the period: ages 17 (twice, below the first edge 18.5: no bucket), 30, 45, and 65 (an
    # edge: the bucket it starts); 70 is not in the period
    assert ages.values.tolist() == [["[18.5, 65)", 2], ["[65, inf)", 1]]
    assert released(result.output, "web", [])["count"].tolist() == [4]  # in the period


def test_time_keys_hour_and_year_are_iso_text(tmp_path, small_inputs):
    """`hour` as YYYY-MM-DDTHH, `year` as YYYY (text, like `month`), every public hour of the
    input days released, counts equal to the truth."""
    spec = spec_of(
        input={"path": str(small_inputs["parquet"])},
        output=str(tmp_path / "release"),
        budget={"epsilon": 1e12, "delta": 1e-6},
        bounds={"max_partitions_contributed": 1000, "max_contributions_per_partition": 1000},
        queries=[
            {"name": "hours", "partition_by": ["hour"],
             "partition_selection": {"public_partitions": {"hour": "input_range"}}},
            {"name": "years", "partition_by": ["year"],
             "partition_selection": {"public_partitions": ["2025", "2026"]}},
        ],
    )  # fmt: skip
    result = run_job(spec, "local", echo=lambda _: None)
    rows = pd.read_parquet(small_inputs["parquet"])
    hours = released(result.output, "hours", ["hour"])
    days = sorted(rows["TX_DATETIME"].dt.date.unique())
    assert len(hours) == 24 * len(days)
    truth = rows.groupby(rows["TX_DATETIME"].dt.strftime("%Y-%m-%dT%H")).size()
    got = hours.set_index("hour")["count"]
    assert (got.loc[truth.index] == truth).all() and got.drop(truth.index).eq(0).all()
    years = released(result.output, "years", ["year"])
    assert years.values.tolist() == [["2025", 0], ["2026", len(rows)]]


def test_a_bad_public_time_key_names_its_place(tmp_path, small_inputs):
    spec = spec_of(
        input={"path": str(small_inputs["parquet"])},
        output=str(tmp_path / "release"),
        queries=[{"name": "hours", "partition_by": ["hour"],
                  "partition_selection": {"public_partitions": ["2026-01-01T24"]}}],
    )  # fmt: skip
    with pytest.raises(InputError, match=r"queries.hours.partition_selection.public_partitions"):
        run_job(spec, "local", echo=lambda _: None)


@pytest.mark.slow
def test_the_files_layout_takes_a_folder_and_refuses_mixed_suffixes(book, tmp_path):
    """A folder of files (Hive-style subfolders included) from the CLI alone; without a
    format, a folder mixing .csv and .parquet is a one-line error; with one, the other
    suffix is not input."""
    folder = tmp_path / "in" / "region=north"
    folder.mkdir(parents=True)
    (folder / "part-1.csv").write_bytes(book.read_bytes())
    args = ["run", "--input", tmp_path / "in", "--no-ledger", "--schema", "book_transactions",
            "--layout", "files", "--start-date", "2026-01-01", "--end-date", "2026-01-03",
            "--metrics", "count", "--public-partitions", "1..5", "--epsilon", "1e12",
            "--max-partitions-contributed", "1000", "--max-contributions-per-partition", "1000",
            ]  # fmt: skip
    done = cli(*args, "--output", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert "reading 1 files (2026-01-01 to 2026-01-03)" in done.stderr
    rows = book_truth(book)
    rows = rows[(rows["TX_DATETIME"] < "2026-01-04") & rows["TERMINAL_ID"].between(1, 5)]
    got = pd.read_parquet(tmp_path / "out" / "terminal_stats").sort_values("TERMINAL_ID")
    assert (
        got["count"].tolist()
        == rows.groupby("TERMINAL_ID").size().reindex(range(1, 6), fill_value=0).tolist()
    )
    (folder / "part-2.parquet").write_bytes(b"PAR1")
    mixed = cli(*args, "--output", tmp_path / "out2")
    assert mixed.returncode == 1, mixed.stderr  # an input error
    assert mixed.stderr.count("\n") == 1 and "Traceback" not in mixed.stderr
    assert "holds both .csv and .parquet files" in mixed.stderr
    assert not (tmp_path / "out2").exists()
    named = cli(*args, "--format", "csv", "--output", tmp_path / "out3")
    assert named.returncode == 0, named.stderr


def test_the_spec_hash_follows_a_schema_files_content_not_its_path(tmp_path):
    columns = json.loads((ROOT / "schemas/transactions.json").read_text())["fields"]
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"name": "tx", "fields": columns}))
    second.write_text(json.dumps({"name": "tx", "fields": columns}))
    default = spec_of()
    a, b = spec_of(input={"schema": str(first)}), spec_of(input={"schema": str(second)})
    assert spec_hash(a) == spec_hash(b) != spec_hash(default)
    assert spec_hash(spec_of(input={"schema": "transactions"})) == spec_hash(default)
    edited = tmp_path / "c.json"
    edited.write_text(
        json.dumps({"name": "tx", "fields": [*columns, {"name": "X", "type": "int64"}]})
    )
    assert spec_hash(spec_of(input={"schema": str(edited)})) != spec_hash(a)
    before = spec_hash(a)
    first.write_text(edited.read_text())  # edited in place, in the same process
    assert spec_hash(spec_of(input={"schema": str(first)})) != before
    assert spec_hash(a) == before  # a spec is hashed by the columns it read


def test_a_string_column_rejects_blanks_and_bad_utf8_on_every_engine(cards, tmp_path, engine):
    """The declared schema's rules for a string key: a blank (null) and bytes that are not
    UTF-8 are rejected with the column and the rule, the raw row kept for the operator."""
    import os

    folder = tmp_path / "in"
    folder.mkdir()
    day = sorted(cards.glob("*.csv"))[0]
    lines = day.read_bytes().splitlines(keepends=True)
    header = lines[0].decode().strip().split(",")
    at = header.index("MERCHANT_CATEGORY")

    def broken(line: bytes, value: bytes) -> bytes:
        fields = line.rstrip(b"\n").split(b",")
        fields[at] = value
        return b",".join(fields) + b"\n"

    lines[3] = broken(lines[3], b"")
    lines[5] = broken(lines[5], b"gro\xffcery")
    (folder / day.name).write_bytes(b"".join(lines))
    spec = build_spec(
        load_raw(ROOT / "jobs/configs/card_payments.yaml"),
        {
            "input.path": str(folder),
            "input.format": "csv",
            "output": str(tmp_path / "out"),
            "input.max_rejected_fraction": 0.01,
        },
    )
    result = run_job(spec, engine, echo=lambda _: None)
    state = Path(os.environ["DPPIPELINE_STATE_DIR"])
    rejected = pd.read_parquet(state / "quarantine" / result.run_id / "rejected.parquet")
    rejected = rejected.sort_values("_row", ignore_index=True)
    assert rejected["_row"].tolist() == [4, 6]  # physical lines (the header is line 1)
    assert rejected["_reason"].tolist() == [
        "MERCHANT_CATEGORY is null",
        "MERCHANT_CATEGORY is not valid UTF-8",
    ]


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_hive_style_folders_give_a_column_on_every_engine(cards, tmp_path, engine, fmt):
    """A table partitioned by COUNTRY the way Hive, Spark and pyarrow write it
    (`COUNTRY=BE/part-0.parquet`): the column is not in the files; the layout `files` takes it
    from the folder names, checked by the column's rules, and keys by it like any column."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    rows = card_truth(cards).drop(columns="month")
    table = pa.Table.from_pandas(rows, preserve_index=False)
    root = tmp_path / "hive"
    if fmt == "parquet":
        pq.write_to_dataset(table, root, partition_cols=["COUNTRY"])
    else:
        for country, part in rows.groupby("COUNTRY"):
            folder = root / f"COUNTRY={country}"
            folder.mkdir(parents=True)
            text = part.drop(columns="COUNTRY").assign(
                PAID_AT=part["PAID_AT"].dt.strftime("%Y-%m-%d %H:%M:%S")
            )
            pacsv.write_csv(pa.Table.from_pandas(text, preserve_index=False), folder / "p.csv")
    spec = build_spec(
        load_raw(ROOT / "jobs/configs/card_payments.yaml"),
        {
            **HUGE,
            "input.path": str(root),
            "input.layout": "files",
            "input.start_date": START,
            "input.end_date": START + dt.timedelta(days=DAYS - 1),
            "output": str(tmp_path / "release"),
        },
    )
    spec = spec.model_copy(
        update={"queries": (spec.queries[1].model_copy(update={"partition_by": ("COUNTRY",)}),)}
    )
    from dppipeline.inputs.files import with_detected_layout

    result = run_job(with_detected_layout(spec), engine, echo=lambda _: None, seed=5)
    got = released(result.output, "by_country_and_amount", ["COUNTRY"])
    truth = rows.groupby("COUNTRY").size()
    assert got["COUNTRY"].tolist() == truth.index.tolist()
    assert got["count"].tolist() == truth.tolist()


def test_a_string_privacy_unit_is_sampled_alike_by_every_engine(tmp_path, spark):
    """Bounds that bind (L0 = 2, Linf = 3) on a string privacy unit: with the same run seed,
    every engine keeps the same rows (each hashes the unit's UTF-8 text as Spark does)."""
    rng = np.random.default_rng(1)
    n = 3000
    moments = pd.Timestamp("2026-03-01") + pd.to_timedelta(rng.integers(0, 3 * 86400, n), "s")
    rows = pd.DataFrame({
        "account": [f"acc-{i}-é" for i in rng.integers(0, 200, n)],
        "shop": [f"s{i}" for i in rng.integers(0, 20, n)],
        "t": moments.strftime("%Y-%m-%d %H:%M:%S"),
    })  # fmt: skip
    rows.to_csv(tmp_path / "rows.csv", index=False)
    released_by = {}
    for engine in ("local", "spark", "beam"):
        spec = spec_of(
            name="p",
            privacy_unit="account",
            partition_key="shop",
            metrics=["count", "privacy_id_count"],
            input={
                "path": str(tmp_path / "rows.csv"),
                "schema": [
                    {"name": "account", "type": "string"},
                    {"name": "shop", "type": "string"},
                    {"name": "t", "type": "timestamp[us]", "role": "event_time"},
                ],
                "layout": "files",
                "start_date": "2026-03-01",
                "end_date": "2026-03-03",
            },
            budget={"epsilon": 1e12, "delta": 1e-6},
            bounds={"max_partitions_contributed": 2, "max_contributions_per_partition": 3},
            partition_selection={"public_partitions": [f"s{i}" for i in range(20)]},
            output=str(tmp_path / engine),
        )
        result = run_job(spec, engine, echo=lambda _: None, seed=7)
        released_by[engine] = released(result.output, "p", ["shop"])
    local = released_by["local"]
    assert local["count"].sum() < len(rows)  # the bounds bind
    assert local.equals(released_by["spark"]) and local.equals(released_by["beam"])
