"""Per-partition sums, the DP release of each partition shard (`core.mechanisms`) and the
release's Parquet file (one per dataset, rows in key order: `engines.kernel.release_file`),
written by exact name."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import apache_beam as beam
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import Metrics
from apache_beam.typehints import KV, Any

from dppipeline.core.mechanisms import (
    AGGREGATE_COLUMNS,
    AGGREGATE_DTYPES,
    CENTRED_SQUARES,
    VALUES,
    distinct_aggregate,
)
from dppipeline.core.plan import JobPlan
from dppipeline.core.tasks import (
    AggregationTask,
    JobTasks,
    release_job,
)
from dppipeline.engines.base import ReleaseJob
from dppipeline.engines.beam.bound import decode_keys, encode_key_frame, encoded_key
from dppipeline.engines.beam.elements import METRICS_NAMESPACE, CompactingCombineFn
from dppipeline.engines.beam.record import ReleaseRecord
from dppipeline.engines.kernel.bounding import (
    DISTINCT_VALUES_PREFIX,
    stable_shard,
)
from dppipeline.engines.kernel.release_file import (
    RELEASE_FILE,
    ReleaseWriter,
    SortedPart,
    merge_sorted_parts,
    part_row_groups,
    sort_by_keys,
)

PUBLIC_CHUNK = 100_000  # public keys per element


def _sum_frames(frames: list[pd.DataFrame], key: str) -> pd.DataFrame:
    """Partial aggregates summed per key; kept values (percentiles) concatenated; distinct
    value sets (count_distinct) united."""
    merged = pd.concat(frames, ignore_index=True)
    totals = [c for c in (*AGGREGATE_COLUMNS, CENTRED_SQUARES) if c in merged]
    out = merged.groupby(key, sort=False, as_index=False)[totals].sum()
    if VALUES in merged:
        values = merged.groupby(key, sort=False)[VALUES].agg(lambda v: np.concatenate(list(v)))
        out[VALUES] = values.reindex(out[key]).to_list()
    for column in (c for c in merged.columns if c.startswith(DISTINCT_VALUES_PREFIX)):
        sets = merged.groupby(key, sort=False)[column].agg(
            lambda v: pd.unique(np.concatenate(list(v)))
        )
        out[column] = sets.reindex(out[key]).to_list()
    return out


def distinct_counts(aggregates: pd.DataFrame, task: AggregationTask) -> pd.DataFrame:
    """Merged value sets -> the count_distinct aggregates `core.mechanisms` takes."""
    for column in task.distinct:
        sets = aggregates.pop(DISTINCT_VALUES_PREFIX + column)
        aggregates[distinct_aggregate(column)] = np.fromiter(
            (len(s) for s in sets), dtype=np.int64, count=len(sets)
        )
    return aggregates


class _SumPerPartition(CompactingCombineFn):
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
        frame[CENTRED_SQUARES] = pd.Series([], dtype="float64")
    if task.values:
        frame[VALUES] = pd.Series([], dtype=object)
    for column in task.distinct:
        frame[distinct_aggregate(column)] = pd.Series([], dtype="int64")
    return frame


class _ReleaseShard(beam.DoFn):
    """Every task's exact aggregates of one partition shard (and the public keys that fall in
    it) -> each query's released rows, by `core.mechanisms`, as (shard, table) tagged by query
    (the shard names the file the rows are written to)."""

    def __init__(
        self,
        plan: JobPlan,
        tasks: JobTasks,
        schemas: dict[str, pa.Schema],
        record: ReleaseRecord | None = None,
    ):
        self._plan, self._tasks, self._schemas = plan, tasks, schemas
        self._record = record
        self._released = Metrics.counter(METRICS_NAMESPACE, "partitions_released")

    def process(self, element) -> list:
        shard, grouped = element
        if self._record is None:
            tables = self._release(grouped)
        else:  # noise once per charge: an earlier execution's tables if it released the shard
            recorded = self._record.recorded(shard)
            tables = (
                self._record.keep(shard, self._release(grouped)) if recorded is None else recorded
            )
        outputs = []
        for query, table in tables.items():
            if table.num_rows:
                self._released.inc(table.num_rows)
                outputs.append(beam.pvalue.TaggedOutput(query, (shard, table)))
        return outputs

    def _release(self, grouped) -> dict[str, pa.Table]:
        """Selection and noise for one shard: every query's released table (maybe empty)."""
        exact: dict[str, pd.DataFrame] = {}
        for task in self._tasks.tasks:
            frames = [f for f in grouped.get(task.name, ()) if f is not None]
            if frames:
                merged = pd.concat(frames, ignore_index=True)
                keys = decode_keys(merged[encoded_key(task)].to_numpy(), task)
                merged = distinct_counts(merged.drop(columns=[encoded_key(task)]), task)
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
        tables = {}
        for query, released in release_job(self._plan, shard_tasks, exact).items():
            schema = self._schemas[query]
            tables[query] = (
                pa.Table.from_pandas(released[schema.names], schema=schema, preserve_index=False)
                if len(released)
                else schema.empty_table()  # an empty frame's date keys are float64
            )
        return tables


_PUBLIC = "public:"
_EVERY_SHARD = "every-shard"


class ReleaseDP(beam.PTransform):
    """{task name: exact aggregates per partition shard} -> {query: released Arrow tables}:
    one CoGroupByKey brings each shard's aggregates of every task, and the public keys that
    fall in it, to one `core.mechanisms` call (selection + noise)."""

    def __init__(self, job: ReleaseJob, partition_shards: int, record: str | None = None):
        super().__init__()
        self._job, self._shards, self._record = job, partition_shards, record

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
        record = None
        if self._record is not None:  # every shard released in every execution, even empty
            record = ReleaseRecord(self._record, tuple(queries))
            inputs[_EVERY_SHARD] = pipeline | "EveryPartitionShard" >> beam.Create(
                [(shard, None) for shard in range(self._shards)]
            )
        release = _ReleaseShard(
            job.plan,
            job.tasks,
            {q: job.release_schema(q) for q in queries},
            record,
        )
        return (
            inputs
            | "GroupByPartitionShard" >> beam.CoGroupByKey()
            | "SelectAndNoise" >> beam.ParDo(release).with_outputs(*queries)
        )


class WriteParquetFile(beam.DoFn):
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


class _WriteSortedPart(beam.DoFn):
    """(partition shard, released table) -> the table, sorted by key, as
    `<folder>/part-SSSSS.parquet` in row groups a merge can hold one of per part; yields the
    file's name. A retried bundle overwrites its own file."""

    def __init__(self, folder: str, schema: pa.Schema, keys: list[str], row_group_rows: int):
        self._folder, self._schema, self._keys = folder, schema, keys
        self._row_group_rows = row_group_rows

    def process(self, element) -> Iterator[str]:
        shard, table = element
        path = parquet_name(self._folder, "part", shard)
        rows = sort_by_keys(table.cast(self._schema), self._keys)
        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            pq.write_table(rows, handle, row_group_size=self._row_group_rows)
        yield path


def _read_row_group(path: str, index: int) -> pa.Table:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return pq.ParquetFile(handle).read_row_group(index)


def _sorted_part(path: str) -> SortedPart:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        groups = pq.ParquetFile(handle).metadata.num_row_groups
    return SortedPart(read=lambda index: _read_row_group(path, index), row_groups=groups)


class _MergeRelease(beam.DoFn):
    """Every sorted part's name (one element, once all parts are written) -> the dataset's one
    file, `<dataset>/part-00000.parquet` (`engines.kernel.release_file`), rows merged in key
    order, one row group per part in memory. No parts (nothing released): the file holds the
    schema and no rows. Rewritten whole when retried."""

    def __init__(self, dataset_dir: str, schema: pa.Schema, keys: list[str]):
        self._dir, self._schema, self._keys = dataset_dir, schema, keys

    def process(self, paths: list[str]) -> None:
        parts = [_sorted_part(path) for path in sorted(paths)]
        target = FileSystems.join(self._dir, RELEASE_FILE)
        with (
            FileSystems.create(target, compression_type=CompressionTypes.UNCOMPRESSED) as handle,
            ReleaseWriter(handle, self._schema) as writer,
        ):
            merge_sorted_parts(parts, self._keys, writer)


class WriteRelease(beam.PTransform):
    """(partition shard, released table) -> the dataset's one file, the same on every engine:
    each shard's rows sorted into a part under `parts_dir` (a folder of the staging area the
    launcher removes), then, once every shard is written, the parts merged into
    `<dataset_dir>/part-00000.parquet`. The folder is in the runner's staging area, published
    only on success."""

    def __init__(
        self,
        dataset_dir: str | Path,
        parts_dir: str,
        schema: pa.Schema,
        keys: list[str],
        partition_shards: int,
    ):
        super().__init__()
        self._dir, self._parts, self._schema = str(dataset_dir), parts_dir, schema
        self._keys, self._shards = keys, partition_shards

    def expand(self, tables):
        write = _WriteSortedPart(
            self._parts, self._schema, self._keys, part_row_groups(self._shards)
        )
        return (
            tables
            | "WriteSortedParts" >> beam.ParDo(write)
            | "AllParts" >> beam.combiners.ToList()
            | "MergeParts" >> beam.ParDo(_MergeRelease(self._dir, self._schema, self._keys))
        )


def _chunks(keys: np.ndarray) -> list[np.ndarray]:
    return np.array_split(keys, max(1, math.ceil(len(keys) / PUBLIC_CHUNK)))


def _split_by_shard(keys: np.ndarray, shards: int) -> Iterator[tuple[int, np.ndarray]]:
    target = stable_shard(keys, shards)
    for shard in np.unique(target):
        yield int(shard), keys[target == shard]
