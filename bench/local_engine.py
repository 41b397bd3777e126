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
import datetime as dt
import gc
import importlib
import importlib.metadata
import json
import logging
import math
import os
import platform
import re
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import psutil
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from dppipeline.commands.generate import generate
from dppipeline.spec.model import JobSpec, build_spec

# dppipeline.orchestration.runner and pipeline_dp are imported inside the functions that use
# them: see _quiet_imports.

BENCH_DIR = Path(__file__).resolve().parent
DATA_DIR = BENCH_DIR / "data"
RESULTS_DIR = BENCH_DIR / "results"
KEYS_FILE = DATA_DIR / "public_terminals.csv"
MARKER = "_generated.json"  # skipped by the readers: they ignore names starting with "_"

# Row-count label -> days generated at 25,000 transactions a day.
SIZES: dict[str, int] = {"1M": 40, "5M": 200}
POPULATION: dict[str, int] = {"customers": 5000, "terminals": 1000, "tx_per_day": 25000, "seed": 0}
PRIVACY_UNIT, KEY, VALUE = "CUSTOMER_ID", "TERMINAL_ID", "TX_AMOUNT"
EPSILON, DELTA = 1.0, 1e-6
L0, LINF = 20, 10
MIN_VALUE, MAX_VALUE = 0.0, 200.0
N_TERMINALS = POPULATION["terminals"]
# The job's parameters as the JSON results record them, after the population.
JOB_PARAMETERS: dict[str, Any] = {
    "epsilon": EPSILON,
    "delta": DELTA,
    "max_partitions_contributed": L0,
    "max_contributions_per_partition": LINF,
    "min_value": MIN_VALUE,
    "max_value": MAX_VALUE,
    "noise": "laplace",
    "public_partitions": N_TERMINALS,
}
# The job in one sentence: the first line of every benchmark's report.
JOB_SUMMARY = (
    f"Job: count, sum, mean of {VALUE} per {KEY}, privacy unit {PRIVACY_UNIT}, "
    f"{N_TERMINALS} public partitions, L0={L0}, Linf={LINF}, "
    f"values in [{MIN_VALUE:g}, {MAX_VALUE:g}], epsilon={EPSILON:g}, delta={DELTA:g}, Laplace."
)

OURS = "dppipeline local"
PIPELINEDP = "PipelineDP LocalBackend"
DUCKDB = "DuckDB (non-private)"
PACKAGES = ("pipeline-dp", "python-dp", "polars", "duckdb", "pyarrow", "numpy", "pandas")


def progress(line: str) -> None:
    """Progress goes to stderr so that stdout holds only the result tables."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True)
class Dataset:
    """One generated input folder and what it holds."""

    label: str
    folder: Path
    rows: int
    files: list[Path]

    @property
    def glob(self) -> str:
        return str(self.folder / "date=*" / "*.parquet")


def _parquet_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("date=*/*.parquet"))


def _parquet_rows(files: Sequence[Path]) -> int:
    """Row count from the Parquet footers only: cheap enough to check on every run."""
    return sum(pq.ParquetFile(path).metadata.num_rows for path in files)


def ensure_dataset(label: str, days: int) -> Dataset:
    """Generates `bench/data/rows_<label>` once; reuses it while its row count still matches.

    A marker written after generation records the arguments and the row count, so a partial or
    differently sized folder (an interrupted run, other arguments) is regenerated, not timed.
    """
    folder = DATA_DIR / f"rows_{label}"
    wanted = {**POPULATION, "days": days, "format": "parquet"}
    marker = folder / MARKER
    if marker.is_file():
        recorded = json.loads(marker.read_text())
        files = _parquet_files(folder)
        if (
            recorded.get("params") == wanted
            and len(files) == days
            and _parquet_rows(files) == recorded.get("rows")
        ):
            progress(f"{label}: reusing {folder} ({recorded['rows']:,} rows)")
            return Dataset(label, folder, int(recorded["rows"]), files)
    if folder.exists():
        shutil.rmtree(folder)
    progress(f"{label}: generating {days} days into {folder}")
    summary = generate(
        folder,
        fmt="parquet",
        customers=POPULATION["customers"],
        terminals=POPULATION["terminals"],
        days=days,
        tx_per_day=POPULATION["tx_per_day"],
        seed=POPULATION["seed"],
        progress=lambda line: progress(f"{label}: {line}"),
    )
    marker.write_text(json.dumps({"params": wanted, "rows": summary.rows}, indent=2) + "\n")
    return Dataset(label, folder, summary.rows, _parquet_files(folder))


def write_public_keys() -> Path:
    """Terminals 0..999, one per line under a TERMINAL_ID header, as the spec reads them."""
    text = KEY + "\n" + "".join(f"{k}\n" for k in range(N_TERMINALS))
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    if not KEYS_FILE.is_file() or KEYS_FILE.read_text() != text:
        KEYS_FILE.write_text(text)
    return KEYS_FILE


# ---------------------------------------------------------------------------------------------
# The three contenders


def build_job_spec(data: Dataset, keys: Path) -> JobSpec:
    """The same job as jobs/configs/terminal_stats.yaml, spelled as CLI-style overrides."""
    return build_spec(
        {},
        {
            "input.path": str(data.folder),
            "input.format": "parquet",
            "output": str(DATA_DIR / f"release_{data.label}"),
            "privacy_unit": PRIVACY_UNIT,
            "partition_key": KEY,
            "value": VALUE,
            "metrics": ["count", "sum", "mean"],
            "noise": "laplace",
            "budget.epsilon": EPSILON,
            "budget.delta": DELTA,
            "bounds.max_partitions_contributed": L0,
            "bounds.max_contributions_per_partition": LINF,
            "bounds.min_value": MIN_VALUE,
            "bounds.max_value": MAX_VALUE,
            "partition_selection.public_partitions": str(keys),
        },
    )


def run_ours(spec: JobSpec) -> None:
    """One end-to-end release, as `dppipeline run` does it; the release is read back later."""
    from dppipeline.orchestration.runner import run_job

    run_job(spec, engine="local", overwrite=True, echo=lambda _line: None)


def count_noise_se(spec: JobSpec) -> float | None:
    """Standard error that noise alone gives the mean released count over the public terminals:
    released means within a few of these of the bounded one are consistent."""
    from dppipeline.orchestration.runner import make_plan

    stddev = make_plan(spec).queries[0].plan.metric_noise_stddev("count")  # the one query
    return None if stddev is None else stddev / math.sqrt(N_TERMINALS)


def read_our_release(spec: JobSpec) -> pd.DataFrame:
    """The published release table, for the sanity check (not timed)."""
    assert spec.output is not None
    return pd.read_parquet(Path(spec.output) / spec.name)


def run_pipelinedp(data: Dataset) -> list[tuple[Any, Any]]:
    """PipelineDP's DPEngine on LocalBackend, from Parquet to materialised results."""
    import pipeline_dp  # imported late: see _quiet_imports

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
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=DELTA)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    params = pipeline_dp.AggregateParams(
        metrics=[pipeline_dp.Metrics.COUNT, pipeline_dp.Metrics.SUM, pipeline_dp.Metrics.MEAN],
        noise_kind=pipeline_dp.NoiseKind.LAPLACE,
        max_partitions_contributed=L0,
        max_contributions_per_partition=LINF,
        min_value=MIN_VALUE,
        max_value=MAX_VALUE,
    )
    extractors = pipeline_dp.DataExtractors(
        privacy_id_extractor=itemgetter(0),
        partition_extractor=itemgetter(1),
        value_extractor=itemgetter(2),
    )
    # A Python list: DPEngine tests `if public_partitions:`, which a numpy array refuses.
    result = engine.aggregate(rows, params, extractors, public_partitions=list(range(N_TERMINALS)))
    accountant.compute_budgets()
    return list(result)


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


ENGINE_MODULE, RELEASE_MODULE = "dppipeline.engines.local.engine", "dppipeline.engines.base"
CONTAINER = "compute_aggregates"  # the engine's whole share, called by run_job
# Functions timed separately in one extra, instrumented run, by the module that calls them, with
# what they do. Names absent from today's code are skipped: the engine is being refactored (for
# instance bound_contributions split into sample_contributions + aggregate_per_partition).
INNER_STAGES: dict[str, str] = {
    "read_validated": "Polars read + validate",
    "bound_contributions": "numpy L0/Linf sampling + aggregates",
    "sample_contributions": "numpy L0/Linf sampling",
    "aggregate_per_partition": "numpy per-partition aggregates",
}
# Called after compute_aggregates, by the module that releases and writes each query.
OUTER_STAGES: dict[str, str] = {
    "release_job": "partition selection + PyDP noise per partition",
    "write_dataset": "write the released Parquet file",
}


@contextlib.contextmanager
def timed_stages(
    targets: dict[str, list[str]], totals: dict[str, float], results: dict[str, Any]
) -> Iterator[None]:
    """Wraps functions where their callers look them up, accumulating wall time per name and
    keeping each one's last result.

    Patching the call sites rather than copying the engine's steps keeps the breakdown true to
    whatever `run_job` does today. `targets` maps a module to the names to wrap.
    """
    patched: list[tuple[Any, str, Any]] = []
    try:
        for module_name, names in targets.items():
            module = importlib.import_module(module_name)
            for name in names:
                original = getattr(module, name)

                def wrapper(*args: Any, _fn: Any = original, _name: str = name, **kw: Any) -> Any:
                    start = time.perf_counter()
                    try:
                        results[_name] = _fn(*args, **kw)
                        return results[_name]
                    finally:
                        totals[_name] = totals.get(_name, 0.0) + time.perf_counter() - start

                setattr(module, name, wrapper)
                patched.append((module, name, original))
        yield
    finally:
        for module, name, original in reversed(patched):
            setattr(module, name, original)


def _instrumented_run(spec: JobSpec, inner: list[str], outer: list[str]) -> dict[str, Any]:
    """One run of ours with its stage functions timed; returns seconds per name plus results."""
    totals = dict.fromkeys([CONTAINER, *inner, *outer], 0.0)
    results: dict[str, Any] = {}
    targets = {ENGINE_MODULE: [CONTAINER, *inner], RELEASE_MODULE: outer}
    gc.collect()
    start = time.perf_counter()
    with timed_stages(targets, totals, results):
        run_ours(spec)
    return {"total": time.perf_counter() - start, "seconds": totals, "results": results}


def stage_breakdown(spec: JobSpec, repeat: int) -> tuple[dict[str, float], float]:
    """Where our engine spends its time (read, bound, release, publish, the rest) in the
    fastest of `repeat` instrumented runs, so that one noisy run cannot skew the split; and
    the mean exact bounded count per public partition (before noise), for the sanity check."""
    engine_module = importlib.import_module(ENGINE_MODULE)
    release_module = importlib.import_module(RELEASE_MODULE)
    inner = [n for n in INNER_STAGES if hasattr(engine_module, n)]
    outer = [n for n in OUTER_STAGES if hasattr(release_module, n)]
    best = min(
        (_instrumented_run(spec, inner, outer) for _ in range(repeat)), key=itemgetter("total")
    )
    seconds, total = best["seconds"], best["total"]
    engine = seconds[CONTAINER]
    stages = {f"{n} ({INNER_STAGES[n]})": seconds[n] for n in inner}
    stages["rest of compute_aggregates (key filter, factorize, clip)"] = engine - sum(
        seconds[n] for n in inner
    )
    stages.update({f"{n} ({OUTER_STAGES[n]})": seconds[n] for n in outer})
    stages["rest of run_job (plan, key file, discovery, manifest, fsync, rename)"] = (
        total - engine - sum(seconds[n] for n in outer)
    )
    stages["total (instrumented run)"] = total
    aggregates = best["results"][CONTAINER].aggregates[spec.name]  # the job's one query
    return stages, float(aggregates["count"].sum()) / N_TERMINALS


# ---------------------------------------------------------------------------------------------
# Reporting


def machine_facts() -> dict[str, Any]:
    """What a reader needs to compare figures across machines."""
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
    facts.update(package_versions(PACKAGES))
    return facts


def package_versions(packages: Sequence[str]) -> dict[str, str | None]:
    """Installed version of each package, None when it is not installed."""
    versions: dict[str, str | None] = {}
    for package in packages:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def _fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}x"


def _fmt_number(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


_NUMERIC = re.compile(r"^([-+]?[\d,]+(\.\d+)?x?|n/a)$")


def _numeric_columns(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[bool]:
    """Columns whose every cell is a number (or n/a): those are right-aligned."""
    return [all(_NUMERIC.match(r[i]) for r in rows) for i in range(len(headers))]


def _table_text(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Plain aligned columns for the terminal."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    numeric = _numeric_columns(headers, rows)

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if right else c.ljust(w)
            for c, w, right in zip(cells, widths, numeric, strict=True)
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _table_md(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "| " + " | ".join(headers) + " |"
    rule = "|" + "|".join("---:" if r else "---" for r in _numeric_columns(headers, rows)) + "|"
    return "\n".join([head, rule, *("| " + " | ".join(r) + " |" for r in rows)])


# (title, headers, rows): one table of a report; a table without rows is not shown.
Table = tuple[str, list[str], list[list[str]]]


def _report_text(preamble: Sequence[str], tables: Sequence[Table]) -> str:
    """A report for the terminal: the preamble, then each table under its title."""
    parts = list(preamble)
    for title, headers, rows in tables:
        if rows:
            parts += ["", title, _table_text(headers, rows)]
    return "\n".join(parts)


def _report_markdown(
    heading: str, preamble: Sequence[str], command: str, tables: Sequence[Table]
) -> list[str]:
    """A report's Markdown lines: heading, preamble, command, then each table as a section."""
    parts = [f"# {heading}", "", *preamble, "", f"Command: `{command}`"]
    for title, headers, rows in tables:
        if rows:
            parts += ["", f"## {title}", "", _table_md(headers, rows)]
    return parts


@dataclass
class Report:
    """Everything measured, renderable as text, Markdown and JSON from one set of tables."""

    args: dict[str, Any]
    machine: dict[str, Any]
    timings: list[Timing] = field(default_factory=list)
    sanity: list[dict[str, Any]] = field(default_factory=list)
    stages: dict[str, dict[str, float]] = field(default_factory=dict)

    def best(self, label: str, engine: str) -> float | None:
        for t in self.timings:
            if t.label == label and t.engine == engine:
                return t.best
        return None

    def ratios(self) -> list[dict[str, Any]]:
        out = []
        for label in dict.fromkeys(t.label for t in self.timings):
            ours = self.best(label, OURS)
            out.append(
                {
                    "label": label,
                    "rows": next(t.rows for t in self.timings if t.label == label),
                    "pipelinedp_over_ours": _ratio(self.best(label, PIPELINEDP), ours),
                    "ours_over_duckdb": _ratio(ours, self.best(label, DUCKDB)),
                }
            )
        return out

    def tables(self) -> list[Table]:
        """(title, headers, rows) of every table, in print order."""
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
                _fmt_ratio(r["pipelinedp_over_ours"]),
                _fmt_ratio(r["ours_over_duckdb"]),
            ]
            for r in self.ratios()
        ]
        sanity_rows = [
            [
                f"{s['rows']:,}",
                f"{s['ours_mean_count']:,.1f}",
                _fmt_number(s["pipelinedp_mean_count"], ",.1f"),
                f"{s['ours_bounded_exact_mean_count']:,.1f}",
                _fmt_number(s["noise_standard_error_of_mean_count"], ",.1f"),
                _fmt_number(s["ours_z"], "+.1f"),
                _fmt_number(s["pipelinedp_z"], "+.1f"),
                f"{s['duckdb_raw_mean_count']:,.1f}",
                f"{s['ours_partitions']:,}",
                _fmt_number(s["pipelinedp_partitions"], ",d"),
            ]
            for s in self.sanity
        ]
        labels = list(self.stages)
        stage_names = list(next(iter(self.stages.values()))) if self.stages else []
        stage_rows = [
            [name, *(f"{self.stages[label][name]:.3f}" for label in labels)] for name in stage_names
        ]
        machine_rows = [[k, str(v)] for k, v in self.machine.items()]
        return [
            (
                "Wall time, seconds, including reading the Parquet input",
                ["rows", "engine", "runs", "seconds", "median", "all runs (s)"],
                timing_rows,
            ),
            ("Ratios", ["rows", "PipelineDP / ours", "ours / DuckDB"], ratio_rows),
            (
                "Sanity check (not timed): mean released count per terminal; "
                "z = (released - bounded) / noise s.e., expect |z| < 3",
                [
                    "rows",
                    "ours",
                    "PipelineDP",
                    "bounded, before noise",
                    "noise s.e.",
                    "ours z",
                    "PDP z",
                    "DuckDB raw",
                    "ours partitions",
                    "PDP partitions",
                ],
                sanity_rows,
            ),
            (
                "Where our time goes (fastest of the extra instrumented runs), seconds",
                ["stage", *labels],
                stage_rows,
            ),
            ("Machine", ["fact", "value"], machine_rows),
        ]

    def preamble(self) -> list[str]:
        repeat = self.args["repeat"]
        return [
            JOB_SUMMARY,
            "Each timing is wall time including reading the Parquet input "
            f"(OS page cache warm). Ours and DuckDB: 1 warm-up, then best of {repeat}; "
            "PipelineDP: 1 run.",
            "DuckDB is non-private (no bounding, no noise): a floor, not a competitor. "
            "Raw counts are larger than bounded ones: Linf keeps at most "
            f"{LINF} transactions per customer and terminal.",
        ]

    def text(self) -> str:
        return _report_text(self.preamble(), self.tables())

    def markdown(self) -> str:
        heading = f"Local engine benchmark ({self.args['finished_at']})"
        parts = _report_markdown(heading, self.preamble(), self.args["command"], self.tables())
        return "\n".join(parts) + "\n"

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


# ---------------------------------------------------------------------------------------------
# Main


def bench_size(label: str, days: int, keys: Path, args: argparse.Namespace, report: Report) -> None:
    """All contenders on one data size; PipelineDP last so its garbage cannot slow the others."""
    data = ensure_dataset(label, days)
    spec = build_job_spec(data, keys)

    ours, _ = time_runs(
        label, data.rows, OURS, lambda: run_ours(spec), repeat=args.repeat, warmup=1
    )
    released = read_our_release(spec)

    con = duckdb.connect()
    try:
        floor, raw = time_runs(
            label, data.rows, DUCKDB, lambda: run_duckdb(con, data), repeat=args.repeat, warmup=1
        )
    finally:
        con.close()

    progress(f"{label}: {OURS} stage breakdown (best of {args.repeat} instrumented runs)")
    report.stages[label], bounded_mean_count = stage_breakdown(spec, args.repeat)

    timings = [ours]  # table order: ours, PipelineDP, DuckDB
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
    noise_se = count_noise_se(spec)
    report.sanity.append(
        {
            "label": label,
            "rows": data.rows,
            "ours_mean_count": ours_mean,
            "pipelinedp_mean_count": pdp_mean,
            "ours_bounded_exact_mean_count": bounded_mean_count,
            "noise_standard_error_of_mean_count": noise_se,
            "ours_z": _z(ours_mean, bounded_mean_count, noise_se),
            "pipelinedp_z": _z(pdp_mean, bounded_mean_count, noise_se),
            "duckdb_raw_mean_count": float(raw["n"].sum()) / N_TERMINALS,
            "ours_partitions": len(released),
            "pipelinedp_partitions": pdp_partitions,
        }
    )


def _z(released: float | None, exact: float, se: float | None) -> float | None:
    """Distance from the exact bounded mean in noise standard errors; |z| < 3 is expected."""
    if released is None or not se:
        return None
    return (released - exact) / se


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.local_engine",
        description="Time the local engine against PipelineDP LocalBackend and DuckDB.",
    )
    parser.add_argument(
        "--sizes",
        default=",".join(SIZES),
        help=f"comma list of row counts to run, from {', '.join(SIZES)} (default: all)",
    )
    parser.add_argument("--skip-pipelinedp", action="store_true", help="skip the slow reference")
    parser.add_argument(
        "--repeat", type=int, default=3, help="timed runs of ours and DuckDB (best is kept)"
    )
    args = parser.parse_args(argv)
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in args.sizes if s not in SIZES]
    if unknown or not args.sizes:
        parser.error(f"--sizes: choose from {', '.join(SIZES)}; got {args.sizes}")
    if args.repeat < 1:
        parser.error("--repeat: must be >= 1")
    return args


def _quiet_imports() -> None:
    """pipeline-dp imports apache_beam when installed, which logs a GCP warning on the root
    logger; the same filter as the CLI. Modules importing pipeline-dp are therefore imported
    lazily, after this runs."""
    logging.getLogger().addFilter(lambda record: "apitools" not in record.getMessage())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _quiet_imports()
    report = Report(
        args={
            "sizes": args.sizes,
            "repeat": args.repeat,
            "skip_pipelinedp": args.skip_pipelinedp,
            "command": " ".join(
                ["python -m bench.local_engine", *(sys.argv[1:] if argv is None else argv)]
            ),
        },
        machine=machine_facts(),
    )
    keys = write_public_keys()
    started = time.perf_counter()
    for label in args.sizes:
        bench_size(label, SIZES[label], keys, args, report)
    report.args["finished_at"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    report.args["bench_wall_s"] = round(time.perf_counter() - started, 1)

    print(report.text())
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "local_engine.md").write_text(report.markdown())
    (RESULTS_DIR / "local_engine.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    progress(f"wrote {RESULTS_DIR / 'local_engine.md'} and {RESULTS_DIR / 'local_engine.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
