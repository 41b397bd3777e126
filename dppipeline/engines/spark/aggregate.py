"""Aggregation and release on Spark: bounded pairs -> exact aggregates per partition -> the
engine-neutral `core.release`.

The one exchange after bounding carries the pair aggregates to their partition. The release
runs:

- on the driver, when the aggregate table has at most $DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS
  rows (default 1,000,000; one `toPandas`; the common case: terminals number in thousands);
- on the executors with `mapInPandas` otherwise (each batch of partitions released
  independently, which gives the same distribution), written by Spark; for one-query jobs
  (a shared selection needs every member's aggregates together, on the driver).
"""

from __future__ import annotations

import os

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dppipeline.core.release import (
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
from dppipeline.engines.spark.types import to_spark_ddl


# Above this many partitions the release runs on the executors (mapInPandas). Read when the
# engine runs, so tests and users can set it per run.
def driver_release_max_partitions() -> int:
    return int(os.environ.get("DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS", "1000000"))


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


def release_on_executors(
    aggregates: DataFrame, job: ReleaseJob, query: str, public: DataFrame | None
) -> DataFrame:
    """mapInPandas over batches of partitions; the plan travels to the executors (a plain
    value) and each batch rebuilds the secure PyDP mechanisms from it. For a query with
    public keys (`public` given) or its own selection: every batch is independent."""
    task = job.tasks.task(query)
    plan = job.plan.query(query).plan
    arrow_schema = job.release_schema(query)
    ddl = to_spark_ddl(arrow_schema)
    names, keys = arrow_schema.names, task.key_names

    def release_batches(batches):
        for batch in batches:
            if VALUES in batch:
                batch[VALUES] = value_arrays(batch[VALUES])
            yield release_partitions(batch, keys, plan)[names]

    if public is not None:
        counts = (*AGGREGATE_COLUMNS, CENTRED_SQUARES, *map(distinct_aggregate, task.distinct))
        zeros = {c: 0 for c in counts if c in aggregates.columns}
        aggregates = public.join(aggregates, on=keys, how="left").fillna(zeros)
    return aggregates.mapInPandas(release_batches, StructType.fromDDL(ddl))
