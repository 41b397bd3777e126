"""CSV files as records: one tokenizer for every engine, so that every engine reads the same
records, fields and line numbers from the same bytes.

The dialect is RFC 4180: `,` between fields, `"` quotes a field (`""` inside it is one quote,
and a quoted field may hold line breaks), lines end with LF, CRLF or CR, the first line is the
header, blank lines are skipped. A record keeps the physical line it starts on (the header is
line 1; a quoted line break counts), the number of fields it has (a record whose count is not
the header's is rejected row-wise by the `fields` rule), and its fields as text, empty fields
as null. A UTF-8 byte-order mark is dropped; bytes that are not UTF-8 become U+FFFD, which the
`utf8` rule rejects row-wise. A quote that is never closed, or a closing quote followed by
anything but a separator, fails the file, naming the line where the quote opens.

Two readers, one result: files without any `"` (and no lone CR) are split by Polars, with line
numbers and field counts from numpy over the bytes; other files go through Python's `csv`
module (slower, exact for quoting). Local, the Beam workers and the Spark executors all call
`read_csv_records` on a file's bytes.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence

import numpy as np
import polars as pl

from dppipeline.errors import InputError
from dppipeline.inputs.contract import columns_from_path, missing_column
from dppipeline.spec.schema import Schema
from dppipeline.storage import Location, StorageError

ROW = "_row"  # the physical line a record starts on (header = 1)
FIELDS = "_fields"  # the record's number of fields
HEADER_FIELDS = "_header_fields"  # the header's number of fields (the same on every row)
_BOM = b"\xef\xbb\xbf"
_BLANKS = " \t"
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_FIELD_END = re.compile(r"[,\r\n]")


def _reader(text: str) -> csv.Reader:  # type: ignore[name-defined]
    """Python's csv reader over `text`, strict about quotes, taking a field as long as the
    text: the module's default limit (131,072 characters, process-wide) refused valid files
    with a long quoted field as malformed. Only ever raised, never lowered."""
    if len(text) >= csv.field_size_limit():
        csv.field_size_limit(len(text) + 1)
    return csv.reader(io.StringIO(text, newline=""), strict=True)


def header_of(data: bytes, source: str) -> list[str]:
    """The header's column names (blanks around each name stripped)."""
    data = data.removeprefix(_BOM)
    if not data.lstrip(b"\r\n"):
        raise InputError(f"{source}: empty file (no header line)")
    first_line = data[: data.find(b"\n") + 1] if b"\n" in data else data
    if b'"' not in first_line:  # an unquoted header is one line: no need to decode the rest
        data = first_line
    text = data.decode("utf-8", errors="replace")
    reader = _reader(text)
    try:
        header: list[str] = next(reader, [])
    except csv.Error:
        raise InputError(f"{source} line 1: malformed header") from None
    if not header or all(not name.strip(_BLANKS) for name in header):
        raise InputError(f"{source}: the first line is not a header")
    return [name.strip(_BLANKS) for name in header]


def check_header(path: str, schema: Schema, head_bytes: int = 1 << 16) -> None:
    """Reads only a file's first bytes: the header must name every schema column. Lets a
    driver or launcher fail before any job for a file its workers would refuse."""
    where = Location.of(path)
    try:
        if where.is_local:
            with open(where.path, "rb") as handle:
                head = handle.read(head_bytes)
        else:
            head = where.read_head(head_bytes)
    except StorageError as exc:
        raise InputError(f"cannot read {exc}") from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    if b"\n" not in head and len(head) == head_bytes:
        return  # a header longer than that: the worker reads and checks it
    if b'"' in head:
        head = head[: head.rfind(b"\n") + 1] or head  # whole lines only (a quoted header)
    header = header_of(head, path)
    from_path = columns_from_path(path, header, schema)
    for name in schema.names:
        if name not in header and name not in from_path:
            raise missing_column(path, name, schema)


def read_csv_records(data: bytes, source: str, schema: Schema) -> pl.DataFrame:
    """The records of one CSV file: the schema's columns as text (null when empty or absent),
    plus the line each record starts on (`_row`, Int64), its field count (`_fields`) and the
    header's (`_header_fields`). Raises InputError naming the file (and line) for a file that
    cannot be read as records: empty, without a schema column, or with a broken quote."""
    data = data.removeprefix(_BOM)
    header = header_of(data, source)
    from_path = columns_from_path(source, header, schema)
    columns = [name for name in schema.names if name not in from_path]
    positions = []
    for name in columns:
        if header.count(name) > 1:
            raise InputError(f"{source}: column {name} appears twice in the header")
        if name not in header:
            raise missing_column(source, name, schema)
        positions.append(header.index(name))
    simple = b'"' not in data and (b"\r" not in data or data.count(b"\r") == data.count(b"\r\n"))
    frame = _split_simple(data, header, positions, columns) if simple else None
    if frame is None:
        frame = _split_quoted(data, source, len(header), positions, columns)
    if from_path:  # Hive-style folders: the same text on every record of the file
        frame = frame.with_columns(pl.lit(v, pl.String).alias(n) for n, v in from_path.items())
    return frame


def _split_simple(
    data: bytes, header: list[str], positions: list[int], columns: Sequence[str]
) -> pl.DataFrame | None:
    """Fast path for a file without quotes or lone CRs: every line is a record. Polars splits
    the fields; numpy counts each line's fields and finds blank lines. None if Polars did not
    see the lines numpy did (the exact reader then takes over)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    breaks = np.flatnonzero(raw == 0x0A)
    ends = np.append(breaks, len(raw))
    if ends[-1] == (breaks[-1] + 1 if len(breaks) else 0):  # ends with a line break
        ends = ends[:-1]
    starts = np.concatenate(([0], ends[:-1] + 1))
    # Commas per line: each line's span [start, next start) holds its bytes and its break.
    commas = (raw == 0x2C).view(np.uint8)
    fields = np.add.reduceat(commas, starts, dtype=np.int64) + 1
    lengths = ends - starts
    first = raw[np.minimum(starts, len(raw) - 1)]
    blank = (lengths == 0) | ((lengths == 1) & (first == 0x0D))
    raw_names = [n.rstrip("\r") for n in data[: ends[0]].decode(errors="replace").split(",")]
    if len(raw_names) != len(header) or len(set(raw_names)) != len(raw_names):
        return None
    frame = pl.read_csv(
        data,
        has_header=True,
        schema={name: pl.String for name in raw_names},
        columns=[raw_names[p] for p in positions],
        truncate_ragged_lines=True,
        encoding="utf8" if data.isascii() else "utf8-lossy",
        quote_char=None,
    )
    if frame.height != len(starts) - 1:
        return None
    frame = frame.rename(dict(zip(frame.columns, columns, strict=True))).with_columns(
        pl.Series(ROW, np.arange(2, len(starts) + 1, dtype=np.int64)),
        pl.Series(FIELDS, fields[1:].astype(np.int32)),
        pl.lit(len(header), pl.Int32).alias(HEADER_FIELDS),
    )
    return frame.filter(pl.Series(~blank[1:])) if blank[1:].any() else frame


def _split_quoted(
    data: bytes, source: str, n_header: int, positions: list[int], columns: Sequence[str]
) -> pl.DataFrame:
    """The exact reader: Python's csv module, strict about quotes."""
    text = data.decode("utf-8", errors="replace")
    reader = _reader(text)
    values: list[list[str | None]] = [[] for _ in columns]
    lines: list[int] = []
    counts: list[int] = []
    start = 1
    try:
        next(reader)  # the header (read by header_of)
        start = reader.line_num + 1
        for record in reader:
            if record:
                lines.append(start)
                counts.append(len(record))
                for out, position in zip(values, positions, strict=True):
                    field = record[position] if position < len(record) else ""
                    out.append(field or None)
            start = reader.line_num + 1
    except csv.Error:
        raise _quote_error(text, source, start, reader.line_num) from None
    frame = pl.DataFrame(
        {
            name: pl.Series(name, column, pl.String)
            for name, column in zip(columns, values, strict=True)
        }
    )
    return frame.with_columns(
        pl.Series(ROW, lines, pl.Int64),
        pl.Series(FIELDS, counts, pl.Int32),
        pl.lit(n_header, pl.Int32).alias(HEADER_FIELDS),
    )


def _quote_error(text: str, source: str, record_line: int, error_line: int) -> InputError:
    """The error for a record the csv module refused: where an unclosed quote opens, or the
    line where a closed quote is followed by something other than a separator."""
    offset = 0
    for _ in range(record_line - 1):
        found = _LINE_BREAK.search(text, offset)
        if found is None:
            break
        offset = found.end()
    opening = _unclosed_quote(text, offset)
    if opening is not None:
        line = record_line + len(_LINE_BREAK.findall(text, offset, opening))
        return InputError(f"{source} line {line}: a quoted field is never closed")
    return InputError(
        f"{source} line {error_line}: malformed quoted field (a closing quote must be followed "
        "by a separator or a line break)"
    )


def _unclosed_quote(text: str, offset: int) -> int | None:
    """Offset of the first quote opening a field that no quote closes, scanning fields from
    `offset` (a record's start); None if every quoted field closes."""
    position, end = offset, len(text)
    while position < end:
        if text[position] == '"':
            search = position + 1
            while True:
                close = text.find('"', search)
                if close == -1:
                    return position
                if text.startswith('"', close + 1):
                    search = close + 2
                    continue
                break
            position = close + 1
        found = _FIELD_END.search(text, position)
        if found is None:
            return None
        position = found.end()
    return None
