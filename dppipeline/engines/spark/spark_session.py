"""The SparkSession the Spark engine runs in, with the defaults a user would expect.

Under spark-submit the session (master, resources) comes from the command line; this module only
fills in what is unset. Run in-process (`dppipeline run --engine spark`), it starts `local[*]`.
"""

from __future__ import annotations

import shutil
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

from dppipeline import settings
from dppipeline.errors import UsageError

# SQL defaults applied only where neither spark-submit nor the user set a value.
SQL_DEFAULTS: dict[str, str] = {
    "spark.sql.adaptive.enabled": "true",  # AQE: coalesces shuffle partitions, handles skew
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    # Bounding shuffles every row: 16 MB reduce tasks (Spark's default is 64 MB) spread them
    # evenly over the cores and keep each task's collected values small
    # (docs/explanation/engines.md).
    "spark.sql.adaptive.advisoryPartitionSizeInBytes": "16m",
    "spark.sql.adaptive.skewJoin.enabled": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",  # fast toPandas / mapInPandas
    "spark.sql.session.timeZone": "UTC",
    # Hash (not sort) aggregation for collect_list in Linf bounding: Spark's default falls back
    # to sorting after 128 keys per task.
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "1000000",
    # List input files on the driver: the day folders are known, a listing job costs seconds.
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
}
# Spark's console progress bar prints, on stderr, each stage's task counts, which follow the
# data (adaptive execution sizes tasks at run time): off in every session dppipeline starts,
# whatever spark-defaults.conf or --conf say. Progress goes through the job's own `[spark]`
# lines, whose text depends on public parameters only.
SESSION_SETTINGS: dict[str, str] = {"spark.ui.showConsoleProgress": "false"}
LOG4J_CONF = Path(__file__).resolve().parent / "log4j2.properties"


def check_java() -> None:
    """Spark needs a JVM: say so plainly instead of a py4j stack trace."""
    java_home = settings.java_home()
    if java_home and (java_home / "bin" / "java").exists():
        return
    if shutil.which("java") is None:
        raise UsageError(
            "--engine spark needs Java 17 or newer: install a JDK and put `java` on PATH "
            "or set JAVA_HOME"
        )


def get_spark(
    app_name: str = "dppipeline", master: str | None = None, conf: dict[str, str] | None = None
):
    """The active SparkSession (a caller's: its settings are its own), or a new one, with
    `SESSION_SETTINGS` (no console progress bar).

    Under spark-submit (or the pyspark shell) the master and resources come from there; run
    in-process, the master is `master`, else $DPPIPELINE_SPARK_MASTER, else `local[*]`.
    """
    from pyspark.sql import SparkSession  # noqa: PLC0415

    warnings.filterwarnings("ignore", message=".*PySpark does not yet fully support pandas.*")
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    check_java()
    builder = SparkSession.builder.appName(app_name)
    for key, value in {**(conf or {}), **SESSION_SETTINGS}.items():
        builder = builder.config(key, value)
    if not settings.launched_by_spark_submit():
        chosen = master or settings.spark_master()
        builder = builder.master(chosen)
        builder = builder.config(
            "spark.driver.extraJavaOptions",
            f"-Dlog4j2.configurationFile={LOG4J_CONF.as_uri()} {settings.spark_java_options()}",
        )
        if chosen.startswith("local"):
            # Python workers of a local session use this interpreter (and its packages).
            settings.default_pyspark_python(sys.executable)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings.spark_log_level())
    explicit = spark.sparkContext.getConf()
    for key, value in SQL_DEFAULTS.items():
        if not explicit.contains(key):
            spark.conf.set(key, value)
    return spark


class _BackgroundStart:
    """`get_spark()` on a thread of its own: the JVM's start (5 s or more) overlaps the imports
    and the budget planning, which need no Spark. Not a daemon: a run that ends without Spark
    (an error, or a release the ledger already holds) waits for the start to finish before the
    interpreter exits; a session cut off mid-start made spark-submit fail the rerun."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._session: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._start, name="spark-start").start()

    def _start(self) -> None:
        try:
            self._session = get_spark()
        except BaseException as exc:  # re-raised in the caller's thread by result()
            self._error = exc
        finally:
            self._done.set()

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._session


_started: dict[str, _BackgroundStart] = {}  # at most one: the process's default session


def start_spark_early() -> None:
    """Starts the default session in the background, once per process (`dppipeline run
    --engine spark` calls it before importing anything heavy); `started_spark` collects it."""
    if not _started:
        _started["default"] = _BackgroundStart()


def started_spark():
    """The session `start_spark_early` began (waiting for it), else `get_spark()`."""
    return _started["default"].result() if _started else get_spark()


def shuffle_partitions(input_bytes: int, parallelism: int) -> int:
    """Initial shuffle partitions for the data size (AQE coalesces them to its advisory size):
    about 16 MB of input per partition, at least 2 per core, at most 2000."""
    by_size = input_bytes // (16 << 20) + 1
    return int(min(2000, max(2 * parallelism, by_size)))
