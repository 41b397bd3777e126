"""Local engine vs PipelineDP LocalBackend vs a non-private DuckDB query, on the same data.

Why: the local engine exists because PipelineDP's LocalBackend pushes every row through Python
generators, which is too slow for nightly jobs. This benchmark keeps that claim honest by timing,
in one run and on the same generated Parquet files, each program as its own process from start
to exit (bench._harness measures the wall time and the memory of the process tree):

1. `python -m dppipeline run --engine local` (ours), and the bank's 10-query job on the same data;
2. `python -m bench._pipelinedp_local`: PipelineDP's `DPEngine` on `LocalBackend` with the same
   parameters, fed Python tuples read with pyarrow: the reference implementation (up to
   PIPELINEDP_MAX_SIZE: above it, its Python tuples no longer fit this machine);
3. a `python -c` DuckDB `GROUP BY`: the non-private floor.

`--stages` adds where our time goes, from extra in-process runs. Run with `make bench` or
`python -m bench.local_engine [--sizes 5M,20M,100M] [--skip-pipelinedp] [--repeat N]`.
Results go to stdout and to `bench/results/local_engine.{md,json}`; progress to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import re
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

from bench._harness import (
    DATA_DIR,
    KEY,
    SAMPLE_INTERVAL_S,
    VALUE,
    Dataset,
    Program,
    bank_job_command,
    bench_ledger,
    build_job_spec,
    ensure_dataset,
    ours_command,
    pipelinedp_command,
    progress,
    run_benchmark,
    up_to,
    write_public_keys,
)
from bench._report import (
    ProcessReport,
    Table,
    machine_facts,
    parse_bench_args,
    start_args,
)
from dppipeline.spec.model import JobSpec

LOG_DIR = DATA_DIR / "local_logs"
SIZES = ("1M", "5M", "20M", "100M")
DEFAULT_SIZES = ("5M", "20M", "100M")
TARGETS = {"5M": 5.0, "20M": 5.0, "100M": 8.0}  # ours / DuckDB (issue 35)
MEMORY_TARGET_MB = {"100M": 2048.0}  # ours' peak at 100M rows
PIPELINEDP_MAX_SIZE = "20M"  # 7 GB of Python tuples at 20M rows; 100M would not fit in 24 GiB
BANK_MAX_SIZE = "20M"  # 4.3 GB at 20M rows (800,000 terminal-days); 100M would not fit

OURS = "dppipeline local"
BANK = "dppipeline local, bank job (10 queries)"
PIPELINEDP = "PipelineDP LocalBackend"
DUCKDB = "DuckDB (non-private)"
PACKAGES = ("pipeline-dp", "python-dp", "polars", "duckdb", "pyarrow", "numpy", "pandas")

# The non-private floor, as a user would write it: one SQL over the daily files, the result
# written to Parquet. Run with `python -c`, so that it imports nothing but duckdb.
DUCKDB_PROGRAM = f"""\
import sys
import duckdb
source, target = sys.argv[1:3]
duckdb.sql(
    "COPY (SELECT {KEY}, count(*) AS count, sum({VALUE}) AS sum, avg({VALUE}) AS mean "
    f"FROM read_parquet('{{source}}/date=*/*.parquet') GROUP BY 1) TO '{{target}}' (FORMAT parquet)"
)
print("bench-marker: output written", file=sys.stderr, flush=True)
"""

OURS_MARKERS = {
    "ready": re.compile(r"^\[local\] reading "),
    "done": re.compile(r"^\[local\] release written to "),
}
SCRIPT_MARKERS = {"done": re.compile(r"^bench-marker: output written")}


def programs(data: Dataset, keys: Path, args: argparse.Namespace) -> dict[str, Program]:
    """The contenders in run order (PipelineDP last, when not skipped and the size allows)."""
    label, repeat = data.label, args.repeat
    ours_out = DATA_DIR / f"local_release_{label}"
    pdp_out = DATA_DIR / f"local_pipelinedp_{label}.parquet"
    duckdb_out = DATA_DIR / f"local_duckdb_{label}.parquet"
    found = {
        OURS: Program(
            OURS,
            ours_command("local", data, keys, ours_out, bench_ledger("local", label)),
            {},
            OURS_MARKERS,
            ours_out / build_job_spec(data, keys).name,
            repeat,
        ),
        BANK: Program(
            BANK,
            bank_job_command(
                "local", data, DATA_DIR / f"local_bank_{label}", bench_ledger("local", label)
            ),
            {},
            OURS_MARKERS,
            DATA_DIR / f"local_bank_{label}" / "mean_ticket_per_terminal",
            repeat,
        ),
        DUCKDB: Program(
            DUCKDB,
            [sys.executable, "-c", DUCKDB_PROGRAM, str(data.folder), str(duckdb_out)],
            {},
            SCRIPT_MARKERS,
            duckdb_out,
            repeat,
        ),
        PIPELINEDP: Program(
            PIPELINEDP,
            pipelinedp_command("bench._pipelinedp_local", data, pdp_out),
            {},
            SCRIPT_MARKERS,
            pdp_out,
            1,
        ),
    }
    if args.skip_pipelinedp:
        del found[PIPELINEDP]
    return up_to(found, label, {PIPELINEDP: PIPELINEDP_MAX_SIZE, BANK: BANK_MAX_SIZE})


RELEASED = {"ours": (OURS, "ours"), "pipelinedp": (PIPELINEDP, "PipelineDP")}


# ---------------------------------------------------------------------------------------------
# Where our time goes (--stages): in-process runs with the engine's stages wrapped


def run_ours(spec: JobSpec) -> None:
    """One end-to-end release in this process, as `dppipeline run` does it."""
    from dppipeline.lifecycle.runner import run_job

    run_job(spec, engine="local", overwrite=True, echo=lambda _line: None)


ENGINE, TASKS = "dppipeline.engines.local.engine", "dppipeline.engines.kernel.polars_tasks"
CONTAINER = (ENGINE, "aggregate_validated")  # the engine's whole share, reads included
# Functions timed in extra, instrumented runs, patched where their callers look them up (so the
# breakdown stays true to whatever run_job does today): inside aggregate_validated, then after it.
INNER_STAGES = {
    (ENGINE, "read_validated"): "Polars read + validate",
    (TASKS, "sample_contributions"): "numpy L0/Linf sampling",
    (TASKS, "aggregate_per_partition"): "numpy per-partition aggregates",
}
OUTER_STAGES = {
    ("dppipeline.engines.base", "release_job"): "partition selection + PyDP noise per partition",
    ("dppipeline.engines.base", "write_dataset"): "write the released Parquet file",
}


@contextlib.contextmanager
def timed_calls(targets: Sequence[tuple[str, str]], seconds: dict[str, float]) -> Iterator[None]:
    """Wraps each (module, function) for the duration, adding its wall time to `seconds`."""
    with contextlib.ExitStack() as undo:
        for module_name, name in targets:
            module = importlib.import_module(module_name)
            original = getattr(module, name)

            def timed(*args: Any, _fn: Any = original, _name: str = name, **kw: Any) -> Any:
                start = time.perf_counter()
                try:
                    return _fn(*args, **kw)
                finally:
                    seconds[_name] = seconds.get(_name, 0.0) + time.perf_counter() - start

            setattr(module, name, timed)
            undo.callback(setattr, module, name, original)
        yield


def stage_breakdown(spec: JobSpec, repeat: int) -> dict[str, float]:
    """Where our engine spends its time (read, bound, release, publish, the rest) in the
    fastest of `repeat` instrumented runs, so that one noisy run cannot skew the split."""
    runs = []
    for _ in range(repeat):
        seconds: dict[str, float] = {}
        gc.collect()
        start = time.perf_counter()
        with timed_calls([CONTAINER, *INNER_STAGES, *OUTER_STAGES], seconds):
            run_ours(spec)
        runs.append((time.perf_counter() - start, seconds))
    total, seconds = min(runs, key=itemgetter(0))
    engine = seconds[CONTAINER[1]]
    inner = {f"{n} ({what})": seconds.get(n, 0.0) for (_, n), what in INNER_STAGES.items()}
    outer = {f"{n} ({what})": seconds.get(n, 0.0) for (_, n), what in OUTER_STAGES.items()}
    return {
        **inner,
        "rest of aggregate_validated (key filter, factorize, clip)": engine - sum(inner.values()),
        **outer,
        "rest of run_job (plan, key file, discovery, manifest, fsync, rename)": total
        - engine
        - sum(outer.values()),
        "total (instrumented run)": total,
    }


# ---------------------------------------------------------------------------------------------
# Reporting and main


@dataclass
class Report(ProcessReport):
    NAME = "local_engine"
    TITLE = "Local engine benchmark"
    PHASES = (
        "start = process start to the first input read (imports, plan, discovery; PipelineDP "
        "and DuckDB: not marked); work = read, bound, release, write"
    )
    PROGRAMS = (OURS, BANK, PIPELINEDP, DUCKDB)
    RATIOS = (
        ("ours_over_duckdb", "ours / DuckDB", OURS, DUCKDB, ".1f", "median"),
        ("pipelinedp_over_ours", "PipelineDP / ours", PIPELINEDP, OURS, ".1f", "median"),
        ("bank_over_ours", "10 queries / 1", BANK, OURS, ".2f", "median"),
        ("ours_peak_over_duckdb_peak", "ours / DuckDB MB", OURS, DUCKDB, ".1f", "peak"),
    )
    RATIO_TITLE = (
        "Ratios (median seconds; targets: ours / DuckDB <= "
        + ", ".join(f"{t:g}x at {label}" for label, t in TARGETS.items())
        + "; ours' peak <= "
        + ", ".join(f"{mb:,.0f} MB at {label}" for label, mb in MEMORY_TARGET_MB.items())
        + ")"
    )
    stages: dict[str, dict[str, float]] = field(default_factory=dict)  # --stages

    def target(self, label: str, first: float | None) -> tuple[float | None, str]:
        goal = TARGETS.get(label)
        if goal is None or first is None:
            return goal, "-"
        verdict = "met" if first <= goal else f"missed ({first:.1f}x)"
        if label in MEMORY_TARGET_MB and (peak := self.peak(label, OURS)) is not None:
            fits = peak <= MEMORY_TARGET_MB[label]
            verdict += f"; memory {'met' if fits else 'missed'} ({peak:,.0f} MB)"
        return goal, verdict

    def timing_tables(self) -> list[Table]:
        per_row = ("peak bytes / input row", lambda t: f"{t.peak_mb * 2**20 / t.rows:.0f}")
        return [self.wall_table(*per_row)]

    def sanity_tables(self) -> list[Table]:
        return [self.released_sanity("DuckDB raw")]

    def tables(self) -> list[Table]:
        stages = self.stages
        if not stages:
            return super().tables()
        labels = list(stages)
        names = list(next(iter(stages.values())))
        rows = [[name, *(f"{stages[label][name]:.3f}" for label in labels)] for name in names]
        title = "Where our time goes (in-process, fastest of --repeat instrumented runs), seconds"
        return [*super().tables(), (title, ["stage", *labels], rows)]

    def how_run(self) -> list[str]:
        return [
            "Each program is its own process; seconds are wall time from process start to exit "
            f"(imports, read, compute, write), median of {self.args['repeat']} run(s) after "
            "one untimed warm-up process (PipelineDP: 1 run, up to "
            f"{PIPELINEDP_MAX_SIZE} rows). The OS page cache holds the input.",
            "Peak MB: the highest sum of RSS over the process tree, sampled every "
            f"{SAMPLE_INTERVAL_S:g} s. DuckDB is non-private (no bounding, no noise): a floor, "
            "not a competitor.",
        ]

    def other_json(self) -> dict[str, Any]:
        return {"duckdb_program": DUCKDB_PROGRAM, "stages_s": self.stages}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.local_engine",
        description="Time the local engine against PipelineDP LocalBackend and DuckDB, each as "
        "its own process.",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each program per size (median is kept)"
    )
    parser.add_argument(
        "--stages",
        action="store_true",
        help="also time our stages in extra in-process runs (read, bound, release, write)",
    )
    return parse_bench_args(parser, argv, SIZES, default_sizes=DEFAULT_SIZES)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = Report(
        args=start_args(args, "python -m bench.local_engine", argv), machine=machine_facts(PACKAGES)
    )
    if args.stages:  # in this process, before the timed processes run
        keys = write_public_keys()
        for label in args.sizes:
            progress(f"{label}: {OURS} stage breakdown (best of {args.repeat} instrumented runs)")
            spec = build_job_spec(ensure_dataset(label), keys)
            report.stages[label] = stage_breakdown(spec, args.repeat)
    status = run_benchmark(report, args, programs, RELEASED, DUCKDB, LOG_DIR, ".2f")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
