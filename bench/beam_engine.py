"""Beam engine vs PipelineDP BeamBackend vs a non-private Beam pipeline, on the same data.

Four programs, each its own process on Beam's DirectRunner (bench._harness measures wall time
from start to exit and the memory of the whole process tree): `python -m dppipeline run --engine
beam` (ours), the same on two SDK worker processes, `python -m bench._pipelinedp_beam`
(PipelineDP's DPEngine on BeamBackend, the reference; the issue's target: at least 5x slower
than ours at 1M and 5M rows) and `python -m bench._beam_baseline` (CombinePerKey, the non-private
floor). What is measured and why: bench/README.md. Run with `make bench` or
`python -m bench.beam_engine [--sizes 1M,5M] [--repeat N] [--repeat-pipelinedp N]
[--skip-pipelinedp]`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._harness import (
    DATA_DIR,
    KEY,
    SAMPLE_INTERVAL_S,
    VALUE,
    Dataset,
    Program,
    Timing,
    bank_job_command,
    bench_ledger,
    build_job_spec,
    ours_command,
    pipelinedp_command,
    run_benchmark,
)
from bench._report import (
    ProcessReport,
    Table,
    machine_facts,
    parse_bench_args,
    sanity_table,
    start_args,
)

LOG_DIR = DATA_DIR / "beam_logs"
SIZES = ("1M", "5M")
PIPELINEDP_TARGET = 5.0  # the target: PipelineDP / ours at least this ...
TARGET_SIZES = ("1M", "5M")  # ... at these sizes
MULTI_PROCESS_OPTIONS = ("--direct_running_mode=multi_processing", "--direct_num_workers=2")

OURS = "dppipeline beam"  # the job's default: scaled Linf bounding (count, sum, mean)
SAMPLED = "dppipeline beam, linf_bounding: sample"
BANK = "dppipeline beam, bank job (10 queries)"
OURS_2P = "dppipeline beam (2 processes)"
PIPELINEDP = "PipelineDP BeamBackend"
BASELINE = "Beam CombinePerKey (non-private)"
PACKAGES = ("pipeline-dp", "python-dp", "polars", "pyarrow", "numpy", "pandas", "apache-beam")

# Output lines that end each phase: "ready" when the pipeline is built and about to run (ours:
# the engine's `Beam 2.x on DirectRunner` line, after planning), "done" when the output is
# written (ours: after the manifest and the atomic publish). PipelineDP marks only the end.
OURS_MARKERS = {
    "ready": re.compile(r"^\[beam\]\s+[\d.]+s Beam \S+ on "),
    "done": re.compile(r"^\[beam\] release written to "),
}
PIPELINEDP_MARKERS = {"done": re.compile(r"^bench-marker: pipeline finished")}
BASELINE_MARKERS = {
    "ready": re.compile(r"^bench-marker: pipeline built"),
    "done": re.compile(r"^bench-marker: pipeline finished"),
}


def programs(data: Dataset, keys: Path, args: argparse.Namespace) -> dict[str, Program]:
    """The contenders in run order (PipelineDP last, when not skipped), each running this
    interpreter from the project root; ours with the same flags as in bench.spark_engine."""
    label, repeat, name = data.label, args.repeat, build_job_spec(data, keys).name
    ours_out = DATA_DIR / f"beam_release_{label}"
    sampled_out = DATA_DIR / f"beam_sampled_{label}"
    book = bench_ledger("beam", label)
    ours_2p_out = DATA_DIR / f"beam_release_{label}_2proc"
    pdp_out = DATA_DIR / f"beam_pipelinedp_{label}"
    baseline_out = DATA_DIR / f"beam_baseline_{label}"
    baseline = [
        *(sys.executable, "-m", "bench._beam_baseline"),
        *("--input", str(data.folder), "--output", str(baseline_out)),
        *("--partition-key", KEY, "--value", VALUE),
    ]
    found = {
        OURS: Program(
            OURS,
            ours_command("beam", data, keys, ours_out, book),
            {},
            OURS_MARKERS,
            ours_out / name,
            repeat,
        ),
        SAMPLED: Program(
            SAMPLED,
            ours_command("beam", data, keys, sampled_out, book, "--linf-bounding", "sample"),
            {},
            OURS_MARKERS,
            sampled_out / name,
            repeat,
        ),
        BANK: Program(
            BANK,
            bank_job_command("beam", data, DATA_DIR / f"beam_bank_{label}", book),
            {},
            OURS_MARKERS,
            DATA_DIR / f"beam_bank_{label}" / "mean_ticket_per_terminal",
            repeat,
        ),
        OURS_2P: Program(
            OURS_2P,
            ours_command("beam", data, keys, ours_2p_out, book, *MULTI_PROCESS_OPTIONS),
            {},
            OURS_MARKERS,
            ours_2p_out / name,
            repeat,
        ),
        BASELINE: Program(
            BASELINE, baseline, {}, BASELINE_MARKERS, baseline_out, repeat, clear_output=True
        ),
        PIPELINEDP: Program(
            PIPELINEDP,
            pipelinedp_command("bench._pipelinedp_beam", data, pdp_out),
            {},
            PIPELINEDP_MARKERS,
            pdp_out,
            args.repeat_pipelinedp,
            clear_output=True,
        ),
    }
    if args.skip_pipelinedp:
        del found[PIPELINEDP]
    return found


# The programs whose released counts the sanity check reads back: JSON prefix -> (program, name).
RELEASED = {
    "ours": (OURS, "ours"),
    "sampled": (SAMPLED, "ours, sampled"),
    "ours_2proc": (OURS_2P, "ours (2 processes)"),
    "pipelinedp": (PIPELINEDP, "PipelineDP"),
}


def _run_cells(t: Timing) -> list[str]:
    if not t.runs:
        return ["failed", "n/a", "n/a", "-", "n/a", "n/a"]
    return [
        f"best/median of {len(t.runs)}" if len(t.runs) > 1 else "1 run",
        f"{t.best:.2f}",
        f"{t.median:.2f}",
        ", ".join(f"{r.seconds:.2f}{'*' if r.disturbed else ''}" for r in t.runs),
        f"{t.peak_mb:,.0f}",
        f"{t.largest_mb:,.0f}",
    ]


class Report(ProcessReport):
    NAME = "beam_engine"
    TITLE = "Beam engine benchmark"
    PHASES = (
        "start = process start to pipeline built (ours: after planning; PipelineDP: not "
        "marked); work = running the pipeline (read, compute, write; ours: also the manifest "
        "and the publish)"
    )
    PROGRAMS = (OURS, SAMPLED, BANK, OURS_2P, PIPELINEDP, BASELINE)
    RATIOS = (
        ("pipelinedp_over_ours", "PipelineDP / ours", PIPELINEDP, OURS, ".1f", "median"),
        ("sampled_over_ours", "sampled / scaled (default)", SAMPLED, OURS, ".2f", "median"),
        ("bank_over_ours", "10 queries / 1", BANK, OURS, ".2f", "median"),
        (
            "pipelinedp_over_ours_2proc",
            "PipelineDP / ours (2 proc)",
            PIPELINEDP,
            OURS_2P,
            ".1f",
            "median",
        ),
        ("ours_over_baseline", "ours / baseline", OURS, BASELINE, ".2f", "median"),
        (
            "ours_2proc_over_baseline",
            "ours (2 proc) / baseline",
            OURS_2P,
            BASELINE,
            ".2f",
            "median",
        ),
        ("ours_peak_over_baseline_peak", "ours / baseline MB", OURS, BASELINE, ".1f", "peak"),
    )
    RATIO_TITLE = (
        "Ratios (median seconds; the issue's target: PipelineDP / ours >= "
        f"{PIPELINEDP_TARGET:g}x at {', '.join(TARGET_SIZES)})"
    )

    def target(self, label: str, first: float | None) -> tuple[float | None, str]:
        if label not in TARGET_SIZES:
            return None, "-"
        if first is None:
            return PIPELINEDP_TARGET, "-"
        return PIPELINEDP_TARGET, "met" if first >= PIPELINEDP_TARGET else f"missed ({first:.1f}x)"

    def timing_tables(self) -> list[Table]:
        headers = ["program", "runs", "best s", "median s", "all runs (s)"]
        headers += ["peak MB (tree)", "largest process MB"]
        tables = []
        for label in self.labels():
            rows = [t for t in self.timings if t.label == label]
            title = (
                f"{label} ({rows[0].rows:,} rows): wall time of each process, start to exit "
                "(seconds), and peak memory (MB)"
            )
            tables.append((title, headers, [[t.program, *_run_cells(t)] for t in rows]))
        return tables

    def sanity_tables(self) -> list[Table]:
        title = (
            "Sanity check (not timed): mean released count per terminal (last run); bounded "
            "= local engine's exact bounded mean before noise; z = (released - bounded) / "
            "noise s.e., expect |z| < 3"
        )
        released = [
            ("ours", "ours", "ours z"),
            ("sampled", "ours, sampled", "sampled z"),
            ("ours_2proc", "ours (2 proc)", "ours (2 proc) z"),
            ("pipelinedp", "PipelineDP", "PDP z"),
        ]
        partitions = [("ours", "ours partitions"), ("pipelinedp", "PDP partitions")]
        raw = ("baseline_raw_mean_count", "baseline raw")
        return [sanity_table(title, self.sanity, released, raw, partitions)]

    def how_run(self) -> list[str]:
        return [
            "Each program is its own process on Beam's DirectRunner (in_memory; '2 processes': "
            f"{' '.join(MULTI_PROCESS_OPTIONS)}); seconds are wall time from process start to "
            "exit (imports, pipeline construction, read, compute, write), best and median of "
            f"{self.args['repeat']} run(s) ({self.args['repeat_pipelinedp']} for PipelineDP) "
            "after one untimed warm-up process.",
            "Peak MB: the highest sum of RSS over the process tree (with multi_processing, the "
            f"SDK workers too), sampled every {SAMPLE_INTERVAL_S:g} s; shared pages count once "
            "per process. Largest process MB: the most any one process held.",
        ]

    def engine_parameters(self) -> dict[str, Any]:
        return {"beam_runner": "DirectRunner", "multi_process_options": list(MULTI_PROCESS_OPTIONS)}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.beam_engine",
        description="Time the Beam engine against PipelineDP BeamBackend and a non-private Beam "
        "pipeline, each as its own process on the DirectRunner.",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of ours and of the baseline per size (best and median reported; default 3)",
    )
    parser.add_argument(
        "--repeat-pipelinedp", type=int, default=1, help="runs of PipelineDP per size (default 1)"
    )
    repeats = ("repeat", "repeat_pipelinedp")
    return parse_bench_args(parser, argv, SIZES, default_sizes=["1M"], repeats=repeats)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    machine = machine_facts(PACKAGES)
    machine["beam_runner"] = "DirectRunner (in_memory; ours also multi_processing, 2 workers)"
    report = Report(args=start_args(args, "python -m bench.beam_engine", argv), machine=machine)
    if args.skip_pipelinedp:
        report.args["repeat_pipelinedp"] = 0
    return run_benchmark(report, args, programs, RELEASED, BASELINE, LOG_DIR, ".2f")


if __name__ == "__main__":
    raise SystemExit(main())
