"""Beam engine vs PipelineDP BeamBackend vs a non-private Beam pipeline, on the same data.

Why: the Beam engine moves batches (Parquet row groups, shards) through the runner and does the
per-row work with numpy and Polars inside DoFns, where PipelineDP's BeamBackend sends every row
through the runner, several times (the issue's target: at least 3x faster than PipelineDP at 1M
rows). This benchmark times, in one run, on the local benchmark's generated Parquet files, all on
Beam's DirectRunner:

1. `python -m dppipeline run --engine beam …`: ours, DirectRunner in its default in_memory mode;
2. the same with `--direct_running_mode=multi_processing --direct_num_workers=2` (Beam pipeline
   options, passed through by `dppipeline run`): ours on two SDK worker processes;
3. `python -m bench._pipelinedp_beam …`: PipelineDP's `DPEngine` on `BeamBackend` with the same
   parameters, reading the same files with `beam.io.ReadFromParquet`: the reference;
4. `python -m bench._beam_baseline …`: `ReadFromParquet` -> (terminal, amount) ->
   `CombinePerKey` (count, sum, mean) -> `WriteToParquet`: the non-private floor.

Each program is its own process, timed from start to exit (what a user waits for: imports,
pipeline construction, read, work, write), with the peak resident memory of its whole process
tree (the sum of RSS, sampled every 0.1 s with psutil; with multi_processing, the SDK workers
too). The measuring machinery (disturbance detection, retries, memory sampling, phases) is
`bench.spark_engine`'s, the report's `bench._report`'s. Run with `make bench` or
`python -m bench.beam_engine [--sizes 1M,5M] [--repeat N] [--repeat-pipelinedp N]
[--skip-pipelinedp]`. Results go to stdout and to `bench/results/beam_engine.{md,json}`; progress
to stderr; each program's output, with arrival times, to `bench/data/beam_logs/`.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from bench._report import (
    ProcessReport,
    bench_parser,
    machine_facts_with,
    parse_bench_args,
    start_args,
)
from bench.local_engine import (
    DATA_DIR,
    KEY,
    N_TERMINALS,
    SIZES,
    VALUE,
    Dataset,
    Table,
    _fmt_number,
    _fmt_ratio,
    _ratio,
    build_job_spec,
    ensure_dataset,
    progress,
    write_public_keys,
)
from bench.spark_engine import (
    IDLE_CORES,
    SAMPLE_INTERVAL_S,
    ProgramError,
    Timing,
    _z,
    bounded_reference,
    log_stem,
    mean_count,
    ours_command,
    pipelinedp_command,
    run_timed,
    shown,
    untimed,
    warm_page_cache,
)

LOG_DIR = DATA_DIR / "beam_logs"
# Ours records each release in a budget ledger and returns an already published release without
# recomputing it: the benchmark keeps its own ledger and asks for a new release every run.
LEDGER = DATA_DIR / "beam_ledger.sqlite"

PIPELINEDP_TARGET = 3.0  # the issue's target: PipelineDP / ours at least this ...
TARGET_SIZES = ("1M",)  # ... at these sizes
MULTI_PROCESS_OPTIONS = ("--direct_running_mode=multi_processing", "--direct_num_workers=2")

OURS = "dppipeline beam"
OURS_2P = "dppipeline beam (2 processes)"
PIPELINEDP = "PipelineDP BeamBackend"
BASELINE = "Beam CombinePerKey (non-private)"
PROGRAMS = (OURS, OURS_2P, PIPELINEDP, BASELINE)  # table order
PACKAGES = ("apache-beam", "pipeline-dp", "python-dp", "polars", "pyarrow", "numpy", "pandas")

# Output lines that mark the end of each phase: "ready" when the pipeline is built and about to
# run (ours: the engine's `Beam 2.x on DirectRunner` line, after planning), "done" when the
# output is written (ours: the `released` line, after the manifest and the atomic publish).
# PipelineDP's program marks only the end of its pipeline.
_OURS_MARKERS = {
    "ready": re.compile(r"^\[beam\]\s+[\d.]+s Beam \S+ on "),
    "done": re.compile(r"^\[beam\] release written to "),
}
MARKERS: dict[str, dict[str, re.Pattern[str]]] = {
    OURS: _OURS_MARKERS,
    OURS_2P: _OURS_MARKERS,
    PIPELINEDP: {"done": re.compile(r"^bench-marker: pipeline finished")},
    BASELINE: {
        "ready": re.compile(r"^bench-marker: pipeline built"),
        "done": re.compile(r"^bench-marker: pipeline finished"),
    },
}


# ---------------------------------------------------------------------------------------------
# Commands


def outputs(data: Dataset) -> dict[str, Path]:
    """Program -> the folder it writes (ours: the release; its table is in <folder>/<job name>)."""
    return {
        OURS: DATA_DIR / f"beam_release_{data.label}",
        OURS_2P: DATA_DIR / f"beam_release_{data.label}_2proc",
        PIPELINEDP: DATA_DIR / f"beam_pipelinedp_{data.label}",
        BASELINE: DATA_DIR / f"beam_baseline_{data.label}",
    }


def commands(data: Dataset, keys: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Program -> (argv, extra environment). Every program runs this interpreter from the project
    root; ours is invoked with the same flags as in bench.spark_engine."""
    python, out = sys.executable, outputs(data)
    pipelinedp = pipelinedp_command("bench._pipelinedp_beam", data, out[PIPELINEDP])
    baseline = [
        *(python, "-m", "bench._beam_baseline"),
        *("--input", str(data.folder), "--output", str(out[BASELINE])),
        *("--partition-key", KEY, "--value", VALUE),
    ]
    return {
        OURS: (ours_command("beam", data, keys, out[OURS], LEDGER), {}),
        OURS_2P: (
            ours_command("beam", data, keys, out[OURS_2P], LEDGER, *MULTI_PROCESS_OPTIONS),
            {},
        ),
        PIPELINEDP: (pipelinedp, {}),
        BASELINE: (baseline, {}),
    }


# ---------------------------------------------------------------------------------------------
# Timing


@dataclass
class BeamTiming(Timing):
    """bench.spark_engine's Timing (median, peak memory, discarded runs), plus the best run and
    the error of a program that failed (it is then not run again at that size)."""

    failure: str | None = None

    @property
    def best(self) -> float:
        return min(r.seconds for r in self.runs)


def _clear_shards(program: str, output: Path) -> Callable[[], None] | None:
    """Before each run of a program writing with Beam's sinks: removes its output folder (they
    name shards part-NNNNN-of-MMMMM: a previous run's shards could remain)."""
    if program not in (PIPELINEDP, BASELINE):
        return None
    return lambda: shutil.rmtree(output, ignore_errors=True)


def bench_size(label: str, keys: Path, args: argparse.Namespace, report: Report) -> None:
    """All programs on one size, interleaved per round; PipelineDP last in each round."""
    data = ensure_dataset(label, SIZES[label])
    warm_page_cache(data)
    cmds, out = commands(data, keys), outputs(data)
    timings = {p: BeamTiming(label, data.rows, p, shown(*cmds[p])) for p in PROGRAMS}
    repeats = {OURS: args.repeat, OURS_2P: args.repeat, BASELINE: args.repeat}
    repeats[PIPELINEDP] = 0 if args.skip_pipelinedp else args.repeat_pipelinedp
    for i in range(max(repeats.values())):
        for program in (OURS, OURS_2P, BASELINE, PIPELINEDP):
            timing = timings[program]
            if i >= repeats[program] or timing.failure is not None:
                continue
            argv, env = cmds[program]
            what = f"{label}: {program} run {i + 1}/{repeats[program]}"
            log = log_stem(LOG_DIR, label, program, i)
            try:
                run_timed(
                    argv,
                    env,
                    what,
                    log,
                    MARKERS[program],
                    args,
                    timing,
                    prepare=_clear_shards(program, out[program]),
                    seconds_format=".2f",
                )
            except ProgramError as exc:
                timing.failure = str(exc)
                progress(f"error: {exc}")
    report.timings.extend(timings[p] for p in PROGRAMS if timings[p].runs or timings[p].failure)

    progress(f"{label}: reading the outputs back; bounded reference on the local engine")
    name = build_job_spec(data, keys).name

    def released(program: str) -> tuple[float | None, int | None]:
        timing = timings[program]
        if not timing.runs or timing.failure is not None:
            return None, None
        path = out[program] / name if program in (OURS, OURS_2P) else out[program]
        try:
            return mean_count(path)
        except (OSError, KeyError, ValueError) as exc:
            progress(f"{label}: cannot read {path} back ({type(exc).__name__}: {exc})")
            return None, None

    bounded, noise_se = bounded_reference(data, keys)
    means = {p: released(p) for p in (OURS, OURS_2P, PIPELINEDP)}
    raw = None
    if timings[BASELINE].runs and timings[BASELINE].failure is None:
        raw = float(pd.read_parquet(out[BASELINE])["count"].sum()) / N_TERMINALS
    report.sanity.append(
        {
            "label": label,
            "rows": data.rows,
            "ours_mean_count": means[OURS][0],
            "ours_2proc_mean_count": means[OURS_2P][0],
            "pipelinedp_mean_count": means[PIPELINEDP][0],
            "bounded_exact_mean_count": bounded,
            "noise_standard_error_of_mean_count": noise_se,
            "ours_z": _z(means[OURS][0], bounded, noise_se),
            "ours_2proc_z": _z(means[OURS_2P][0], bounded, noise_se),
            "pipelinedp_z": _z(means[PIPELINEDP][0], bounded, noise_se),
            "baseline_raw_mean_count": raw,
            "ours_partitions": means[OURS][1],
            "ours_2proc_partitions": means[OURS_2P][1],
            "pipelinedp_partitions": means[PIPELINEDP][1],
        }
    )
    print(
        f"sanity {label}: mean released count per terminal: ours "
        f"{_fmt_number(means[OURS][0], ',.1f')}, ours (2 processes) "
        f"{_fmt_number(means[OURS_2P][0], ',.1f')}, PipelineDP "
        f"{_fmt_number(means[PIPELINEDP][0], ',.1f')} (bounded before noise "
        f"{_fmt_number(bounded, ',.1f')}, noise s.e. {_fmt_number(noise_se, ',.1f')}; raw "
        f"{_fmt_number(raw, ',.1f')})",
        flush=True,
    )


def warm_up(keys: Path, label: str) -> None:
    """One untimed baseline process: apache_beam's modules into the OS page cache."""
    data = ensure_dataset(label, SIZES[label])
    shutil.rmtree(outputs(data)[BASELINE], ignore_errors=True)
    untimed(commands(data, keys)[BASELINE], BASELINE, label, LOG_DIR, MARKERS[BASELINE])


# ---------------------------------------------------------------------------------------------
# Reporting (the shared parts: bench._report)


def beam_machine_facts() -> dict[str, Any]:
    facts = machine_facts_with(PACKAGES, unused=("duckdb",))  # the local benchmark's
    facts["beam_runner"] = "DirectRunner (in_memory; ours also multi_processing, 2 workers)"
    return facts


def _target_text(label: str, ratio: float | None) -> str:
    if label not in TARGET_SIZES or ratio is None:
        return "-"
    return "met" if ratio >= PIPELINEDP_TARGET else f"missed ({ratio:.1f}x)"


def _run_cells(t: BeamTiming) -> list[str]:
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
    DAYS = SIZES
    PHASES = (
        "start = process start to pipeline built (ours: after planning; PipelineDP: not "
        "marked); work = running the pipeline (read, compute, write; ours: also the manifest "
        "and the publish)"
    )

    def ratios(self) -> list[dict[str, Any]]:
        out = []
        for label in self.labels():
            ours, ours2, pdp, floor = (self.median(label, p) for p in PROGRAMS)
            ours_t, floor_t = self.timing(label, OURS), self.timing(label, BASELINE)
            pdp_over_ours = _ratio(pdp, ours)
            out.append(
                {
                    "label": label,
                    "rows": next(t.rows for t in self.timings if t.label == label),
                    "pipelinedp_over_ours": pdp_over_ours,
                    "target": PIPELINEDP_TARGET if label in TARGET_SIZES else None,
                    "target_verdict": _target_text(label, pdp_over_ours),
                    "pipelinedp_over_ours_2proc": _ratio(pdp, ours2),
                    "ours_over_baseline": _ratio(ours, floor),
                    "ours_2proc_over_baseline": _ratio(ours2, floor),
                    "ours_peak_over_baseline_peak": _ratio(
                        ours_t.peak_mb if ours_t else None, floor_t.peak_mb if floor_t else None
                    ),
                }
            )
        return out

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

    def ratio_table(self) -> Table:
        rows = [
            [
                f"{r['rows']:,}",
                _fmt_ratio(r["pipelinedp_over_ours"]),
                r["target_verdict"],
                _fmt_ratio(r["pipelinedp_over_ours_2proc"]),
                _fmt_number(r["ours_over_baseline"], ".2f") + "x",
                _fmt_number(r["ours_2proc_over_baseline"], ".2f") + "x",
                _fmt_ratio(r["ours_peak_over_baseline_peak"]),
            ]
            for r in self.ratios()
        ]
        headers = ["rows", "PipelineDP / ours", "target", "PipelineDP / ours (2 proc)"]
        headers += ["ours / baseline", "ours (2 proc) / baseline", "ours / baseline MB"]
        return (
            "Ratios (median seconds; the issue's target: PipelineDP / ours >= "
            f"{PIPELINEDP_TARGET:g}x at {', '.join(TARGET_SIZES)})",
            headers,
            rows,
        )

    def sanity_table(self) -> Table:
        rows = [
            [
                f"{s['rows']:,}",
                _fmt_number(s["ours_mean_count"], ",.1f"),
                _fmt_number(s["ours_2proc_mean_count"], ",.1f"),
                _fmt_number(s["pipelinedp_mean_count"], ",.1f"),
                _fmt_number(s["bounded_exact_mean_count"], ",.1f"),
                _fmt_number(s["noise_standard_error_of_mean_count"], ",.1f"),
                _fmt_number(s["ours_z"], "+.1f"),
                _fmt_number(s["ours_2proc_z"], "+.1f"),
                _fmt_number(s["pipelinedp_z"], "+.1f"),
                _fmt_number(s["baseline_raw_mean_count"], ",.1f"),
                _fmt_number(s["ours_partitions"], ",d"),
                _fmt_number(s["pipelinedp_partitions"], ",d"),
            ]
            for s in self.sanity
        ]
        headers = ["rows", "ours", "ours (2 proc)", "PipelineDP", "bounded, before noise"]
        headers += ["noise s.e.", "ours z", "ours (2 proc) z", "PDP z", "baseline raw"]
        headers += ["ours partitions", "PDP partitions"]
        return (
            "Sanity check (not timed): mean released count per terminal (last run); bounded "
            "= local engine's exact bounded mean before noise; z = (released - bounded) / "
            "noise s.e., expect |z| < 3",
            headers,
            rows,
        )

    def other_tables(self) -> list[Table]:
        failures = [
            [f"{t.rows:,}", t.program, (t.failure or "").splitlines()[0]]
            for t in self.timings
            if t.failure
        ]
        title = "Failed programs (see the log named in the message)"
        return [(title, ["rows", "program", "error"], failures)]

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

    def timing_figures(self, t: BeamTiming) -> dict[str, Any]:
        return {
            "best_s": t.best if t.runs else None,
            "median_s": t.median if t.runs else None,
            "peak_mb": t.peak_mb if t.runs else None,
            "largest_process_mb": t.largest_mb if t.runs else None,
            "failure": t.failure,
        }

    def commands_section(self) -> list[str]:
        first = self.timings[0].label if self.timings else None
        lines = [f"## Commands ({first} shown)", ""]
        return lines + [f"- {t.program}: `{t.command}`" for t in self.timings if t.label == first]


# ---------------------------------------------------------------------------------------------
# Main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = bench_parser(
        "python -m bench.beam_engine",
        "Time the Beam engine against PipelineDP BeamBackend and a non-private Beam pipeline, "
        "each as its own process on the DirectRunner.",
        SIZES,
        default_sizes=["1M"],
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
    return parse_bench_args(parser, argv, SIZES, IDLE_CORES, ("repeat", "repeat_pipelinedp"))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = Report(
        args=start_args(
            args,
            "python -m bench.beam_engine",
            argv,
            IDLE_CORES,
            repeat_pipelinedp=0 if args.skip_pipelinedp else args.repeat_pipelinedp,
        ),
        machine=beam_machine_facts(),
    )
    keys = write_public_keys()
    started = time.perf_counter()
    try:
        warm_up(keys, args.sizes[0])
    except ProgramError as exc:  # the baseline cannot run: nothing else will
        print(f"bench.beam_engine: error: {exc}", file=sys.stderr)
        return 1
    for label in args.sizes:
        bench_size(label, keys, args, report)
    report.finish(started)
    failed = [f"{t.label} {t.program}" for t in report.timings if t.failure]
    if failed:
        print(f"bench.beam_engine: error: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
