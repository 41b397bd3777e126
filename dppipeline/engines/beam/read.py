"""Reading and validating on the workers: the launcher lists the input parts (CSV files, Parquet
row groups); workers open each through Beam's FileSystems and check it by the input contract."""

from __future__ import annotations

import datetime as dt
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import apache_beam as beam
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import Metrics

from dppipeline.engines.beam.elements import METRICS_NAMESPACE
from dppipeline.engines.kernel.polars_read import (
    FileRows,
    csv_rows,
    rejected_schema,
    validate_batch,
)
from dppipeline.engines.kernel.polars_rules import DAY
from dppipeline.errors import InputError
from dppipeline.inputs.contract import (
    column_sources,
    columns_from_path,
    rules_for,
)
from dppipeline.inputs.csv_records import ROW, check_header
from dppipeline.inputs.files import DailyPartition, first_line
from dppipeline.spec.schema import Schema
from dppipeline.storage import Location


@dataclass(frozen=True)
class InputPart:
    """What one read element covers: a whole CSV file, or one row group of a Parquet file
    (`first_row`: the 0-based position of its first row in the file, from the footer).
    `index`: its place in the launcher's list, which names its scratch files."""

    index: int
    path: str
    day: dt.date
    fmt: str
    row_group: int | None = None
    first_row: int = 0


@dataclass(frozen=True)
class RawBatch:
    """Rows as read, before validation, or the reason the part could not be read.
    `nbytes`: what was read (Arrow bytes, or the CSV file's), Beam's size estimate."""

    index: int
    rows: FileRows | None
    error: str | None = None
    nbytes: int = 0


class RawBatchCoder(beam.coders.Coder):
    """RawBatch elements pickled whole when a runner ships them between workers; their size
    for Beam's byte counters taken from `nbytes`. Beam estimates an element's size by
    encoding it (the first ten elements of every PCollection, then about 10 / n of them),
    and pickling a batch's lazy frame cost more than reading and validating the batch."""

    def encode(self, value: RawBatch) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes) -> RawBatch:
        return pickle.loads(encoded)

    def is_deterministic(self) -> bool:
        return False

    def estimate_size(self, value: RawBatch) -> int:
        return value.nbytes + len(value.error or "")


beam.coders.registry.register_coder(RawBatch, RawBatchCoder)


def input_parts(days: Sequence[DailyPartition], fmt: str, schema: Schema) -> list[InputPart]:
    """The elements the pipeline reads, listed by the launcher: one per CSV file (its header
    checked here), one per Parquet row group (from the footers, read here, which also names
    a corrupt file, a missing column or an unusable type before the pipeline starts)."""
    parts: list[InputPart] = []
    for day in days:
        for path in day.files:
            if fmt == "csv":
                check_header(str(path), schema)
                parts.append(InputPart(len(parts), str(path), day.day, fmt))
                continue
            metadata = _parquet_metadata(path)
            column_sources(str(path), metadata.schema.to_arrow_schema(), schema)
            first_row = 0
            for group in range(metadata.num_row_groups):
                parts.append(InputPart(len(parts), str(path), day.day, fmt, group, first_row))
                first_row += metadata.row_group(group).num_rows
    return parts


def _parquet_metadata(path: Path | Location) -> pq.FileMetaData:
    """The footer, read by the launcher through `dppipeline.storage` (pyarrow.fs)."""
    where = Location.of(path)
    try:
        fs, inner = where.filesystem()
        return pq.read_metadata(inner, filesystem=fs)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{where.display()}: cannot read as parquet: {first_line(exc)}") from None


def read_part(part: InputPart, schema: Schema) -> RawBatch:
    """One element's rows, opened through Beam's file systems (the path is opened, never
    matched as a pattern)."""
    try:
        with FileSystems.open(part.path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            if part.fmt == "csv":
                data = f.read()
                rows = csv_rows(data, part.path, part.day, schema)
                return RawBatch(part.index, rows, nbytes=len(data))
            parquet = pq.ParquetFile(f)
            sources = column_sources(part.path, parquet.schema_arrow, schema)
            from_path = columns_from_path(part.path, parquet.schema_arrow.names, schema)
            in_file = [name for name in schema.names if name not in from_path]
            table = parquet.read_row_group(part.row_group, columns=in_file)
    except InputError as exc:
        return RawBatch(part.index, None, str(exc))
    except (OSError, pa.ArrowException) as exc:
        message = f"{part.path}: cannot read as {part.fmt}: {first_line(exc)}"
        return RawBatch(part.index, None, message)
    start = part.first_row + 1
    frame = pl.from_arrow(table).with_columns(
        *[pl.lit(value, pl.String).alias(name) for name, value in from_path.items()],
        pl.int_range(start, start + table.num_rows, dtype=pl.Int64).alias(ROW),
        pl.lit(part.day).alias(DAY),
    )
    rows = FileRows(part.path, frame.lazy(), sources, rules_for(schema, sources, csv=False))
    return RawBatch(part.index, rows, nbytes=table.nbytes)


class ReadTransactions(beam.PTransform):
    """The launcher's list of input parts -> RawBatch elements (a CSV file or a Parquet row
    group each)."""

    def __init__(self, parts: Sequence[InputPart], schema: Schema):
        super().__init__()
        self._parts, self._schema = list(parts), schema

    def expand(self, pbegin):
        return (
            pbegin
            # Create spreads its elements itself (a Reshuffle when it has more than one)
            | "ListInputParts" >> beam.Create(self._parts)
            | "ReadParts" >> beam.Map(read_part, schema=self._schema).with_output_types(RawBatch)
        )


class ValidateBatch(beam.DoFn):
    REJECTED, UNREADABLE = "rejected", "unreadable"

    def __init__(self, schema: Schema):
        self._schema = schema
        self._rows_read = Metrics.counter(METRICS_NAMESPACE, "rows_read")
        self._rows_rejected = Metrics.counter(METRICS_NAMESPACE, "rows_rejected")

    def process(self, batch: RawBatch) -> list:
        if batch.rows is None:
            return [beam.pvalue.TaggedOutput(self.UNREADABLE, (batch.index, batch.error))]
        try:
            valid, rejected = validate_batch(batch.rows, self._schema)
        except pl.exceptions.PolarsError as exc:
            message = f"{batch.rows.path}: cannot read: {first_line(exc)}"
            return [beam.pvalue.TaggedOutput(self.UNREADABLE, (batch.index, message))]
        outputs: list = []
        n_rejected = 0 if rejected is None else rejected.height
        self._rows_read.inc(valid.height + n_rejected)
        if rejected is not None:
            self._rows_rejected.inc(n_rejected)
            text = rejected.to_arrow().cast(rejected_arrow_schema(self._schema))
            outputs.append(beam.pvalue.TaggedOutput(self.REJECTED, (batch.index, text)))
        if valid.height:
            outputs.append((batch.rows.path, valid))
        return outputs


def rejected_arrow_schema(schema: Schema) -> pa.Schema:
    """Quarantine rows: where, why, and every column as the text that was read."""
    return pl.DataFrame(schema=rejected_schema(schema)).to_arrow().schema


class ValidateTransactions(beam.PTransform):
    """RawBatch -> (source, valid rows: the job's columns, `_source_file`, `_row`) main
    output; (part index, rejected rows as Arrow text) and (part index, unreadable message)
    as tagged outputs 'rejected' and 'unreadable'. Counts go to Beam metrics."""

    def __init__(self, schema: Schema):
        super().__init__()
        self._schema = schema

    def expand(self, batches):
        return batches | "CheckRules" >> beam.ParDo(ValidateBatch(self._schema)).with_outputs(
            ValidateBatch.REJECTED, ValidateBatch.UNREADABLE, main="valid"
        )
