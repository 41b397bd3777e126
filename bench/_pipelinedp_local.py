"""PipelineDP's DPEngine on LocalBackend: the reference program timed by bench.local_engine.

    python -m bench._pipelinedp_local --input bench/data/rows_5M --output /tmp/pdp.parquet

What a PipelineDP user writes without a cluster: the daily Parquet files read with pyarrow into
(customer, terminal, amount) tuples, `DPEngine.aggregate` on `LocalBackend` with public
partitions, `compute_budgets()`, the lazy result materialised with `list`, and written with
pandas so that the work is really done. The defaults are the benchmark's parameters.

Progress markers go to stderr. This file imports only pyarrow, pandas, pipeline_dp and
bench._programs (standard library only), nothing of the benchmark.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pandas as pd
import pyarrow.dataset as pads

from bench._programs import add_job_flags, dp_aggregate, mark, program_parser, quiet_gcp_warning

quiet_gcp_warning()  # pipeline_dp imports apache_beam when installed

import pipeline_dp  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    parser = program_parser(
        "python -m bench._pipelinedp_local", "Parquet file to write the released rows to"
    )
    add_job_flags(parser)
    args = parser.parse_args(argv)
    columns = [args.privacy_unit, args.partition_key, args.value]
    # Partitioning "hive" reads the date=… folders as the Spark and Beam programs do.
    table = pads.dataset(args.input, format="parquet", partitioning="hive").to_table(
        columns=columns
    )
    rows = list(zip(*(table.column(c).to_pylist() for c in columns), strict=True))
    del table
    mark(f"rows read ({len(rows):,})")
    released = list(dp_aggregate(pipeline_dp, pipeline_dp.LocalBackend(), rows, args))
    mark(f"result computed ({len(released)} partitions)")
    pd.DataFrame(
        {
            args.partition_key: [key for key, _ in released],
            "count": [metrics.count for _, metrics in released],
            "sum": [metrics.sum for _, metrics in released],
            "mean": [metrics.mean for _, metrics in released],
        }
    ).to_parquet(args.output, index=False)
    mark("output written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
