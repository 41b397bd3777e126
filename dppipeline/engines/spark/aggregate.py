"""Aggregation and release on Spark: bounded pairs -> exact aggregates per partition -> the
engine-neutral `core.mechanisms`.

The one exchange after bounding carries the pair aggregates to their partition. The release
runs:

- on the driver, when the aggregate table has at most $DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS
  rows (default 1,000,000; one `toPandas`; the common case: terminals number in thousands);
- on the executors with `mapInArrow` otherwise (each batch of partitions released
  independently, which gives the same distribution), for one-query jobs (a shared selection
  needs every member's aggregates together, on the driver). The released batches come back to
  the driver in key order, one task at a time, and the driver writes them.

Either way the driver writes the dataset's one file with `engines.kernel.release_file`: the
same name, row order, row groups and metadata whichever path ran (the path follows the data).
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from dppipeline.core.mechanisms import (
    AGGREGATE_COLUMNS,
    CENTRED_SQUARES,
    VALUES,
    distinct_aggregate,
    release_partitions,
    value_arrays,
)
from dppipeline.core.tasks import (
    GLOBAL_KEY,
    AggregationTask,
    canonical_keys,
)
from dppipeline.engines.base import ReleaseJob
from dppipeline.engines.spark.bound import bounded_pairs, distinct_name, group_keys


def partition_aggregates(pairs: DataFrame, task: AggregationTask) -> DataFrame:
    """Kept pairs -> per partition privacy_id_count, count, sum, ... (one exchange)."""
    aggregates = [
        F.count(F.lit(1)).alias("privacy_id_count"),
        F.sum("count").alias("count"),
        F.sum("sum").cast("double").alias("sum"),
    ]
    if task.sum_squares:
        aggregates.append(F.sum(CENTRED_SQUARES).cast("double").alias(CENTRED_SQUARES))
    if task.values:
        aggregates.append(F.flatten(F.collect_list("_values")).alias(VALUES))
    # count_distinct: the union of the pairs' distinct values, then its size (one row holds a
    # partition's distinct values, as it holds its kept values for percentiles).
    aggregates += [
        F.size(F.array_distinct(F.flatten(F.collect_list(distinct_name(i))))).alias(
            distinct_aggregate(column)
        )
        for i, column in enumerate(task.distinct)
    ]
    return pairs.groupBy(*group_keys(task)).agg(*aggregates)


def bound_and_aggregate(
    rows: DataFrame, task: AggregationTask, unit: str, salt: bytes, *, by_unit: bool = False
) -> DataFrame:
    """Typed input rows (`by_unit`: from `shuffled_by_unit`) -> the task's exact bounded
    aggregates per partition."""
    return partition_aggregates(bounded_pairs(rows, task, unit, salt, by_unit=by_unit), task)


def to_aggregates_frame(exact: pd.DataFrame, task: AggregationTask) -> pd.DataFrame:
    """Spark's result on the driver, with keys in the canonical pandas form."""
    exact = exact.drop(columns=[GLOBAL_KEY], errors="ignore")
    if VALUES in exact:
        exact[VALUES] = value_arrays(exact[VALUES])
    return canonical_keys(exact, task.keys)


ARROW_CHUNK = "arrow_ipc"  # the column of `release_on_executors`: one IPC stream per batch


def release_on_executors(
    aggregates: DataFrame, job: ReleaseJob, query: str, public: DataFrame | None
) -> DataFrame:
    """The release in key order, as Arrow IPC streams (one row per released batch) for the
    driver to write (`released_batches`).

    The aggregates are sorted by key (a range exchange), then each batch of partitions is
    released where it lies by `mapInArrow`: the plan travels to the executors (a plain value)
    and each batch rebuilds the secure PyDP mechanisms from it. For a query with public keys
    (`public` given) or its own selection: every batch is independent. A task's batches come
    out in key order and tasks in range order, so reading the result task by task
    (`toLocalIterator`) gives the rows sorted by key, one task's rows at a time."""
    task = job.tasks.task(query)
    plan = job.plan.query(query).plan
    arrow_schema = job.release_schema(query)
    names, keys = arrow_schema.names, task.key_names

    def release_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            exact = batch.to_pandas()
            if VALUES in exact:
                exact[VALUES] = value_arrays(exact[VALUES])
            released = release_partitions(exact, keys, plan)[names]
            if len(released):
                table = pa.Table.from_pandas(released, schema=arrow_schema, preserve_index=False)
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, table.schema) as stream:
                    stream.write_table(table)
                yield pa.RecordBatch.from_pydict(
                    {ARROW_CHUNK: [sink.getvalue().to_pybytes()]},
                    schema=pa.schema([(ARROW_CHUNK, pa.binary())]),
                )

    if public is not None:
        counts = (*AGGREGATE_COLUMNS, CENTRED_SQUARES, *map(distinct_aggregate, task.distinct))
        zeros = {c: 0 for c in counts if c in aggregates.columns}
        aggregates = public.join(aggregates, on=keys, how="left").fillna(zeros)
    ordered = aggregates.orderBy(*keys)
    return ordered.mapInArrow(release_batches, f"{ARROW_CHUNK} binary")


def released_batches(chunks: DataFrame) -> Iterator[pa.Table]:
    """The driver's side of `release_on_executors`: its released rows, in key order, one
    batch at a time.

    The release runs first as one job on every core, its output kept where it was computed
    (`localCheckpoint`: executors' memory, spilling to disk, in the partitions adaptive
    execution sized); the driver then reads it task by task, holding one task's output and
    prefetching the next. `toLocalIterator` alone would run the release itself a task or two
    at a time (on a cluster of many cores, a release of millions of partitions would wait
    for it), and `persist` + `count` keeps the sort's partitions un-coalesced (one Python task
    per shuffle partition: 111-195 s for 1M partitions on local[2], against 61-88 s this way;
    bench/release_write.py). Each partition's noise is drawn once, by that job; an executor
    lost before the driver has read its part fails the run (a checkpoint is not recomputed)."""
    kept = chunks.localCheckpoint(eager=True)
    for row in kept.toLocalIterator(prefetchPartitions=True):
        yield pa.ipc.open_stream(row[ARROW_CHUNK]).read_all()
