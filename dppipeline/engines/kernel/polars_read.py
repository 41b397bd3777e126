"""In-process reading and validation with Polars: typed rows in, rejects counted and kept aside.

Each file is read on its own (so a rejected row keeps its file and position) and checked
against the input contract (`dppipeline.inputs.contract`, compiled by `polars_rules`); Polars
collects the files' lazy frames in parallel. Parquet is read by Polars (`glob=False`: a path
is a path) after pyarrow read its footer; CSV by the shared tokenizer (`csv_records`).
The Beam engine validates its batches with the same functions.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from dppipeline.engines.kernel.polars_rules import BAD, DAY, flag_rows, parsed_name, reason
from dppipeline.errors import InputError
from dppipeline.inputs.contract import (
    RejectedRow,
    RejectSummary,
    Rule,
    Source,
    column_sources,
    columns_from_path,
    rules_for,
)
from dppipeline.inputs.csv_records import ROW, read_csv_records
from dppipeline.inputs.files import DailyPartition, first_line, parquet_footer, read_bytes
from dppipeline.spec.schema import Schema
from dppipeline.storage import Location

REASON = "_reason"
SOURCE = "_source_file"


@dataclass
class ValidatedInput:
    """Rows that passed validation (schema types, plus `_source_file` and `_row`, the row's
    identity for sampling) and those that did not (as text, with file, row and reason)."""

    rows: pl.DataFrame
    rejected: pl.DataFrame
    summary: RejectSummary


@dataclass(frozen=True)
class FileRows:
    """One file's rows as read, with what the rules need to check them."""

    path: str
    frame: pl.LazyFrame  # the job's columns as read, `_row`, `_day` (and CSV field counts)
    sources: Mapping[str, Source]
    rules: tuple[Rule, ...]


def parquet_rows(path: Path | Location, day: dt.date | None, schema: Schema) -> FileRows:
    where = Location.of(path)
    footer = parquet_footer(where)
    sources = column_sources(where.display(), footer, schema)
    from_path = columns_from_path(where.display(), footer.names, schema)
    in_file = [name for name in schema.names if name not in from_path]
    frame = (
        pl.scan_parquet(where.path, glob=False)
        if where.is_local
        else _remote_parquet(where, in_file)
    )
    frame = (
        frame.select(in_file)
        .with_columns(pl.lit(value, pl.String).alias(name) for name, value in from_path.items())
        .select(schema.names)
        .with_row_index(ROW, offset=1)
        .with_columns(pl.col(ROW).cast(pl.Int64), pl.lit(day).alias(DAY))
    )
    return FileRows(where.display(), frame, sources, rules_for(schema, sources, csv=False))


def _remote_parquet(where: Location, columns: list[str]) -> pl.LazyFrame:
    """A Parquet file on a store, read through the same pyarrow file system that listed it
    (whatever store pyarrow knows, credentials from its usual places)."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    fs, inner = where.filesystem()
    try:
        table = pq.read_table(inner, filesystem=fs, columns=columns)
    except Exception as exc:  # pyarrow's OSError / ArrowInvalid: the file is named
        raise InputError(f"{where.display()}: cannot read as parquet: {first_line(exc)}") from None
    return pl.from_arrow(table).lazy()  # type: ignore[union-attr]


def csv_rows(data: bytes, path: str, day: dt.date | None, schema: Schema) -> FileRows:
    """A CSV file's records (its bytes already read), every column as text."""
    records = read_csv_records(data, path, schema)
    sources = dict.fromkeys(schema.names, Source.TEXT)
    frame = records.lazy().with_columns(pl.lit(day).alias(DAY))
    return FileRows(path, frame, sources, rules_for(schema, sources, csv=True))


def checked(rows: FileRows, schema: Schema) -> pl.LazyFrame:
    return flag_rows(rows.frame, schema, rows.sources, rows.rules)


def split_rows(
    flagged: pl.DataFrame, rows: FileRows, schema: Schema, files: pl.Enum | None = None
) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """(valid rows with schema types, `_source_file` and `_row`; rejected rows as text with
    file, row and reason, or None). `files`: every file of the read as an Enum, so a valid
    row's file is a small code (the Linf priority reads the codes; text per row cost 0.5 s of
    a 5M-row run)."""
    bad = flagged.get_column(BAD)
    rejected = None
    source = pl.lit(rows.path).alias(SOURCE)
    valid_source = source if files is None else pl.lit(rows.path, dtype=files).alias(SOURCE)
    if bad.any():
        flagged = flagged.rechunk()  # polars can panic filtering a multi-chunk frame by a mask
        bad = bad.rechunk()
        rejected = flagged.filter(bad).select(
            source,
            pl.col(ROW),
            reason(rows.rules, rows.sources).alias(REASON),
            *[pl.col(n).cast(pl.String) for n in schema.names],
        )
        flagged = flagged.filter(~bad)
    valid = flagged.select(
        *[pl.col(parsed_name(n)).alias(n) for n in schema.names], valid_source, pl.col(ROW)
    )
    return valid, rejected


def validate_batch(rows: FileRows, schema: Schema) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """Validates one batch already in memory (a Beam element): the same rules as a file."""
    return split_rows(checked(rows, schema).collect(), rows, schema)


def rejected_schema(schema: Schema) -> dict[str, pl.DataType]:
    """Quarantine rows: where, why, and every column as the text that was read."""
    return {SOURCE: pl.String(), ROW: pl.Int64(), REASON: pl.String()} | {
        name: pl.String() for name in schema.names
    }


MEMORY_SOURCE = "DataFrame"  # how rejected rows and errors name in-memory input


def validate_frame(
    frame: pl.DataFrame, schema: Schema, source: str = MEMORY_SOURCE
) -> ValidatedInput:
    """In-memory rows (the Python API) checked by the same contract as a Parquet file: the
    frame's column types stand for the footer's (a missing column, or a type that cannot hold
    the schema's, is an InputError naming it), `_row` is a row's 1-based position, and
    rejected rows are kept as text with their reason, like a file's."""
    sources = column_sources(source, frame.head(0).to_arrow().schema, schema)
    lazy = (
        frame.lazy()
        .select(schema.names)
        .with_row_index(ROW, offset=1)
        .with_columns(pl.col(ROW).cast(pl.Int64), pl.lit(None, pl.Date).alias(DAY))
    )
    rows = FileRows(source, lazy, sources, rules_for(schema, sources, csv=False))
    valid, rejected = split_rows(checked(rows, schema).collect(), rows, schema, pl.Enum([source]))
    if rejected is None:
        rejected = pl.DataFrame(schema=rejected_schema(schema))
    summary = RejectSummary(
        rows_read=valid.height + rejected.height,
        rows_rejected=rejected.height,
        first=first_rejected(rejected, "parquet"),
    )
    return ValidatedInput(rows=valid, rejected=rejected, summary=summary)


def _raise_for_unreadable_file(files: Sequence[FileRows], schema: Schema, fmt: str) -> None:
    """After a failed parallel collect: find the file and say so."""
    for rows in files:
        try:
            checked(rows, schema).collect()
        except pl.exceptions.PolarsError as exc:
            raise InputError(f"{rows.path}: cannot read as {fmt}: {first_line(exc)}") from None


def file_names(days: Sequence[DailyPartition]) -> pl.Enum:
    """Every file of a read, as valid rows name them (`_source_file`)."""
    return pl.Enum(list(dict.fromkeys(Location.of(p).display() for d in days for p in d.files)))


def read_validated(
    days: list[DailyPartition], fmt: str, schema: Schema, names: pl.Enum | None = None
) -> ValidatedInput:
    """Reads every file of the selected days; splits valid rows from rejected ones. `names`:
    the files of the whole read when this is one batch of it (`file_names`)."""
    listed = [(path, day.day) for day in days for path in day.files]
    if fmt == "parquet":
        files = [parquet_rows(path, day, schema) for path, day in listed]
    else:
        # Tokenizing is Polars and numpy, which release the GIL: one thread per core.
        with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
            files = list(
                pool.map(
                    lambda item: csv_rows(
                        read_bytes(item[0]), Location.of(item[0]).display(), item[1], schema
                    ),
                    listed,
                )
            )
    try:
        collected = pl.collect_all([checked(rows, schema) for rows in files])
    except pl.exceptions.PolarsError:
        _raise_for_unreadable_file(files, schema, fmt)
        raise
    valid_parts, rejected_parts = [], []
    names = names if names is not None else file_names(days)
    for rows, flagged in zip(files, collected, strict=True):
        valid, rejected = split_rows(flagged, rows, schema, names)
        valid_parts.append(valid)
        if rejected is not None:
            rejected_parts.append(rejected)
    valid_rows = pl.concat(valid_parts, rechunk=True)
    rejected = (
        pl.concat(rejected_parts)
        if rejected_parts
        else pl.DataFrame(schema=rejected_schema(schema))
    )
    summary = RejectSummary(
        rows_read=valid_rows.height + rejected.height,
        rows_rejected=rejected.height,
        first=first_rejected(rejected, fmt),
    )
    return ValidatedInput(rows=valid_rows, rejected=rejected, summary=summary)


def first_rejected(rejected: pl.DataFrame, fmt: str) -> RejectedRow | None:
    """The first rejected row in file order (the frame's order), then row order."""
    if rejected.height == 0:
        return None
    head = rejected.row(0, named=True)
    row = None if head[ROW] is None else int(head[ROW])
    return RejectedRow(file=head[SOURCE], row=row, reason=head[REASON], fmt=fmt)
