"""Run by tests/engines/test_spark_engine.py in its own process: bounding with a task that
fails once.

Usage: python spark_forced_retry.py OUTPUT_JSON MARKER_DIR

Starts Spark on `local[2,4]` (2 threads, a task may fail up to 3 times and be retried), bounds
a skewed input twice with the same salt: once failure-free, once with a Python UDF on the
bounded pairs that raises on the first attempt of partition 0 of the bounding stage (after
Linf and L0 ran in that task, so the retry recomputes them). Writes both exact aggregates,
every kept pair of the failing run, and the input, as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from pyspark import TaskContext
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from dppipeline.core.tasks import task_for
from dppipeline.engines.kernel.sampling import new_salt
from dppipeline.engines.spark.aggregate import partition_aggregates
from dppipeline.engines.spark.bound import bounded_pairs
from dppipeline.engines.spark.spark_session import get_spark
from dppipeline.spec.model import build_spec

L0, LINF = 3, 2


def skewed_rows() -> pd.DataFrame:
    """300 customers at up to 8 of 12 terminals, 1-6 rows per pair, integer amounts (exact
    sums whatever the order), identities (file, row) over three files."""
    rng = np.random.default_rng(17)
    customers, terminals = [], []
    for customer in range(300):
        for terminal in rng.choice(12, size=rng.integers(1, 9), replace=False):
            n = int(rng.integers(1, 7))
            customers += [customer] * n
            terminals += [int(terminal)] * n
    n = len(customers)
    files = rng.choice(["a.parquet", "b.parquet", "c.parquet"], n)
    return pd.DataFrame(
        {
            "CUSTOMER_ID": np.array(customers, dtype=np.int64),
            "TERMINAL_ID": np.array(terminals, dtype=np.int64),
            "TX_AMOUNT": rng.integers(1, 100, n).astype(np.float64),
            "_source_file": files,
            "_row": pd.Series(files).groupby(files).cumcount().to_numpy() + 1,
        }
    )


def main(output: Path, markers: Path) -> None:
    spark = get_spark(
        app_name="dppipeline-forced-retry",
        master="local[2,4]",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"},
    )
    spec = build_spec(
        {},
        {
            "input.path": "unused",
            "output": "unused",
            "metrics": ["count", "sum"],
            "bounds.max_partitions_contributed": L0,
            "bounds.max_contributions_per_partition": LINF,
            "bounds.min_value": 0.0,
            "bounds.max_value": 100.0,
        },
    )
    task = task_for(spec.queries[0], spec.source_schema)
    salt = new_salt(99)
    rows = skewed_rows()
    frame = spark.createDataFrame(rows).repartition(3)

    def fail_on_first_attempt(count: int) -> int:
        context = TaskContext.get()
        if context.partitionId() == 0 and context.attemptNumber() == 0:
            (markers / f"stage{context.stageId()}-attempt0-failed").touch()
            raise RuntimeError("injected failure: first attempt of partition 0")
        return count

    failing = F.udf(fail_on_first_attempt, LongType())
    clean = partition_aggregates(bounded_pairs(frame, task, spec.privacy_unit, salt), task)
    pairs = bounded_pairs(frame, task, spec.privacy_unit, salt)
    pairs = pairs.withColumn("count", failing(F.col("count")))
    retried = partition_aggregates(pairs, task)
    result = {
        "clean": clean.toPandas().sort_values("TERMINAL_ID").to_dict("list"),
        "retried": retried.toPandas().sort_values("TERMINAL_ID").to_dict("list"),
        "retried_pairs": pairs.select("CUSTOMER_ID", "TERMINAL_ID", "count")
        .toPandas()
        .to_dict("list"),
        "input": rows[["CUSTOMER_ID", "TERMINAL_ID"]].to_dict("list"),
        "bounds": [L0, LINF],
    }
    output.write_text(json.dumps(result, default=int))
    spark.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
