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
tree (the sum of RSS, sampled every 0.1 s from /proc; with multi_processing, the SDK workers
too). The measuring machinery (disturbance detection, retries, memory sampling, phases) is
`bench.spark_engine`'s. Run with `make bench` or `python -m bench.beam_engine [--sizes 1M,5M]
[--repeat N] [--repeat-pipelinedp N] [--skip-pipelinedp]`. Results go to stdout and to
`bench/results/beam_engine.{md,json}`; progress to stderr; each program's output, with arrival
times, to `bench/data/beam_logs/`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bench.local_engine import (
    DATA_DIR,
    DELTA,
    EPSILON,
    KEY,
    L0,
    LINF,
    MAX_VALUE,
    MIN_VALUE,
    N_TERMINALS,
    POPULATION,
    PRIVACY_UNIT,
    RESULTS_DIR,
    SIZES,
    VALUE,
    Dataset,
    _fmt_number,
    _fmt_ratio,
    _quiet_imports,
    _ratio,
    _table_md,
    _table_text,
    build_job_spec,
    ensure_dataset,
    machine_facts,
    progress,
    write_public_keys,
)
from bench.spark_engine import (
    IDLE_CORES,
    SAMPLE_INTERVAL_S,
    ProgramError,
    Timing,
    _run_json,
    _secs,
    _z,
    bounded_reference,
    mean_count,
    measure,
    shown,
    wait_for_idle,
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
    "done": re.compile(r"^\[beam\] released "),
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

    def ours(output: Path, *beam_options: str) -> list[str]:
        return [
            *(python, "-m", "dppipeline", "run", "--engine", "beam"),
            *("--input", str(data.folder), "--format", "parquet", "--output", str(output)),
            *("--privacy-unit", PRIVACY_UNIT, "--partition-key", KEY, "--value", VALUE),
            *("--metrics", "count,sum,mean", "--noise", "laplace"),
            *("--epsilon", f"{EPSILON:g}", "--delta", f"{DELTA:g}"),
            *("--max-partitions-contributed", str(L0)),
            *("--max-contributions-per-partition", str(LINF)),
            *("--min-value", f"{MIN_VALUE:g}", "--max-value", f"{MAX_VALUE:g}"),
            *("--public-partitions", str(keys), "--overwrite"),
            *("--ledger", f"sqlite:///{LEDGER}", "--new-release"),
            *beam_options,
        ]

    pipelinedp = [
        *(python, "-m", "bench._pipelinedp_beam"),
        *("--input", str(data.folder), "--output", str(out[PIPELINEDP])),
        *("--privacy-unit", PRIVACY_UNIT, "--partition-key", KEY, "--value", VALUE),
        *("--partitions", str(N_TERMINALS), "--epsilon", f"{EPSILON:g}", "--delta", f"{DELTA:g}"),
        *("--max-partitions-contributed", str(L0), "--max-contributions-per-partition", str(LINF)),
        *("--min-value", f"{MIN_VALUE:g}", "--max-value", f"{MAX_VALUE:g}"),
    ]
    baseline = [
        *(python, "-m", "bench._beam_baseline"),
        *("--input", str(data.folder), "--output", str(out[BASELINE])),
        *("--partition-key", KEY, "--value", VALUE),
    ]
    return {
        OURS: (ours(out[OURS]), {}),
        OURS_2P: (ours(out[OURS_2P], *MULTI_PROCESS_OPTIONS), {}),
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


def run_program(
    program: str,
    argv: list[str],
    env: dict[str, str],
    what: str,
    log_name: str,
    args: argparse.Namespace,
    timing: BeamTiming,
    output: Path,
) -> None:
    """One timed run, run again (at most --retries times) while others disturbed it; a disturbed
    run kept for lack of retries is marked in the tables."""
    for attempt in range(args.retries + 1):
        if program in (PIPELINEDP, BASELINE):
            # Beam's sinks name shards part-NNNNN-of-MMMMM: a previous run's shards could remain.
            shutil.rmtree(output, ignore_errors=True)
        waited = wait_for_idle(args.idle_wait)
        progress(f"{what}: started (load {os.getloadavg()[0]:.2f})")
        retry = f"_retry{attempt}" if attempt else ""
        run = measure(argv, env, LOG_DIR / f"{log_name}{retry}.log", MARKERS[program], what)
        run.waited_for_idle_s = waited
        progress(
            f"{what}: {run.seconds:.2f} s, peak {run.peak_mb:,.0f} MB, others used "
            f"{run.others_cores:.2f} cores (tree gone {run.tree_gone_s:.1f} s after exit)"
        )
        if not run.disturbed or attempt == args.retries:
            break
        timing.discarded.append(run)
        progress(f"{what}: disturbed by other work: discarded, running it again")
    timing.runs.append(run)


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
            slug = re.sub(r"[^a-z0-9]+", "_", program.lower()).strip("_")
            try:
                run_program(
                    program, argv, env, what, f"{label}_{slug}_{i + 1}", args, timing, out[program]
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
    argv, env = commands(data, keys)[BASELINE]
    shutil.rmtree(outputs(data)[BASELINE], ignore_errors=True)
    progress(f"warm-up: one untimed {BASELINE} process on {label}")
    measure(argv, env, LOG_DIR / "warmup.log", MARKERS[BASELINE], "warm-up")


# ---------------------------------------------------------------------------------------------
# Reporting


def beam_machine_facts() -> dict[str, Any]:
    facts = machine_facts()
    facts.pop("duckdb", None)  # the local benchmark's, unused here
    for package in PACKAGES:
        try:
            facts[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            facts[package] = None
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


@dataclass
class Report:
    args: dict[str, Any]
    machine: dict[str, Any]
    timings: list[BeamTiming] = field(default_factory=list)
    sanity: list[dict[str, Any]] = field(default_factory=list)

    def timing(self, label: str, program: str) -> BeamTiming | None:
        """The program's timing at that size, if it has runs."""
        return next(
            (t for t in self.timings if t.label == label and t.program == program and t.runs),
            None,
        )

    def median(self, label: str, program: str) -> float | None:
        t = self.timing(label, program)
        return None if t is None else t.median

    def ratios(self) -> list[dict[str, Any]]:
        out = []
        for label in dict.fromkeys(t.label for t in self.timings):
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

    def tables(self) -> list[tuple[str, list[str], list[list[str]]]]:
        tables = []
        for label in dict.fromkeys(t.label for t in self.timings):
            rows = [t for t in self.timings if t.label == label]
            tables.append(
                (
                    f"{label} ({rows[0].rows:,} rows): wall time of each process, start to exit "
                    "(seconds), and peak memory (MB)",
                    [
                        "program",
                        "runs",
                        "best s",
                        "median s",
                        "all runs (s)",
                        "peak MB (tree)",
                        "largest process MB",
                    ],
                    [[t.program, *_run_cells(t)] for t in rows],
                )
            )
        ratio_rows = [
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
        phase_rows = []
        for t in self.timings:
            if not t.runs:
                continue
            run = t.median_run()
            phases = run.phases()
            phase_rows.append(
                [
                    f"{t.rows:,}",
                    t.program,
                    _secs(phases["start"]),
                    _secs(phases["work"]),
                    _secs(phases["exit"]),
                    f"{run.seconds:.1f}",
                    f"{run.cpu_s:.1f}",
                    f"{run.others_cpu_s:.1f}",
                    str(len(t.discarded)),
                    f"{run.loadavg_1m:.2f}",
                ]
            )
        sanity_rows = [
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
        failures = [
            [f"{t.rows:,}", t.program, (t.failure or "").splitlines()[0]]
            for t in self.timings
            if t.failure
        ]
        machine_rows = [[k, str(v)] for k, v in self.machine.items()]
        return [
            *tables,
            (
                "Ratios (median seconds; the issue's target: PipelineDP / ours >= "
                f"{PIPELINEDP_TARGET:g}x at {', '.join(TARGET_SIZES)})",
                [
                    "rows",
                    "PipelineDP / ours",
                    "target",
                    "PipelineDP / ours (2 proc)",
                    "ours / baseline",
                    "ours (2 proc) / baseline",
                    "ours / baseline MB",
                ],
                ratio_rows,
            ),
            (
                "Phases of the median run (seconds): start = process start to pipeline built "
                "(ours: after planning; PipelineDP: not marked); work = running the pipeline "
                "(read, compute, write; ours: also the manifest and the publish); exit = output "
                "written to process exit; CPU = CPU seconds of the program's processes; others' "
                "CPU = CPU seconds the rest of the machine used meanwhile (disturbance); "
                "discarded runs = disturbed runs of this program and size that were run again",
                [
                    "rows",
                    "program",
                    "start",
                    "work",
                    "exit",
                    "total",
                    "CPU s",
                    "others' CPU s",
                    "discarded runs",
                    "load at start",
                ],
                phase_rows,
            ),
            (
                "Sanity check (not timed): mean released count per terminal (last run); bounded "
                "= local engine's exact bounded mean before noise; z = (released - bounded) / "
                "noise s.e., expect |z| < 3",
                [
                    "rows",
                    "ours",
                    "ours (2 proc)",
                    "PipelineDP",
                    "bounded, before noise",
                    "noise s.e.",
                    "ours z",
                    "ours (2 proc) z",
                    "PDP z",
                    "baseline raw",
                    "ours partitions",
                    "PDP partitions",
                ],
                sanity_rows,
            ),
            (
                "Failed programs (see the log named in the message)",
                ["rows", "program", "error"],
                failures,
            ),
            ("Machine", ["fact", "value"], machine_rows),
        ]

    def preamble(self) -> list[str]:
        return [
            f"Job: count, sum, mean of {VALUE} per {KEY}, privacy unit {PRIVACY_UNIT}, "
            f"{N_TERMINALS} public partitions, L0={L0}, Linf={LINF}, "
            f"values in [{MIN_VALUE:g}, {MAX_VALUE:g}], epsilon={EPSILON:g}, delta={DELTA:g}, "
            "Laplace.",
            "Each program is its own process on Beam's DirectRunner (in_memory; '2 processes': "
            f"{' '.join(MULTI_PROCESS_OPTIONS)}); seconds are wall time from process start to "
            "exit (imports, pipeline construction, read, compute, write), best and median of "
            f"{self.args['repeat']} run(s) ({self.args['repeat_pipelinedp']} for PipelineDP) "
            "after one untimed warm-up process.",
            "Peak MB: the highest sum of RSS over the process tree (with multi_processing, the "
            f"SDK workers too), sampled every {SAMPLE_INTERVAL_S:g} s; shared pages count once "
            "per process. Largest process MB: the most any one process held.",
            f"A run during which the rest of the machine used more than {IDLE_CORES:g} cores "
            f"on average is disturbed and run again (at most {self.args['retries']} times); "
            "a * marks a disturbed run kept because no retry was left.",
            "The baseline is non-private (no bounding, no noise): a floor, not a competitor.",
        ]

    def text(self) -> str:
        parts = self.preamble()
        for title, headers, rows in self.tables():
            if rows:
                parts += ["", title, _table_text(headers, rows)]
        return "\n".join(parts)

    def markdown(self) -> str:
        parts = [f"# Beam engine benchmark ({self.args['finished_at']})", "", *self.preamble()]
        parts += ["", f"Command: `{self.args['command']}`"]
        for title, headers, rows in self.tables():
            if rows:
                parts += ["", f"## {title}", "", _table_md(headers, rows)]
        first = self.timings[0].label if self.timings else None
        parts += ["", f"## Commands ({first} shown)", ""]
        parts += [f"- {t.program}: `{t.command}`" for t in self.timings if t.label == first]
        return "\n".join(parts) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {
            "args": self.args,
            "machine": self.machine,
            "parameters": {
                "population": POPULATION,
                "days": SIZES,
                "epsilon": EPSILON,
                "delta": DELTA,
                "max_partitions_contributed": L0,
                "max_contributions_per_partition": LINF,
                "min_value": MIN_VALUE,
                "max_value": MAX_VALUE,
                "noise": "laplace",
                "public_partitions": N_TERMINALS,
                "beam_runner": "DirectRunner",
                "multi_process_options": list(MULTI_PROCESS_OPTIONS),
            },
            "note": (
                "seconds: wall time of each process from start to exit; peak_mb: highest sampled "
                "sum of RSS over the process tree"
            ),
            "timings": [
                {
                    "label": t.label,
                    "rows": t.rows,
                    "program": t.program,
                    "command": t.command,
                    "best_s": t.best if t.runs else None,
                    "median_s": t.median if t.runs else None,
                    "peak_mb": t.peak_mb if t.runs else None,
                    "largest_process_mb": t.largest_mb if t.runs else None,
                    "failure": t.failure,
                    "runs": [_run_json(r) for r in t.runs],
                    "discarded_runs": [_run_json(r) for r in t.discarded],
                }
                for t in self.timings
            ],
            "ratios": self.ratios(),
            "sanity": self.sanity,
        }


# ---------------------------------------------------------------------------------------------
# Main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.beam_engine",
        description=(
            "Time the Beam engine against PipelineDP BeamBackend and a non-private Beam "
            "pipeline, each as its own process on the DirectRunner."
        ),
    )
    parser.add_argument(
        "--sizes",
        default="1M",
        help=f"comma list of row counts to run, from {', '.join(SIZES)} (default: 1M)",
    )
    parser.add_argument("--skip-pipelinedp", action="store_true", help="skip the slow reference")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of ours and of the baseline per size (best and median reported; default 3)",
    )
    parser.add_argument(
        "--repeat-pipelinedp", type=int, default=1, help="runs of PipelineDP per size (default 1)"
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        help=f"reruns of a run disturbed by other work (> {IDLE_CORES:g} cores), default 2",
    )
    parser.add_argument(
        "--idle-wait",
        type=float,
        default=600.0,
        help="longest wait, in seconds, for the machine to be idle before each run (default 600)",
    )
    args = parser.parse_args(argv)
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in args.sizes if s not in SIZES]
    if unknown or not args.sizes:
        parser.error(f"--sizes: choose from {', '.join(SIZES)}; got {args.sizes}")
    if args.repeat < 1 or args.repeat_pipelinedp < 1:
        parser.error("--repeat and --repeat-pipelinedp: must be >= 1")
    if args.retries < 0 or args.idle_wait < 0:
        parser.error("--retries and --idle-wait: must be >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _quiet_imports()  # the bounded reference imports pipeline-dp
    load = os.getloadavg()
    if load[0] > 0.5:
        progress(f"warning: load average {load[0]:.2f} at start; timings may be disturbed")
    report = Report(
        args={
            "sizes": args.sizes,
            "repeat": args.repeat,
            "repeat_pipelinedp": 0 if args.skip_pipelinedp else args.repeat_pipelinedp,
            "retries": args.retries,
            "idle_wait_s": args.idle_wait,
            "idle_cores": IDLE_CORES,
            "skip_pipelinedp": args.skip_pipelinedp,
            "command": " ".join(
                ["python -m bench.beam_engine", *(sys.argv[1:] if argv is None else argv)]
            ),
            "loadavg_at_start": [round(x, 2) for x in load],
        },
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
    report.args["finished_at"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    report.args["bench_wall_s"] = round(time.perf_counter() - started, 1)
    report.args["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]

    print(report.text())
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "beam_engine.md").write_text(report.markdown())
    (RESULTS_DIR / "beam_engine.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    progress(f"wrote {RESULTS_DIR / 'beam_engine.md'} and {RESULTS_DIR / 'beam_engine.json'}")
    failed = [f"{t.label} {t.program}" for t in report.timings if t.failure]
    if failed:
        print(f"bench.beam_engine: error: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
