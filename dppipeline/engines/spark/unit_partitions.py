"""Several queries bounded in one pass over the rows shuffled by privacy unit.

A job of several queries shuffles its valid rows by unit once (`bound.shuffled_by_unit`), so
every row of a unit lies in one partition: bounding a unit needs no other partition. Here
each partition runs every additive query's bounding at once, in a Python worker
(`mapInArrow`), with the code the local engine runs (`polars_tasks.TaskBounder`, on the
priorities Spark computed: the same rows are kept), and yields per query its partial
aggregates per partition key; one small aggregation sums the partials of each key across
partitions. One scan of the shuffled rows for all of them, where a Spark job per query
rescanned them and ranked them again (the bank's 12 queries: docs/explanation/benchmarks.md).

A partition key's aggregates over all units are those of each partition of units, summed
(counts, sums, centred squares, privacy unit counts) or, for the kept values that
percentiles, max and min release, concatenated. Queries with count_distinct take the per-query
path (`bound.bounded_pairs`): their distinct sets would travel as sets.

The run's salt travels to the workers inside the pickled function, as the release plan does
for `aggregate.release_on_executors`: never as a literal in a Spark plan or the UI.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from dppipeline.core.columns import CENTRED_SQUARES, VALUES, value_arrays
from dppipeline.core.tasks import AggregationTask, KeyColumn, canonical_keys
from dppipeline.engines.kernel.polars_tasks import TaskBounder
from dppipeline.engines.kernel.sampling import SamplingKeys
from dppipeline.engines.spark.types import to_spark_ddl

TASK = "_task"
SUMS: dict[str, pa.DataType] = {
    "privacy_id_count": pa.int64(),
    "count": pa.int64(),
    "sum": pa.float64(),
    CENTRED_SQUARES: pa.float64(),
}
# Rows of a partition bounded at a time: Arrow hands them over 10,000 at a time, and a batch
# that small would spend more on each query's per-batch steps than on the rows.
BATCH_ROWS = 1_000_000
# What the batches of a partition kept, thinned together past this many rows (`TaskBounder`).
COMPACT_ROWS = 2_000_000


def bounds_in_one_pass(task: AggregationTask) -> bool:
    """Whether the task's aggregates combine across partitions of units by sums and
    concatenation."""
    return not task.distinct


def key_slot(position: int, key: KeyColumn) -> str:
    """The output column carrying a task's `position`-th key: one per position and type, so
    the tasks of a job share a few columns (each task reads only its own)."""
    kind = key.kind if key.kind in ("int64", "date") else "string"
    return f"_key{position}_{kind}"


def partial_schema(tasks: Sequence[AggregationTask]) -> pa.Schema:
    """Task number, every key slot the tasks use, the additive aggregates."""
    slots = {key_slot(i, k): k.arrow_type for t in tasks for i, k in enumerate(t.keys)}
    values = [(VALUES, pa.list_(pa.float64()))] if any(t.values for t in tasks) else []
    return pa.schema([(TASK, pa.int32()), *sorted(slots.items()), *SUMS.items(), *values])


def bound_in_one_pass(
    rows: DataFrame, tasks: Sequence[AggregationTask], unit: str, salt: bytes
) -> dict[str, pd.DataFrame]:
    """Rows from `shuffled_by_unit` -> each task's exact bounded aggregates per partition, in
    the form `core.mechanisms` takes, from one Spark job."""
    schema = partial_schema(tasks)

    def bound_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        bounder = TaskBounder(tasks, unit, SamplingKeys.from_salt(salt), compact_rows=COMPACT_ROWS)
        pending: list[pa.RecordBatch] = []
        held = 0
        for batch in batches:
            pending.append(batch)
            held += batch.num_rows
            if held >= BATCH_ROWS:
                bounder.add(pl.DataFrame(pa.Table.from_batches(pending)))
                pending, held = [], 0
        if pending:
            bounder.add(pl.DataFrame(pa.Table.from_batches(pending)))
        elif not any(bounder.kept.values()):  # a partition no unit hashed to
            return
        for number, task in enumerate(tasks):
            yield partial_batch(number, task, bounder.aggregates(task), schema)

    partials = rows.mapInArrow(bound_partition, to_spark_ddl(schema))
    slots = [name for name in schema.names if name.startswith("_key")]
    combine = [F.sum(name).alias(name) for name in SUMS]
    if VALUES in schema.names:
        combine.append(F.flatten(F.collect_list(VALUES)).alias(VALUES))
    with warnings.catch_warnings():  # PySpark's warning on a failure quotes the worker's error
        warnings.simplefilter("ignore", UserWarning)
        combined = partials.groupBy(TASK, *slots).agg(*combine).toPandas()
    return {
        task.name: task_aggregates(combined[combined[TASK] == number], task)
        for number, task in enumerate(tasks)
    }


def partial_batch(
    number: int, task: AggregationTask, aggregates: pd.DataFrame, schema: pa.Schema
) -> pa.RecordBatch:
    """One task's aggregates of one partition in the shared output schema."""
    columns: dict[str, pa.Array] = {}
    slots = {key_slot(i, k): k for i, k in enumerate(task.keys)}
    for field in schema:
        if field.name == TASK:
            values: object = [number] * len(aggregates)
        elif field.name in slots:
            values = aggregates[slots[field.name].name]
        elif field.name == VALUES and VALUES in aggregates:
            columns[VALUES] = value_lists(list(aggregates[VALUES]))
            continue
        elif field.name in aggregates:
            values = aggregates[field.name]
        else:  # another task's key, or an aggregate the task does not need
            values = [None] * len(aggregates)
        columns[field.name] = pa.array(values, type=field.type, from_pandas=True)
    return pa.RecordBatch.from_pydict(columns, schema=schema)


def value_lists(arrays: list[np.ndarray]) -> pa.ListArray:
    """Each partition key's kept values as one Arrow list (no Python float per value)."""
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    flat = np.concatenate(arrays).astype(np.float64) if arrays else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(flat))


def task_aggregates(combined: pd.DataFrame, task: AggregationTask) -> pd.DataFrame:
    """One task's summed rows, with its key columns named and typed as every engine gives
    them."""
    names = {key_slot(i, k): k.name for i, k in enumerate(task.keys)}
    sums = [c for c in SUMS if c != CENTRED_SQUARES or task.sum_squares]
    kept = [VALUES] if task.values else []
    frame = combined[[*names, *sums, *kept]].rename(columns=names).reset_index(drop=True)
    if task.values:
        frame[VALUES] = value_arrays(frame[VALUES])
    return canonical_keys(frame, task.keys)
