"""Spark engine vs PipelineDP SparkRDDBackend vs a non-private Spark query, on the same data.

Why: the Spark engine bounds and aggregates with DataFrame operations (no Python per row), where
PipelineDP's SparkRDDBackend pickles every row through Python workers. This benchmark times, in
one run, on the local benchmark's generated Parquet files (plus a 20M-row set), and all on Spark
`local[2]` with the default driver memory:

1. `python -m dppipeline run --engine spark …`, with DPPIPELINE_SPARK_MASTER=local[2]: ours;
2. `python -m bench._pipelinedp_spark …`: PipelineDP's `DPEngine` on `SparkRDDBackend` with the
   same parameters, fed an RDD of tuples read with `spark.read.parquet`: the reference;
3. a `python -c` script: `spark.read.parquet(folder).groupBy(TERMINAL_ID).agg(count, sum, avg)`
   written as Parquet: the non-private floor.

Each program is its own process, timed from start to exit (what a user waits for: JVM start,
imports, read, work, write), with the peak resident memory of its whole process tree (Python
driver, JVM, Python workers; the sum of RSS, sampled every 0.1 s with psutil). Run with
`make bench` or `python -m bench.spark_engine [--sizes 1M,5M,20M] [--skip-pipelinedp]
[--repeat N]`. Results go to stdout and to `bench/results/spark_engine.{md,json}`; progress to
stderr; each program's output, with arrival times, to `bench/data/spark_logs/`.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import psutil

from bench._report import (
    ProcessReport,
    bench_parser,
    machine_facts_with,
    parse_bench_args,
    start_args,
)
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
    PRIVACY_UNIT,
    VALUE,
    Dataset,
    Table,
    _fmt_number,
    _fmt_ratio,
    _ratio,
    build_job_spec,
    count_noise_se,
    ensure_dataset,
    progress,
    write_public_keys,
)

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = DATA_DIR / "spark_logs"
# Ours records each release in a budget ledger (by default ./state/ledger.sqlite, shared with the
# project) and returns an already published release without recomputing it. The benchmark keeps
# its own ledger and asks for a new release every run, so that every run does the work.
LEDGER = DATA_DIR / "spark_ledger.sqlite"

# Row-count label -> days generated at 25,000 transactions a day (1M and 5M: the local benchmark's).
SIZES: dict[str, int] = {"1M": 40, "5M": 200, "20M": 800}
TARGET_SIZES = ("5M", "20M")  # where ours must stay within TARGET x the non-private baseline
TARGET = 1.5
MASTER = "local[2]"
SAMPLE_INTERVAL_S = 0.1
HEARTBEAT_S = 30.0
# The box is shared: a run during which the rest of the machine used more than IDLE_CORES cores
# on average is "disturbed", discarded and run again (up to --retries times); before each run the
# benchmark waits (up to --idle-wait seconds) until the rest of the machine is that quiet,
# measured over IDLE_PROBE_S seconds with nothing of the benchmark running.
IDLE_CORES = 0.1
IDLE_PROBE_S = 2.0

OURS = "dppipeline spark"
PIPELINEDP = "PipelineDP SparkRDDBackend"
BASELINE = "Spark groupBy (non-private)"
TUNED = "Spark groupBy, our JVM and listing settings"
# What ours sets that would also speed the baseline: its JVM's garbage collector and listing the
# input on the driver. The same program with these shows how much of the gap is bounding alone.
TUNED_SUBMIT_ARGS = (
    "--driver-java-options -XX:+UseParallelGC "
    "--conf spark.sql.sources.parallelPartitionDiscovery.threshold=100000 pyspark-shell"
)
PACKAGES = ("pyspark", "py4j", "pipeline-dp", "python-dp", "apache-beam", "pyarrow", "pandas")

# The non-private floor, as a user would write it: plain session (Spark defaults), the folder read
# with partition discovery, one aggregation, Parquet out. Run with `python -c`, so that it imports
# nothing but pyspark. Markers on stderr are timestamped by the benchmark.
BASELINE_PROGRAM = f"""\
import sys
from pyspark.sql import SparkSession, functions as F
source, target, master = sys.argv[1:4]
spark = SparkSession.builder.master(master).appName("baseline-bench").getOrCreate()
spark.sparkContext.setLogLevel("WARN")
print("bench-marker: session ready", file=sys.stderr, flush=True)
(
    spark.read.parquet(source)
    .groupBy("{KEY}")
    .agg(
        F.count(F.lit(1)).alias("count"),
        F.sum("{VALUE}").alias("sum"),
        F.avg("{VALUE}").alias("mean"),
    )
    .write.mode("overwrite")
    .parquet(target)
)
print("bench-marker: output written", file=sys.stderr, flush=True)
"""

# Output lines that mark the end of each phase, per program: (phase, pattern). "ready" is when the
# SparkSession is usable (ours: the engine starts, after planning and with the JVM started in the
# background meanwhile), "done" when the output is written; the rest until exit is shutdown.
MARKERS: dict[str, dict[str, re.Pattern[str]]] = {
    OURS: {
        "ready": re.compile(r"^\[spark\]\s+[\d.]+s Spark \S+ on "),
        "done": re.compile(r"^\[spark\] release written to "),
    },
    PIPELINEDP: {
        "ready": re.compile(r"^bench-marker: session ready"),
        "done": re.compile(r"^bench-marker: output written"),
    },
    BASELINE: {
        "ready": re.compile(r"^bench-marker: session ready"),
        "done": re.compile(r"^bench-marker: output written"),
    },
}
MARKERS[TUNED] = MARKERS[BASELINE]
PROGRAMS = (OURS, PIPELINEDP, BASELINE, TUNED)  # the order of the tables


# ---------------------------------------------------------------------------------------------
# Commands


def ours_output(data: Dataset) -> Path:
    return DATA_DIR / f"spark_release_{data.label}"


def pipelinedp_output(data: Dataset) -> Path:
    return DATA_DIR / f"spark_pipelinedp_{data.label}.parquet"


def baseline_output(data: Dataset) -> Path:
    return DATA_DIR / f"spark_baseline_{data.label}"


# The job's parameters as flags, in the order both ours and PipelineDP's programs are given them:
# the columns first, then (after what differs) the budget and the bounds.
COLUMN_FLAGS = ("--privacy-unit", PRIVACY_UNIT, "--partition-key", KEY, "--value", VALUE)
BOUND_FLAGS = (
    *("--epsilon", f"{EPSILON:g}", "--delta", f"{DELTA:g}"),
    *("--max-partitions-contributed", str(L0), "--max-contributions-per-partition", str(LINF)),
    *("--min-value", f"{MIN_VALUE:g}", "--max-value", f"{MAX_VALUE:g}"),
)


def ours_command(
    engine: str, data: Dataset, keys: Path, output: Path, ledger: Path, *options: str
) -> list[str]:
    """`dppipeline run` of the job on `engine`, with its own ledger and a new release each time;
    `options` last (Beam pipeline options, passed through)."""
    return [
        *(sys.executable, "-m", "dppipeline", "run", "--engine", engine),
        *("--input", str(data.folder), "--format", "parquet", "--output", str(output)),
        *COLUMN_FLAGS,
        *("--metrics", "count,sum,mean", "--noise", "laplace"),
        *BOUND_FLAGS,
        *("--public-partitions", str(keys), "--overwrite"),
        *("--ledger", f"sqlite:///{ledger}", "--new-release"),
        *options,
    ]


def pipelinedp_command(module: str, data: Dataset, output: Path, *options: str) -> list[str]:
    """PipelineDP's program `module` on the job; `options` first (the Spark master)."""
    return [
        *(sys.executable, "-m", module, *options),
        *("--input", str(data.folder), "--output", str(output)),
        *COLUMN_FLAGS,
        *("--partitions", str(N_TERMINALS)),
        *BOUND_FLAGS,
    ]


def commands(data: Dataset, keys: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Program -> (argv, extra environment). Every program runs this interpreter from the project
    root, with PYSPARK_PYTHON set to it (ours sets that default itself)."""
    python = sys.executable
    ours = ours_command("spark", data, keys, ours_output(data), LEDGER)
    pipelinedp = pipelinedp_command(
        "bench._pipelinedp_spark", data, pipelinedp_output(data), "--master", MASTER
    )
    baseline = [
        python,
        "-c",
        BASELINE_PROGRAM,
        str(data.folder),
        str(baseline_output(data)),
        MASTER,
    ]
    return {
        OURS: (ours, {"DPPIPELINE_SPARK_MASTER": MASTER}),
        PIPELINEDP: (pipelinedp, {}),
        BASELINE: (baseline, {}),
        TUNED: (baseline, {"PYSPARK_SUBMIT_ARGS": TUNED_SUBMIT_ARGS}),
    }


def shown(argv: Sequence[str], env: dict[str, str]) -> str:
    """A command as a user would type it (the baseline's program text abbreviated)."""
    words = ["python", *("<program>" if "\n" in w else w for w in argv[1:])]
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(words)])


# ---------------------------------------------------------------------------------------------
# Measuring one process


def _busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting for I/O) since boot."""
    times = psutil.cpu_times()
    return float(times.user + times.nice + times.system + times.irq + times.softirq + times.steal)


class TreeSampler(threading.Thread):
    """Samples (psutil) the summed RSS of a process and all its descendants until stopped.

    The sum counts pages shared between processes (forked Python workers) once per process: an
    upper bound of the tree's footprint, as `ps` would add it up."""

    def __init__(self, root: int):
        super().__init__(daemon=True)
        self.root = psutil.Process(root)
        self.peak_bytes = 0
        self.largest: tuple[int, str] = (0, "")  # most RSS of any one process, and its name
        self.seen: dict[int, psutil.Process] = {}
        self.cpu: dict[int, float] = {}  # pid -> CPU seconds at its last sample
        self._stop_event = threading.Event()

    def sample(self) -> None:
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        total = 0
        for process in tree:
            try:
                with process.oneshot():
                    rss, cpu = process.memory_info().rss, process.cpu_times()
                    name = process.name()
            except psutil.NoSuchProcess:  # gone meanwhile
                continue
            self.seen.setdefault(process.pid, process)
            self.cpu[process.pid] = cpu.user + cpu.system
            total += rss
            if rss > self.largest[0]:
                self.largest = (rss, name)
        self.peak_bytes = max(self.peak_bytes, total)

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(SAMPLE_INTERVAL_S)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def wait_gone(self, timeout: float) -> float:
        """Seconds until every process of the tree has ended (the JVM outlives the Python driver
        by its shutdown), so that the next program starts on an idle machine."""
        start = time.perf_counter()
        psutil.wait_procs(list(self.seen.values()), timeout=timeout)
        return time.perf_counter() - start


@dataclass
class Run:
    """One process: wall time from start to exit, peak memory, phase marks, its log."""

    seconds: float
    peak_mb: float
    largest_mb: float
    largest_process: str
    marks: dict[str, float]
    tree_gone_s: float
    cpu_s: float  # CPU seconds used by the program's process tree (sampled)
    others_cpu_s: float  # CPU seconds the rest of the machine used meanwhile: disturbance
    loadavg_1m: float  # at start
    log: str
    waited_for_idle_s: float = 0.0

    @property
    def others_cores(self) -> float:
        return self.others_cpu_s / self.seconds

    @property
    def disturbed(self) -> bool:
        return self.others_cores > IDLE_CORES

    def phases(self) -> dict[str, float | None]:
        """Start -> session ready -> output written -> exit, in seconds per phase."""
        ready, done = self.marks.get("ready"), self.marks.get("done")
        return {
            "start": ready,
            "work": None if ready is None or done is None else done - ready,
            "exit": None if done is None else self.seconds - done,
        }


class ProgramError(RuntimeError):
    pass


def measure(
    argv: list[str],
    env: dict[str, str],
    log_path: Path,
    markers: dict[str, re.Pattern[str]],
    what: str,
) -> Run:
    """Runs one program; its merged stdout and stderr go to `log_path`, each line stamped with its
    arrival time; a heartbeat goes to stderr every HEARTBEAT_S seconds."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    marks: dict[str, float] = {}
    with log_path.open("w") as log:
        log.write(f"$ {shown(argv, env)}\n")
        log.flush()
        load = os.getloadavg()[0]
        busy = _busy_cpu_seconds()
        start = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        sampler = TreeSampler(proc.pid)
        sampler.start()

        def read_output() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                at = time.perf_counter() - start
                log.write(f"[{at:8.3f}] {line}")
                for name, pattern in markers.items():
                    if name not in marks and pattern.search(line):
                        marks[name] = at

        reader = threading.Thread(target=read_output, daemon=True)
        reader.start()
        while True:
            try:
                returncode = proc.wait(timeout=HEARTBEAT_S)
                break
            except subprocess.TimeoutExpired:
                progress(f"{what}: still running, {time.perf_counter() - start:.0f} s elapsed")
        seconds = time.perf_counter() - start
        busy = _busy_cpu_seconds() - busy
        sampler.stop()
        gone = sampler.wait_gone(timeout=60.0)
        reader.join(timeout=10.0)
    missing = [name for name in markers if name not in marks]
    if returncode != 0 or missing:
        # A missing mark means the program did not do the work (or its output changed).
        why = f"exit code {returncode}" + (f", no {'/'.join(missing)} line" if missing else "")
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
        raise ProgramError(f"{what}: {why}; end of {log_path}:\n{tail}")
    return Run(
        seconds=seconds,
        peak_mb=sampler.peak_bytes / 2**20,
        largest_mb=sampler.largest[0] / 2**20,
        largest_process=sampler.largest[1],
        marks=marks,
        tree_gone_s=gone,
        cpu_s=sum(sampler.cpu.values()),
        others_cpu_s=max(0.0, busy - sum(sampler.cpu.values())),
        loadavg_1m=load,
        log=str(log_path.relative_to(ROOT)),
    )


@dataclass
class Timing:
    """All runs of one program at one size; the tables report the median."""

    label: str
    rows: int
    program: str
    command: str
    runs: list[Run] = field(default_factory=list)
    discarded: list[Run] = field(default_factory=list)  # disturbed runs that were run again

    @property
    def median(self) -> float:
        return statistics.median(r.seconds for r in self.runs)

    @property
    def peak_mb(self) -> float:
        return max(r.peak_mb for r in self.runs)

    @property
    def largest_mb(self) -> float:
        return max(r.largest_mb for r in self.runs)

    def median_run(self) -> Run:
        """The run whose time is closest to the median (its phases are shown)."""
        return min(self.runs, key=lambda r: abs(r.seconds - self.median))


# ---------------------------------------------------------------------------------------------
# Reading the outputs back (not timed)


def mean_count(path: Path) -> tuple[float, int]:
    frame = pd.read_parquet(path)
    return float(frame["count"].mean()), len(frame)


def bounded_reference(data: Dataset, keys: Path) -> tuple[float | None, float | None]:
    """Mean exact bounded count per public terminal (before noise) from one local-engine
    aggregation of the same data, and the standard error noise alone gives a released mean."""
    try:
        from dppipeline.core.tasks import plan_tasks
        from dppipeline.engines.base import ReleaseJob
        from dppipeline.engines.local.engine import compute_aggregates
        from dppipeline.inputs.files import discover_partitions
        from dppipeline.orchestration.runner import make_plan

        spec = build_job_spec(data, keys)
        days = discover_partitions(data.folder, "parquet")
        # The job's tasks, public keys read from `keys` as a run reads them.
        job = plan_tasks(spec, make_plan(spec), days)
        result = compute_aggregates(
            job.tasks,
            days,
            fmt=spec.input.format,
            unit=spec.privacy_unit,
            max_rejected_fraction=spec.input.max_rejected_fraction,
            quarantine=DATA_DIR / "spark_quarantine",
            salt=ReleaseJob.sampling_salt(),
        )
        aggregates = result.aggregates[spec.name]  # the job's one query
        return float(aggregates["count"].sum()) / N_TERMINALS, count_noise_se(spec)
    except Exception as exc:  # the local engine is refactored independently: do not lose the run
        progress(f"{data.label}: no bounded reference ({type(exc).__name__}: {exc})")
        return None, None


def _z(released: float | None, exact: float | None, se: float | None) -> float | None:
    if released is None or exact is None or not se:
        return None
    return (released - exact) / se


# ---------------------------------------------------------------------------------------------
# Reporting (the shared parts: bench._report)


def java_version() -> str | None:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    except OSError:
        return None
    lines = (out.stderr or out.stdout).splitlines()
    return lines[0].strip() if lines else None


def spark_machine_facts() -> dict[str, Any]:
    # polars, duckdb, numpy: the local benchmark's, unused here
    facts = machine_facts_with(PACKAGES, unused=("polars", "duckdb", "numpy"))
    facts["java"] = java_version()
    facts["spark_master"] = MASTER
    facts["spark_driver_memory"] = "default (1g)"
    return facts


def _target_text(label: str, ratio: float | None, ours: float, floor: float) -> str:
    if label not in TARGET_SIZES or ratio is None:
        return "-"
    if ratio <= TARGET:
        return "met"
    return f"missed by {ratio - TARGET:.2f}x ({ours - TARGET * floor:.1f} s)"


class Report(ProcessReport):
    NAME = "spark_engine"
    TITLE = "Spark engine benchmark"
    DAYS = SIZES
    PHASES = "start = process start to SparkSession ready; work = read, compute, write"

    def ratios(self) -> list[dict[str, Any]]:
        out = []
        for label in self.labels():
            ours, pdp, floor, tuned = (self.timing(label, p) for p in PROGRAMS)
            assert ours is not None and floor is not None
            ratio = _ratio(ours.median, floor.median)
            out.append(
                {
                    "label": label,
                    "rows": ours.rows,
                    "ours_over_baseline": ratio,
                    "target": TARGET if label in TARGET_SIZES else None,
                    "target_verdict": _target_text(label, ratio, ours.median, floor.median),
                    "ours_over_tuned_baseline": _ratio(
                        ours.median, tuned.median if tuned else None
                    ),
                    "pipelinedp_over_ours": _ratio(pdp.median if pdp else None, ours.median),
                    "ours_peak_over_baseline_peak": _ratio(ours.peak_mb, floor.peak_mb),
                }
            )
        return out

    def timing_tables(self) -> list[Table]:
        rows = [
            [
                f"{t.rows:,}",
                t.program,
                f"median of {len(t.runs)}" if len(t.runs) > 1 else "1 run",
                f"{t.median:.1f}",
                ", ".join(f"{r.seconds:.1f}{'*' if r.disturbed else ''}" for r in t.runs),
                f"{t.peak_mb:,.0f}",
                f"{t.largest_mb:,.0f}",
            ]
            for t in self.timings
        ]
        headers = ["rows", "program", "runs", "seconds", "all runs (s)"]
        headers += ["peak MB (tree)", "largest process MB"]
        title = "Wall time of each process, start to exit (seconds), and peak memory (MB)"
        return [(title, headers, rows)]

    def ratio_table(self) -> Table:
        rows = [
            [
                f"{r['rows']:,}",
                _fmt_number(r["ours_over_baseline"], ".2f") + "x",
                r["target_verdict"],
                _fmt_number(r["ours_over_tuned_baseline"], ".2f") + "x",
                _fmt_ratio(r["pipelinedp_over_ours"]),
                _fmt_ratio(r["ours_peak_over_baseline_peak"]),
            ]
            for r in self.ratios()
        ]
        return (
            f"Ratios (median seconds; target: ours / baseline <= {TARGET}x at "
            f"{', '.join(TARGET_SIZES)})",
            [
                "rows",
                "ours / baseline",
                "target",
                "ours / baseline on our settings",
                "PipelineDP / ours",
                "ours / baseline MB",
            ],
            rows,
        )

    def sanity_table(self) -> Table:
        rows = [
            [
                f"{s['rows']:,}",
                f"{s['ours_mean_count']:,.1f}",
                _fmt_number(s["pipelinedp_mean_count"], ",.1f"),
                _fmt_number(s["bounded_exact_mean_count"], ",.1f"),
                _fmt_number(s["noise_standard_error_of_mean_count"], ",.1f"),
                _fmt_number(s["ours_z"], "+.1f"),
                _fmt_number(s["pipelinedp_z"], "+.1f"),
                f"{s['baseline_raw_mean_count']:,.1f}",
                f"{s['ours_partitions']:,}",
                _fmt_number(s["pipelinedp_partitions"], ",d"),
            ]
            for s in self.sanity
        ]
        headers = ["rows", "ours", "PipelineDP", "bounded, before noise", "noise s.e.", "ours z"]
        headers += ["PDP z", "baseline raw", "ours partitions", "PDP partitions"]
        return (
            "Sanity check (not timed): mean released count per terminal; bounded = local "
            "engine's exact bounded mean before noise; z = (released - bounded) / noise s.e.",
            headers,
            rows,
        )

    def how_run(self) -> list[str]:
        return [
            f"Each program is its own process on Spark {MASTER}, default driver memory; seconds "
            "are wall time from process start to exit (JVM start, imports, read, compute, write), "
            f"median of {self.args['repeat']} run(s) after one untimed warm-up process.",
            "Peak MB: the highest sum of RSS over the process tree (Python driver, JVM, Python "
            f"workers), sampled every {SAMPLE_INTERVAL_S:g} s; shared pages count once per "
            "process. Largest process MB: the most any one process held (the JVM, usually).",
        ]

    def engine_parameters(self) -> dict[str, Any]:
        return {"spark_master": MASTER}

    def other_json(self) -> dict[str, Any]:
        return {"baseline_program": BASELINE_PROGRAM}

    def commands_section(self) -> list[str]:
        lines = ["## Commands (1M shown; the baseline's `<program>` is in the JSON)", ""]
        for program in dict.fromkeys(t.program for t in self.timings):
            timing = next(t for t in self.timings if t.program == program)
            lines.append(f"- {program}: `{timing.command}`")
        return lines


# ---------------------------------------------------------------------------------------------
# Main


def others_cores(seconds: float = IDLE_PROBE_S) -> float:
    """Cores the rest of the machine keeps busy, over `seconds` (nothing of ours runs)."""
    busy = _busy_cpu_seconds()
    time.sleep(seconds)
    return (_busy_cpu_seconds() - busy) / seconds


def wait_for_idle(max_wait: float) -> float:
    """Waits until the rest of the machine uses under IDLE_CORES cores, at most `max_wait`
    seconds; returns the seconds waited."""
    start, noted = time.perf_counter(), -HEARTBEAT_S
    while True:
        cores = others_cores()
        waited = time.perf_counter() - start
        if cores < IDLE_CORES:
            return waited
        if waited >= max_wait:
            progress(f"machine still busy ({cores:.2f} cores used) after {waited:.0f} s: going on")
            return waited
        if waited - noted >= HEARTBEAT_S:
            progress(f"machine busy ({cores:.2f} cores used by others): waiting ({waited:.0f} s)")
            noted = waited


def log_stem(log_dir: Path, label: str, program: str, i: int) -> Path:
    """Where run `i` (from 0) of a program at a size logs, without `_retry<n>.log`."""
    slug = re.sub(r"[^a-z0-9]+", "_", program.lower()).strip("_")
    return log_dir / f"{label}_{slug}_{i + 1}"


def run_timed(
    argv: list[str],
    env: dict[str, str],
    what: str,
    log: Path,
    markers: dict[str, re.Pattern[str]],
    args: argparse.Namespace,
    timing: Timing,
    prepare: Callable[[], None] | None = None,
    seconds_format: str = ".1f",
) -> None:
    """One timed run, after waiting for an idle machine, run again (at most --retries times)
    while others disturbed it; a disturbed run kept for lack of retries is marked in the tables.
    `prepare` runs before each attempt; `seconds_format` is that of the progress line."""
    for attempt in range(args.retries + 1):
        if prepare is not None:
            prepare()
        waited = wait_for_idle(args.idle_wait)
        progress(f"{what}: started (load {os.getloadavg()[0]:.2f})")
        retry = f"_retry{attempt}" if attempt else ""
        run = measure(argv, env, log.with_name(f"{log.name}{retry}.log"), markers, what)
        run.waited_for_idle_s = waited
        progress(
            f"{what}: {run.seconds:{seconds_format}} s, peak {run.peak_mb:,.0f} MB, others used "
            f"{run.others_cores:.2f} cores (tree gone {run.tree_gone_s:.1f} s after exit)"
        )
        if not run.disturbed or attempt == args.retries:
            break
        timing.discarded.append(run)
        progress(f"{what}: disturbed by other work: discarded, running it again")
    timing.runs.append(run)


def warm_page_cache(data: Dataset) -> None:
    """Reads every input file once, so the first program timed does not pay for the disk."""
    for path in data.files:
        with path.open("rb") as f:
            while f.read(1 << 20):
                pass


def bench_size(label: str, keys: Path, args: argparse.Namespace, report: Report) -> None:
    """All programs on one size, interleaved per repetition; PipelineDP last in each round."""
    data = ensure_dataset(label, SIZES[label])
    warm_page_cache(data)
    programs = [OURS, BASELINE, TUNED] + ([] if args.skip_pipelinedp else [PIPELINEDP])
    cmds = commands(data, keys)
    timings = {p: Timing(label, data.rows, p, shown(*cmds[p])) for p in PROGRAMS}
    for i in range(args.repeat):
        for program in programs:
            argv, env = cmds[program]
            what = f"{label}: {program} run {i + 1}/{args.repeat}"
            log = log_stem(LOG_DIR, label, program, i)
            run_timed(argv, env, what, log, MARKERS[program], args, timings[program])
    report.timings.extend(timings[p] for p in PROGRAMS if timings[p].runs)

    progress(f"{label}: reading the outputs back; bounded reference on the local engine")
    ours_mean, ours_partitions = mean_count(ours_output(data) / build_job_spec(data, keys).name)
    pdp_mean, pdp_partitions = (
        (None, None) if args.skip_pipelinedp else mean_count(pipelinedp_output(data))
    )
    raw = pd.read_parquet(baseline_output(data))
    bounded, noise_se = bounded_reference(data, keys)
    report.sanity.append(
        {
            "label": label,
            "rows": data.rows,
            "ours_mean_count": ours_mean,
            "pipelinedp_mean_count": pdp_mean,
            "bounded_exact_mean_count": bounded,
            "noise_standard_error_of_mean_count": noise_se,
            "ours_z": _z(ours_mean, bounded, noise_se),
            "pipelinedp_z": _z(pdp_mean, bounded, noise_se),
            "baseline_raw_mean_count": float(raw["count"].sum()) / N_TERMINALS,
            "ours_partitions": ours_partitions,
            "pipelinedp_partitions": pdp_partitions,
        }
    )
    print(
        f"sanity {label}: mean released count per terminal: ours {ours_mean:,.1f}, PipelineDP "
        f"{_fmt_number(pdp_mean, ',.1f')} (bounded before noise {_fmt_number(bounded, ',.1f')}, "
        f"noise s.e. {_fmt_number(noise_se, ',.1f')}; raw {float(raw['count'].mean()):,.1f})",
        flush=True,
    )


def untimed(
    command: tuple[list[str], dict[str, str]],
    program: str,
    label: str,
    log_dir: Path,
    markers: dict[str, re.Pattern[str]],
) -> None:
    """One untimed process of a program (a warm-up), logged to `log_dir`/warmup.log."""
    progress(f"warm-up: one untimed {program} process on {label}")
    measure(*command, log_dir / "warmup.log", markers, "warm-up")


def warm_up(keys: Path, label: str) -> None:
    """One untimed baseline process: JVM jars and Python modules into the OS page cache."""
    data = ensure_dataset(label, SIZES[label])
    untimed(commands(data, keys)[BASELINE], BASELINE, label, LOG_DIR, MARKERS[BASELINE])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = bench_parser(
        "python -m bench.spark_engine",
        "Time the Spark engine against PipelineDP SparkRDDBackend and a non-private Spark query, "
        f"each as its own process on {MASTER}.",
        SIZES,
        default_sizes=SIZES,
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of each program per size (median is kept)"
    )
    return parse_bench_args(parser, argv, SIZES, IDLE_CORES)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = Report(
        args=start_args(args, "python -m bench.spark_engine", argv, IDLE_CORES),
        machine=spark_machine_facts(),
    )
    keys = write_public_keys()
    started = time.perf_counter()
    try:
        warm_up(keys, args.sizes[0])
        for label in args.sizes:
            bench_size(label, keys, args, report)
    except ProgramError as exc:
        print(f"bench.spark_engine: error: {exc}", file=sys.stderr)
        return 1
    report.finish(started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
