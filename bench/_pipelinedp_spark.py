"""PipelineDP's DPEngine on SparkRDDBackend: the reference program timed by bench.spark_engine.

    python -m bench._pipelinedp_spark --input bench/data/rows_5M --output /tmp/pdp.parquet

What a PipelineDP user writes: a SparkSession, the Parquet folder read with `spark.read.parquet`,
an RDD of (customer, terminal, amount) tuples, `DPEngine.aggregate` with public partitions,
`compute_budgets()`, `collect()`, and the result written with pandas, so that the work is really
done. The defaults are the benchmark's parameters; `bench.spark_engine` passes them explicitly.

Progress markers go to stderr (the benchmark timestamps them on arrival). This file imports only
pyspark, pipeline_dp, pandas and bench._programs (standard library only), nothing of the
benchmark, whose imports would be charged to it.
The session is not stopped explicitly: like `dppipeline run`, the process exits and the JVM
shuts down when its stdin closes.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import pandas as pd

from bench._programs import add_job_flags, dp_aggregate, mark, program_parser, quiet_gcp_warning

quiet_gcp_warning()  # pipeline_dp imports apache_beam when installed

import pipeline_dp  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = program_parser(
        "python -m bench._pipelinedp_spark", "Parquet file to write the released rows to"
    )
    parser.add_argument("--master", default="local[2]")
    add_job_flags(parser)
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
    backend = pipeline_dp.SparkRDDBackend(spark.sparkContext)
    released = dp_aggregate(pipeline_dp, backend, rows, args).collect()
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
