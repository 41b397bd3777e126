"""In-process reading and validation with Polars: typed rows in, rejects counted and kept aside.

Each file is read as its own lazy frame (so a rejected row keeps its file and line) and Polars
collects them in parallel. Values are parsed leniently (`strict=False`) and a row whose parse
failed gets a reason, instead of one bad cell failing the whole file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from dppipeline.errors import InputError
from dppipeline.io import DailyPartition
from dppipeline.schemas import Schema
from dppipeline.validation import RejectedRow, RejectSummary

_POLARS_TYPES: dict[str, pl.DataType] = {
    "int64": pl.Int64(),
    "float64": pl.Float64(),
    "string": pl.String(),
    "timestamp[us]": pl.Datetime("us"),
}
_TIME_FORMATS = ("%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f")
REASON = "_reason"
_BAD = "_bad"
SOURCE = "_source_file"
ROW = "_row"


@dataclass
class ValidatedInput:
    """Rows that passed validation (schema types, plus their identity `_source_file` and
    `_row`) and those that did not (all as text)."""

    rows: pl.DataFrame
    rejected: pl.DataFrame
    summary: RejectSummary


def _parse(column: str, source: pl.DataType, target: str) -> pl.Expr:
    """The column converted to its schema type; null where the text does not parse."""
    wanted = _POLARS_TYPES[target]
    expr = pl.col(column)
    if source == wanted:
        return expr
    if target == "timestamp[us]":
        if source.is_temporal():
            return expr.cast(wanted)
        text = expr.cast(pl.String).str.strip_chars()
        return pl.coalesce(
            [text.str.to_datetime(f, strict=False, time_unit="us") for f in _TIME_FORMATS]
        )
    if source.is_numeric() and target in ("int64", "float64"):
        return expr.cast(wanted, strict=False)
    return expr.cast(pl.String).str.strip_chars().cast(wanted, strict=False)


def _rules(schema: Schema, value_column: str) -> list[tuple[pl.Expr, pl.Expr]]:
    """(condition that breaks a rule, reason text) per rule, in the order they are reported."""
    rules: list[tuple[pl.Expr, pl.Expr]] = []
    for field in schema.fields:
        raw, parsed = pl.col(field.name), pl.col(_parsed(field.name))
        if not field.nullable:
            rules.append((raw.is_null(), pl.lit(f"{field.name} is null")))
        rules.append(
            (
                raw.is_not_null() & parsed.is_null(),
                pl.format(
                    "{} {} is not a valid " + field.type,
                    pl.lit(field.name),
                    raw.cast(pl.String).str.slice(0, 40),
                ),
            )
        )
        if field.name == value_column:
            rules.append(
                (parsed.is_not_null() & ~parsed.is_finite(), pl.lit(f"{field.name} is not finite"))
            )
    return rules


def _parsed(name: str) -> str:
    return f"_parsed_{name}"


def _reason_expr(rules: list[tuple[pl.Expr, pl.Expr]]) -> pl.Expr:
    """First broken rule of a row, as text (only evaluated on rows known to be bad)."""
    expr = pl.when(rules[0][0]).then(rules[0][1])
    for condition, text in rules[1:]:
        expr = expr.when(condition).then(text)
    return expr.otherwise(pl.lit("invalid row"))


def _scan(path: Path, fmt: str) -> pl.LazyFrame:
    if fmt == "csv":
        return pl.scan_csv(path, infer_schema=False)
    return pl.scan_parquet(path)


def missing_column_error(names: list[str], source: str, schema: Schema) -> InputError | None:
    """The error for a file that lacks a schema column, or None."""
    missing = [f.name for f in schema.fields if f.name not in names]
    if not missing:
        return None
    return InputError(
        f"{source}: missing column {missing[0]} (required by schemas/{schema.name}.json)"
    )


def parse_and_flag(
    frame: pl.LazyFrame, file_schema: pl.Schema, schema: Schema, value_column: str
) -> pl.LazyFrame:
    """Schema columns, each parsed into its type beside the original, and one bad-row flag."""
    rules = _rules(schema, value_column)
    return (
        frame.select(schema.names)
        .with_columns(
            _parse(f.name, file_schema[f.name], f.type).alias(_parsed(f.name))
            for f in schema.fields
        )
        # One cheap boolean per row; reasons are worked out later, for bad rows only.
        .with_columns(pl.any_horizontal([condition for condition, _ in rules]).alias(_BAD))
    )


def _validate_file(path: Path, fmt: str, schema: Schema, value_column: str) -> pl.LazyFrame:
    frame = _scan(path, fmt)
    try:
        file_schema = frame.collect_schema()
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise InputError(f"{path}: cannot read as {fmt}: {first_line(exc)}") from None
    error = missing_column_error(file_schema.names(), str(path), schema)
    if error:
        raise error
    return parse_and_flag(frame, file_schema, schema, value_column)


def validate_batch(
    frame: pl.DataFrame,
    source: str,
    fmt: str,
    schema: Schema,
    value_column: str,
    *,
    first_row: int | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """Validates rows already in memory (e.g. a Beam element): the same rules as a file.

    `first_row`: the row number of the batch's first row in its file, for a batch that does
    not start the file (a Parquet row group); rows keep their numbers in the file.
    """
    error = missing_column_error(frame.columns, source, schema)
    if error:
        raise error
    flagged = parse_and_flag(frame.lazy(), frame.schema, schema, value_column).collect()
    return split_rows(
        flagged, source, fmt, schema, _rules(schema, value_column), first_row=first_row
    )


def first_line(exc: BaseException) -> str:
    """The first line of an error message, for one-line user errors."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _raise_for_unreadable_file(files: list[Path], frames: list[pl.LazyFrame], fmt: str) -> None:
    """After a failed parallel read: find the file (and, for CSV, the line) and say so."""
    for path, frame in zip(files, frames, strict=True):
        try:
            frame.collect()
        except pl.exceptions.PolarsError as exc:
            where = _ragged_csv_line(path) if fmt == "csv" else None
            detail = f" line {where}: wrong number of fields" if where else ""
            raise InputError(f"{path}{detail}: cannot read as {fmt}: {first_line(exc)}") from None


def _ragged_csv_line(path: Path) -> int | None:
    with path.open(newline="") as handle:
        return ragged_csv_line(handle)


def ragged_csv_line(lines: Iterable[str]) -> int | None:
    """First line whose field count differs from the header's (error path only)."""
    import csv  # noqa: PLC0415

    reader = csv.reader(lines)
    header = next(reader, [])
    for row in reader:
        if row and len(row) != len(header):
            return reader.line_num
    return None


def split_rows(
    frame: pl.DataFrame,
    source: str,
    fmt: str,
    schema: Schema,
    rules: list[tuple[pl.Expr, pl.Expr]],
    *,
    first_row: int | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """(valid rows with schema types and `_row`, rejected rows as text with file, row and
    reason). `first_row`: the row number of the frame's first row (default: the file's)."""
    if first_row is None:
        first_row = 2 if fmt == "csv" else 1  # CSV: the header is line 1
    # Row identity (sampling priorities): every row's line or row number in its file, taken
    # before blank lines are dropped so that line numbers survive their removal.
    frame = frame.with_row_index(ROW, offset=first_row)
    if fmt == "csv":
        # A blank line reads as a row of nulls: not a transaction, not a reject.
        blank = pl.all_horizontal(pl.col(schema.names).is_null())
        frame = frame.filter(~blank)
    bad = frame.get_column(_BAD)
    rejected = None
    if bad.any():
        frame = frame.rechunk()  # polars can panic filtering a multi-chunk frame by a mask
        rejected = frame.filter(bad.rechunk()).select(
            pl.lit(source).alias(SOURCE),
            ROW,
            _reason_expr(rules).alias(REASON),
            *[pl.col(n).cast(pl.String) for n in schema.names],
        )
        frame = frame.filter(~bad.rechunk())
    valid = frame.select(
        *[pl.col(_parsed(n)).alias(n) for n in schema.names], pl.col(ROW).cast(pl.Int64)
    )
    return valid, rejected


def read_validated(
    days: list[DailyPartition], fmt: str, schema: Schema, value_column: str
) -> ValidatedInput:
    """Reads every file of the selected days; splits valid rows from rejected ones."""
    files = [path for day in days for path in day.files]
    frames = [_validate_file(path, fmt, schema, value_column) for path in files]
    try:
        collected = pl.collect_all(frames)
    except pl.exceptions.PolarsError:
        _raise_for_unreadable_file(files, frames, fmt)
        raise
    rules = _rules(schema, value_column)
    # Row identity (sampling priorities): the file as text, stored once per file (an Enum).
    file_type = pl.Enum([str(path) for path in files])
    valid_parts, rejected_parts = [], []
    for path, frame in zip(files, collected, strict=True):
        valid, rejected = split_rows(frame, str(path), fmt, schema, rules)
        valid_parts.append(valid.with_columns(pl.lit(str(path), dtype=file_type).alias(SOURCE)))
        if rejected is not None:
            rejected_parts.append(rejected)
    rows = pl.concat(valid_parts, rechunk=True) if valid_parts else pl.DataFrame()
    rejected = (
        pl.concat(rejected_parts)
        if rejected_parts
        else pl.DataFrame(schema={SOURCE: pl.String, ROW: pl.UInt32, REASON: pl.String})
    )
    first = None
    if rejected.height:
        head = rejected.row(0, named=True)
        first = RejectedRow(file=head[SOURCE], row=int(head[ROW]), reason=head[REASON], fmt=fmt)
    summary = RejectSummary(
        rows_read=rows.height + rejected.height, rows_rejected=rejected.height, first=first
    )
    return ValidatedInput(rows=rows, rejected=rejected, summary=summary)


def first_rejected_row(
    path: Path, days: list[DailyPartition], fmt: str, schema: Schema, value_column: str
) -> RejectedRow | None:
    """The first bad row of one file, with its line or row: re-validated here, for engines
    that keep no positions (Spark's CSV reader, Beam's Parquet row groups)."""
    day = next(d for d in days if any(p.resolve() == path.resolve() for p in d.files))
    one = DailyPartition(day.day, (path,))
    return read_validated([one], fmt, schema, value_column).summary.first
