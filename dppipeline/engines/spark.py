"""The Spark engine: bounding and aggregation as DataFrame operations, release by the core.

No Python runs per row. Linf bounding collects each (privacy unit, partition) pair's values in a
hash aggregate and keeps the first Linf of a random permutation (`shuffle`), a uniform sample;
at 5M rows on 2 cores it measured 8.1 s against 9.4 s for `row_number()` over a random order
(which sorts every row) and 3.2 s for a plain groupBy of the same rows. L0
bounding ranks the (much fewer) pairs per privacy unit with `row_number()` over `rand()`. The
exact aggregates then go to the engine-neutral `core.release`:

- on the driver, when the aggregate table has at most $DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS
  rows (default 1,000,000; one `toPandas`; the common case: terminals number in thousands);
- on the executors with `mapInPandas` otherwise (each batch of partitions released
  independently, which gives the same distribution), written by Spark.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dppipeline.core.budget import BudgetPlan
from dppipeline.core.release import (
    release_arrow_schema,
    release_partitions,
)
from dppipeline.engines import spark_read
from dppipeline.engines.base import EngineRun, ReleaseJob, release_to_dataset
from dppipeline.engines.local_read import first_rejected_row
from dppipeline.engines.spark_session import get_spark, shuffle_partitions
from dppipeline.schemas import transactions_schema
from dppipeline.spec import JobSpec
from dppipeline.validation import RejectSummary, check_rejected_fraction

log = logging.getLogger("dppipeline.spark")


# Above this many partitions the release runs on the executors (mapInPandas). Read when the
# engine runs, so tests and users can set it per run.
def driver_release_max_partitions() -> int:
    return int(os.environ.get("DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS", "1000000"))


VALUE = "_value"
INSET_MAX_KEYS = 100_000
_ARROW_TO_SPARK = {"int64": "bigint", "double": "double", "string": "string"}


def clip(column: str, spec: JobSpec):
    """The value clipped to [min_value, max_value] (0 when only counts are released)."""
    if not spec.needs_value_bounds:
        return F.lit(0.0)
    low, high = spec.bounds.min_value, spec.bounds.max_value
    return F.least(F.greatest(F.col(column).cast("double"), F.lit(low)), F.lit(high))


def public_frame(spark: SparkSession, public_keys: pd.DataFrame, key: str) -> DataFrame:
    """The public key list as a Spark DataFrame, built on the driver from Arrow (no Python
    worker starts)."""
    return spark.createDataFrame(public_keys[[key]])


def keep_public(rows: DataFrame, key: str, public_keys: pd.DataFrame) -> DataFrame:
    """Rows whose key is listed: an IN-set filter for lists up to INSET_MAX_KEYS keys (no job,
    no shuffle, no Python), a broadcast semi-join for longer ones."""
    keys = public_keys[key].tolist()
    if len(keys) <= INSET_MAX_KEYS:
        return rows.where(F.col(key).isin(keys))
    listed = public_frame(rows.sparkSession, public_keys, key)
    return rows.join(F.broadcast(listed), on=key, how="left_semi")


def bound_and_aggregate(
    rows: DataFrame, spec: JobSpec, public_keys: pd.DataFrame | None, seed: int | None = None
) -> DataFrame:
    """(privacy unit, key, value) rows -> exact bounded aggregates per partition."""
    unit, key = spec.privacy_unit, spec.partition_key
    rows = rows.select(unit, key, clip(spec.value, spec).alias(VALUE))
    # Linf: a uniform sample of rows per (privacy unit, partition): the pair's values are
    # collected by a hash aggregate, randomly permuted, and the first Linf kept.
    linf = spec.bounds.max_contributions_per_partition
    sampled = F.slice(F.shuffle(F.collect_list(VALUE), seed), 1, linf)
    # (privacy unit, key) -> count, sum
    pairs = (
        rows.groupBy(unit, key)
        .agg(sampled.alias("_values"))
        .select(
            unit,
            key,
            F.size("_values").alias("count"),
            F.aggregate("_values", F.lit(0.0), lambda total, x: total + x).alias("sum"),
        )
    )
    if public_keys is not None:
        # Before L0 bounding, so no privacy unit spends its L0 on partitions never released.
        # Linf bounding is per pair, so filtering pairs here equals filtering rows earlier,
        # on ~100x fewer rows.
        pairs = keep_public(pairs, key, public_keys)
    # L0: a uniform sample of partitions per privacy unit, each counted once.
    per_unit = Window.partitionBy(unit).orderBy(F.rand(None if seed is None else seed + 1))
    pairs = pairs.withColumn("_rank", F.row_number().over(per_unit)).where(
        F.col("_rank") <= spec.bounds.max_partitions_contributed
    )
    # (key) -> privacy_id_count, count, sum
    return pairs.groupBy(key).agg(
        F.count(F.lit(1)).alias("privacy_id_count"),
        F.sum("count").alias("count"),
        F.sum("sum").cast("double").alias("sum"),
    )


def release_on_executors(
    aggregates: DataFrame, key: str, plan: BudgetPlan, metrics: tuple[str, ...]
) -> DataFrame:
    """mapInPandas over batches of partitions; the plan travels to the executors (a plain
    value) and each batch rebuilds the secure PyDP mechanisms from it."""
    arrow_schema = release_arrow_schema(key, metrics)
    ddl = ", ".join(f"{f.name} {_ARROW_TO_SPARK[str(f.type)]}" for f in arrow_schema)
    names = arrow_schema.names

    def release_batches(batches):
        for batch in batches:
            yield release_partitions(batch, [key], plan)[names]

    return aggregates.mapInPandas(release_batches, StructType.fromDDL(ddl))


class SparkEngine:
    """Spark engine: the same job on `local[*]`, a standalone cluster, YARN or Kubernetes."""

    name = "spark"

    def __init__(self, spark: SparkSession | None = None):
        self._spark = spark
        self._starting: concurrent.futures.Future | None = None

    def prepare(self) -> None:
        """Starts the JVM in the background while the runner plans the budget (the JVM start
        and pipeline-dp's imports each take seconds; nothing here reads data)."""
        if self._spark is None and self._starting is None:
            pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spark-start")
            self._starting = pool.submit(get_spark)
            pool.shutdown(wait=False)

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            self._spark = self._starting.result() if self._starting else get_spark()
        return self._spark

    def run(self, job: ReleaseJob, dataset_dir: Path) -> EngineRun:
        started = time.monotonic()

        def progress(step: str) -> None:
            job.progress(f"{time.monotonic() - started:6.1f}s {step}")

        spark, spec = self.spark, job.spec
        progress(f"Spark {spark.version} on {spark.sparkContext.master}")
        schema = transactions_schema()
        input_bytes = sum(p.stat().st_size for day in job.days for p in day.files)
        spark.conf.set(
            "spark.sql.shuffle.partitions",
            str(shuffle_partitions(input_bytes, spark.sparkContext.defaultParallelism)),
        )
        spark.sparkContext.setJobGroup("dppipeline", f"dppipeline {spec.name}: read + bound")
        raw = spark_read.read_raw(spark, job.days, spec.input.format, schema)
        validated = spark_read.validate(raw, schema, spec.value)
        observation = Observation("validation")
        validated = validated.observe(
            observation,
            F.count(F.lit(1)).alias("rows"),
            F.count_if(F.col(spark_read.BAD)).alias("rejected"),
        )
        progress("reading, validating, bounding contributions, aggregating per partition")
        aggregates = bound_and_aggregate(
            spark_read.valid_rows(validated, schema), spec, job.public_keys, job.seed
        )
        # One job reads, bounds and aggregates, and brings the (small) result to the driver.
        # One action; no persist(): the result is small and goes straight to the driver.
        limit = driver_release_max_partitions()
        exact = aggregates.limit(limit + 1).toPandas()
        progress(f"{len(exact):,} partitions aggregated; checking rejected rows")
        rejects = self._check_rejects(observation.get, validated, job, schema)
        if len(exact) <= limit:
            progress("releasing on the driver (partition selection and noise)")
            released = self._release_on_driver(exact, job, dataset_dir)
        else:
            progress("releasing on the executors (partition selection and noise)")
            released = self._release_on_executors(aggregates, job, dataset_dir)
        return EngineRun(rejects=rejects, released_partitions=released)

    def _check_rejects(
        self, metrics: dict, validated: DataFrame, job: ReleaseJob, schema
    ) -> RejectSummary:
        rows, rejected = int(metrics["rows"]), int(metrics["rejected"])
        if rejected == 0:
            summary = RejectSummary(rows, 0, None)
            check_rejected_fraction(summary, job.spec.input.max_rejected_fraction)
            return summary
        quarantine = job.quarantine / "rejected.parquet"
        bad = spark_read.rejected_rows(validated, schema, job.spec.value)
        bad.write.mode("overwrite").parquet(str(quarantine))
        first_file = bad.select(F.min(spark_read.SOURCE)).first()[0]
        first = first_rejected_row(
            spark_read.local_path(first_file),
            job.days,
            job.spec.input.format,
            schema,
            job.spec.value,
        )
        summary = RejectSummary(rows, rejected, first, quarantine)
        check_rejected_fraction(summary, job.spec.input.max_rejected_fraction)
        return summary

    def _release_on_driver(self, exact: pd.DataFrame, job: ReleaseJob, dataset_dir: Path) -> int:
        key = job.spec.partition_key
        exact[key] = exact[key].astype(transactions_schema().field(key).type)
        return release_to_dataset(exact, job, dataset_dir)

    def _release_on_executors(
        self, aggregates: DataFrame, job: ReleaseJob, dataset_dir: Path
    ) -> int:
        """Recomputes the aggregates (with fresh sampling; the driver copy is discarded
        unreleased) and releases each batch where it lies; Spark writes the dataset."""
        spec, key = job.spec, job.spec.partition_key
        if job.public_keys is not None:
            public = public_frame(self.spark, job.public_keys, key)
            aggregates = public.join(aggregates, on=key, how="left").fillna(
                0, subset=["privacy_id_count", "count", "sum"]
            )
        self.spark.sparkContext.setJobGroup("dppipeline", f"dppipeline {spec.name}: release")
        released = release_on_executors(aggregates, key, job.plan, spec.metrics)
        released.write.parquet(str(dataset_dir))
        return sum(
            pq.ParquetFile(p).metadata.num_rows for p in sorted(dataset_dir.glob("*.parquet"))
        )
