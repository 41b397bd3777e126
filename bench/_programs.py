"""What the programs timed against ours share (bench._pipelinedp_spark, bench._pipelinedp_beam,
bench._beam_baseline): the progress markers, the log filter and the command line flags.

Standard library only, like the modules those programs import anyway: importing this costs them
nothing measurable, and nothing of the benchmark (pandas, duckdb, dppipeline) is charged to them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from operator import itemgetter
from typing import Any


def quiet_gcp_warning() -> None:
    """apache_beam (which pipeline_dp imports when installed) logs a GCP warning on the root
    logger when imported without its GCP extras: call before importing either."""
    logging.getLogger().addFilter(lambda record: "apitools" not in record.getMessage())


def mark(text: str) -> None:
    """A progress marker on stderr; the benchmark timestamps it on arrival."""
    print(f"bench-marker: {text}", file=sys.stderr, flush=True)


def program_parser(prog: str, output_help: str) -> argparse.ArgumentParser:
    """A parser with the flags every program takes: --input and --output."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--input", required=True, help="Parquet folder (daily date=… subfolders)")
    parser.add_argument("--output", required=True, help=output_help)
    return parser


def add_job_flags(parser: argparse.ArgumentParser) -> None:
    """The job's flags, for PipelineDP's programs; the defaults are the benchmark's parameters
    (the benchmarks pass them explicitly; bench.local_engine uses the defaults)."""
    add = parser.add_argument
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


def dp_aggregate(pipeline_dp: Any, backend: Any, rows: Any, args: argparse.Namespace) -> Any:
    """PipelineDP's `DPEngine.aggregate` of the job on `backend` (count, sum and mean, Laplace,
    public partitions 0..N-1) over (privacy unit, partition, value) tuples, with the budget
    computed: the released result, lazy on Spark and Beam. `pipeline_dp` is passed in so that
    this module stays standard library only."""
    accountant = pipeline_dp.NaiveBudgetAccountant(
        total_epsilon=args.epsilon, total_delta=args.delta
    )
    engine = pipeline_dp.DPEngine(accountant, backend)
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
    partitions = list(range(args.partitions))
    result = engine.aggregate(rows, params, extractors, public_partitions=partitions)
    accountant.compute_budgets()  # before any action: Spark's and Beam's results are lazy
    return result
