"""Files: input discovery and public key files' text (publication: `publication.py`; keys
parsed to their type by `core.tasks`).

Daily layouts, as data lakes and the book's data set use them: `DIR/date=YYYY-MM-DD/*.parquet`
(Hive-style folders) and `DIR/YYYY-MM-DD.csv` (one file a day). The `files` layout: one file,
or every `.csv` / `.parquet` file under a folder (subfolders included, whatever their names,
Hive-style `key=value/` folders among them), read whole and filtered to the job's period by its
time column. `DIR` is a local folder or a URI (`dppipeline.storage`): the same names, listed
through the store's own listing; a local folder keeps its symbolic-link checks.
"""

from __future__ import annotations

import csv
import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from dppipeline.errors import InputError
from dppipeline.storage import Location, StorageError

if TYPE_CHECKING:
    from dppipeline.spec.model import JobSpec

_DAY = r"(\d{4}-\d{2}-\d{2})"
_PARQUET_DIR = re.compile(rf"^date={_DAY}$")
_CSV_FILE = re.compile(rf"^{_DAY}\.csv$")


@dataclass(frozen=True)
class DailyPartition:
    """One day of input: its date and the files that hold it (local paths, or URIs). With
    the `files` layout, the one part has no day: rows are checked against the period by the
    time column, not against a file's day."""

    day: dt.date | None
    files: tuple[Path | Location, ...]


_SUFFIXES = {".csv": "csv", ".parquet": "parquet"}


def discover_files(root: str | Path, fmt: str | None) -> list[DailyPartition]:
    """The `files` layout: `root` itself when it is a file, else every file under it whose
    suffix is `.csv` or `.parquet` (hidden and `_` names skipped), sorted by path. `fmt`
    None: the suffixes decide, and a folder mixing them is refused."""
    where = Location.of(root)
    try:
        if where.is_local:
            path = where.path
            _check_link(path)
            if not path.exists():
                raise InputError(f"input {path} does not exist")
            found: list[Path | Location] = (
                [path]
                if path.is_file()
                else [p for p in sorted(path.rglob("*")) if _visible(p.relative_to(path).parts)]
            )
            files = [
                f for f in found if Path(str(f)).suffix in _SUFFIXES and Path(str(f)).is_file()
            ]
        elif where.is_file():
            files = [where]
        elif where.is_dir():
            files = [
                where.join(rel)
                for rel in where.files()
                if _visible(tuple(rel.split("/"))) and Path(rel).suffix in _SUFFIXES
            ]
        else:
            raise InputError(f"input {where.display()} does not exist")
    except StorageError as exc:
        raise InputError(f"cannot list input {exc}") from None
    if not files:
        raise InputError(f"no .csv or .parquet files in {where.display()}")
    kinds = {_SUFFIXES.get(Path(str(f)).suffix, "") for f in files}
    wanted = fmt or (kinds.pop() if len(kinds) == 1 else None)
    if wanted is None:
        raise InputError(
            f"input {where.display()} holds both .csv and .parquet files: keep one format per "
            "input, or name it with --format (input.format)"
        )
    chosen = tuple(f for f in files if _SUFFIXES.get(Path(str(f)).suffix) == wanted)
    if not chosen:
        raise InputError(f"no .{wanted} files in {where.display()}")
    for f in chosen:
        if isinstance(f, Path):
            _check_link(f)
    return [DailyPartition(None, chosen)]


def _visible(parts: Sequence[str]) -> bool:
    return not any(part.startswith((".", "_")) for part in parts)


def discover_partitions(root: str | Path, fmt: str) -> list[DailyPartition]:
    """All daily partitions under `root` in the given layout, sorted by day. Names are
    matched, never expanded as patterns; a day file or folder that is a broken or looping
    symbolic link, or a `.parquet` entry that is not a file, is an error naming it (a day
    must never be skipped silently)."""
    if not Location.of(root).is_local:
        return _discover_remote(Location.of(root), fmt)
    root = Location.of(root).path
    if not root.exists():
        raise InputError(f"input folder {root} does not exist")
    if not root.is_dir():
        raise InputError(f"input {root} is not a folder")
    days: list[DailyPartition] = []
    for entry in _entries(root):
        if entry.name.startswith((".", "_")):
            continue
        pattern = _PARQUET_DIR if fmt == "parquet" else _CSV_FILE
        match = pattern.match(entry.name)
        if not match:
            continue
        _check_link(entry)
        if fmt == "parquet" and entry.is_dir():
            files = tuple(
                _checked_parquet(p)
                for p in _entries(entry)
                if p.suffix == ".parquet" and not p.name.startswith((".", "_"))
            )
            if files:
                days.append(DailyPartition(_parse_day(match.group(1), entry), files))
        elif fmt == "csv" and entry.is_file():
            days.append(DailyPartition(_parse_day(match.group(1), entry), (entry,)))
    if not days:
        layout = "date=YYYY-MM-DD/*.parquet folders" if fmt == "parquet" else "YYYY-MM-DD.csv files"
        raise InputError(f"no daily partitions ({layout}) in {root}")
    return days


def detect_layout(root: str | Path) -> str:
    """The input layout a folder holds when the spec does not name one: `csv` for
    `YYYY-MM-DD.csv` files, else `parquet` (`date=YYYY-MM-DD/` folders, and the error that a
    folder with neither gets). A folder holding both is refused: which days count would
    depend on a default."""
    where = Location.of(root)
    try:
        if where.is_local:
            if not where.path.is_dir():
                return "parquet"  # discovery names the missing folder
            names = [entry.name for entry in _entries(where.path)]
        else:
            if not where.is_dir():
                return "parquet"
            names = [entry.name for entry, _ in where.children()]
    except (StorageError, InputError):
        return "parquet"  # unreadable here (e.g. a scheme only the engine reaches): discovery,
        # through the engine's file systems, reads it or names the problem
    visible = [name for name in names if not name.startswith((".", "_"))]
    csv = [name for name in visible if _CSV_FILE.match(name)]
    parquet = [name for name in visible if _PARQUET_DIR.match(name)]
    if csv and parquet:
        raise InputError(
            f"input folder {where.display()} mixes layouts ({parquet[0]}/ and {csv[0]}): "
            "keep one per folder, or name it with --format (input.format)"
        )
    return "csv" if csv else "parquet"


def with_detected_layout(spec: JobSpec) -> JobSpec:
    """The spec with `input.format` detected when it names none: from the folder's daily
    layout (a folder of `YYYY-MM-DD.csv` files needs no `--format csv`), or with layout
    `files` from the files' suffixes. A detected csv is recorded as if given, so the release
    key is the one `--format csv` gives; parquet stays the unset default. Light on purpose:
    the CLI calls it before pipeline-dp is imported (see `cli.main._skip_pld_unless_used`)."""
    if spec.input.path is None or "format" in spec.input.model_fields_set:
        return spec
    if spec.input.layout == "files":
        parts = discover_files(spec.input.path, None)
        found_format = "csv" if str(parts[0].files[0]).endswith(".csv") else "parquet"
    else:
        found_format = detect_layout(spec.input.path)
    if found_format == spec.input.format:
        return spec
    found = spec.input.model_copy(update={"format": found_format})
    return spec.model_copy(update={"input": found})


def _discover_remote(root: Location, fmt: str) -> list[DailyPartition]:
    """`discover_partitions` on a store: one listing of the root, one per day folder."""
    from pyarrow.fs import FileType  # noqa: PLC0415

    try:
        if not root.is_dir():
            raise InputError(f"input folder {root.display()} does not exist (or is not a folder)")
        entries = root.children()
    except StorageError as exc:
        raise InputError(f"cannot list input folder {exc}") from None
    days: list[DailyPartition] = []
    pattern = _PARQUET_DIR if fmt == "parquet" else _CSV_FILE
    for entry, info in entries:
        match = pattern.match(entry.name)
        if entry.name.startswith((".", "_")) or not match:
            continue
        day = _parse_day(match.group(1), entry)
        if fmt == "parquet" and info.type == FileType.Directory:
            try:
                inside = entry.children()
            except StorageError as exc:
                raise InputError(f"cannot list input folder {exc}") from None
            files = tuple(
                path
                for path, file_info in inside
                if path.name.endswith(".parquet")
                and not path.name.startswith((".", "_"))
                and _remote_file(path, file_info)
            )
            if files:
                days.append(DailyPartition(day, files))
        elif fmt == "csv" and info.type == FileType.File:
            days.append(DailyPartition(day, (entry,)))
    if not days:
        layout = "date=YYYY-MM-DD/*.parquet folders" if fmt == "parquet" else "YYYY-MM-DD.csv files"
        raise InputError(f"no daily partitions ({layout}) in {root.display()}")
    return days


def _remote_file(path: Location, info: object) -> bool:
    from pyarrow.fs import FileType  # noqa: PLC0415

    if getattr(info, "type", None) != FileType.File:
        raise InputError(f"{path.display()}: not a file (a day folder holds Parquet files)")
    return True


def _entries(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError as exc:
        raise InputError(
            f"cannot list input folder {folder}: {exc.strerror or type(exc).__name__}"
        ) from None


def _check_link(path: Path) -> None:
    """A symbolic link must lead somewhere (`exists` is false for a broken or looping one)."""
    if path.is_symlink() and not path.exists():
        raise InputError(f"{path}: a broken or looping symbolic link")


def _checked_parquet(path: Path) -> Path:
    _check_link(path)
    if not path.is_file():
        raise InputError(f"{path}: not a file (a day folder holds Parquet files)")
    return path


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of a reader's error message (at most `limit` characters), for one-line
    errors about a file's structure (never used for messages about cell values)."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


def read_bytes(path: str | Path | Location) -> bytes:
    """A whole input file; an unreadable one is an InputError naming it."""
    where = Location.of(path)
    if not where.is_local:
        try:
            return where.read_bytes()
        except StorageError as exc:
            raise InputError(f"cannot read {exc}") from None
    try:
        with open(where.path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None


def parquet_footer(path: str | Path | Location) -> pa.Schema:
    """A Parquet file's schema from its footer; an unreadable footer names the file."""
    where = Location.of(path)
    try:
        if where.is_local:
            return pq.read_schema(where.path)
        fs, inner = where.filesystem()
        return pq.read_schema(inner, filesystem=fs)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{where.display()}: cannot read as parquet: {first_line(exc)}") from None


def file_stamp(path: Path | Location) -> tuple[int, int]:
    """(size, modification time in ns) of an input file, for the release key's fingerprint."""
    where = Location.of(path)
    if where.is_local:
        stat = where.path.stat()
        return stat.st_size, stat.st_mtime_ns
    info = where.info()
    return int(info.size or 0), int(info.mtime_ns or 0)


def select_days(
    partitions: list[DailyPartition], start: dt.date | None, end: dt.date | None, root: str | Path
) -> list[DailyPartition]:
    """The partitions in the inclusive range [start, end]; an empty selection is an error."""
    chosen = [
        p
        for p in partitions
        if p.day is not None and (start is None or p.day >= start) and (end is None or p.day <= end)
    ]
    if not chosen:
        raise InputError(
            f"no daily partitions between {start or 'the start'} and {end or 'the end'} in "
            f"{root} (it has {partitions[0].day} to {partitions[-1].day})"
        )
    return chosen


def _parse_day(text: str, path: Path | Location) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        where = path.display() if isinstance(path, Location) else path
        raise InputError(f"{where}: {text} is not a valid date") from None


def key_lines(path: str | Path, columns: Sequence[str]) -> list[tuple[int, list[str]]]:
    """The one reader of public key files: (line number, the texts of `columns`) per key.

    A file is a CSV whose header names every key column (other columns ignored; quoted fields
    as in any CSV), or, for a single key column, one key per line without a header. Blank
    lines are skipped; line numbers are physical (the header is line 1).
    """
    text = key_file_text(path)
    path = Location.of(path).display()  # how errors name it
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines:
        raise InputError(f"public partitions {path}: no keys")
    header = [name.strip() for name in next(csv.reader([lines[0][1]]))]
    if all(column in header for column in columns):
        positions = [header.index(column) for column in columns]
        out = []
        for number, line in lines[1:]:
            fields = next(csv.reader([line]))
            short = [p for p in positions if p >= len(fields)]
            if short:
                raise InputError(
                    f"public partitions {path} line {number}: no {header[short[0]]} field "
                    f"(column {short[0] + 1} of the header)"
                )
            out.append((number, [fields[p].strip() for p in positions]))
        if not out:
            raise InputError(f"public partitions {path}: no keys")
        return out
    if len(columns) == 1:  # no header: the whole line is the key
        return [(number, [line.strip()]) for number, line in lines]
    missing = next(column for column in columns if column not in header)
    raise InputError(f"public partitions {path}: no {missing} column in the header")


def key_file_text(path: str | Path) -> str:
    """A public key file's text: UTF-8 (a byte-order mark dropped); a binary file or bytes
    that are not UTF-8 are an error naming the file (and line)."""
    where = Location.of(path)
    path = where.display()
    try:
        data = where.path.read_bytes() if where.is_local else where.read_bytes()
    except StorageError as exc:
        raise InputError(f"cannot read public partitions {exc}") from None
    except OSError as exc:
        raise InputError(
            f"cannot read public partitions {path}: {exc.strerror or type(exc).__name__}"
        ) from None
    if b"\x00" in data:
        raise InputError(f"public partitions {path}: a binary file, not text (one key per line)")
    data = data.removeprefix(b"\xef\xbb\xbf")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"public partitions {path} line {line}: not UTF-8 text") from None
