"""In-process reading and validation with Polars: typed rows in, rejects counted and kept aside.

Each file is read as its own lazy frame (so a rejected row keeps its file and line) and Polars
collects them in parallel. Values are parsed leniently (`strict=False`) and a row whose parse
failed gets a reason, instead of one bad cell failing the whole file.
"""

from __future__ import annotations

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
SOURCE = "_source_file"
ROW = "_row"


@dataclass
class ValidatedInput:
    """Rows that passed validation (schema types) and those that did not (all as text)."""

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


def _reason_expr(schema: Schema, value_column: str, parsed_names: dict[str, str]) -> pl.Expr:
    """First broken rule of a row, as text; null for a valid row."""
    conditions: list[tuple[pl.Expr, pl.Expr]] = []
    for field in schema.fields:
        raw, parsed = pl.col(field.name), pl.col(parsed_names[field.name])
        if not field.nullable:
            conditions.append((raw.is_null(), pl.lit(f"{field.name} is null")))
        conditions.append(
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
            conditions.append(
                (parsed.is_not_null() & ~parsed.is_finite(), pl.lit(f"{field.name} is not finite"))
            )
    expr = pl.when(conditions[0][0]).then(conditions[0][1])
    for condition, text in conditions[1:]:
        expr = expr.when(condition).then(text)
    return expr.otherwise(pl.lit(None, dtype=pl.String))


def _scan(path: Path, fmt: str) -> pl.LazyFrame:
    if fmt == "csv":
        return pl.scan_csv(path, infer_schema=False)
    return pl.scan_parquet(path)


def _validate_file(path: Path, fmt: str, schema: Schema, value_column: str) -> pl.LazyFrame:
    frame = _scan(path, fmt)
    try:
        file_schema = frame.collect_schema()
    except (pl.exceptions.ComputeError, OSError) as exc:
        raise InputError(f"{path}: cannot read as {fmt}: {str(exc).splitlines()[0]}") from None
    missing = [f.name for f in schema.fields if f.name not in file_schema]
    if missing:
        raise InputError(
            f"{path}: missing column {missing[0]} (required by schemas/{schema.name}.json)"
        )
    parsed_names = {f.name: f"_parsed_{f.name}" for f in schema.fields}
    first_row = 2 if fmt == "csv" else 1  # CSV: the header is line 1
    return (
        frame.select(schema.names)
        .with_row_index(ROW, offset=first_row)
        .with_columns(
            _parse(f.name, file_schema[f.name], f.type).alias(parsed_names[f.name])
            for f in schema.fields
        )
        .with_columns(_reason_expr(schema, value_column, parsed_names).alias(REASON))
        .with_columns(pl.lit(str(path)).alias(SOURCE))
    )


def read_validated(
    days: list[DailyPartition], fmt: str, schema: Schema, value_column: str
) -> ValidatedInput:
    """Reads every file of the selected days; splits valid rows from rejected ones."""
    files = [path for day in days for path in day.files]
    frames = [_validate_file(path, fmt, schema, value_column) for path in files]
    try:
        collected = pl.collect_all(frames)
    except pl.exceptions.PolarsError as exc:
        raise InputError(f"cannot read input: {str(exc).splitlines()[0]}") from None
    parsed_names = [f"_parsed_{name}" for name in schema.names]
    valid_parts, rejected_parts = [], []
    for frame in collected:
        bad = frame.get_column(REASON).is_not_null()
        if bad.any():
            rejected_parts.append(
                frame.filter(bad).select(
                    SOURCE, ROW, REASON, *[pl.col(n).cast(pl.String) for n in schema.names]
                )
            )
        valid_parts.append(
            frame.filter(~bad).select(
                [pl.col(p).alias(n) for p, n in zip(parsed_names, schema.names, strict=True)]
            )
        )
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
