"""Content fingerprints of input files: what identifies the data a release charges, whatever
its paths, folder names, links or modification times are.

Why: a scope is a name (the input folder's, or `budget.scope`), so the same days copied,
linked or renamed into another folder, or released under another scope name, would meet a
second cap. The ledger records these fingerprints with every spend of a file run and refuses
the same data under another scope (`Ledger.reserve`).

Cheap on any size of data, and never a data page read:

- Parquet: the file's size and its footer's bytes (schema, row groups with their row counts,
  byte offsets and column statistics): two reads at the end of the file, usually one.
- CSV: the size and the sha256 of the first and last 64 KiB (the whole file when it is at most
  128 KiB). Two CSV files of the same size that differ only in their middle look the same:
  that errs toward refusing, never toward a second cap.

A file that holds no rows (a Parquet footer saying 0 rows, a CSV that is at most its header)
has no fingerprint: it holds no one's data, and empty days look alike in every dataset.
Local paths and stores are read through `Location.filesystem` (during a run, the engine's own
file systems: Spark reads stores through Hadoop's API).
"""

from __future__ import annotations

import contextvars
import datetime as dt
import hashlib
import os
import struct
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from dppipeline.errors import InputError
from dppipeline.inputs.files import DailyPartition, first_line
from dppipeline.storage import Location, StorageError

EDGE = 64 * 1024  # bytes read at each end of a CSV file; the first read at a Parquet file's end
_MAGIC = b"PAR1"
READERS = 8  # files fingerprinted at once


@dataclass(frozen=True)
class FileContent:
    """One input file as the ledger records it: its day (None for layout `files`), its path
    relative to the input root (as this run names it, for messages), and its fingerprint
    (None: it holds no rows)."""

    day: dt.date | None
    name: str
    fingerprint: str | None


def input_contents(
    days: Sequence[DailyPartition], root: str | Path | Location, fmt: str
) -> tuple[FileContent, ...]:
    """The fingerprint of every file of the selected partitions, in their order. Files are
    read by a few threads at once (on a store each read waits for a round trip), each in a
    copy of this context: the engine's file systems (`remote_filesystems`) are a context
    variable, which a new thread would not see."""
    base = Location.of(root)
    files = [(day.day, Location.of(path)) for day in days for path in day.files]
    with ThreadPoolExecutor(READERS) as pool:
        tasks = [
            pool.submit(contextvars.copy_context().run, file_fingerprint, where, fmt)
            for _, where in files
        ]
        found = [task.result() for task in tasks]
    return tuple(
        FileContent(day, _relative(where, base), fingerprint)
        for (day, where), fingerprint in zip(files, found, strict=True)
    )


def file_fingerprint(path: str | Path | Location, fmt: str) -> str | None:
    """sha256 (hex) of the format, the size and what identifies the content (above); None for
    a file without rows. An unreadable file, or a Parquet file without a footer, is an
    InputError naming it."""
    where = Location.of(path)
    try:
        fs, inner = where.filesystem()
        with fs.open_input_file(inner) as handle:
            size = int(handle.size())
            if fmt == "parquet":
                identity, rows = _parquet_identity(handle, size, where)
            else:
                identity, rows = _csv_identity(handle, size)
    except StorageError as exc:
        raise InputError(f"cannot read {exc}") from None
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot read {where.display()}: {first_line(exc)}") from None
    if not rows:
        return None
    digest = hashlib.sha256(f"{fmt}\0{size}\0".encode())
    digest.update(identity)
    return digest.hexdigest()


def _parquet_identity(handle: pa.NativeFile, size: int, where: Location) -> tuple[bytes, bool]:
    """(the footer's bytes, whether the file has rows): the metadata block and its length."""
    if size < 12:
        raise InputError(f"{where.display()}: not a Parquet file (too short)")
    tail = _read_at(handle, max(size - EDGE, 0), min(size, EDGE))
    if tail[-4:] != _MAGIC:
        raise InputError(f"{where.display()}: not a Parquet file (no footer)")
    length = struct.unpack("<I", tail[-8:-4])[0]
    if length + 12 > size:
        raise InputError(f"{where.display()}: a broken Parquet footer")
    if length + 8 > len(tail):  # a footer larger than the first read: one more read
        tail = _read_at(handle, size - length - 8, length + 8)
    footer = tail[-length - 8 : -8]
    try:
        rows = footer_rows(footer)
    except (IndexError, ValueError):
        raise InputError(f"{where.display()}: a broken Parquet footer") from None
    return footer, rows > 0


def footer_rows(footer: bytes) -> int:
    """`num_rows` of a Parquet footer (Thrift compact protocol `FileMetaData`, field 3),
    read without building the footer's objects (pyarrow's metadata costs 0.15 ms a file)."""
    reader = _Compact(footer)
    field = 0
    while True:
        head = reader.byte()
        kind = head & 0x0F
        if kind == 0:
            raise ValueError("no num_rows")
        field = field + (head >> 4) if head >> 4 else reader.zigzag()
        if field == 3 and kind == 6:
            return reader.zigzag()
        reader.skip(kind)


class _Compact:
    """Just enough of Thrift's compact protocol to skip values and read integers."""

    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def byte(self) -> int:
        self.at += 1
        return self.data[self.at - 1]

    def varint(self) -> int:
        value = shift = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 70:
                raise ValueError("varint too long")

    def zigzag(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def skip(self, kind: int) -> None:
        if kind in (1, 2):  # booleans: the value is the type
            return
        if kind == 3:
            self.at += 1
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.at += 8
        elif kind == 8:
            length = self.varint()  # read before `self.at` is: varint() moves it
            self.at += length
        elif kind in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self.skip_element(head & 0x0F)
        elif kind == 11:
            size = self.varint()
            types = self.byte() if size else 0
            for _ in range(size):
                self.skip_element(types >> 4)
                self.skip_element(types & 0x0F)
        elif kind == 12:
            while (head := self.byte()) & 0x0F:
                if not head >> 4:
                    self.zigzag()
                self.skip(head & 0x0F)
        else:
            raise ValueError(f"unknown Thrift type {kind}")
        if self.at > len(self.data):
            raise ValueError("truncated")

    def skip_element(self, kind: int) -> None:
        """A list, set or map element: a boolean there takes one byte."""
        if kind in (1, 2):
            self.at += 1
        else:
            self.skip(kind)


def _csv_identity(handle: pa.NativeFile, size: int) -> tuple[bytes, bool]:
    """(the first and last 64 KiB, or the whole file; whether any line follows the header)."""
    if size <= 2 * EDGE:
        whole = _read_at(handle, 0, size)
        lines = [line for line in whole.splitlines() if line.strip()]
        return whole, len(lines) > 1
    return _read_at(handle, 0, EDGE) + _read_at(handle, size - EDGE, EDGE), True


def _read_at(handle: pa.NativeFile, offset: int, length: int) -> bytes:
    handle.seek(offset)
    return bytes(handle.read(length))


def _relative(path: Location, base: Location) -> str:
    """The file's path under the input root (its name when the root is the file itself)."""
    if path.uri == base.uri:
        return path.name
    if path.uri.startswith(base.uri.rstrip("/") + "/"):
        return path.uri[len(base.uri.rstrip("/")) + 1 :]
    if path.is_local and base.is_local:
        return os.path.relpath(path.path, base.path)
    return path.uri.removeprefix(base.uri).lstrip("/")
