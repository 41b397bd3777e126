"""Files: daily partition discovery and public key lists (publication: `publication.py`).

Two input layouts, as data lakes and the book's data set use them:
`DIR/date=YYYY-MM-DD/*.parquet` (Hive-style folders) and `DIR/YYYY-MM-DD.csv` (one file a day).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dppipeline.errors import InputError

_DAY = r"(\d{4}-\d{2}-\d{2})"
_PARQUET_DIR = re.compile(rf"^date={_DAY}$")
_CSV_FILE = re.compile(rf"^{_DAY}\.csv$")


@dataclass(frozen=True)
class DailyPartition:
    """One day of input: its date and the files that hold it."""

    day: dt.date
    files: tuple[Path, ...]


def discover_partitions(root: str | Path, fmt: str) -> list[DailyPartition]:
    """All daily partitions under `root` in the given layout, sorted by day."""
    root = Path(root)
    if not root.exists():
        raise InputError(f"input folder {root} does not exist")
    if not root.is_dir():
        raise InputError(f"input {root} is not a folder")
    days: list[DailyPartition] = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith((".", "_")):
            continue
        if fmt == "parquet":
            match = _PARQUET_DIR.match(entry.name)
            if match and entry.is_dir():
                files = tuple(
                    sorted(
                        p
                        for p in entry.iterdir()
                        if p.suffix == ".parquet" and not p.name.startswith((".", "_"))
                    )
                )
                if files:
                    days.append(DailyPartition(_parse_day(match.group(1), entry), files))
        else:
            match = _CSV_FILE.match(entry.name)
            if match and entry.is_file():
                days.append(DailyPartition(_parse_day(match.group(1), entry), (entry,)))
    if not days:
        layout = "date=YYYY-MM-DD/*.parquet folders" if fmt == "parquet" else "YYYY-MM-DD.csv files"
        raise InputError(f"no daily partitions ({layout}) in {root}")
    return days


def select_days(
    partitions: list[DailyPartition], start: dt.date | None, end: dt.date | None, root: str | Path
) -> list[DailyPartition]:
    """The partitions in the inclusive range [start, end]; an empty selection is an error."""
    chosen = [
        p for p in partitions if (start is None or p.day >= start) and (end is None or p.day <= end)
    ]
    if not chosen:
        raise InputError(
            f"no daily partitions between {start or 'the start'} and {end or 'the end'} in "
            f"{root} (it has {partitions[0].day} to {partitions[-1].day})"
        )
    return chosen


def _parse_day(text: str, path: Path) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise InputError(f"{path}: {text} is not a valid date") from None


def read_public_partitions(path: str | Path, key_column: str, dtype: str) -> pd.DataFrame:
    """A public key list: a CSV with a `key_column` header, or one key per line without one.

    Keys are parsed to the key column's type; duplicates are dropped; a bad key names its line.
    """
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InputError(f"cannot read public partitions {path}: {exc.strerror}") from None
    entries = [(n, line.strip()) for n, line in enumerate(lines, start=1) if line.strip()]
    header = [name.strip().lstrip("\ufeff") for name in entries[0][1].split(",")] if entries else []
    if key_column in header:
        position = header.index(key_column)
        try:
            entries = [(n, line.split(",")[position].strip()) for n, line in entries[1:]]
        except IndexError:
            raise InputError(
                f"public partitions {path}: a line has no {key_column} field "
                f"(column {position + 1} of the header)"
            ) from None
    if not entries:
        raise InputError(f"public partitions {path}: no keys")
    keys: list[object] = []
    for line_no, text in entries:
        if dtype == "int64":
            try:
                keys.append(int(text))
            except ValueError:
                raise InputError(
                    f"public partitions {path} line {line_no}: {text!r} is not an int64 "
                    f"{key_column}"
                ) from None
        else:
            keys.append(text)
    frame = pd.DataFrame({key_column: keys}).drop_duplicates(ignore_index=True)
    if dtype == "int64":
        frame[key_column] = frame[key_column].astype("int64")
    return frame
