"""Row validation: rejected rows are counted, located (file + line/row) and kept aside in the
operator's quarantine folder; above max_rejected_fraction the run fails."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.data import DAYS

from dppipeline.engines.kernel.polars_read import read_validated
from dppipeline.engines.kernel.polars_rules import broken, column_flag, parsed, parsed_name
from dppipeline.errors import InputError
from dppipeline.inputs.contract import (
    Check,
    RejectedRow,
    RejectSummary,
    Source,
    check_rejected_fraction,
    rules_for,
)
from dppipeline.inputs.files import DailyPartition
from dppipeline.lifecycle.runner import run_job
from dppipeline.spec.model import build_spec
from dppipeline.spec.schema import transactions_schema

HEADER = "TRANSACTION_ID,TX_DATETIME,CUSTOMER_ID,TERMINAL_ID,TX_AMOUNT"
COLUMNS = HEADER.split(",")
DEFAULT_MAX_FRACTION = 0.001


def quarantine_root() -> Path:
    """Where runs of this test put rejected rows (the test's own state folder)."""
    return Path(os.environ["DPPIPELINE_STATE_DIR"]) / "quarantine"


def read(paths: list[Path], fmt: str):
    days = [DailyPartition(DAYS[0] + dt.timedelta(days=i), (p,)) for i, p in enumerate(paths)]
    return read_validated(days, fmt, transactions_schema())


def write_csv(path: Path, rows: list[str], header: str = HEADER) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def json_keys(value: object) -> list[str]:
    """Every key of a nested JSON value, lower-cased."""
    if isinstance(value, dict):
        return [k.lower() for k in value] + [k for v in value.values() for k in json_keys(v)]
    if isinstance(value, list):
        return [k for v in value for k in json_keys(v)]
    return []


def rejected_by_row(rejected: pl.DataFrame) -> dict[int, str]:
    return dict(zip(rejected["_row"].to_list(), rejected["_reason"].to_list(), strict=True))


# --------------------------------------------------------------------------- read_validated

CSV_DAY1 = [
    "0,2026-01-01 00:00:01,1,10,12.5",  # line 2: valid
    "1,2026-01-01 00:00:02,,10,3.0",  # line 3: null CUSTOMER_ID
    "2,2026-01-01 00:00:03,2,,4.0",  # line 4: null TERMINAL_ID
    "3,2026-01-01 00:00:04,3,11,abc",  # line 5: unparseable amount
    "4,2026-01-01 00:00:05,3,11,inf",  # line 6: infinite amount
    "5,2026-01-01 25:61:00,3,11,1.0",  # line 7: bad timestamp
    "6,2026-01-01T00:00:07,4,12,7.25",  # line 8: valid (ISO 'T' separator)
    "7,2026-01-01 00:00:08,4,12,NaN",  # line 9: NaN amount
]
CSV_DAY1_REJECTS = {
    3: ["CUSTOMER_ID", "null"],
    4: ["TERMINAL_ID", "null"],
    5: ["TX_AMOUNT", "float64"],
    6: ["TX_AMOUNT", "finite"],
    7: ["TX_DATETIME", "timestamp"],
    9: ["TX_AMOUNT", "finite"],
}
CSV_DAY2 = [
    "8,2026-01-02 00:00:01,5,10,1.0",  # line 2: valid
    "9,2026-01-02 00:00:02,5,10,-inf",  # line 3: infinite amount
]


def test_csv_rejects_counted_with_reasons_and_lines(tmp_path):
    day1 = write_csv(tmp_path / "2026-01-01.csv", CSV_DAY1)
    day2 = write_csv(tmp_path / "2026-01-02.csv", CSV_DAY2)

    result = read([day1, day2], "csv")

    summary = result.summary
    assert summary.rows_read == 10
    assert summary.rows_rejected == 7
    assert math.isclose(summary.fraction, 0.7)
    # The first rejected row: first file in day order, first bad line in it (header = line 1).
    assert summary.first == RejectedRow(
        file=str(day1), row=3, reason=summary.first.reason, fmt="csv"
    )
    assert "CUSTOMER_ID" in summary.first.reason
    assert summary.first.describe().startswith(f"{day1} line 3: ")

    rejected = result.rejected
    day1_rejects = rejected.filter(pl.col("_source_file") == str(day1))
    reasons = rejected_by_row(day1_rejects)
    assert sorted(reasons) == sorted(CSV_DAY1_REJECTS)
    for line, words in CSV_DAY1_REJECTS.items():
        for word in words:
            assert word in reasons[line], (line, reasons[line])
        assert "abc" not in reasons[line] and "25:61" not in reasons[line]  # never the value
    day2_rejects = rejected.filter(pl.col("_source_file") == str(day2))
    assert list(rejected_by_row(day2_rejects)) == [3]
    # Rejected rows keep their raw text, for whoever repairs the input.
    raw = day1_rejects.filter(pl.col("_row") == 5).row(0, named=True)
    assert raw["TX_AMOUNT"] == "abc"
    assert raw["TRANSACTION_ID"] == "3"

    rows = result.rows
    assert rows.columns == [*COLUMNS, "_source_file", "_row"]
    assert rows.schema["TX_DATETIME"] == pl.Datetime("us")
    assert rows.schema["CUSTOMER_ID"] == pl.Int64
    assert rows.schema["TX_AMOUNT"] == pl.Float64
    assert rows["TRANSACTION_ID"].to_list() == [0, 6, 8]
    assert rows["TX_AMOUNT"].to_list() == [12.5, 7.25, 1.0]
    assert rows["TX_DATETIME"][1] == dt.datetime(2026, 1, 1, 0, 0, 7)


def test_first_reject_follows_file_order_not_line_order(tmp_path):
    day1 = write_csv(tmp_path / "2026-01-01.csv", CSV_DAY1[:1] + CSV_DAY1[6:7])  # all valid
    day2 = write_csv(tmp_path / "2026-01-02.csv", [CSV_DAY2[0]] * 5 + [CSV_DAY2[1]])
    day3 = write_csv(tmp_path / "2026-01-03.csv", [CSV_DAY1[1]])
    summary = read([day1, day2, day3], "csv").summary
    assert summary.rows_rejected == 2
    assert (summary.first.file, summary.first.row) == (str(day2), 7)


def _parquet(path: Path, columns: dict[str, pa.Array], row_group_size: int = 2) -> Path:
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def _times(*seconds: int) -> pa.Array:
    base = dt.datetime(2026, 1, 1)
    return pa.array([base + dt.timedelta(seconds=s) for s in seconds], pa.timestamp("us"))


def test_parquet_rejects_counted_with_reasons_and_rows(tmp_path):
    typed = _parquet(
        tmp_path / "typed.parquet",
        {
            "TRANSACTION_ID": pa.array(range(6), pa.int64()),
            "TX_DATETIME": _times(*range(6)),
            "CUSTOMER_ID": pa.array([1, None, 2, 3, 4, 5], pa.int64()),
            "TERMINAL_ID": pa.array([10, 10, None, 11, 11, 12], pa.int64()),
            "TX_AMOUNT": pa.array([1.0, 2.0, 3.0, math.inf, math.nan, 5.0]),
        },
    )
    # Text columns, as some exports write them: parsed, and rejected where they do not parse.
    text = _parquet(
        tmp_path / "text.parquet",
        {
            "TRANSACTION_ID": pa.array([6, 7, 8, 9], pa.int64()),
            "TX_DATETIME": pa.array(
                ["2026-01-02 00:00:00", "not a time", "2026-01-02T00:00:02", "2026-01-02 00:00:03"]
            ),
            "CUSTOMER_ID": pa.array([1, 2, 3, 4], pa.int64()),
            "TERMINAL_ID": pa.array([10, 11, 12, 13], pa.int64()),
            "TX_AMOUNT": pa.array(["1.5", "2.5", " 3.5 ", "abc"]),
            "EXTRA": pa.array(["ignored"] * 4),
        },
    )

    result = read([typed, text], "parquet")

    summary = result.summary
    assert (summary.rows_read, summary.rows_rejected) == (10, 6)
    assert summary.first.file == str(typed)
    assert summary.first.row == 2  # 1-based, across row groups of 2 rows
    assert summary.first.describe().startswith(f"{typed} row 2: ")
    rejected = result.rejected
    typed_reasons = rejected_by_row(rejected.filter(pl.col("_source_file") == str(typed)))
    assert sorted(typed_reasons) == [2, 3, 4, 5]
    assert "CUSTOMER_ID" in typed_reasons[2]
    assert "TERMINAL_ID" in typed_reasons[3]
    assert "TX_AMOUNT" in typed_reasons[4]
    assert "finite" in typed_reasons[4]
    assert "finite" in typed_reasons[5]
    text_reasons = rejected_by_row(rejected.filter(pl.col("_source_file") == str(text)))
    assert sorted(text_reasons) == [2, 4]
    assert "TX_DATETIME" in text_reasons[2]
    assert text_reasons[4] == "TX_AMOUNT is not a valid float64 (a decimal number)"

    rows = result.rows
    assert rows.columns == [*COLUMNS, "_source_file", "_row"]
    assert rows["TRANSACTION_ID"].to_list() == [0, 5, 6, 8]
    assert rows["TX_AMOUNT"].to_list() == [1.0, 5.0, 1.5, 3.5]
    assert rows["TX_DATETIME"][3] == dt.datetime(2026, 1, 2, 0, 0, 2)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_missing_column_names_file_and_column(tmp_path, fmt):
    columns = [c for c in COLUMNS if c != "TERMINAL_ID"]
    if fmt == "csv":
        path = write_csv(
            tmp_path / "2026-01-01.csv", ["0,2026-01-01 00:00:01,1,2.0"], ",".join(columns)
        )
    else:
        path = _parquet(
            tmp_path / "part-00000.parquet",
            {
                "TRANSACTION_ID": pa.array([0], pa.int64()),
                "TX_DATETIME": _times(1),
                "CUSTOMER_ID": pa.array([1], pa.int64()),
                "TX_AMOUNT": pa.array([2.0]),
            },
        )
    with pytest.raises(InputError) as info:
        read([path], fmt)
    assert str(path) in str(info.value)
    assert "TERMINAL_ID" in str(info.value)


def test_unreadable_parquet_names_the_file(tmp_path):
    path = tmp_path / "part-00000.parquet"
    path.write_text("not parquet at all")
    with pytest.raises(InputError) as info:
        read([path], "parquet")
    assert str(path) in str(info.value)


def test_empty_csv_file_names_the_file(tmp_path):
    """A zero-byte day file (an interrupted export) is an input error naming the file."""
    path = tmp_path / "2026-01-01.csv"
    path.write_text("")
    with pytest.raises(InputError) as info:
        read([path], "csv")
    assert str(path) in str(info.value)


def test_csv_row_with_extra_field_is_rejected_with_its_line(tmp_path):
    """A CSV line with one field too many (an unquoted thousands separator) is rejected
    row-wise, never read shifted (issue 15 item 4)."""
    ok = write_csv(tmp_path / "2026-01-01.csv", CSV_DAY1[:1])
    bad = write_csv(
        tmp_path / "2026-01-02.csv", [CSV_DAY2[0], "10,2026-01-02 00:00:03,5,11,1,000.50"]
    )
    result = read([ok, bad], "csv")
    assert (result.summary.rows_read, result.summary.rows_rejected) == (3, 1)
    assert result.summary.first.describe() == (
        f"{bad} line 3: wrong number of fields (not the header's)"
    )
    assert result.rows["TRANSACTION_ID"].to_list() == [0, 8]  # never read shifted


def test_header_only_csv_holds_no_rows(tmp_path):
    result = read([write_csv(tmp_path / "2026-01-01.csv", [])], "csv")
    assert (result.summary.rows_read, result.summary.rows_rejected) == (0, 0)
    assert result.summary.first is None
    with pytest.raises(InputError, match="no rows"):
        check_rejected_fraction(result.summary, DEFAULT_MAX_FRACTION)


@pytest.mark.parametrize(("rejected", "fails"), [(0, False), (1, False), (2, True)])
def test_threshold_fails_only_above_the_fraction(rejected, fails):
    first = RejectedRow(file="/in/2026-01-02.csv", row=7, reason="TX_AMOUNT is null", fmt="csv")
    summary = RejectSummary(rows_read=1000, rows_rejected=rejected, first=first)
    if not fails:
        check_rejected_fraction(summary, DEFAULT_MAX_FRACTION)
        return
    with pytest.raises(InputError) as info:
        check_rejected_fraction(summary, DEFAULT_MAX_FRACTION)
    assert "/in/2026-01-02.csv line 7" in str(info.value)


# --------------------------------------------------------------------------- whole runs


def corrupt_csv(path: Path, lines: list[int]) -> None:
    """Sets TX_AMOUNT to 'abc' on the given lines (header = line 1)."""
    text = path.read_text().splitlines()
    for line in lines:
        fields = text[line - 1].split(",")
        fields[-1] = "abc"
        text[line - 1] = ",".join(fields)
    path.write_text("\n".join(text) + "\n")


def corrupt_parquet(path: Path, rows: list[int]) -> None:
    """Sets CUSTOMER_ID to null on the given rows (1-based)."""
    table = pq.read_table(path)
    ids = table.column("CUSTOMER_ID").to_pylist()
    for row in rows:
        ids[row - 1] = None
    column = table.schema.get_field_index("CUSTOMER_ID")
    table = table.set_column(column, "CUSTOMER_ID", pa.array(ids, pa.int64()))
    pq.write_table(table, path)


def day_file(root: Path, fmt: str, day: int) -> Path:
    iso = DAYS[day].isoformat()
    return root / f"{iso}.csv" if fmt == "csv" else root / f"date={iso}" / "part-00000.parquet"


def corrupt(root: Path, fmt: str, day: int, positions: list[int]) -> Path:
    path = day_file(root, fmt, day)
    (corrupt_csv if fmt == "csv" else corrupt_parquet)(path, positions)
    return path


def total_rows(root: Path, fmt: str) -> int:
    if fmt == "csv":
        return sum(len(p.read_text().splitlines()) - 1 for p in root.glob("*.csv"))
    return sum(pq.read_metadata(p).num_rows for p in root.glob("date=*/*.parquet"))


def job(root: Path, fmt: str, output: Path):
    return build_spec(
        {},
        {
            "input.path": str(root),
            "input.format": fmt,
            "output": str(output),
            "bounds.min_value": 0.0,
            "bounds.max_value": 100.0,
            "bounds.max_partitions_contributed": 1,
            "bounds.max_contributions_per_partition": 1,
        },
    )


@pytest.fixture(params=["csv", "parquet"])
def workdir(request, tmp_path, small_inputs) -> tuple[str, Path]:
    """(fmt, a private copy of the generated input in that layout), safe to corrupt."""
    fmt = request.param
    root = tmp_path / "in"
    shutil.copytree(small_inputs[fmt], root)
    return fmt, root


def test_under_threshold_run_quarantines_rejected_rows(workdir):
    fmt, root = workdir
    assert 1 / total_rows(root, fmt) <= DEFAULT_MAX_FRACTION  # one bad row is tolerated
    bad_file = corrupt(root, fmt, 1, [10])
    output = root.parent / "release"
    said: list[str] = []

    result = run_job(job(root, fmt, output), echo=said.append)

    # The operator hears about the rejects; the release does not.
    assert any("rejected 1" in line for line in said), said
    quarantine = quarantine_root() / result.run_id / "rejected.parquet"
    assert quarantine.is_file()
    rejected = pl.read_parquet(quarantine)
    assert rejected.height == 1
    row = rejected.row(0, named=True)
    assert row["_source_file"] == str(bad_file)
    assert row["_row"] == 10
    assert ("TX_AMOUNT" if fmt == "csv" else "CUSTOMER_ID") in row["_reason"]
    if fmt == "csv":
        assert row["TX_AMOUNT"] == "abc"
    else:
        assert row["CUSTOMER_ID"] is None

    assert sorted(p.name for p in output.iterdir()) == ["manifest.json", "terminal_stats"]
    assert result.manifest.run_id == result.run_id
    written = json.loads((result.output / "manifest.json").read_text())
    for path in output.rglob("*"):
        assert "reject" not in path.name.lower()
        if path.is_file() and path.name != "manifest.json":
            assert b"reject" not in path.read_bytes().lower(), path
    # The manifest may state the policy (max_rejected_fraction), never counts or locations.
    manifest_text = (output / "manifest.json").read_text().lower()
    assert "quarantine" not in manifest_text
    assert all(key == "max_rejected_fraction" for key in json_keys(written) if "reject" in key)
    assert all("rows" not in key for key in json_keys(written))
    # Nothing beside the release: the quarantine is with the operator's state.
    assert sorted(p.name for p in root.parent.iterdir()) == ["in", "release", "state"]


def test_above_threshold_run_fails_naming_first_bad_row(workdir):
    fmt, root = workdir
    # Two bad rows in day 2, one in day 3 (on an earlier line): the first is day 2's.
    first_file = corrupt(root, fmt, 1, [10, 20])
    corrupt(root, fmt, 2, [3])
    assert 3 / total_rows(root, fmt) > DEFAULT_MAX_FRACTION
    output = root.parent / "release"

    with pytest.raises(InputError) as info:
        run_job(job(root, fmt, output), echo=lambda _: None)

    message = str(info.value)
    word = "line" if fmt == "csv" else "row"
    assert f"{first_file} {word} 10:" in message
    assert "max_rejected_fraction" in message
    assert not output.exists()
    # Only the quarantine is left beside the input: no release, no staging folder.
    assert sorted(p.name for p in root.parent.iterdir()) == ["in", "state"]
    (quarantine,) = quarantine_root().glob("*/rejected.parquet")
    assert pl.read_parquet(quarantine).height == 3


def test_above_threshold_cli_exit_1_without_release(tmp_path, small_inputs):
    root = tmp_path / "in"
    shutil.copytree(small_inputs["csv"], root)
    bad_file = corrupt(root, "csv", 0, [5, 6, 7])
    dest = tmp_path / "dest"
    dest.mkdir()
    output = dest / "release"
    env = {k: v for k, v in os.environ.items() if k != "DPPIPELINE_DEBUG"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dppipeline",
            "run",
            "--format",
            "csv",
            "--input",
            str(root),
            "--output",
            str(output),
            "--min-value",
            "0",
            "--max-value",
            "100",
            "--max-partitions-contributed",
            "1",
            "--max-contributions-per-partition",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr[-800:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("dppipeline run: error: ")
    assert f"{bad_file} line 5:" in errors[0]
    assert result.stderr.strip().splitlines()[-1] == errors[0]
    assert not any(dest.iterdir())
    assert len(list(quarantine_root().glob("*/rejected.parquet"))) == 1


def test_blank_csv_lines_are_skipped_and_line_numbers_stay_true(tmp_path):
    path = write_csv(
        tmp_path / "2026-01-01.csv",
        [
            "0,2026-01-01 00:00:01,1,10,2.0",
            "",
            "1,2026-01-01 00:00:02,2,10,abc",
            "",
        ],
    )
    result = read([path], "csv")
    assert (result.summary.rows_read, result.summary.rows_rejected) == (2, 1)
    assert result.summary.first.row == 4  # header line 1, blank line 3 still counted


def null_out(path: Path, column: str, row: int) -> None:
    """Sets `column` to null on one (1-based) row of a Parquet file."""
    table = pq.read_table(path)
    values = table.column(column).to_pylist()
    values[row - 1] = None
    index = table.schema.get_field_index(column)
    pq.write_table(
        table.set_column(index, column, pa.array(values, table.schema.field(index).type)), path
    )


@pytest.mark.parametrize("engine", ["local", "spark", "beam"])
def test_only_the_columns_a_job_reads_are_validated(engine, tmp_path, small_inputs, request):
    """A null TRANSACTION_ID rejects a row only for a job that reads the column (here: keyed
    by it); a null CUSTOMER_ID (the unit) always does, and so does a null TX_DATETIME: with
    layout daily the time column is read whatever the queries name, every row checked
    against its file's day (issue 32 item 9c). Every engine agrees, and the quarantine names
    the broken column (Beam keeps no Parquet row numbers, so rows are told apart by their
    reason)."""
    if engine == "spark":
        request.getfixturevalue("spark")
    root = tmp_path / "in"
    shutil.copytree(small_inputs["parquet"], root)
    path = day_file(root, "parquet", 1)
    null_out(path, "TRANSACTION_ID", 5)
    null_out(path, "TX_DATETIME", 6)
    null_out(path, "CUSTOMER_ID", 7)
    rows_total = total_rows(root, "parquet")

    def run(name: str, partition_by: list[str]) -> tuple[list[str], pd.DataFrame]:
        said: list[str] = []
        spec = build_spec(
            {
                "name": name,
                "input": {"path": str(root), "format": "parquet", "max_rejected_fraction": 0.01},
                "output": str(tmp_path / name),
                "bounds": {
                    "min_value": 0.0,
                    "max_value": 100.0,
                    "max_partitions_contributed": 1,
                    "max_contributions_per_partition": 1,
                },
                "queries": [{"name": "q", "partition_by": partition_by, "metrics": ["count"]}],
            }
        )
        result = run_job(spec, engine, echo=said.append)
        quarantine = quarantine_root() / result.run_id / "rejected.parquet"
        return said, pd.read_parquet(quarantine)  # Spark writes a folder

    said, rejected = run("by_terminal", ["TERMINAL_ID"])
    assert any(f"read {rows_total:,} rows; rejected 2" in line for line in said), said
    assert sorted(rejected["_reason"]) == ["CUSTOMER_ID is null", "TX_DATETIME is null"]
    assert "TRANSACTION_ID" not in rejected.columns  # never read

    said, rejected = run("by_transaction", ["TRANSACTION_ID"])
    assert any(f"read {rows_total:,} rows; rejected 3" in line for line in said), said
    assert sorted(rejected["_reason"]) == [
        "CUSTOMER_ID is null",
        "TRANSACTION_ID is null",
        "TX_DATETIME is null",
    ]


# --------------------------------------------------------------------------- the rules


NUMBER_CHARACTERS = [*"0123456789+-.eE \t\n,_xXdf", "inf", "nan", "Infinity", "\u0663", "\ufffd"]
TIME_PIECES = ["2026-01-01", "2026-02-30", "2026-1-1", "0999-01-01", " ", "T", "\t"]
TIME_PIECES += ["10:00:00", "23:59:60", "24:00:00", "9:00:00", ".5", ".1234567", "Z", "+01:00"]
TIME_PIECES += [" UTC", "\ufffd", "\n", ":", "0", ""]


def texts(pieces: list[str], size: int):
    return st.lists(st.sampled_from(pieces), max_size=size).map("".join)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(texts(NUMBER_CHARACTERS, 6), texts(TIME_PIECES, 5)), min_size=1))
def test_polars_fast_flags_equal_the_whole_rule_chain(rows):
    """The local engine flags int64 and float64 text by a failed parse alone and timestamp
    text by its grammar (not also its UTF-8 and zone checks): the same rows as the whole
    chain of rules, so the extra regular expressions run only for rejected rows' reasons."""
    schema = transactions_schema().subset(["TX_DATETIME", "TERMINAL_ID", "TX_AMOUNT"])
    sources = dict.fromkeys(schema.names, Source.TEXT)
    rules = rules_for(schema, sources, csv=False)
    numbers, times = [r[0] for r in rows], [r[1] for r in rows]
    frame = pl.DataFrame(
        {"TERMINAL_ID": numbers, "TX_AMOUNT": numbers, "TX_DATETIME": times, "_day": DAYS[0]}
    ).with_columns(parsed(f, Source.TEXT).alias(parsed_name(f.name)) for f in schema.fields)
    for field in schema.fields:
        mine = [r for r in rules if r.column == field.name]
        fast = frame.select(column_flag(field, Source.TEXT, rules)).to_series()
        whole = frame.select(pl.any_horizontal([broken(r, sources) for r in mine])).to_series()
        assert fast.to_list() == whole.to_list(), field.name


def test_every_check_has_a_reason_that_names_its_column_and_no_value():
    schema = transactions_schema()
    for sources in (
        dict.fromkeys(schema.names, Source.TEXT),
        {**dict.fromkeys(schema.names, Source.FLOAT), "TX_DATETIME": Source.ZONED_TIMESTAMP},
    ):
        rules = rules_for(schema, sources, csv=True)
        assert rules[0].check is Check.FIELDS
        for rule in rules[1:]:
            assert rule.reason.startswith(f"{rule.column} ")
        assert len({r.reason for r in rules}) == len(rules) - sum(  # one text per rule, but
            r.check is Check.NON_FINITE_TEXT
            for r in rules  # nan text reads "not finite" too
        )
