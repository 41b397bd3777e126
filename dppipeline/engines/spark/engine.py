"""The Spark engine: the seam (`engines.base`) over Spark's read, bound and aggregate steps.

A job of one query bounds in `bound.py` and aggregates in `aggregate.py`. A job of several
reads, validates and shuffles its rows by unit once and bounds its queries in one pass over
that shuffle (`unit_partitions.py`); count_distinct queries take a Spark job each over the
persisted shuffle. The release runs in `aggregate.py`.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import pandas as pd
from pyspark import StorageLevel
from pyspark.sql import DataFrame, Observation, SparkSession

from dppipeline import settings
from dppipeline.core.tasks import (
    AggregationTask,
    read_schema,
)
from dppipeline.engines.base import EngineRun, ReleaseJob, release_to_datasets
from dppipeline.engines.kernel.release_file import RELEASE_FILE, ReleaseWriter
from dppipeline.engines.spark import read as spark_read
from dppipeline.engines.spark.aggregate import (
    bound_and_aggregate,
    release_on_executors,
    released_batches,
    to_aggregates_frame,
)
from dppipeline.engines.spark.bound import shuffled_by_unit
from dppipeline.engines.spark.hadoop_fs import hadoop_resolver
from dppipeline.engines.spark.spark_session import (
    shuffle_partitions,
    start_spark_early,
    started_spark,
)
from dppipeline.engines.spark.unit_partitions import bound_in_one_pass, bounds_in_one_pass
from dppipeline.errors import InputError
from dppipeline.inputs.contract import RejectedRow, RejectSummary, check_rejected_fraction
from dppipeline.inputs.files import file_stamp
from dppipeline.inputs.quarantine import FILE_NAME, private_folder, seal
from dppipeline.logs import statistic
from dppipeline.storage.location import Resolver

log = logging.getLogger(__name__)


EMPTY_RELATION_RULE = "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation"


def keep_observations_of_empty_results(spark: SparkSession) -> None:
    """Zero rows must not change a run's outcome. When a task's filter matches no row,
    adaptive execution replaces the empty stage, with the CollectMetrics node that counts the
    rows read, by an empty relation, and the observation never arrives (SPARK-54620): the run
    would crash. Excluding that one AQE rule keeps the node (the empty stage still runs)."""
    key = "spark.sql.adaptive.optimizer.excludedRules"
    excluded = [r for r in (spark.conf.get(key, "") or "").split(",") if r.strip()]
    if EMPTY_RELATION_RULE not in excluded:
        spark.conf.set(key, ",".join([*excluded, EMPTY_RELATION_RULE]))


class SparkEngine:
    """Spark engine: the same job on `local[*]`, a standalone cluster, YARN or Kubernetes."""

    name = "spark"
    writes_to_stores = False  # the runner uploads what the driver staged locally

    def __init__(self, spark: SparkSession | None = None):
        self._spark = spark

    def prepare(self) -> None:
        """Starts the JVM in the background while the runner plans the budget (the JVM start
        and pipeline-dp's imports each take seconds; nothing here reads data)."""
        if self._spark is None:
            start_spark_early()

    def file_systems(self) -> Resolver:
        """Every remote location through the session's Hadoop FileSystem API: whatever the
        cluster's Hadoop configuration reaches, with its credentials."""
        return hadoop_resolver(lambda: self.spark)

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            self._spark = started_spark()
        return self._spark

    def run(self, job: ReleaseJob, staging: Path) -> EngineRun:
        started = time.monotonic()

        def progress(step: str) -> None:
            job.progress(f"{time.monotonic() - started:6.1f}s {step}")

        spark, spec, tasks = self.spark, job.spec, job.tasks.tasks
        progress(f"Spark {spark.version} on {spark.sparkContext.master}")
        schema = read_schema(spec, tasks)
        in_memory = isinstance(job.rows, DataFrame)  # the Python API: the caller's DataFrame
        if not in_memory and not spark.sparkContext.getConf().contains(
            "spark.sql.shuffle.partitions"
        ):  # a caller's session keeps its own settings
            input_bytes = sum(file_stamp(p)[0] for day in job.days for p in day.files)
            parallelism = spark.sparkContext.defaultParallelism
            partitions = shuffle_partitions(input_bytes, parallelism)
            spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
        keep_observations_of_empty_results(spark)
        spark.sparkContext.setJobGroup("dppipeline", f"dppipeline {spec.name}: read + bound")
        if in_memory:
            inputs = spark_read.read_frame(job.rows, schema)
        else:
            inputs = spark_read.read_validated(spark, job.days, spec.input.format, schema)
        observation = Observation("validation")
        validated = inputs.validated.observe(observation, *spark_read.observed_counts())
        valid = spark_read.valid_rows(validated, schema)
        # Several queries: read, validate and shuffle by unit once for all, bound in one pass;
        # persisted when more Spark jobs read the shuffle (queries the pass cannot bound).
        shared = len(tasks) > 1
        one_pass = [t for t in tasks if shared and bounds_in_one_pass(t)]
        persisted = shared and len(one_pass) < len(tasks)
        if shared:
            valid = shuffled_by_unit(valid, spec.privacy_unit, job.salt)
        if persisted:
            valid = valid.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            return self._run_tasks(
                job,
                valid,
                one_pass=one_pass,
                observation=observation,
                rejected=inputs.rejected,
                staging=staging,
                progress=progress,
            )
        except Exception as exc:  # a file Spark could not read: one line naming it
            files = [p for day in job.days for p in day.files]
            failure = spark_read.read_failure(exc, files)
            if failure is None and not in_memory and spec.input.format == "parquet":
                failure = spark_read.undecodable_parquet(exc, files, schema)
            if failure is None:
                raise
            raise failure from None
        finally:
            if persisted:
                valid.unpersist()

    def _run_tasks(
        self,
        job: ReleaseJob,
        valid: DataFrame,
        *,
        one_pass: list[AggregationTask],
        observation,
        rejected,
        staging,
        progress,
    ) -> EngineRun:
        """Each task's aggregates to the driver (several tasks: one job for those in
        `one_pass`, one per other task), then the release by the core; or,
        for a one-query job with more partitions than the driver limit, the release on the
        executors. Where it releases shows only behind --debug-statistics, and a job of
        several queries releases on the driver whatever its partitions number: whether a run
        succeeds, and what it prints, must not depend on how many partitions the data fill
        (a limit that failed such a job was a data-dependent failure)."""
        tasks, unit = job.tasks.tasks, job.spec.privacy_unit
        limit = settings.driver_release_max_partitions()  # read per run: tests set it
        exact: dict[str, pd.DataFrame] = {}
        rejects = None
        shared = len(tasks) > 1  # `valid` is then `shuffled_by_unit` (see `run`)
        if one_pass:
            self.spark.sparkContext.setJobGroup(
                "dppipeline", f"dppipeline {job.spec.name}: bound {len(one_pass)} queries"
            )
            progress(f"{len(one_pass)} queries: bounding contributions in one pass, aggregating")
            exact = bound_in_one_pass(valid, one_pass, unit, job.salt)
            progress("checking rejected rows")
            rejects = self._check_rejects(observation.get, rejected, job)
            for name, frame in exact.items():
                statistic(log, f"{name}: {len(frame):,} partitions aggregated before selection")
        for task in tasks:
            if task.name in exact:
                continue
            self.spark.sparkContext.setJobGroup("dppipeline", f"dppipeline {task.name}: bound")
            progress(f"{task.name}: filtering, bounding contributions, aggregating")
            aggregates = bound_and_aggregate(valid, task, unit, job.salt, by_unit=shared)
            movable = len(tasks) == 1 and bool(task.keys)  # may release on the executors
            with warnings.catch_warnings():  # PySpark's warning on a failure: a Java trace
                warnings.simplefilter("ignore", UserWarning)
                frame = (aggregates.limit(limit + 1) if movable else aggregates).toPandas()
            if rejects is None:
                progress("checking rejected rows")
                rejects = self._check_rejects(observation.get, rejected, job)
            if movable and len(frame) > limit:
                progress("releasing (partition selection and noise)")
                statistic(log, f"{task.name}: released on the executors")
                released = self._release_on_executors(aggregates, job, task.name, staging)
                return EngineRun(rejects=rejects, released_partitions={task.name: released})
            statistic(log, f"{task.name}: {len(frame):,} partitions aggregated before selection")
            exact[task.name] = to_aggregates_frame(frame, task)
        progress("releasing (partition selection and noise)")
        exact = {task.name: exact[task.name] for task in tasks}  # in the job's order
        released_rows = release_to_datasets(exact, job, staging)
        assert rejects is not None
        return EngineRun(rejects=rejects, released_partitions=released_rows)

    def _check_rejects(self, metrics: dict, rejected: DataFrame, job: ReleaseJob) -> RejectSummary:
        """A file that could not be split fails the run; rejected rows go to the quarantine
        (a folder of Parquet parts, owner-only), and above max_rejected_fraction fail it,
        naming the first bad file and row."""
        if metrics["error"] is not None:
            raise InputError(metrics["error"])
        rows, count = int(metrics["rows"]), int(metrics["rejected"])
        summary = RejectSummary(rows, count, None)
        if count:
            quarantine = private_folder(job.quarantine) / FILE_NAME
            rejected.write.mode("overwrite").parquet(f"file:{quarantine}")
            seal(quarantine)
            head = rejected.orderBy(spark_read.SOURCE, spark_read.ROW).first()
            first = RejectedRow(
                file=head[spark_read.SOURCE],
                row=head[spark_read.ROW],
                reason=head[spark_read.REASON],
                fmt=job.spec.input.format,
            )
            summary = RejectSummary(rows, count, first, quarantine)
        check_rejected_fraction(summary, job.spec.input.max_rejected_fraction)
        return summary

    def _release_on_executors(
        self, aggregates: DataFrame, job: ReleaseJob, query: str, staging: Path
    ) -> int:
        """Recomputes the aggregates (the same sample: priorities depend on the salt only; the
        driver copy is discarded unreleased), releases each batch where it lies, and streams
        the released batches, in key order, into the dataset's one file on the driver (never
        more than a task's output or two in the driver's memory)."""
        public_keys = job.tasks.public_keys.get(query)
        public = None if public_keys is None else self.spark.createDataFrame(public_keys)
        self.spark.sparkContext.setJobGroup("dppipeline", f"dppipeline {query}: release")
        chunks = release_on_executors(aggregates, job, query, public)
        dataset_dir = staging / query
        dataset_dir.mkdir(parents=True)
        with ReleaseWriter(dataset_dir / RELEASE_FILE, job.release_schema(query)) as writer:
            for batch in released_batches(chunks):
                writer.write(batch)
        return writer.rows
