"""The Beam engine: composite transforms that parallelise on any runner; DirectRunner locally.

    ReadTransactions -> ValidateTransactions -> BoundContributions -> AggregatePerPartition
        -> ReleaseDP -> WriteRelease          (rejected rows -> WriteRejected, quarantine)

Elements are batches, never single rows: a Parquet row group, a whole CSV file, or the rows
of one shard. The launcher lists the input parts (reading the Parquet footers and the CSV
headers, so a bad file fails before the pipeline starts); workers open each listed file through
Beam's `FileSystems` (a path is opened, never matched as a pattern) and validate it with the
local engine's functions (the same contract, the same reasons, the same positions). Rejected
rows and unreadable-file reports are written through Beam's file systems to `_scratch/` in the
staging area, read back by the launcher and removed before the run returns. Per-row work is
numpy and Polars inside a DoFn, the way Beam's own batched IO works, so the runner's
per-element cost is paid per batch (PipelineDP's BeamBackend pays it per row, several times).

Bounding is exact whatever the bundles are:

- Rows are routed to `unit_shards` shards by a stable hash of the privacy unit, so all of a
  unit's rows meet in one shard.
- Linf: every row gets its priority, a keyed hash of the run's secret salt and the row's
  identity (file, row number), and a combiner keeps, per (privacy unit, partition) pair, the
  `max_contributions_per_partition` lowest. Bottom-k composes across bundles, so the combiner
  cuts data before the shuffle (a customer with 100,000 rows at one terminal ships 10 of
  them), and a retried bundle keeps the same rows.
- L0: per shard, `bounding.sample_contributions` (the local engine's code) keeps the
  `max_partitions_contributed` pairs per unit of lowest keyed hash of (salt, key, unit) and
  aggregates them.
- Per-partition partial aggregates are routed to `partition_shards` shards by a stable hash of
  the key, summed by a combiner, aligned with the public partitions (a PCollection joined by
  CoGroupByKey) and released by `core.release` in a DoFn: one batch per shard.

Public partitions also reach the first step as a side input, to drop unlisted rows before
bounding (no unit spends its L0 on a partition that is never released).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import apache_beam as beam
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import Metrics, MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.typehints import KV, Any

from dppipeline.core.budget import JobPlan
from dppipeline.core.release import (
    AGGREGATE_COLUMNS,
    AGGREGATE_DTYPES,
    SUM_SQUARES,
    VALUES,
)
from dppipeline.core.tasks import (
    AggregationTask,
    JobTasks,
    canonical_keys,
    input_schema,
    release_job,
)
from dppipeline.engines.base import EngineRun, ReleaseJob
from dppipeline.engines.shared.bounding import (
    aggregate_per_partition,
    aggregates_frame,
    bottom_k_per_group,
    sample_contributions,
    stable_shard,
)
from dppipeline.engines.shared.polars_read import (
    FileRows,
    csv_rows,
    first_rejected,
    rejected_schema,
    validate_batch,
)
from dppipeline.engines.shared.polars_rules import DAY
from dppipeline.engines.shared.polars_tasks import task_rows
from dppipeline.engines.shared.sampling import (
    SamplingKeys,
    pair_priorities,
    partition_seeds,
    row_priorities,
)
from dppipeline.errors import InputError, UsageError
from dppipeline.inputs.contract import (
    RejectSummary,
    check_rejected_fraction,
    column_sources,
    rules_for,
)
from dppipeline.inputs.csv_records import ROW, check_header
from dppipeline.inputs.files import DailyPartition, first_line
from dppipeline.inputs.quarantine import private_folder, write_rejected
from dppipeline.logs import debug_statistics_enabled, statistic
from dppipeline.spec.schema import Schema, transactions_schema

log = logging.getLogger(__name__)

METRICS_NAMESPACE = "dppipeline"
# Rows per shard the defaults aim at: enough to amortise a DoFn call, small enough for a worker.
ROWS_PER_SHARD = 4_000_000
BYTES_PER_ROW_ESTIMATE = 12  # compressed Parquet / CSV bytes per transaction, roughly
MIN_SHARDS, MAX_SHARDS = 4, 4096
COMPACT_EVERY = 16  # combiner: compact an accumulator after this many added blocks
PUBLIC_CHUNK = 100_000


# ---------------------------------------------------------------------------------------------
# Elements


@dataclass(frozen=True)
class ContributionBlock:
    """Clipped contributions, column-wise, each with its Linf sampling priority (a keyed hash
    of the run's salt and the row's identity, see `engines.sampling`)."""

    unit: np.ndarray
    key: np.ndarray
    priority: np.ndarray
    value: np.ndarray

    def __len__(self) -> int:
        return len(self.unit)

    def take(self, positions: np.ndarray) -> ContributionBlock:
        return ContributionBlock(
            self.unit[positions],
            self.key[positions],
            self.priority[positions],
            self.value[positions],
        )

    @staticmethod
    def concat(blocks: Sequence[ContributionBlock]) -> ContributionBlock:
        if len(blocks) == 1:
            return blocks[0]
        return ContributionBlock(
            *(np.concatenate([getattr(b, f) for b in blocks]) for f in _BLOCK_FIELDS)
        )

    def pair_codes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(unit codes, unit values, key codes, key values, pair codes) for this block's rows;
        code i has value values[i]."""
        unit_codes, unit_values = pd.factorize(self.unit)
        key_codes, key_values = pd.factorize(self.key)
        n_keys = max(len(key_values), 1)
        pair = unit_codes.astype(np.int64) * n_keys + key_codes
        return (
            unit_codes.astype(np.int64),
            np.asarray(unit_values),
            key_codes.astype(np.int64),
            np.asarray(key_values),
            pair,
        )

    def bottom_k_per_pair(self, k: int) -> ContributionBlock:
        """The k lowest-priority rows of each (privacy unit, partition) pair (equal
        priorities, a hash collision, settled by value: the same rows whatever the order
        bundles arrive in)."""
        if len(self) <= k:
            return self
        *_, pair = self.pair_codes()
        return self.take(bottom_k_per_group(pair, self.priority, k, self.value))


_BLOCK_FIELDS = ("unit", "key", "priority", "value")


# ---------------------------------------------------------------------------------------------
# Read and validate


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
    """Rows as read, before validation, or the reason the part could not be read."""

    index: int
    rows: FileRows | None
    error: str | None = None


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


def _parquet_metadata(path: Path) -> pq.FileMetaData:
    try:
        return pq.read_metadata(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: cannot read as parquet: {first_line(exc)}") from None


def read_part(part: InputPart, schema: Schema) -> RawBatch:
    """One element's rows, opened through Beam's file systems (the path is opened, never
    matched as a pattern)."""
    try:
        with FileSystems.open(part.path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            if part.fmt == "csv":
                return RawBatch(part.index, csv_rows(f.read(), part.path, part.day, schema))
            parquet = pq.ParquetFile(f)
            sources = column_sources(part.path, parquet.schema_arrow, schema)
            table = parquet.read_row_group(part.row_group, columns=schema.names)
    except InputError as exc:
        return RawBatch(part.index, None, str(exc))
    except (OSError, pa.ArrowException) as exc:
        message = f"{part.path}: cannot read as {part.fmt}: {first_line(exc)}"
        return RawBatch(part.index, None, message)
    start = part.first_row + 1
    frame = pl.from_arrow(table).with_columns(
        pl.int_range(start, start + table.num_rows, dtype=pl.Int64).alias(ROW),
        pl.lit(part.day).alias(DAY),
    )
    rows = FileRows(part.path, frame.lazy(), sources, rules_for(schema, sources, csv=False))
    return RawBatch(part.index, rows)


class ReadTransactions(beam.PTransform):
    """The launcher's list of input parts -> RawBatch elements (a CSV file or a Parquet row
    group each)."""

    def __init__(self, parts: Sequence[InputPart], schema: Schema):
        super().__init__()
        self._parts, self._schema = list(parts), schema

    def expand(self, pbegin):
        return (
            pbegin
            | "ListInputParts" >> beam.Create(self._parts)
            | "SpreadInputParts" >> beam.Reshuffle()
            | "ReadParts" >> beam.Map(read_part, schema=self._schema)
        )


class _ValidateBatch(beam.DoFn):
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
        return batches | "CheckRules" >> beam.ParDo(_ValidateBatch(self._schema)).with_outputs(
            _ValidateBatch.REJECTED, _ValidateBatch.UNREADABLE, main="valid"
        )


# ---------------------------------------------------------------------------------------------
# Bound contributions


_KEY_SEPARATOR = "\x1f"  # joins the parts of a composite key (ASCII unit separator)


def encoded_key(task: AggregationTask) -> str:
    """The one column a task's key travels in: the key itself when it is one int64 or string
    column, else `_key` (a composite key or a time bucket, as text; a global total: 0)."""
    keys = task.keys
    if len(keys) == 1 and keys[0].kind in ("int64", "string"):
        return keys[0].name
    return "_key"


def encode_keys(frame: pl.DataFrame, task: AggregationTask) -> np.ndarray:
    """The task's keys of each row as one numpy array, the same in every worker."""
    if not task.keys:
        return np.zeros(frame.height, dtype=np.int64)
    if encoded_key(task) != "_key":
        return frame.get_column(task.keys[0].name).to_numpy()
    parts = [pl.col(k.name).cast(pl.String) for k in task.keys]
    return frame.select(pl.concat_str(parts, separator=_KEY_SEPARATOR)).to_series().to_numpy()


def decode_keys(encoded: np.ndarray, task: AggregationTask) -> pd.DataFrame:
    """Inverse of `encode_keys`: canonical key columns (no column for a global total)."""
    if not task.keys:
        return pd.DataFrame(index=range(len(encoded)))
    if encoded_key(task) != "_key":
        return canonical_keys(pd.DataFrame({task.keys[0].name: encoded}), task.keys)
    split = pd.Series(encoded, dtype=object).str.split(_KEY_SEPARATOR, expand=True)
    frame = pd.DataFrame(index=range(len(encoded)))
    for i, key in enumerate(task.keys):
        column = split[i] if len(encoded) else pd.Series([], dtype=object)
        if key.kind == "int64":
            frame[key.name] = column.astype("int64")
        elif key.kind == "date":
            frame[key.name] = [dt.date.fromisoformat(v) for v in column]
        else:
            frame[key.name] = column.astype(object)
    return frame


def encode_key_frame(keys: pd.DataFrame, task: AggregationTask) -> np.ndarray:
    """`encode_keys` of a pandas key list (public partitions), formatted as rows are."""
    return encode_keys(pl.from_pandas(keys[task.key_names]), task)


class _ClipAndShard(beam.DoFn):
    """Valid rows -> (unit shard, ContributionBlock): the task's filter, keys and public
    keys applied, values clipped, every row given its Linf priority from its identity."""

    def __init__(self, task: AggregationTask, unit: str, unit_shards: int, salt: bytes):
        self._task, self._unit = task, unit
        self._shards, self._salt = unit_shards, salt
        self._public: pl.DataFrame | None = None

    def setup(self) -> None:
        self._keys = SamplingKeys.from_salt(self._salt)
        if self._task.public_keys is not None:  # converted once per worker, not per batch
            self._public = pl.from_pandas(self._task.public_keys, include_index=False)

    def process(self, element) -> list:
        source, rows = element
        frame = task_rows(rows, self._task, self._unit, public=self._public)
        if frame.height == 0:
            return []
        units = frame.get_column(self._unit).to_numpy()
        keys = encode_keys(frame, self._task)
        values = frame.get_column("_value").to_numpy()
        # A batch holds rows of one file: (source, `_row`) identifies each row.
        positions = frame.get_column(ROW).to_numpy() if ROW in frame.columns else None
        if positions is None:  # rows built in memory (tests): numbered within the batch
            positions = np.arange(frame.height)
        priority = row_priorities(self._keys, [source], np.zeros(len(units), np.int64), positions)
        block = ContributionBlock(units, keys, priority, values)
        shard = stable_shard(units, self._shards)
        order = np.argsort(shard, kind="stable")
        bounds = np.flatnonzero(np.diff(shard[order])) + 1
        return [
            (int(shard[positions[0]]), block.take(positions))
            for positions in np.split(order, bounds)
        ]


class _CompactingCombineFn(beam.CombineFn):
    """A combiner whose accumulator is a list of blocks, compacted into one (`_merge`) every
    COMPACT_EVERY added blocks and whenever the runner merges or extracts."""

    def _merge(self, items: list) -> Any:
        raise NotImplementedError

    def create_accumulator(self) -> list:
        return []

    def _compact(self, items: list) -> list:
        return items if len(items) <= 1 else [self._merge(items)]

    def add_input(self, items, item):
        items.append(item)
        return self._compact(items) if len(items) >= COMPACT_EVERY else items

    def merge_accumulators(self, accumulators):
        return self._compact([item for items in accumulators for item in items])

    def compact(self, items):
        return self._compact(items)

    def extract_output(self, items):
        compacted = self._compact(items)
        return compacted[0] if compacted else None


class _SampleRowsPerPair(_CompactingCombineFn):
    """Linf: the lowest-priority `k` rows of each (privacy unit, partition) pair (uniform)."""

    def __init__(self, k: int):
        self._k = k

    def _merge(self, blocks: list[ContributionBlock]) -> ContributionBlock:
        return ContributionBlock.concat(blocks).bottom_k_per_pair(self._k)

    def _compact(self, blocks: list[ContributionBlock]) -> list[ContributionBlock]:
        # Even one block is cut to k per pair: a single bundle may hold a whole heavy pair.
        return [self._merge(blocks)] if blocks else []


class _SamplePartitionsPerUnit(beam.DoFn):
    """L0 + aggregation within a unit shard -> (partition shard, partial aggregates)."""

    def __init__(self, task: AggregationTask, unit: str, partition_shards: int, salt: bytes):
        self._task, self._key = task, encoded_key(task)
        self._unit_kind = transactions_schema().field(unit).type
        self._shards, self._salt = partition_shards, salt
        # The exact number of (unit, partition) pairs is not private: a runner's UI shows
        # every counter, so it exists only under --debug-statistics (read by the launcher).
        self._pairs = (
            Metrics.counter(METRICS_NAMESPACE, "pairs_after_linf")
            if debug_statistics_enabled()
            else None
        )

    def setup(self) -> None:
        self._keys = SamplingKeys.from_salt(self._salt)

    def process(self, element) -> list:
        _, block = element
        if block is None or len(block) == 0:
            return []
        unit_codes, unit_values, key_codes, key_values, _ = block.pair_codes()
        n_keys = max(len(key_values), 1)
        task = self._task
        seeds = partition_seeds(
            self._keys, decode_keys(key_values, task), [k.kind for k in task.keys]
        )
        # The rows are already <= Linf per pair; sample_contributions keeps them all and
        # keeps the L0 pairs of lowest priority per unit, exactly as the local engine does.
        sample = sample_contributions(
            unit_codes,
            key_codes,
            n_keys=n_keys,
            max_partitions_contributed=task.max_partitions_contributed,
            max_contributions_per_partition=task.max_contributions_per_partition,
            row_priority=block.priority,
            pair_priority=lambda units, codes: pair_priorities(
                seeds[codes], unit_values[units], self._unit_kind
            ),
            values=block.value,
        )
        if self._pairs is not None:
            self._pairs.inc(len(sample.pair_key_codes))
        bounded = aggregate_per_partition(
            sample,
            key_codes,
            block.value,
            n_keys,
            sum_squares=task.sum_squares,
            keep_values=task.values,
        )
        partial = aggregates_frame(bounded, self._key, key_values)
        target = stable_shard(partial[self._key].to_numpy(), self._shards)
        return [
            (int(target_shard), part.reset_index(drop=True))
            for target_shard, part in partial.groupby(target, sort=False)
        ]


class BoundContributions(beam.PTransform):
    """(source, valid rows) -> (partition shard, partial aggregates) of one task: Linf then
    L0, each keeping the entries of lowest priority under the run's salt."""

    def __init__(
        self,
        task: AggregationTask,
        unit: str,
        unit_shards: int,
        partition_shards: int,
        salt: bytes,
    ):
        super().__init__()
        self._task, self._unit, self._salt = task, unit, salt
        self._unit_shards, self._partition_shards = unit_shards, partition_shards

    def expand(self, valid):
        task = self._task
        return (
            valid
            | "ClipAndShardByPrivacyUnit"
            >> beam.ParDo(
                _ClipAndShard(task, self._unit, self._unit_shards, self._salt)
            ).with_output_types(KV[int, Any])
            | "SampleRowsPerPartition"
            >> beam.CombinePerKey(_SampleRowsPerPair(task.max_contributions_per_partition))
            | "SamplePartitionsPerUnit"
            >> beam.ParDo(
                _SamplePartitionsPerUnit(task, self._unit, self._partition_shards, self._salt)
            ).with_output_types(KV[int, Any])
        )


# ---------------------------------------------------------------------------------------------
# Aggregate, release, write


def _sum_frames(frames: list[pd.DataFrame], key: str) -> pd.DataFrame:
    """Partial aggregates summed per key; kept values (percentiles) concatenated."""
    merged = pd.concat(frames, ignore_index=True)
    totals = [c for c in (*AGGREGATE_COLUMNS, SUM_SQUARES) if c in merged]
    out = merged.groupby(key, sort=False, as_index=False)[totals].sum()
    if VALUES in merged:
        values = merged.groupby(key, sort=False)[VALUES].agg(lambda v: np.concatenate(list(v)))
        out[VALUES] = values.reindex(out[key]).to_list()
    return out


class _SumPerPartition(_CompactingCombineFn):
    """Partial aggregates of one partition shard -> their sum per partition key."""

    def __init__(self, key: str):
        self._key = key

    def _merge(self, frames: list[pd.DataFrame]) -> pd.DataFrame:
        return _sum_frames(frames, self._key)


class AggregatePerPartition(beam.PTransform):
    """(partition shard, partial aggregates) -> (partition shard, exact bounded aggregates)."""

    def __init__(self, task: AggregationTask):
        super().__init__()
        self._key = encoded_key(task)

    def expand(self, partials):
        return partials | "SumPerPartition" >> beam.CombinePerKey(_SumPerPartition(self._key))


def _empty_aggregates(task: AggregationTask) -> pd.DataFrame:
    frame = decode_keys(np.zeros(0, dtype=object), task)
    for column, dtype in AGGREGATE_DTYPES.items():
        frame[column] = pd.Series([], dtype=dtype)
    if task.sum_squares:
        frame[SUM_SQUARES] = pd.Series([], dtype="float64")
    if task.values:
        frame[VALUES] = pd.Series([], dtype=object)
    return frame


class _ReleaseShard(beam.DoFn):
    """Every task's exact aggregates of one partition shard (and the public keys that fall in
    it) -> each query's released rows, by `core.release`, as (shard, table) tagged by query
    (the shard names the file the rows are written to)."""

    def __init__(self, plan: JobPlan, tasks: JobTasks, schemas: dict[str, pa.Schema]):
        self._plan, self._tasks, self._schemas = plan, tasks, schemas
        self._released = Metrics.counter(METRICS_NAMESPACE, "partitions_released")

    def process(self, element) -> list:
        shard, grouped = element
        exact: dict[str, pd.DataFrame] = {}
        for task in self._tasks.tasks:
            frames = [f for f in grouped.get(task.name, ()) if f is not None]
            if frames:
                merged = pd.concat(frames, ignore_index=True)
                keys = decode_keys(merged[encoded_key(task)].to_numpy(), task)
                merged = merged.drop(columns=[encoded_key(task)])
                exact[task.name] = pd.concat([keys, merged], axis=1)
            else:
                exact[task.name] = _empty_aggregates(task)
        public: dict[str, pd.DataFrame | None] = {}
        for name in self._tasks.public_keys:
            task = self._tasks.task(name)
            chunks = list(grouped.get(_PUBLIC + name, ()))
            encoded = np.concatenate(chunks) if chunks else np.zeros(0, dtype=object)
            public[name] = decode_keys(encoded, task)
        shard_tasks = JobTasks(self._tasks.tasks, self._tasks.selection_sources, public)
        outputs = []
        for query, released in release_job(self._plan, shard_tasks, exact).items():
            if len(released):
                schema = self._schemas[query]
                table = pa.Table.from_pandas(
                    released[schema.names], schema=schema, preserve_index=False
                )
                self._released.inc(table.num_rows)
                outputs.append(beam.pvalue.TaggedOutput(query, (shard, table)))
        return outputs


_PUBLIC = "public:"


class ReleaseDP(beam.PTransform):
    """{task name: exact aggregates per partition shard} -> {query: released Arrow tables}:
    one CoGroupByKey brings each shard's aggregates of every task, and the public keys that
    fall in it, to one `core.release` call (selection + noise)."""

    def __init__(self, job: ReleaseJob, partition_shards: int):
        super().__init__()
        self._job, self._shards = job, partition_shards

    def expand(self, aggregates: dict):
        job, pipeline = self._job, next(iter(aggregates.values())).pipeline
        inputs = dict(aggregates)
        for name, keys in job.tasks.public_keys.items():
            task = job.tasks.task(name)
            encoded = encode_key_frame(keys, task) if keys is not None else np.zeros(1, np.int64)
            inputs[_PUBLIC + name] = (
                pipeline
                | f"PublicPartitions[{name}]" >> beam.Create(_chunks(encoded))
                | f"ShardPublicPartitions[{name}]"
                >> beam.FlatMap(_split_by_shard, shards=self._shards).with_output_types(
                    KV[int, Any]
                )
            )
        queries = [q.name for q in job.plan.queries]
        release = _ReleaseShard(
            job.plan,
            job.tasks,
            {q: job.release_schema(q) for q in queries},
        )
        return (
            inputs
            | "GroupByPartitionShard" >> beam.CoGroupByKey()
            | "SelectAndNoise" >> beam.ParDo(release).with_outputs(*queries)
        )


class _WriteParquetFile(beam.DoFn):
    """(number, Arrow table) -> `<folder>/<prefix>-<number>.parquet`, through Beam's file
    systems. One file per number, so a retried bundle overwrites its own file, and an exact
    name: Beam's file sinks match their temporary files as patterns, which breaks in a folder
    whose name holds `[` or `*` (a path is a path)."""

    def __init__(self, folder: str, prefix: str, schema: pa.Schema):
        self._folder, self._prefix, self._schema = folder, prefix, schema

    def process(self, element) -> None:
        number, table = element
        write_parquet(parquet_name(self._folder, self._prefix, number), table.cast(self._schema))


def parquet_name(folder: str, prefix: str, number: int) -> str:
    return FileSystems.join(folder, f"{prefix}-{number:05d}.parquet")


def write_parquet(path: str, table: pa.Table) -> None:
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        pq.write_table(table, handle)


class WriteRelease(beam.PTransform):
    """(partition shard, released table) -> `part-SSSSS.parquet` in the dataset folder (a
    shard with nothing released writes no file; the engine writes an empty one for a query
    that released nothing). The folder is in the runner's staging area, published only on
    success."""

    def __init__(self, dataset_dir: Path, schema: pa.Schema):
        super().__init__()
        self._dir, self._schema = dataset_dir, schema

    def expand(self, tables):
        return tables | "WriteParquet" >> beam.ParDo(
            _WriteParquetFile(str(self._dir), "part", self._schema)
        )


def _chunks(keys: np.ndarray) -> list[np.ndarray]:
    return np.array_split(keys, max(1, math.ceil(len(keys) / PUBLIC_CHUNK)))


def _split_by_shard(keys: np.ndarray, shards: int) -> Iterator[tuple[int, np.ndarray]]:
    target = stable_shard(keys, shards)
    for shard in np.unique(target):
        yield int(shard), keys[target == shard]


# ---------------------------------------------------------------------------------------------
# The engine


def default_shards(input_bytes: int) -> int:
    """Shards for the data size: about ROWS_PER_SHARD rows each, within [4, 4096]."""
    rows = input_bytes / BYTES_PER_ROW_ESTIMATE
    return int(min(MAX_SHARDS, max(MIN_SHARDS, math.ceil(rows / ROWS_PER_SHARD))))


def check_pipeline_options(args: Sequence[str]) -> PipelineOptions:
    """Beam's PipelineOptions from command-line flags; an unknown flag is a usage error
    (Beam itself only logs and drops it, so a typo would silently change the run)."""
    from apache_beam.options.pipeline_options import _BeamArgumentParser  # noqa: PLC0415

    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    _, unknown = parser.parse_known_args(list(args))
    if unknown:
        raise UsageError(f"unknown Beam pipeline option {unknown[0]!r} (see PipelineOptions)")
    return PipelineOptions(list(args))


class BeamEngine:
    """Beam engine: DirectRunner by default; any runner through standard pipeline options."""

    name = "beam"

    def __init__(
        self,
        pipeline_args: Sequence[str] = (),
        unit_shards: int | None = None,
        partition_shards: int | None = None,
    ):
        self._args = list(pipeline_args)
        if not any(arg.startswith("--default_sdk_harness_log_level") for arg in self._args):
            # Quiet workers by default (multi_processing workers log every bundle at INFO).
            self._args.append("--default_sdk_harness_log_level=WARNING")
        self._options = check_pipeline_options(self._args)
        self._unit_shards, self._partition_shards = unit_shards, partition_shards

    def prepare(self) -> None:
        """Nothing to start: the runner starts when the pipeline runs."""

    def run(self, job: ReleaseJob, staging: Path) -> EngineRun:
        started = time.monotonic()

        def progress(step: str) -> None:
            job.progress(f"{time.monotonic() - started:6.1f}s {step}")

        spec = job.spec
        schema = input_schema(spec.privacy_unit, job.tasks.tasks)
        parts = input_parts(job.days, spec.input.format, schema)
        input_bytes = sum(path.stat().st_size for day in job.days for path in day.files)
        unit_shards = self._unit_shards or default_shards(input_bytes)
        partition_shards = self._partition_shards or unit_shards
        # Rejected rows and unreadable-file reports go through Beam's file systems to a
        # folder in the staging area (which every worker can reach where the release can be
        # written), are read back here, and the folder is removed before this returns.
        scratch = Scratch(FileSystems.join(str(staging), SCRATCH), len(parts))
        try:
            scratch.create()
            pipeline = beam.Pipeline(options=self._options)
            self._build(
                pipeline,
                job,
                parts=parts,
                staging=staging,
                scratch=scratch,
                unit_shards=unit_shards,
                partition_shards=partition_shards,
            )
            runner = self._options.get_all_options().get("runner") or "DirectRunner"
            n_files = sum(len(day.files) for day in job.days)
            progress(
                f"Beam {beam.__version__} on {runner}: {n_files} files, "
                f"{len(job.tasks.tasks)} aggregation(s), {unit_shards} privacy-unit shards, "
                f"{partition_shards} partition shards"
            )
            result = pipeline.run()
            result.wait_until_finish()
            counters = _counters(result)
            progress("pipeline done")
            if "pairs_after_linf" in counters:
                statistic(log, f"{counters['pairs_after_linf']:,} (unit, partition) pairs kept")
            rejects = self._check_input(counters, job, scratch)
        finally:
            scratch.remove()
        released = {}
        for query in job.plan.queries:
            files = sorted((staging / query.name).glob("*.parquet"))
            if not files:  # nothing released: the dataset still has its schema
                empty = job.release_schema(query.name).empty_table()
                write_parquet(parquet_name(str(staging / query.name), "part", 0), empty)
            released[query.name] = sum(pq.ParquetFile(p).metadata.num_rows for p in files)
        return EngineRun(rejects=rejects, released_partitions=released)

    def _build(
        self,
        pipeline: beam.Pipeline,
        job: ReleaseJob,
        *,
        parts: Sequence[InputPart],
        staging: Path,
        scratch: Scratch,
        unit_shards: int,
        partition_shards: int,
    ) -> None:
        spec = job.spec
        schema = input_schema(spec.privacy_unit, job.tasks.tasks)
        batches = pipeline | "ReadTransactions" >> ReadTransactions(parts, schema)
        checked = batches | "ValidateTransactions" >> ValidateTransactions(schema)
        _ = checked[_ValidateBatch.REJECTED] | "WriteRejected" >> beam.ParDo(
            _WriteParquetFile(scratch.folder, "rejected", rejected_arrow_schema(schema))
        )
        _ = checked[_ValidateBatch.UNREADABLE] | "WriteUnreadable" >> beam.ParDo(
            _WriteText(scratch.folder, "unreadable")
        )
        aggregates = {
            task.name: (
                checked.valid
                | f"BoundContributions[{task.name}]"
                >> BoundContributions(
                    task, spec.privacy_unit, unit_shards, partition_shards, job.salt
                )
                | f"AggregatePerPartition[{task.name}]" >> AggregatePerPartition(task)
            )
            for task in job.tasks.tasks
        }
        released = aggregates | "ReleaseDP" >> ReleaseDP(job, partition_shards)
        for query in job.plan.queries:
            _ = released[query.name] | f"WriteRelease[{query.name}]" >> WriteRelease(
                staging / query.name,
                job.release_schema(query.name),
            )

    def _check_input(
        self, counters: dict[str, int], job: ReleaseJob, scratch: Scratch
    ) -> RejectSummary:
        """Unreadable files fail the run, naming the first; rejected rows go to the
        quarantine, and above max_rejected_fraction fail it, naming the first bad row."""
        messages = scratch.unreadable_messages()
        if messages:
            raise InputError(messages[0])
        rows = counters.get("rows_read", 0)
        schema = rejected_arrow_schema(input_schema(job.spec.privacy_unit, job.tasks.tasks))
        rejected = scratch.rejected_rows(schema)  # parts in file order, rows in row order
        summary = RejectSummary(rows, rejected.num_rows, None)
        if rejected.num_rows:
            path = write_rejected(rejected, job.quarantine)
            first = first_rejected(pl.from_arrow(rejected), job.spec.input.format)
            summary = RejectSummary(rows, rejected.num_rows, first, path)
        check_rejected_fraction(summary, job.spec.input.max_rejected_fraction)
        return summary


SCRATCH = "_scratch"


@dataclass(frozen=True)
class Scratch:
    """The folder (under the staging area) where workers leave rejected rows and unreadable
    file reports for the launcher, through Beam's file systems: one file per input part,
    named by the part's index (exact names: nothing is matched as a pattern)."""

    folder: str
    parts: int

    @property
    def is_local(self) -> bool:
        return FileSystems.get_scheme(self.folder) is None

    def create(self) -> None:
        if self.is_local:
            private_folder(Path(self.folder))  # raw rows: owner-only, even for a moment
        else:
            FileSystems.mkdirs(self.folder)

    def unreadable_messages(self) -> list[str]:
        """The reports, in the launcher's order of the parts (files in day order)."""
        messages = []
        for index in range(self.parts):
            path = FileSystems.join(self.folder, f"unreadable-{index:05d}.txt")
            if FileSystems.exists(path):
                with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                    messages.append(f.read().decode())
        return messages

    def rejected_rows(self, schema: pa.Schema) -> pa.Table:
        """Every part's rejected rows, in the launcher's order of the parts."""
        tables = [schema.empty_table()]
        for index in range(self.parts):
            path = parquet_name(self.folder, "rejected", index)
            if FileSystems.exists(path):
                with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                    tables.append(pq.read_table(f))
        return pa.concat_tables(tables)

    def remove(self) -> None:
        if self.is_local:  # Beam's local delete matches its argument as a pattern
            shutil.rmtree(self.folder, ignore_errors=True)
        elif FileSystems.exists(self.folder):
            FileSystems.delete([self.folder])


class _WriteText(beam.DoFn):
    """(number, text) -> `<folder>/<prefix>-<number>.txt` through Beam's file systems."""

    def __init__(self, folder: str, prefix: str):
        self._folder, self._prefix = folder, prefix

    def process(self, element) -> None:
        number, text = element
        path = FileSystems.join(self._folder, f"{self._prefix}-{number:05d}.txt")
        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.write(text.encode())


def _counters(result) -> dict[str, int]:
    """This run's dppipeline counters (committed where the runner reports them)."""
    query = result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))
    counters: dict[str, int] = {}
    for counter in query["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        counters[counter.key.metric.name] = counters.get(counter.key.metric.name, 0) + int(value)
    return counters
