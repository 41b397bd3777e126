"""What the three benchmarks share around their measurements: the command line, the machine
facts, and the report (tables rendered as text and Markdown, the same figures as JSON, written to
bench/results/<name>.{md,json}).

A benchmark subclasses `Report` (in-process timings) or `ProcessReport` (programs measured by
bench._harness) with its tables, its preamble lines and its JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata
import json
import logging
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import psutil

from bench._harness import (
    DAYS,
    IDLE_CORES,
    JOB_PARAMETERS,
    JOB_SUMMARY,
    POPULATION,
    RESULTS_DIR,
    Run,
    Timing,
    progress,
)

# (title, headers, rows): one table of a report; a table without rows is not shown.
Table = tuple[str, list[str], list[list[str]]]

RETRIES = 2
IDLE_WAIT_S = 600.0


# ---------------------------------------------------------------------------------------------
# Command line


def parse_bench_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    sizes: Sequence[str],
    default_sizes: Sequence[str],
    repeats: Sequence[str] = ("repeat",),
    *,
    processes: bool = True,
) -> argparse.Namespace:
    """Adds --sizes and --skip-pipelinedp (and, for benchmarks of processes, --retries and
    --idle-wait) to the benchmark's `repeats` options, parses `argv` and checks them all."""
    shown = "all" if list(default_sizes) == list(sizes) else ", ".join(default_sizes)
    parser.add_argument(
        "--sizes",
        default=",".join(default_sizes),
        help=f"comma list of row counts to run, from {', '.join(sizes)} (default: {shown})",
    )
    parser.add_argument("--skip-pipelinedp", action="store_true", help="skip the slow reference")
    if processes:
        parser.add_argument(
            "--retries",
            type=int,
            default=RETRIES,
            help=f"reruns of a run disturbed by other work (> {IDLE_CORES:g} cores), "
            f"default {RETRIES}",
        )
        parser.add_argument(
            "--idle-wait",
            type=float,
            default=IDLE_WAIT_S,
            help="longest wait, in seconds, for the machine to be idle before each run "
            f"(default {IDLE_WAIT_S:g})",
        )
    args = parser.parse_args(argv)
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    if not args.sizes or any(s not in sizes for s in args.sizes):
        parser.error(f"--sizes: choose from {', '.join(sizes)}; got {args.sizes}")
    if any(getattr(args, name) < 1 for name in repeats):
        flags = " and ".join(f"--{name.replace('_', '-')}" for name in repeats)
        parser.error(f"{flags}: must be >= 1")
    if processes and (args.retries < 0 or args.idle_wait < 0):
        parser.error("--retries and --idle-wait: must be >= 0")
    return args


def quiet_imports() -> None:
    """pipeline-dp imports apache_beam when installed, which logs a GCP warning on the root
    logger; the same filter as the CLI. Modules importing pipeline-dp are therefore imported
    lazily, after this runs."""
    logging.getLogger().addFilter(lambda record: "apitools" not in record.getMessage())


def start_args(args: argparse.Namespace, prog: str, argv: Sequence[str] | None) -> dict[str, Any]:
    """Quiets pipeline-dp's imports, warns of a busy machine and returns the report's `args`:
    the options, the command, the load."""
    quiet_imports()
    load = os.getloadavg()
    if load[0] > 0.5:
        progress(f"warning: load average {load[0]:.2f} at start; timings may be disturbed")
    options = {k: v for k, v in vars(args).items() if k not in ("retries", "idle_wait")}
    if "retries" in vars(args):
        options |= {"retries": args.retries, "idle_wait_s": args.idle_wait}
        options |= {"idle_cores": IDLE_CORES}
    return {
        **options,
        "command": " ".join([prog, *(sys.argv[1:] if argv is None else argv)]),
        "loadavg_at_start": [round(x, 2) for x in load],
    }


# ---------------------------------------------------------------------------------------------
# Machine


def machine_facts(packages: Sequence[str]) -> dict[str, Any]:
    """What a reader needs to compare figures across machines, with the versions of
    `packages` (None when not installed)."""
    facts: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                facts["cpu"] = line.split(":", 1)[1].strip()
                break
    facts["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    for package in packages:
        try:
            facts[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            facts[package] = None
    return facts


# ---------------------------------------------------------------------------------------------
# Formatting and rendering


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def fmt_ratio(value: float | None, spec: str = ".1f") -> str:
    return "n/a" if value is None else f"{value:{spec}}x"


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


_NUMERIC = re.compile(r"^([-+]?[\d,]+(\.\d+)?x?|n/a|-)$")


def _right_aligned(rows: Sequence[Sequence[str]], width: int) -> list[bool]:
    """Columns whose every cell is a number (or n/a)."""
    return [all(_NUMERIC.match(r[i]) for r in rows) for i in range(width)]


def _table_text(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    right = _right_aligned(rows, len(headers))

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _table_md(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    rule = "|" + "|".join("---:" if r else "---" for r in _right_aligned(rows, len(headers))) + "|"
    cells = ["| " + " | ".join(r) + " |" for r in [headers, *rows]]
    return "\n".join([cells[0], rule, *cells[1:]])


def sanity_table(
    title: str,
    sanity: Sequence[dict[str, Any]],
    released: Sequence[tuple[str, str, str]],
    raw: tuple[str, str],
    partitions: Sequence[tuple[str, str]],
    bounded_key: str = "bounded_exact_mean_count",
) -> Table:
    """The sanity check: per size, the mean released count of each `released` (JSON prefix,
    column, z column), the bounded mean before noise, the noise s.e., each one's z, the raw mean
    count (`raw`: JSON key, column) and the partitions released (JSON prefix, column)."""
    headers = ["rows", *(c for _, c, _ in released), "bounded, before noise", "noise s.e."]
    headers += [*(z for _, _, z in released), raw[1], *(c for _, c in partitions)]
    rows = [
        [
            f"{s['rows']:,}",
            *(fmt(s[f"{p}_mean_count"], ",.1f") for p, _, _ in released),
            fmt(s[bounded_key], ",.1f"),
            fmt(s["noise_standard_error_of_mean_count"], ",.1f"),
            *(fmt(s[f"{p}_z"], "+.1f") for p, _, _ in released),
            fmt(s[raw[0]], ",.1f"),
            *(fmt(s[f"{p}_partitions"], ",d") for p, _ in partitions),
        ]
        for s in sanity
    ]
    return title, headers, rows


def accuracy_table(sanity: Sequence[dict[str, Any]]) -> Table:
    """Per size and released program: the RMSE per terminal of its released count and sum
    against the exact bounded values, beside the noise's own standard deviation (what the
    release would show with exact bounding); a sampled bounding adds its sampling error."""
    rows = []
    for s in sanity:
        prefixes = [k.removesuffix("_count_rmse") for k in s if k.endswith("_count_rmse")]
        for prefix in prefixes:
            rows.append(
                [
                    f"{s['rows']:,}",
                    prefix,
                    fmt(s[f"{prefix}_count_rmse"], ",.1f"),
                    fmt(s.get("count_noise_sd"), ",.1f"),
                    fmt(s[f"{prefix}_sum_rmse"], ",.0f"),
                    fmt(s.get("sum_noise_sd"), ",.0f"),
                ]
            )
    title = (
        "Accuracy (not timed): RMSE per public terminal of the last released count and sum "
        "against the exact bounded values of the default (scaled) bounding, and the noise's "
        "standard deviation"
    )
    headers = ["rows", "program", "count RMSE", "count noise sd", "sum RMSE", "sum noise sd"]
    return title, headers, rows


# ---------------------------------------------------------------------------------------------
# Reports


@dataclass
class Report:
    """Everything one benchmark measured, renderable as text, Markdown and JSON from one set of
    tables. Subclasses give the tables, the preamble and the JSON."""

    NAME: ClassVar[str]  # results go to bench/results/<NAME>.{md,json}
    TITLE: ClassVar[str]  # the Markdown heading, before the finishing time

    args: dict[str, Any]
    machine: dict[str, Any]
    timings: list[Any] = field(default_factory=list)
    sanity: list[dict[str, Any]] = field(default_factory=list)

    def tables(self) -> list[Table]:
        raise NotImplementedError

    def preamble(self) -> list[str]:
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def commands_section(self) -> list[str]:
        """Markdown lines after the tables."""
        return []

    def all_tables(self) -> list[Table]:
        machine = [[k, str(v)] for k, v in self.machine.items()]
        return [*self.tables(), ("Machine", ["fact", "value"], machine)]

    def text(self) -> str:
        parts = list(self.preamble())
        for title, headers, rows in self.all_tables():
            if rows:
                parts += ["", title, _table_text(headers, rows)]
        return "\n".join(parts)

    def markdown(self) -> str:
        parts = [f"# {self.TITLE} ({self.args['finished_at']})", "", *self.preamble()]
        parts += ["", f"Command: `{self.args['command']}`"]
        for title, headers, rows in self.all_tables():
            if rows:
                parts += ["", f"## {title}", "", _table_md(headers, rows)]
        tail = self.commands_section()
        return "\n".join([*parts, *([""] if tail else []), *tail]) + "\n"

    def finish(self, started: float) -> None:
        """Records the end of the run, prints the tables and writes the Markdown and JSON."""
        self.args["finished_at"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        self.args["bench_wall_s"] = round(time.perf_counter() - started, 1)
        self.args["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        print(self.text())
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        md, js = RESULTS_DIR / f"{self.NAME}.md", RESULTS_DIR / f"{self.NAME}.json"
        md.write_text(self.markdown())
        js.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        progress(f"wrote {md} and {js}")


PHASE_HEADERS = ["rows", "program", "start", "work", "exit", "total", "CPU s", "others' CPU s"]
PHASE_HEADERS += ["discarded runs", "load at start"]


def run_json(r: Run) -> dict[str, Any]:
    return {
        "seconds": r.seconds,
        "peak_mb": r.peak_mb,
        "largest_process_mb": r.largest_mb,
        "largest_process": r.largest_process,
        "marks_s": r.marks,
        "phases_s": r.phases(),
        "tree_gone_after_exit_s": r.tree_gone_s,
        "cpu_s": r.cpu_s,
        "others_cpu_s": r.others_cpu_s,
        "loadavg_1m_at_start": r.loadavg_1m,
        "log": r.log,
        "waited_for_idle_s": r.waited_for_idle_s,
        "others_cores": r.others_cores,
        "disturbed": r.disturbed,
    }


@dataclass
class ProcessReport(Report):
    """A benchmark of programs, each run as its own process (bench._harness). Subclasses give the
    timing, ratio and sanity tables and the lines that say how their programs run."""

    PHASES: ClassVar[str]  # what the start and work phases are, in the phases table's title
    PROGRAMS: ClassVar[Sequence[str]]  # table order
    # The ratios, in order: (JSON key, column, numerator, denominator, format, "median" seconds
    # or "peak" MB); the target's verdict follows the first.
    RATIOS: ClassVar[Sequence[tuple[str, str, str, str, str, str]]]
    RATIO_TITLE: ClassVar[str]

    timings: list[Timing] = field(default_factory=list)

    def timing_tables(self) -> list[Table]:
        raise NotImplementedError

    def target(self, label: str, first: float | None) -> tuple[float | None, str]:
        """The target of the first ratio at that size, if any, and the verdict."""
        raise NotImplementedError

    def ratios(self) -> list[dict[str, Any]]:
        out = []
        for label in self.labels():
            r: dict[str, Any] = {"label": label}
            r["rows"] = next(t.rows for t in self.timings if t.label == label)
            for i, (key, _, num, den, _, measure) in enumerate(self.RATIOS):
                of = getattr(self, measure)
                r[key] = ratio(of(label, num), of(label, den))
                if i == 0:
                    r["target"], r["target_verdict"] = self.target(label, r[key])
            out.append(r)
        return out

    def ratio_table(self) -> Table:
        first, *rest = self.RATIOS
        headers = ["rows", first[1], "target", *(c[1] for c in rest)]
        rows = [
            [
                f"{r['rows']:,}",
                fmt_ratio(r[first[0]], first[4]),
                r["target_verdict"],
                *(fmt_ratio(r[key], spec) for key, _, _, _, spec, _ in rest),
            ]
            for r in self.ratios()
        ]
        return self.RATIO_TITLE, headers, rows

    def sanity_tables(self) -> list[Table]:
        raise NotImplementedError

    def wall_table(self, column: str, cell: Callable[[Timing], str]) -> Table:
        """Per size and program: median wall seconds, every run, peak MB, and one more column."""
        rows = [
            [
                f"{t.rows:,}",
                t.program,
                f"median of {len(t.runs)}" if len(t.runs) > 1 else "1 run",
                f"{t.median:.2f}",
                ", ".join(f"{r.seconds:.2f}{'*' if r.disturbed else ''}" for r in t.runs),
                f"{t.peak_mb:,.0f}",
                cell(t),
            ]
            for t in self.timings
            if t.runs
        ]
        headers = ["rows", "program", "runs", "seconds", "all runs (s)", "peak MB (tree)", column]
        title = "Wall time of each process, start to exit (seconds), and peak memory (MB)"
        return title, headers, rows

    def released_sanity(self, raw_column: str) -> Table:
        """The sanity check of ours and PipelineDP against the bounded mean before noise."""
        title = (
            "Sanity check (not timed): mean released count per terminal (last run); bounded "
            "= local engine's exact bounded mean before noise; z = (released - bounded) / "
            "noise s.e., expect |z| < 3"
        )
        released = [("ours", "ours", "ours z"), ("pipelinedp", "PipelineDP", "PDP z")]
        partitions = [("ours", "ours partitions"), ("pipelinedp", "PDP partitions")]
        raw = ("baseline_raw_mean_count", raw_column)
        return sanity_table(title, self.sanity, released, raw, partitions)

    def how_run(self) -> list[str]:
        """The preamble's lines on how each program runs and what the seconds and MB are."""
        raise NotImplementedError

    def engine_parameters(self) -> dict[str, Any]:
        return {}

    def other_json(self) -> dict[str, Any]:
        """Keys of the JSON between the note and the timings."""
        return {}

    def timing(self, label: str, program: str) -> Timing | None:
        """The program's timing at that size, if it has runs."""
        return next(
            (t for t in self.timings if t.label == label and t.program == program and t.runs),
            None,
        )

    def median(self, label: str, program: str) -> float | None:
        t = self.timing(label, program)
        return None if t is None else t.median

    def peak(self, label: str, program: str) -> float | None:
        t = self.timing(label, program)
        return None if t is None else t.peak_mb

    def labels(self) -> list[str]:
        return list(dict.fromkeys(t.label for t in self.timings))

    def phase_rows(self) -> list[list[str]]:
        rows = []
        for t in self.timings:
            if not t.runs:
                continue
            run = t.median_run()
            phases = [fmt(run.phases()[p], ".1f") for p in ("start", "work", "exit")]
            rows.append(
                [
                    *(f"{t.rows:,}", t.program, *phases, f"{run.seconds:.1f}"),
                    *(f"{run.cpu_s:.1f}", f"{run.others_cpu_s:.1f}", str(len(t.discarded))),
                    f"{run.loadavg_1m:.2f}",
                ]
            )
        return rows

    def tables(self) -> list[Table]:
        failures = [
            [f"{t.rows:,}", t.program, t.failure.splitlines()[0]] for t in self.timings if t.failure
        ]
        return [
            *self.timing_tables(),
            self.ratio_table(),
            (
                f"Phases of the median run (seconds): {self.PHASES}; exit = output written to "
                "process exit; CPU = CPU seconds of the program's processes; others' CPU = CPU "
                "seconds the rest of the machine used meanwhile (disturbance); discarded runs = "
                "disturbed runs of this program and size that were run again",
                PHASE_HEADERS,
                self.phase_rows(),
            ),
            *self.sanity_tables(),
            accuracy_table(self.sanity),
            (
                "Failed programs (see the log named in the message)",
                ["rows", "program", "error"],
                failures,
            ),
        ]

    def preamble(self) -> list[str]:
        return [
            JOB_SUMMARY,
            *self.how_run(),
            "A run during which the rest of the machine used more than "
            f"{self.args['idle_cores']:g} cores on average is disturbed and run again (at most "
            f"{self.args['retries']} times); a * marks a disturbed run kept because no retry was "
            "left.",
            "The baseline is non-private (no bounding, no noise): a floor, not a competitor.",
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "args": self.args,
            "machine": self.machine,
            "parameters": {
                "population": POPULATION,
                "days": {label: DAYS[label] for label in self.args["sizes"]},
                **JOB_PARAMETERS,
                **self.engine_parameters(),
            },
            "note": (
                "seconds: wall time of each process from start to exit; peak_mb: highest sampled "
                "sum of RSS over the process tree (psutil)"
            ),
            **self.other_json(),
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
                    "runs": [run_json(r) for r in t.runs],
                    "discarded_runs": [run_json(r) for r in t.discarded],
                }
                for t in self.timings
            ],
            "ratios": self.ratios(),
            "sanity": self.sanity,
        }

    def commands_section(self) -> list[str]:
        first = self.timings[0].label if self.timings else None
        shown = [t for t in self.timings if t.label == first]
        abbreviated = any("<program>" in t.command for t in shown)
        note = "; the baseline's `<program>` is in the JSON" if abbreviated else ""
        lines = [f"## Commands ({first} shown{note})", ""]
        return lines + [f"- {t.program}: `{t.command}`" for t in shown]
