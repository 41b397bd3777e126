"""Files: daily partition discovery, day selection, public key lists (publication:
test_publication.py)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
from support.files import touch

from dppipeline.core.tasks import public_partitions
from dppipeline.errors import InputError
from dppipeline.inputs.files import (
    DailyPartition,
    discover_partitions,
    key_lines,
    select_days,
)
from dppipeline.lifecycle.public_keys import read_key_file

D1, D2, D3 = dt.date(2026, 1, 1), dt.date(2026, 1, 2), dt.date(2026, 1, 3)


def read_public_partitions(path: Path, key_column: str, dtype: str):
    """One column's keys as a run gets them: the file read by the run, parsed by core."""
    return public_partitions(read_key_file(path, [key_column]), key_column, dtype)


# --------------------------------------------------------------------------- discovery


def test_discover_parquet_layout(tmp_path):
    # Written out of order, with the debris data lakes and writers leave around.
    for day in ("2026-01-03", "2026-01-01", "2026-01-02"):
        touch(tmp_path / f"date={day}" / "part-00001.parquet")
        touch(tmp_path / f"date={day}" / "part-00000.parquet")
    touch(tmp_path / "date=2026-01-02" / "_SUCCESS")
    touch(tmp_path / "date=2026-01-02" / ".part-00002.parquet.crc")
    touch(tmp_path / "date=2026-01-02" / ".hidden.parquet")
    touch(tmp_path / "date=2026-01-02" / "notes.txt")
    touch(tmp_path / "_SUCCESS")
    touch(tmp_path / ".date=2026-01-04" / "part-00000.parquet")  # hidden folder
    touch(tmp_path / "_date=2026-01-05" / "part-00000.parquet")
    touch(tmp_path / "date=2026-01-06" / "notes.txt")  # a day without parquet files
    touch(tmp_path / "day=2026-01-07" / "part-00000.parquet")
    touch(tmp_path / "date=2026-01-08.parquet")  # a file, not a folder
    touch(tmp_path / "2026-01-09.csv")  # the other layout

    days = discover_partitions(tmp_path, "parquet")

    assert [d.day for d in days] == [D1, D2, D3]
    for d in days:
        folder = tmp_path / f"date={d.day}"
        assert d.files == (folder / "part-00000.parquet", folder / "part-00001.parquet")


def test_discover_csv_layout(tmp_path):
    for day in ("2026-01-03", "2026-01-01", "2026-01-02"):
        touch(tmp_path / f"{day}.csv")
    touch(tmp_path / "_SUCCESS")
    touch(tmp_path / ".2026-01-04.csv")
    touch(tmp_path / "_2026-01-05.csv")
    touch(tmp_path / "2026-01-06.csv.tmp")
    touch(tmp_path / "2026-01-07.txt")
    touch(tmp_path / "transactions.csv")
    touch(tmp_path / "2026-01-08.csv" / "nested.csv")  # a folder named like a day file
    touch(tmp_path / "date=2026-01-09" / "part-00000.parquet")  # the other layout

    days = discover_partitions(tmp_path, "csv")

    assert days == [
        DailyPartition(D1, (tmp_path / "2026-01-01.csv",)),
        DailyPartition(D2, (tmp_path / "2026-01-02.csv",)),
        DailyPartition(D3, (tmp_path / "2026-01-03.csv",)),
    ]


def test_discover_generated_inputs(small_inputs):
    parquet = discover_partitions(small_inputs["parquet"], "parquet")
    csv = discover_partitions(small_inputs["csv"], "csv")
    assert [d.day for d in parquet] == [d.day for d in csv] == [D1, D2, D3]
    assert all(len(d.files) == 1 for d in parquet + csv)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
@pytest.mark.parametrize("kind", ["dangling", "looping"])
def test_discover_refuses_a_broken_day_link(tmp_path, fmt, kind):
    """A day file (or folder, or Parquet file) that is a broken or looping symbolic link is
    an error naming it, never a day skipped while the manifest claims the whole range
    (issue 15 item 9)."""
    if fmt == "csv":
        touch(tmp_path / "2026-01-01.csv")
        link = tmp_path / "2026-01-02.csv"
    else:
        touch(tmp_path / "date=2026-01-01" / "part-00000.parquet")
        touch(tmp_path / "date=2026-01-02" / "part-00000.parquet")
        link = tmp_path / "date=2026-01-02" / "part-00001.parquet"
    if kind == "dangling":
        link.symlink_to(tmp_path / "gone.csv")
    else:
        link.symlink_to(link)
    with pytest.raises(InputError) as info:
        discover_partitions(tmp_path, fmt)
    assert str(info.value) == f"{link}: a broken or looping symbolic link"


def test_discover_refuses_a_dangling_day_folder(tmp_path):
    touch(tmp_path / "date=2026-01-01" / "part-00000.parquet")
    (tmp_path / "date=2026-01-02").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InputError, match="date=2026-01-02: a broken or looping symbolic link"):
        discover_partitions(tmp_path, "parquet")


def test_discover_follows_a_good_link(tmp_path):
    target = touch(tmp_path / "store" / "jan1.csv")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "2026-01-01.csv").symlink_to(target)
    assert discover_partitions(tmp_path / "in", "csv")[0].day == D1


def test_discover_refuses_a_folder_named_like_a_parquet_file(tmp_path):
    touch(tmp_path / "date=2026-01-01" / "part-00000.parquet" / "inner.parquet")
    with pytest.raises(InputError, match=r"part-00000\.parquet: not a file"):
        discover_partitions(tmp_path, "parquet")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any folder")
def test_discover_unreadable_folder_is_one_line(tmp_path):
    touch(tmp_path / "in" / "2026-01-01.csv")
    (tmp_path / "in").chmod(0)
    try:
        with pytest.raises(InputError, match=r"cannot list input folder .*in: Permission denied"):
            discover_partitions(tmp_path / "in", "csv")
    finally:
        (tmp_path / "in").chmod(0o755)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_discover_missing_folder(tmp_path, fmt):
    missing = tmp_path / "nowhere"
    with pytest.raises(InputError) as info:
        discover_partitions(missing, fmt)
    assert str(missing) in str(info.value)
    assert "not exist" in str(info.value)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_discover_file_instead_of_folder(tmp_path, fmt):
    path = touch(tmp_path / "2026-01-01.csv")
    with pytest.raises(InputError) as info:
        discover_partitions(path, fmt)
    assert str(path) in str(info.value)
    assert "not a folder" in str(info.value)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_discover_empty_folder(tmp_path, fmt):
    touch(tmp_path / "_SUCCESS")
    touch(tmp_path / "README.md")
    with pytest.raises(InputError) as info:
        discover_partitions(tmp_path, fmt)
    assert str(tmp_path) in str(info.value)
    assert "no daily partitions" in str(info.value)


def test_discover_invalid_day_names_the_path(tmp_path):
    bad = touch(tmp_path / "2026-02-30.csv")
    touch(tmp_path / "2026-02-28.csv")
    with pytest.raises(InputError) as info:
        discover_partitions(tmp_path, "csv")
    assert str(bad) in str(info.value)


# --------------------------------------------------------------------------- select_days

PARTS = [DailyPartition(D1, ()), DailyPartition(D2, ()), DailyPartition(D3, ())]


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (None, None, [D1, D2, D3]),
        (D2, None, [D2, D3]),
        (None, D2, [D1, D2]),
        (D2, D2, [D2]),
        (D1, D3, [D1, D2, D3]),
        (dt.date(2025, 12, 1), dt.date(2026, 1, 1), [D1]),
        (D3, dt.date(2027, 1, 1), [D3]),
    ],
)
def test_select_days_is_inclusive(start, end, expected):
    assert [p.day for p in select_days(PARTS, start, end, "in")] == expected


@pytest.mark.parametrize(
    ("start", "end"),
    [(dt.date(2026, 2, 1), None), (None, dt.date(2025, 12, 31)), (D2, D1)],
)
def test_select_days_empty_names_the_available_range(start, end):
    with pytest.raises(InputError) as info:
        select_days(PARTS, start, end, "/data/in")
    message = str(info.value)
    assert "/data/in" in message
    assert "2026-01-01 to 2026-01-03" in message


# --------------------------------------------------------------------------- public partitions


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("TERMINAL_ID\n3\n1\n3\n2\n", id="header"),
        pytest.param("3\n1\n\n3\n2\n", id="no-header"),
        pytest.param("  3 \n1\n3\n2\n\n", id="spaces"),
        pytest.param("TERMINAL_ID,NAME\n3,a\n1,b\n3,c\n2,d\n", id="csv-key-first"),
        # "a CSV with the key column": the key need not be its first column.
        pytest.param("NAME,TERMINAL_ID\na,3\nb,1\nc,3\nd,2\n", id="csv-key-second"),
    ],
)
def test_read_public_partitions(tmp_path, text):
    path = touch(tmp_path / "keys.csv", text)
    frame = read_public_partitions(path, "TERMINAL_ID", "int64")
    assert list(frame.columns) == ["TERMINAL_ID"]
    assert str(frame["TERMINAL_ID"].dtype) == "int64"
    assert frame["TERMINAL_ID"].tolist() == [3, 1, 2]  # first occurrence kept, in file order


def test_read_public_partitions_strings(tmp_path):
    path = touch(tmp_path / "keys.txt", "MERCHANT\nb\na\nb\n")
    frame = read_public_partitions(path, "MERCHANT", "string")
    assert frame["MERCHANT"].tolist() == ["b", "a"]


@pytest.mark.parametrize(
    ("text", "line", "bad", "rule"),
    [
        ("TERMINAL_ID\n1\n2\nx7\n", 4, "x7", "not a valid TERMINAL_ID key"),
        ("1\n\n2.5\n", 3, "2.5", "not a valid TERMINAL_ID key"),
        ("terminal_id\n1\n", 1, "terminal_id", "not a valid TERMINAL_ID key"),
        ("1\n\u0663\n", 2, "\u0663", "not a valid TERMINAL_ID key"),  # not an ASCII digit
        ("1\n9223372036854775808\n", 2, "9223372036854775808", "outside the int64 range"),
        ("1\n-9223372036854775809\n", 2, "9223372036854775809", "outside the int64 range"),
    ],
)
def test_read_public_partitions_bad_key_names_the_line(tmp_path, text, line, bad, rule):
    """The line and the rule, never the key's text (issue 15 item 8: a key above int64 was a
    traceback)."""
    path = touch(tmp_path / "keys.csv", text)
    with pytest.raises(InputError) as info:
        read_public_partitions(path, "TERMINAL_ID", "int64")
    message = str(info.value)
    assert str(path) in message
    assert f"line {line}:" in message
    assert rule in message
    assert bad not in message


def test_read_public_partitions_int64_limits(tmp_path):
    path = touch(tmp_path / "keys.csv", "-9223372036854775808\n9223372036854775807\n+5\n")
    keys = read_public_partitions(path, "TERMINAL_ID", "int64")["TERMINAL_ID"].tolist()
    assert keys == [-(2**63), 2**63 - 1, 5]


@pytest.mark.parametrize("dtype", ["int64", "string"])
def test_read_public_partitions_strips_a_byte_order_mark(tmp_path, dtype):
    path = tmp_path / "keys.csv"
    path.write_bytes(b"\xef\xbb\xbfTERMINAL_ID\n3\n1\n")
    keys = read_public_partitions(path, "TERMINAL_ID", dtype)["TERMINAL_ID"].tolist()
    assert keys == ([3, 1] if dtype == "int64" else ["3", "1"])


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", ": a binary file, not text (one key per line)"),
        (b"TERMINAL_ID\n1\n\xe9t\xe9\n", " line 3: not UTF-8 text"),
    ],
)
def test_read_public_partitions_refuses_binary_or_non_utf8(tmp_path, data, words):
    path = tmp_path / "keys.csv"
    path.write_bytes(data)
    with pytest.raises(InputError) as info:
        read_public_partitions(path, "TERMINAL_ID", "int64")
    assert str(info.value) == f"public partitions {path}{words}"


@pytest.mark.parametrize("text", ["", "\n\n", "TERMINAL_ID\n"])
def test_read_public_partitions_without_keys(tmp_path, text):
    path = touch(tmp_path / "keys.csv", text)
    with pytest.raises(InputError, match="no keys"):
        read_public_partitions(path, "TERMINAL_ID", "int64")


def test_read_public_partitions_missing_file(tmp_path):
    with pytest.raises(InputError) as info:
        read_public_partitions(tmp_path / "keys.csv", "TERMINAL_ID", "int64")
    assert str(tmp_path / "keys.csv") in str(info.value)


def test_one_reader_for_every_key_file(tmp_path):
    """`key_lines` reads one-column and several-column key files alike: quoted fields as in
    any CSV, other columns ignored, blank lines skipped, physical line numbers."""
    path = touch(
        tmp_path / "keys.csv",
        'note,TERMINAL_ID,day\n"a, b",7,2026-01-01\n\n"c",8,2026-01-02\n',
    )
    assert key_lines(path, ["TERMINAL_ID", "day"]) == [
        (2, ["7", "2026-01-01"]),
        (4, ["8", "2026-01-02"]),
    ]
    assert key_lines(path, ["TERMINAL_ID"]) == [(2, ["7"]), (4, ["8"])]
    with pytest.raises(InputError, match="no month column in the header"):
        key_lines(path, ["TERMINAL_ID", "month"])
    short = touch(tmp_path / "short.csv", "TERMINAL_ID,day\n7\n")
    with pytest.raises(InputError, match=r"line 2: no day field \(column 2 of the header\)"):
        key_lines(short, ["TERMINAL_ID", "day"])
