"""What bench.spark_engine and bench.beam_engine share around their measurements: the command
line options of a run (sizes, retries, idle wait), the report (tables of runs, ratios, phases,
sanity check and machine, rendered as text, Markdown and JSON from one set of tables) and writing
it out.

Each benchmark subclasses `ProcessReport` with what differs: the timing, ratio and sanity tables,
the lines that say how its programs run, its parameters and its list of commands. The measuring
itself (processes, memory, disturbance, retries) is bench.spark_engine's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from bench.local_engine import (
    JOB_PARAMETERS,
    JOB_SUMMARY,
    POPULATION,
    RESULTS_DIR,
    Table,
    _fmt_number,
    _quiet_imports,
    _report_markdown,
    _report_text,
    machine_facts,
    package_versions,
    progress,
)

if TYPE_CHECKING:
    from bench.spark_engine import Run, Timing

# The benchmark's defaults, shared by the options and by the messages that name them.
RETRIES = 2
IDLE_WAIT_S = 600.0

PHASE_HEADERS = [
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
]


# ---------------------------------------------------------------------------------------------
# Command line


def bench_parser(
    prog: str, description: str, sizes: Sequence[str], default_sizes: Sequence[str]
) -> argparse.ArgumentParser:
    """A parser with --sizes (a comma list of `sizes`) and --skip-pipelinedp; the benchmark adds
    its --repeat options, then `parse_bench_args` the rest."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    shown = "all" if list(default_sizes) == list(sizes) else ", ".join(default_sizes)
    parser.add_argument(
        "--sizes",
        default=",".join(default_sizes),
        help=f"comma list of row counts to run, from {', '.join(sizes)} (default: {shown})",
    )
    parser.add_argument("--skip-pipelinedp", action="store_true", help="skip the slow reference")
    return parser


def parse_bench_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    sizes: Sequence[str],
    idle_cores: float,
    repeats: Sequence[str] = ("repeat",),
) -> argparse.Namespace:
    """Adds --retries and --idle-wait to the benchmark's own options, parses `argv` and checks
    the sizes (a comma list, from `sizes`), the `repeats` options (>= 1) and the retry options."""
    parser.add_argument(
        "--retries",
        type=int,
        default=RETRIES,
        help=f"reruns of a run disturbed by other work (> {idle_cores:g} cores), default {RETRIES}",
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
    unknown = [s for s in args.sizes if s not in sizes]
    if unknown or not args.sizes:
        parser.error(f"--sizes: choose from {', '.join(sizes)}; got {args.sizes}")
    if any(getattr(args, name) < 1 for name in repeats):
        flags = " and ".join(f"--{name.replace('_', '-')}" for name in repeats)
        parser.error(f"{flags}: must be >= 1")
    if args.retries < 0 or args.idle_wait < 0:
        parser.error("--retries and --idle-wait: must be >= 0")
    return args


def start_args(
    args: argparse.Namespace,
    prog: str,
    argv: Sequence[str] | None,
    idle_cores: float,
    **extra: Any,
) -> dict[str, Any]:
    """Quiets pipeline-dp's imports (the bounded reference imports it), warns of a busy machine
    and returns the report's `args`: the options (`extra` after --repeat), the command, the load."""
    _quiet_imports()
    load = os.getloadavg()
    if load[0] > 0.5:
        progress(f"warning: load average {load[0]:.2f} at start; timings may be disturbed")
    return {
        "sizes": args.sizes,
        "repeat": args.repeat,
        **extra,
        "retries": args.retries,
        "idle_wait_s": args.idle_wait,
        "idle_cores": idle_cores,
        "skip_pipelinedp": args.skip_pipelinedp,
        "command": " ".join([prog, *(sys.argv[1:] if argv is None else argv)]),
        "loadavg_at_start": [round(x, 2) for x in load],
    }


def machine_facts_with(packages: Sequence[str], unused: Sequence[str]) -> dict[str, Any]:
    """The local benchmark's machine facts without its `unused` packages, with the versions of
    `packages` (None when not installed)."""
    facts = machine_facts()
    for package in unused:
        facts.pop(package, None)
    facts.update(package_versions(packages))
    return facts


# ---------------------------------------------------------------------------------------------
# Report


def secs(value: float | None) -> str:
    return _fmt_number(value, ".1f")


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
class ProcessReport:
    """Everything one benchmark of processes measured. Subclasses set the class variables and
    give the tables and lines that differ between benchmarks."""

    NAME: ClassVar[str]  # results go to bench/results/<NAME>.{md,json}
    TITLE: ClassVar[str]  # the Markdown heading, before the finishing time
    DAYS: ClassVar[dict[str, int]]  # size label -> days generated
    PHASES: ClassVar[str]  # what the start and work phases are, in the phases table's title

    args: dict[str, Any]
    machine: dict[str, Any]
    timings: list[Timing] = field(default_factory=list)
    sanity: list[dict[str, Any]] = field(default_factory=list)

    # -- what each benchmark gives

    def timing_tables(self) -> list[Table]:
        raise NotImplementedError

    def ratio_table(self) -> Table:
        raise NotImplementedError

    def sanity_table(self) -> Table:
        raise NotImplementedError

    def other_tables(self) -> list[Table]:
        """Tables between the sanity check and the machine facts."""
        return []

    def how_run(self) -> list[str]:
        """The preamble's lines on how each program runs and what the seconds and MB are."""
        raise NotImplementedError

    def engine_parameters(self) -> dict[str, Any]:
        return {}

    def other_json(self) -> dict[str, Any]:
        """Keys of the JSON between the note and the timings."""
        return {}

    def timing_figures(self, t: Timing) -> dict[str, Any]:
        """A timing's figures in the JSON, between its command and its runs."""
        return {"median_s": t.median, "peak_mb": t.peak_mb, "largest_process_mb": t.largest_mb}

    def commands_section(self) -> list[str]:
        """The Markdown's last section: the commands timed."""
        raise NotImplementedError

    # -- shared

    def timing(self, label: str, program: str) -> Timing | None:
        """The program's timing at that size, if it has runs."""
        return next(
            (t for t in self.timings if t.label == label and t.program == program and t.runs),
            None,
        )

    def median(self, label: str, program: str) -> float | None:
        t = self.timing(label, program)
        return None if t is None else t.median

    def labels(self) -> list[str]:
        return list(dict.fromkeys(t.label for t in self.timings))

    def phase_rows(self) -> list[list[str]]:
        rows = []
        for t in self.timings:
            if not t.runs:
                continue
            run = t.median_run()
            phases = run.phases()
            rows.append(
                [
                    f"{t.rows:,}",
                    t.program,
                    secs(phases["start"]),
                    secs(phases["work"]),
                    secs(phases["exit"]),
                    f"{run.seconds:.1f}",
                    f"{run.cpu_s:.1f}",
                    f"{run.others_cpu_s:.1f}",
                    str(len(t.discarded)),
                    f"{run.loadavg_1m:.2f}",
                ]
            )
        return rows

    def tables(self) -> list[Table]:
        """(title, headers, rows) of every table, in print order."""
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
            self.sanity_table(),
            *self.other_tables(),
            ("Machine", ["fact", "value"], [[k, str(v)] for k, v in self.machine.items()]),
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

    def text(self) -> str:
        return _report_text(self.preamble(), self.tables())

    def markdown(self) -> str:
        heading = f"{self.TITLE} ({self.args['finished_at']})"
        parts = _report_markdown(heading, self.preamble(), self.args["command"], self.tables())
        return "\n".join([*parts, "", *self.commands_section()]) + "\n"

    def ratios(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        return {
            "args": self.args,
            "machine": self.machine,
            "parameters": {
                "population": POPULATION,
                "days": self.DAYS,
                **JOB_PARAMETERS,
                **self.engine_parameters(),
            },
            "note": (
                "seconds: wall time of each process from start to exit; peak_mb: highest sampled "
                "sum of RSS over the process tree"
            ),
            **self.other_json(),
            "timings": [
                {
                    "label": t.label,
                    "rows": t.rows,
                    "program": t.program,
                    "command": t.command,
                    **self.timing_figures(t),
                    "runs": [run_json(r) for r in t.runs],
                    "discarded_runs": [run_json(r) for r in t.discarded],
                }
                for t in self.timings
            ],
            "ratios": self.ratios(),
            "sanity": self.sanity,
        }

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
