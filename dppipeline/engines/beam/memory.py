"""A caller's PCollection of rows (the Python API's `ReleaseTransform`): batched, framed and
checked by the same `ValidateBatch` as the engine's file parts, so rows meet the same input
contract, the same reasons and the same bounding as a file run's.

Elements are dicts or `beam.Row`s holding the job's input columns. Each batch of rows
becomes a Polars frame whose column types stand for a Parquet footer's (a column of mixed
Python types is read as text, as a CSV file's would be); its rows are numbered in the batch,
and the batch is named `PCollection-<random id>`: the row's identity for sampling.

What a file run checks after its pipeline (rejected fraction, unreadable input) is checked
inside this pipeline instead, before any released row leaves it: the released rows pass a
gate whose side input is the input's counts, and it fails the pipeline (InputError) when
more than `max_rejected_fraction` of the rows were rejected.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import apache_beam as beam
import polars as pl
import pyarrow as pa

from dppipeline.engines.beam.read import RawBatch, ValidateBatch, ValidateTransactions
from dppipeline.engines.beam.shard_release import WriteParquetFile
from dppipeline.engines.kernel.polars_read import REASON, SOURCE, FileRows
from dppipeline.engines.kernel.polars_rules import DAY
from dppipeline.errors import InputError
from dppipeline.inputs.contract import (
    RejectedRow,
    RejectSummary,
    check_rejected_fraction,
    column_sources,
    missing_column,
    rules_for,
)
from dppipeline.inputs.csv_records import ROW
from dppipeline.inputs.quarantine import private_folder
from dppipeline.spec.schema import Schema

MAX_BATCH_ROWS = 50_000  # rows framed and validated at a time


def as_dict(row: Any) -> Mapping[str, Any]:
    """A dict element as it is, a `beam.Row` (or any named tuple) as its fields."""
    if isinstance(row, Mapping):
        return row
    if hasattr(row, "_asdict"):
        return dict(row._asdict())
    raise InputError(f"ReleaseTransform: rows must be dicts or beam.Row, got {type(row).__name__}")


def _frame(records: list[Mapping[str, Any]], schema: Schema, name: str) -> pl.DataFrame:
    """The batch's job columns as a frame: Python types as Polars infers them (an all-None
    column as the schema's type), or every column as text when a column mixes types."""
    missing = next((c for c in schema.names if any(c not in r for r in records)), None)
    if missing is not None:
        raise missing_column(name, missing, schema)
    columns = {c: [r[c] for r in records] for c in schema.names}
    try:
        frame = pl.DataFrame(columns, infer_schema_length=None, strict=True)
    except (TypeError, pl.exceptions.PolarsError):
        text = {c: [None if v is None else str(v) for v in vs] for c, vs in columns.items()}
        return pl.DataFrame(text, schema=dict.fromkeys(schema.names, pl.String))
    nulls = [c for c in schema.names if frame.schema[c] == pl.Null]
    arrow = {f.name: f.arrow_type for f in schema.fields}
    return frame.with_columns(
        pl.col(c).cast(pl.from_arrow(pa.array([], arrow[c])).dtype) for c in nulls
    )


def raw_batch(records: Iterable[Any], schema: Schema) -> RawBatch:
    """One batch of the caller's rows as the validation step takes a file part."""
    index = uuid.uuid4().int >> 68  # 60 bits: names the batch's quarantine file
    name = f"PCollection-{index:015x}"
    frame = _frame([as_dict(r) for r in records], schema, name)
    sources = column_sources(name, frame.head(0).to_arrow().schema, schema)
    lazy = frame.lazy().with_columns(
        pl.int_range(1, frame.height + 1, dtype=pl.Int64).alias(ROW),
        pl.lit(None, pl.Date).alias(DAY),
    )
    rules = rules_for(schema, sources, csv=False)
    return RawBatch(index, FileRows(name, lazy, sources, rules), nbytes=frame.estimated_size())


class ValidateRows(beam.PTransform):
    """The caller's rows -> the outputs of `ValidateTransactions` (valid batches; rejected
    rows and unreadable reports as tagged outputs)."""

    def __init__(self, schema: Schema):
        super().__init__()
        self._schema = schema

    def expand(self, rows):
        return (
            rows
            | "BatchRows" >> beam.BatchElements(min_batch_size=1, max_batch_size=MAX_BATCH_ROWS)
            | "FrameRows" >> beam.Map(raw_batch, schema=self._schema).with_output_types(RawBatch)
            | "ValidateTransactions" >> ValidateTransactions(self._schema)
        )


def keep_rejected(checked, quarantine: Path, schema: Schema) -> None:
    """Rejected rows to the run's quarantine folder (owner-only), one file per batch;
    unreadable batches fail the pipeline naming the batch."""
    from dppipeline.engines.beam.read import rejected_arrow_schema  # noqa: PLC0415

    folder = str(private_folder(quarantine))
    _ = checked[ValidateBatch.REJECTED] | "KeepRejected" >> beam.ParDo(
        WriteParquetFile(folder, "rejected", rejected_arrow_schema(schema))
    )
    _ = checked[ValidateBatch.UNREADABLE] | "FailUnreadable" >> beam.Map(_fail_unreadable)


def _fail_unreadable(element: tuple[int, str]) -> None:
    raise InputError(element[1])


Counts = tuple[int, int, tuple[str, int, str] | None]  # read, rejected, a first rejected row


def input_counts(checked) -> beam.PCollection:
    """(rows read, rows rejected, the first rejected row of the first batch with one, as
    (batch, row, reason)) over the whole input: one element."""
    valid = checked.valid | "CountValid" >> beam.Map(lambda e: (e[1].height, 0, None))
    rejected = checked[ValidateBatch.REJECTED] | "CountRejected" >> beam.Map(_rejected_counts)
    return (
        (valid, rejected)
        | "AllCounts" >> beam.Flatten()
        | "SumCounts" >> beam.CombineGlobally(_sum_counts)
    )


def _rejected_counts(element: tuple[int, pa.Table]) -> Counts:
    table = element[1]
    head = table.slice(0, 1).to_pylist()[0]
    return table.num_rows, table.num_rows, (head[SOURCE], head[ROW], head[REASON])


def _sum_counts(counts: Iterable[Counts]) -> Counts:
    read = rejected = 0
    first = None
    for r, j, f in counts:
        read, rejected = read + r, rejected + j
        first = min(first, f) if first is not None and f is not None else first or f
    return read, rejected, first


def check_counts(counts: Counts, max_rejected_fraction: float) -> None:
    """The file run's rule: above `max_rejected_fraction` rejected, InputError naming a
    rejected row (its batch, row and reason)."""
    read, rejected, first = counts
    row = None if first is None else RejectedRow(first[0], first[1], first[2], "parquet")
    check_rejected_fraction(RejectSummary(read, rejected, row), max_rejected_fraction)


def gated_rows(released, counts, max_rejected_fraction: float, label: str) -> beam.PCollection:
    """(shard, released Arrow table) -> released rows as dicts, each table only once the
    input's counts pass `max_rejected_fraction`."""

    def rows(element: tuple[int, pa.Table], counts: Counts) -> list[dict[str, Any]]:
        check_counts(counts, max_rejected_fraction)
        return element[1].to_pylist()

    return released | label >> beam.FlatMap(rows, counts=beam.pvalue.AsSingleton(counts))
