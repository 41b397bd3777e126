"""What the programs timed against ours share (bench._pipelinedp_spark, bench._pipelinedp_beam,
bench._beam_baseline): the progress markers, the log filter and the command line flags.

Standard library only, like the modules those programs import anyway: importing this costs them
nothing measurable, and nothing of the benchmark (pandas, duckdb, dppipeline) is charged to them.
"""

from __future__ import annotations

import argparse
import logging
import sys


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
    (it passes them explicitly)."""
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
