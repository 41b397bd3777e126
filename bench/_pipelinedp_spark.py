"""PipelineDP's DPEngine on SparkRDDBackend: the reference program timed by bench.spark_engine.

    python -m bench._pipelinedp_spark --input bench/data/rows_5M --output /tmp/pdp.parquet

What a PipelineDP user writes: a SparkSession, the Parquet folder read with `spark.read.parquet`,
an RDD of (customer, terminal, amount) tuples, `DPEngine.aggregate` with public partitions,
`compute_budgets()`, `collect()`, and the result written with pandas, so that the work is really
done. The defaults are the benchmark's parameters; `bench.spark_engine` passes them explicitly.

Progress markers go to stderr (the benchmark timestamps them on arrival). This file imports only
pyspark, pipeline_dp and pandas, nothing of the benchmark, whose imports would be charged to it.
The session is not stopped explicitly: like `dppipeline run`, the process exits and the JVM
shuts down when its stdin closes.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from operator import itemgetter

import pandas as pd

# pipeline_dp imports apache_beam when installed, which logs a GCP warning on the root logger.
logging.getLogger().addFilter(lambda record: "apitools" not in record.getMessage())

import pipeline_dp  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402


def mark(text: str) -> None:
    print(f"bench-marker: {text}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench._pipelinedp_spark")
    add = parser.add_argument
    add("--input", required=True, help="Parquet folder (daily date=… subfolders)")
    add("--output", required=True, help="Parquet file to write the released rows to")
    add("--master", default="local[2]")
    add("--privacy-unit", default="CUSTOMER_ID")
    add("--partition-key", default="TERMINAL_ID")
    add("--value", default="TX_AMOUNT")
    add("--partitions", type=int, default=1000, help="public partitions are 0..N-1")
    add("--epsilon", type=float, default=1.0)
    add("--delta", type=float, default=1e-6)
    add("--max-partitions-contributed", type=int, default=20)
    add("--max-contributions-per-partition", type=int, default=10)
    add("--min-value", type=float, default=0.0)
    add("--max-value", type=float, default=200.0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # Python workers of a local session run this interpreter (and its packages).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.master(args.master).appName("pipelinedp-bench").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    mark("session ready")

    columns = [args.privacy_unit, args.partition_key, args.value]
    rows = spark.read.parquet(args.input).select(*columns).rdd.map(tuple)
    accountant = pipeline_dp.NaiveBudgetAccountant(
        total_epsilon=args.epsilon, total_delta=args.delta
    )
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.SparkRDDBackend(spark.sparkContext))
    params = pipeline_dp.AggregateParams(
        metrics=[pipeline_dp.Metrics.COUNT, pipeline_dp.Metrics.SUM, pipeline_dp.Metrics.MEAN],
        noise_kind=pipeline_dp.NoiseKind.LAPLACE,
        max_partitions_contributed=args.max_partitions_contributed,
        max_contributions_per_partition=args.max_contributions_per_partition,
        min_value=args.min_value,
        max_value=args.max_value,
    )
    extractors = pipeline_dp.DataExtractors(
        privacy_id_extractor=itemgetter(0),
        partition_extractor=itemgetter(1),
        value_extractor=itemgetter(2),
    )
    # A Python list: DPEngine tests `if public_partitions:`, which a numpy array refuses.
    result = engine.aggregate(
        rows, params, extractors, public_partitions=list(range(args.partitions))
    )
    accountant.compute_budgets()  # before any action: the RDD is lazy
    released = result.collect()
    mark(f"result collected ({len(released)} partitions)")

    frame = pd.DataFrame(
        {
            args.partition_key: [key for key, _ in released],
            "count": [metrics.count for _, metrics in released],
            "sum": [metrics.sum for _, metrics in released],
            "mean": [metrics.mean for _, metrics in released],
        }
    )
    frame.to_parquet(args.output, index=False)
    mark("output written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
