"""A non-private Beam pipeline: the floor timed by bench.beam_engine.

    python -m bench._beam_baseline --input bench/data/rows_1M --output /tmp/beam_baseline

What a plain Beam user writes for the same per-terminal aggregates, with no bounding and no
noise: a Beam pipeline (DirectRunner unless told otherwise) that reads the daily Parquet files
with `beam.io.ReadFromParquet` (the two columns needed), maps each row to a (terminal, amount)
pair, computes count, sum and mean per terminal with one `CombinePerKey` of a tuple combiner
(`CountCombineFn`, `sum`, `MeanCombineFn`: lifted, so it combines before the shuffle), and
writes them with `beam.io.WriteToParquet`. Arguments this program does not know are Beam
pipeline options (`--direct_num_workers=2`, ...).

Progress markers go to stderr. This file imports only apache_beam, pyarrow and bench._programs
(standard library only), nothing of the benchmark, whose imports would be charged to it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import pyarrow as pa

from bench._programs import mark, program_parser, quiet_gcp_warning

quiet_gcp_warning()

import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = program_parser(
        "python -m bench._beam_baseline", "folder to write the per-key aggregates to"
    )
    parser.add_argument("--partition-key", default="TERMINAL_ID")
    parser.add_argument("--value", default="TX_AMOUNT")
    return parser.parse_known_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args, beam_args = parse_args(argv)
    key, value = args.partition_key, args.value
    schema = pa.schema(
        [
            (key, pa.int64()),
            ("count", pa.int64()),
            ("sum", pa.float64()),
            ("mean", pa.float64()),
        ]
    )
    pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
    _ = (
        pipeline
        | "Read" >> beam.io.ReadFromParquet(f"{args.input}/date=*/*.parquet", columns=[key, value])
        | "ToPairs" >> beam.Map(lambda row: (row[key], row[value]))
        | "CountSumMean"
        >> beam.CombinePerKey(
            beam.combiners.SingleInputTupleCombineFn(
                beam.combiners.CountCombineFn(), sum, beam.combiners.MeanCombineFn()
            )
        )
        | "ToDicts"
        >> beam.MapTuple(lambda k, agg: {key: k, "count": agg[0], "sum": agg[1], "mean": agg[2]})
        | "Write"
        >> beam.io.WriteToParquet(f"{args.output}/part", schema, file_name_suffix=".parquet")
    )
    mark("pipeline built")
    pipeline.run().wait_until_finish()
    mark("pipeline finished")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
