"""PipelineDP's DPEngine on BeamBackend: the reference program timed by bench.beam_engine.

    python -m bench._pipelinedp_beam --input bench/data/rows_1M --output /tmp/pdp_beam

What a PipelineDP Beam user writes: a Beam pipeline (DirectRunner unless told otherwise) that
reads the daily Parquet files with `beam.io.ReadFromParquet`, maps each row to a
(customer, terminal, amount) tuple, runs `DPEngine.aggregate` with public partitions on
`BeamBackend`, and writes the released rows with `beam.io.WriteToParquet`. The defaults are
the benchmark's parameters; `bench.beam_engine` passes them explicitly. Arguments this program
does not know are Beam pipeline options (`--direct_num_workers=2`, ...).

Progress markers go to stderr. This file imports only apache_beam, pipeline_dp, pyarrow and
bench._programs (standard library only), nothing of the benchmark, whose imports would be charged
to it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import pyarrow as pa

from bench._programs import add_job_flags, dp_aggregate, mark, program_parser, quiet_gcp_warning

quiet_gcp_warning()  # pipeline_dp imports apache_beam

import apache_beam as beam  # noqa: E402
import pipeline_dp  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = program_parser(
        "python -m bench._pipelinedp_beam", "folder to write the released rows to"
    )
    add_job_flags(parser)
    return parser.parse_known_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args, beam_args = parse_args(argv)
    columns = [args.privacy_unit, args.partition_key, args.value]
    schema = pa.schema(
        [
            (args.partition_key, pa.int64()),
            ("count", pa.float64()),
            ("sum", pa.float64()),
            ("mean", pa.float64()),
        ]
    )
    pattern = f"{args.input}/date=*/*.parquet"
    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        rows = (
            pipeline
            | "Read" >> beam.io.ReadFromParquet(pattern, columns=columns)
            | "ToTuples" >> beam.Map(lambda row: tuple(row[c] for c in columns))
        )
        released = dp_aggregate(pipeline_dp, pipeline_dp.BeamBackend(), rows, args)
        _ = (
            released
            | "ToDicts"
            >> beam.Map(
                lambda kv: {
                    args.partition_key: kv[0],
                    "count": kv[1].count,
                    "sum": kv[1].sum,
                    "mean": kv[1].mean,
                }
            )
            | "Write"
            >> beam.io.WriteToParquet(f"{args.output}/part", schema, file_name_suffix=".parquet")
        )
    mark("pipeline finished")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
