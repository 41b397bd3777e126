"""Local engine vs PipelineDP LocalBackend vs a non-private DuckDB query, on the same data.

Why: the local engine exists because PipelineDP's LocalBackend pushes every row through Python
generators, which is too slow for nightly jobs. This benchmark keeps that claim honest by timing,
in one run and on the same generated Parquet files:

1. `dppipeline.orchestration.runner.run_job` on the local engine, end to end (read, validate,
   bound, release, publish): what a user waits for;
2. PipelineDP's `DPEngine` on `LocalBackend` with the same parameters, fed Python tuples read
   with pyarrow: the reference implementation;
3. a non-private DuckDB `GROUP BY`: the floor, what the same aggregation costs without DP.

Every timing is wall time and includes reading the Parquet input. Ours and DuckDB: one warm-up,
then best of `--repeat`; PipelineDP once (it is slow). Run with `make bench` or
`python -m bench.local_engine [--sizes 1M,5M] [--skip-pipelinedp] [--repeat N]`.
Results go to stdout and to `bench/results/local_engine.{md,json}`; progress to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow.dataset as pads

from bench._harness import (
    BANK_JOB,
    DATA_DIR,
    JOB_PARAMETERS,
    JOB_SUMMARY,
    KEY,
    LINF,
    N_TERMINALS,
    POPULATION,
    PRIVACY_UNIT,
    VALUE,
    Dataset,
    bounded_reference,
    build_job_spec,
    ensure_dataset,
    progress,
    write_public_keys,
    z_score,
)
from bench._programs import add_job_flags, dp_aggregate
from bench._report import (
    Report,
    Table,
    fmt_ratio,
    machine_facts,
    parse_bench_args,
    ratio,
    sanity_table,
    start_args,
)
from dppipeline.spec.model import JobSpec

# dppipeline.orchestration.runner and pipeline_dp are imported inside the functions that use
# them: see bench._report.quiet_imports.

SIZES = ("1M", "5M")
OURS = "dppipeline local"
BANK = "dppipeline local, bank job (12 queries)"
PIPELINEDP = "PipelineDP LocalBackend"
DUCKDB = "DuckDB (non-private)"
PACKAGES = ("pipeline-dp", "python-dp", "polars", "duckdb", "pyarrow", "numpy", "pandas")


# ---------------------------------------------------------------------------------------------
# The three contenders


def run_ours(spec: JobSpec) -> None:
    """One end-to-end release, as `dppipeline run` does it; the release is read back later."""
    from dppipeline.orchestration.runner import run_job

    run_job(spec, engine="local", overwrite=True, echo=lambda _line: None)


def run_bank_job(data: Dataset) -> None:
    """The bank's 12-query job (`jobs/configs/bank_partner_release.yaml`) on the same data."""
    from dppipeline.orchestration.runner import run_job
    from dppipeline.spec.model import build_spec, load_raw

    output = str(DATA_DIR / f"local_bank_{data.label}")
    spec = build_spec(load_raw(BANK_JOB), {"input.path": str(data.folder), "output": output})
    run_job(spec, engine="local", overwrite=True, echo=lambda _line: None)


def read_our_release(spec: JobSpec) -> pd.DataFrame:
    """The published release table, for the sanity check (not timed)."""
    assert spec.output is not None
    return pd.read_parquet(Path(spec.output) / spec.name)


def run_pipelinedp(data: Dataset) -> list[tuple[Any, Any]]:
    """PipelineDP's DPEngine on LocalBackend, from Parquet to materialised results."""
    import pipeline_dp  # imported late: see bench._report.quiet_imports

    table = pads.dataset([str(f) for f in data.files], format="parquet").to_table(
        columns=[PRIVACY_UNIT, KEY, VALUE]
    )
    rows = list(
        zip(
            table.column(PRIVACY_UNIT).to_pylist(),
            table.column(KEY).to_pylist(),
            table.column(VALUE).to_pylist(),
            strict=True,
        )
    )
    del table
    job = argparse.ArgumentParser()
    add_job_flags(job)  # the defaults: the benchmark's parameters
    return list(dp_aggregate(pipeline_dp, pipeline_dp.LocalBackend(), rows, job.parse_args([])))


DUCKDB_SQL = (
    "SELECT {key}, count(*) AS n, sum({value}) AS total, avg({value}) AS mean "
    "FROM read_parquet('{glob}') GROUP BY 1"
)


def run_duckdb(con: duckdb.DuckDBPyConnection, data: Dataset) -> pd.DataFrame:
    """The non-private floor: the same per-terminal aggregates, no bounding and no noise."""
    sql = DUCKDB_SQL.format(key=KEY, value=VALUE, glob=data.glob)
    return con.execute(sql).df()


# ---------------------------------------------------------------------------------------------
# Timing


@dataclass
class Timing:
    """All runs of one engine at one size; `best` is what the tables report."""

    label: str
    rows: int
    engine: str
    runs: list[float] = field(default_factory=list)
    warmups: int = 0

    @property
    def best(self) -> float:
        return min(self.runs)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)


def time_runs(
    label: str, rows: int, engine: str, fn: Callable[[], Any], *, repeat: int, warmup: int
) -> tuple[Timing, Any]:
    """Runs `fn` warm-up + repeat times; returns the timings and the last run's result."""
    timing = Timing(label, rows, engine, warmups=warmup)
    result: Any = None
    for i in range(warmup + repeat):
        gc.collect()  # garbage of the previous run must not be charged to this one
        start = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - start
        kind = "warm-up" if i < warmup else f"run {i - warmup + 1}/{repeat}"
        progress(f"{label}: {engine} {kind}: {elapsed:.3f} s")
        if i >= warmup:
            timing.runs.append(elapsed)
    return timing, result


ENGINE, TASKS = "dppipeline.engines.local.engine", "dppipeline.engines.shared.polars_tasks"
CONTAINER = (ENGINE, "compute_aggregates")  # the engine's whole share, called by run_job
# Functions timed in extra, instrumented runs, patched where their callers look them up (so the
# breakdown stays true to whatever run_job does today): inside compute_aggregates, then after it.
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
        "rest of compute_aggregates (key filter, factorize, clip)": engine - sum(inner.values()),
        **outer,
        "rest of run_job (plan, key file, discovery, manifest, fsync, rename)": total
        - engine
        - sum(outer.values()),
        "total (instrumented run)": total,
    }


# ---------------------------------------------------------------------------------------------
# Reporting and main


@dataclass
class LocalReport(Report):
    """In-process timings (best of `--repeat`), the sanity check and the stage breakdown."""

    NAME = "local_engine"
    TITLE = "Local engine benchmark"

    stages: dict[str, dict[str, float]] = field(default_factory=dict)

    def best(self, label: str, engine: str) -> float | None:
        return next((t.best for t in self.timings if (t.label, t.engine) == (label, engine)), None)

    def ratios(self) -> list[dict[str, Any]]:
        out = []
        for label in dict.fromkeys(t.label for t in self.timings):
            ours = self.best(label, OURS)
            out.append(
                {
                    "label": label,
                    "rows": next(t.rows for t in self.timings if t.label == label),
                    "pipelinedp_over_ours": ratio(self.best(label, PIPELINEDP), ours),
                    "ours_over_duckdb": ratio(ours, self.best(label, DUCKDB)),
                    "bank_over_ours": ratio(self.best(label, BANK), ours),
                }
            )
        return out

    def tables(self) -> list[Table]:
        timing_rows = [
            [
                f"{t.rows:,}",
                t.engine,
                f"best of {len(t.runs)}" if len(t.runs) > 1 else "1 run",
                f"{t.best:.3f}",
                f"{t.median:.3f}",
                ", ".join(f"{r:.3f}" for r in t.runs),
            ]
            for t in self.timings
        ]
        ratio_rows = [
            [
                f"{r['rows']:,}",
                fmt_ratio(r["pipelinedp_over_ours"]),
                fmt_ratio(r["ours_over_duckdb"]),
                fmt_ratio(r["bank_over_ours"]),
            ]
            for r in self.ratios()
        ]
        labels = list(self.stages)
        stage_names = list(next(iter(self.stages.values()))) if self.stages else []
        stage_rows = [
            [name, *(f"{self.stages[label][name]:.3f}" for label in labels)] for name in stage_names
        ]
        return [
            (
                "Wall time, seconds, including reading the Parquet input",
                ["rows", "engine", "runs", "seconds", "median", "all runs (s)"],
                timing_rows,
            ),
            (
                "Ratios",
                ["rows", "PipelineDP / ours", "ours / DuckDB", "12 queries / 1"],
                ratio_rows,
            ),
            sanity_table(
                "Sanity check (not timed): mean released count per terminal; "
                "z = (released - bounded) / noise s.e., expect |z| < 3",
                self.sanity,
                [("ours", "ours", "ours z"), ("pipelinedp", "PipelineDP", "PDP z")],
                ("duckdb_raw_mean_count", "DuckDB raw"),
                [("ours", "ours partitions"), ("pipelinedp", "PDP partitions")],
                bounded_key="ours_bounded_exact_mean_count",
            ),
            (
                "Where our time goes (fastest of the extra instrumented runs), seconds",
                ["stage", *labels],
                stage_rows,
            ),
        ]

    def preamble(self) -> list[str]:
        return [
            JOB_SUMMARY,
            "Each timing is wall time including reading the Parquet input "
            f"(OS page cache warm). Ours and DuckDB: 1 warm-up, then best of "
            f"{self.args['repeat']}; PipelineDP: 1 run.",
            "DuckDB is non-private (no bounding, no noise): a floor, not a competitor. "
            "Raw counts are larger than bounded ones: Linf keeps at most "
            f"{LINF} transactions per customer and terminal.",
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "args": self.args,
            "machine": self.machine,
            "parameters": {"population": POPULATION, **JOB_PARAMETERS},
            "note": "wall time in seconds including reading the Parquet input",
            "timings": [
                {
                    "label": t.label,
                    "rows": t.rows,
                    "engine": t.engine,
                    "warmups": t.warmups,
                    "runs_s": t.runs,
                    "best_s": t.best,
                    "median_s": t.median,
                }
                for t in self.timings
            ],
            "ratios": self.ratios(),
            "sanity": self.sanity,
            "stages_s": self.stages,
        }


def bench_size(label: str, keys: Path, args: argparse.Namespace, report: LocalReport) -> None:
    """All contenders on one data size; PipelineDP last so its garbage cannot slow the others."""
    data = ensure_dataset(label)
    spec = build_job_spec(data, keys)

    ours, _ = time_runs(
        label, data.rows, OURS, lambda: run_ours(spec), repeat=args.repeat, warmup=1
    )
    released = read_our_release(spec)
    bank, _ = time_runs(
        label, data.rows, BANK, lambda: run_bank_job(data), repeat=args.repeat, warmup=1
    )

    con = duckdb.connect()
    try:
        floor, raw = time_runs(
            label, data.rows, DUCKDB, lambda: run_duckdb(con, data), repeat=args.repeat, warmup=1
        )
    finally:
        con.close()

    progress(f"{label}: {OURS} stage breakdown (best of {args.repeat} instrumented runs)")
    report.stages[label] = stage_breakdown(spec, args.repeat)
    bounded_mean_count, noise_se = bounded_reference(data, keys)

    timings = [ours, bank]  # table order: ours, the bank job, PipelineDP, DuckDB
    pdp_mean: float | None = None
    pdp_partitions: int | None = None
    if not args.skip_pipelinedp:
        progress(f"{label}: {PIPELINEDP}, one run (slow: every row goes through Python)")
        reference, result = time_runs(
            label, data.rows, PIPELINEDP, lambda: run_pipelinedp(data), repeat=1, warmup=0
        )
        timings.append(reference)
        pdp_mean = sum(metrics.count for _, metrics in result) / len(result)
        pdp_partitions = len(result)
        del result
        gc.collect()

    report.timings.extend([*timings, floor])
    ours_mean = float(released["count"].mean())
    report.sanity.append(
        {
            "label": label,
            "rows": data.rows,
            "ours_mean_count": ours_mean,
            "pipelinedp_mean_count": pdp_mean,
            "ours_bounded_exact_mean_count": bounded_mean_count,
            "noise_standard_error_of_mean_count": noise_se,
            "ours_z": z_score(ours_mean, bounded_mean_count, noise_se),
            "pipelinedp_z": z_score(pdp_mean, bounded_mean_count, noise_se),
            "duckdb_raw_mean_count": float(raw["n"].sum()) / N_TERMINALS,
            "ours_partitions": len(released),
            "pipelinedp_partitions": pdp_partitions,
        }
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.local_engine",
        description="Time the local engine against PipelineDP LocalBackend and DuckDB.",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="timed runs of ours and DuckDB (best is kept)"
    )
    return parse_bench_args(parser, argv, SIZES, default_sizes=SIZES, processes=False)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = LocalReport(
        args=start_args(args, "python -m bench.local_engine", argv), machine=machine_facts(PACKAGES)
    )
    keys = write_public_keys()
    started = time.perf_counter()
    for label in args.sizes:
        bench_size(label, keys, args, report)
    report.finish(started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
