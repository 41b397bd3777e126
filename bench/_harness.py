"""What the three benchmarks share: the job and its generated data, and timing contenders, each
run as its own process (wall time, and memory and CPU of its process tree read with psutil).

A benchmark declares its contenders as `Program`s (command, environment, progress markers,
output) and hands them to `run_programs`; `bench._report` turns what was measured into tables.
The benchmark code never draws noise: released values come from the programs it runs (PyDP,
pipeline-dp).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
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
import pyarrow.parquet as pq

from dppipeline.spec.model import JobSpec, build_spec
from dppipeline.synthetic.transactions import generate

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "bench" / "data"
RESULTS_DIR = ROOT / "bench" / "results"
KEYS_FILE = DATA_DIR / "public_terminals.csv"
MARKER = "_generated.json"  # skipped by the readers: they ignore names starting with "_"

# Row-count label -> days generated at 25,000 transactions a day.
DAYS: dict[str, int] = {"1M": 40, "5M": 200, "20M": 800, "100M": 4000}
SIZE_ORDER: tuple[str, ...] = tuple(DAYS)  # smallest first


def up_to(found: dict[str, Any], label: str, largest: dict[str, str]) -> dict[str, Any]:
    """The programs of `found` that run at size `label`: those `largest` names stop above the
    size it gives them (too slow or too large for this machine there)."""
    return {
        name: program
        for name, program in found.items()
        if name not in largest or SIZE_ORDER.index(label) <= SIZE_ORDER.index(largest[name])
    }


POPULATION: dict[str, int] = {"customers": 5000, "terminals": 1000, "tx_per_day": 25000, "seed": 0}
PRIVACY_UNIT, KEY, VALUE = "CUSTOMER_ID", "TERMINAL_ID", "TX_AMOUNT"
EPSILON, DELTA = 1.0, 1e-6
L0, LINF = 20, 10
MIN_VALUE, MAX_VALUE = 0.0, 200.0
N_TERMINALS = POPULATION["terminals"]
# The job's parameters as the JSON results record them, after the population.
JOB_PARAMETERS: dict[str, object] = {
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

SAMPLE_INTERVAL_S = 0.1
HEARTBEAT_S = 30.0
# The box is shared: a run during which the rest of the machine used more than IDLE_CORES cores
# on average is "disturbed", discarded and run again (up to --retries times); before each run the
# benchmark waits (up to --idle-wait seconds) until the rest of the machine is that quiet,
# measured over IDLE_PROBE_S seconds with nothing of the benchmark running.
IDLE_CORES = 0.1
IDLE_PROBE_S = 2.0


def progress(line: str) -> None:
    """Progress goes to stderr so that stdout holds only the result tables."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The job and its data


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


def ensure_dataset(label: str) -> Dataset:
    """Generates `bench/data/rows_<label>` once; reuses it while its row count still matches.

    A marker written after generation records the arguments and the row count, so a partial or
    differently sized folder (an interrupted run, other arguments) is regenerated, not timed.
    """
    days = DAYS[label]
    folder = DATA_DIR / f"rows_{label}"
    wanted = {**POPULATION, "days": days, "format": "parquet"}
    marker = folder / MARKER
    if marker.is_file():
        recorded = json.loads(marker.read_text())
        files = _parquet_files(folder)
        # Row count from the Parquet footers only: cheap enough to check on every run.
        rows = sum(pq.ParquetFile(path).metadata.num_rows for path in files)
        if recorded.get("params") == wanted and len(files) == days and rows == recorded["rows"]:
            progress(f"{label}: reusing {folder} ({rows:,} rows)")
            return Dataset(label, folder, rows, files)
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


def noise_stddevs(spec: JobSpec) -> tuple[float | None, float | None]:
    """The noise standard deviation of one released count and one released sum: the error a
    release would have if bounding were exact and only noise were added."""
    from dppipeline.lifecycle.runner import make_plan  # imports pipeline_dp: see _report

    plan = make_plan(spec).queries[0].plan  # the job's one query
    return plan.metric_noise_stddev("count"), plan.metric_noise_stddev("sum")


@dataclass(frozen=True)
class BoundedReference:
    """The exact bounded count and sum per public terminal, before noise, of the job's default
    bounding (the expectation of a sampled bounding too), and the noise of one release."""

    per_terminal: pd.DataFrame  # KEY, count, sum
    count_noise_sd: float | None
    sum_noise_sd: float | None

    @property
    def mean_count(self) -> float:
        return float(self.per_terminal["count"].sum()) / N_TERMINALS

    @property
    def count_noise_se(self) -> float | None:
        """Standard error noise alone gives the mean released count over the public terminals:
        released means within a few of these of the bounded one are consistent."""
        sd = self.count_noise_sd
        return None if sd is None else sd / math.sqrt(N_TERMINALS)


def bounded_reference(data: Dataset, keys: Path) -> BoundedReference | None:
    """The exact bounded values per public terminal from one local-engine aggregation of the
    same data with the job's own bounding, and the noise of one release."""
    try:
        from dppipeline.core.tasks import plan_tasks, read_schema
        from dppipeline.engines.kernel.sampling import new_salt
        from dppipeline.engines.local.engine import compute_aggregates
        from dppipeline.inputs.files import discover_partitions
        from dppipeline.lifecycle.public_keys import read_key_files
        from dppipeline.lifecycle.runner import make_plan

        spec = build_job_spec(data, keys)
        days = discover_partitions(data.folder, "parquet")
        job = plan_tasks(spec, make_plan(spec), days, read_key_files(spec))  # as a run reads
        result = compute_aggregates(
            job.tasks,
            days,
            schema=read_schema(spec, job.tasks),
            fmt=spec.input.format,
            unit=spec.privacy_unit,
            max_rejected_fraction=spec.input.max_rejected_fraction,
            quarantine=DATA_DIR / "bench_quarantine",
            salt=new_salt(),  # unused by scaled bounding; a sampled one draws it as a run does
        )
        aggregates = result.aggregates[spec.name]  # the job's one query
        frame = pd.DataFrame(
            {KEY: list(aggregates[KEY]), "count": aggregates["count"], "sum": aggregates["sum"]}
        )
        return BoundedReference(frame, *noise_stddevs(spec))
    except Exception as exc:  # the local engine is refactored independently: do not lose the run
        progress(f"{data.label}: no bounded reference ({type(exc).__name__}: {exc})")
        return None


def rmse(released: pd.DataFrame, reference: BoundedReference, metric: str) -> float | None:
    """Root mean squared error of a released metric per public terminal against the exact
    bounded value; a terminal missing from the release counts as released 0."""
    exact = reference.per_terminal.set_index(KEY)[metric].astype(float)
    got = released.set_index(released[KEY].astype(exact.index.dtype))[metric].astype(float)
    error = got.reindex(exact.index).fillna(0.0) - exact
    return float(math.sqrt(float((error**2).mean())))


def z_score(released: float | None, exact: float | None, se: float | None) -> float | None:
    """Distance from the exact bounded mean in noise standard errors; |z| < 3 is expected."""
    if released is None or exact is None or not se:
        return None
    return (released - exact) / se


# The job's parameters as flags, in the order both ours and PipelineDP's programs are given them:
# the columns first, then (after what differs) the budget and the bounds.
COLUMN_FLAGS = ("--privacy-unit", PRIVACY_UNIT, "--partition-key", KEY, "--value", VALUE)
BOUND_FLAGS = (
    *("--epsilon", f"{EPSILON:g}", "--delta", f"{DELTA:g}"),
    *("--max-partitions-contributed", str(L0), "--max-contributions-per-partition", str(LINF)),
    *("--min-value", f"{MIN_VALUE:g}", "--max-value", f"{MAX_VALUE:g}"),
)


def bench_ledger(engine: str, label: str) -> Path:
    """A benchmark's own ledger (not the project's: see ours_command), one per engine and size:
    the sizes share their first days' files, and a ledger holds data charged in one scope to
    that scope (rows_5M's first 40 days are rows_1M's, charged in scope rows_1M)."""
    return DATA_DIR / f"{engine}_ledger_{label}.sqlite"


def ours_command(
    engine: str, data: Dataset, keys: Path, output: Path, ledger: Path, *options: str
) -> list[str]:
    """`dppipeline run` of the job on `engine`, with the benchmark's own ledger and a new release
    each time (else a second run returns the published release without computing it); `options`
    last (Beam pipeline options, passed through)."""
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


BANK_JOB = ROOT / "jobs" / "configs" / "bank_partner_release.yaml"


def bank_job_command(
    engine: str, data: Dataset, output: Path, ledger: Path, *options: str
) -> list[str]:
    """`dppipeline run` of the bank's 10-query job (`jobs/configs/bank_partner_release.yaml`)
    on the same data: what several queries cost against the one-query job."""
    return [
        *(sys.executable, "-m", "dppipeline", "run", "--engine", engine),
        *("--config", str(BANK_JOB), "--input", str(data.folder), "--output", str(output)),
        *("--overwrite", "--ledger", f"sqlite:///{ledger}", "--new-release"),
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


# ---------------------------------------------------------------------------------------------
# One process, measured


@dataclass(frozen=True)
class Program:
    """A contender: a command run as its own process from the project root, the output lines
    that end its phases ("ready": session or pipeline built, "done": output written), and the
    Parquet file or folder its per-terminal counts are read back from (not timed)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    markers: dict[str, re.Pattern[str]]
    output: Path
    repeat: int
    clear_output: bool = False  # Beam's sinks name shards -NNNNN-of-MMMMM: old ones could remain

    @property
    def shown(self) -> str:
        """The command as a user would type it (a `python -c` program text abbreviated)."""
        words = ["python", *("<program>" if "\n" in w else w for w in self.argv[1:])]
        env = (f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return " ".join([*env, shlex.join(words)])


@dataclass
class Run:
    """One process: wall time from start to exit, peak memory, phase marks, its log."""

    seconds: float
    peak_mb: float  # highest sampled sum of RSS over the process tree
    largest_mb: float  # most RSS any one process of the tree held
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
        """Start -> ready -> output written -> exit, in seconds per phase."""
        ready, done = self.marks.get("ready"), self.marks.get("done")
        return {
            "start": ready,
            "work": None if ready is None or done is None else done - ready,
            "exit": None if done is None else self.seconds - done,
        }


@dataclass
class Timing:
    """All runs of one program at one size; the error of a program that failed (it is then
    not run again at that size)."""

    label: str
    rows: int
    program: str
    command: str
    runs: list[Run] = field(default_factory=list)
    discarded: list[Run] = field(default_factory=list)  # disturbed runs that were run again
    failure: str | None = None

    @property
    def best(self) -> float:
        return min(r.seconds for r in self.runs)

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


class ProgramError(RuntimeError):
    pass


def _busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting for I/O)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + t.steal


class TreeSampler(threading.Thread):
    """Samples the summed RSS and the CPU time of a process and its descendants until stopped.

    The sum counts pages shared between processes (forked Python workers) once per process: an
    upper bound of the tree's footprint, as `ps` would add it up. (`wait4`'s ru_maxrss gives the
    largest single process only, and misses the JVM, which outlives its parent.)"""

    def __init__(self, root: psutil.Process):
        super().__init__(daemon=True)
        self.root = root
        self.peak_bytes = 0
        self.largest: tuple[int, str] = (0, "")
        self.seen: dict[int, psutil.Process] = {}
        self.cpu: dict[int, float] = {}  # pid -> CPU seconds at its last sample
        self._stop_event = threading.Event()

    def sample(self) -> None:
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        total = 0
        for proc in tree:
            try:
                with proc.oneshot():
                    rss, cpu, name = proc.memory_info().rss, proc.cpu_times(), proc.name()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            self.seen.setdefault(proc.pid, proc)
            self.cpu[proc.pid] = cpu.user + cpu.system
            total += rss
            self.largest = max(self.largest, (rss, name))
        self.peak_bytes = max(self.peak_bytes, total)

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(SAMPLE_INTERVAL_S)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def measure(program: Program, log_path: Path, what: str) -> Run:
    """Runs one program; its merged stdout and stderr go to `log_path`, each line stamped with its
    arrival time; a heartbeat goes to stderr every HEARTBEAT_S seconds. Returns once every process
    of its tree is gone (the JVM outlives the Python driver), so the next starts on a quiet box."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    marks: dict[str, float] = {}
    with log_path.open("w") as log:
        log.write(f"$ {program.shown}\n")
        log.flush()
        load, busy = os.getloadavg()[0], _busy_cpu_seconds()
        start = time.perf_counter()
        proc = psutil.Popen(
            program.argv,
            cwd=ROOT,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable, **program.env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        sampler = TreeSampler(proc)
        sampler.start()

        def read_output() -> None:
            for line in proc.stdout:
                at = time.perf_counter() - start
                log.write(f"[{at:8.3f}] {line}")
                for name, pattern in program.markers.items():
                    if name not in marks and pattern.search(line):
                        marks[name] = at

        reader = threading.Thread(target=read_output, daemon=True)
        reader.start()
        while True:
            try:
                returncode = proc.wait(timeout=HEARTBEAT_S)
                break
            except psutil.TimeoutExpired:
                progress(f"{what}: still running, {time.perf_counter() - start:.0f} s elapsed")
        seconds = time.perf_counter() - start
        busy = _busy_cpu_seconds() - busy
        sampler.stop()
        gone_from = time.perf_counter()
        psutil.wait_procs(list(sampler.seen.values()), timeout=60.0)
        gone = time.perf_counter() - gone_from
        reader.join(timeout=10.0)
    missing = [name for name in program.markers if name not in marks]
    if returncode != 0 or missing:
        # A missing mark means the program did not do the work (or its output changed).
        why = f"exit code {returncode}" + (f", no {'/'.join(missing)} line" if missing else "")
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
        raise ProgramError(f"{what}: {why}; end of {log_path}:\n{tail}")
    cpu = sum(sampler.cpu.values())
    return Run(
        seconds=seconds,
        peak_mb=sampler.peak_bytes / 2**20,
        largest_mb=sampler.largest[0] / 2**20,
        largest_process=sampler.largest[1],
        marks=marks,
        tree_gone_s=gone,
        cpu_s=cpu,
        others_cpu_s=max(0.0, busy - cpu),
        loadavg_1m=load,
        log=str(log_path.relative_to(ROOT)),
    )


def wait_for_idle(max_wait: float) -> float:
    """Waits until the rest of the machine uses under IDLE_CORES cores, at most `max_wait`
    seconds; returns the seconds waited."""
    start, noted = time.perf_counter(), -HEARTBEAT_S
    while True:
        busy = _busy_cpu_seconds()
        time.sleep(IDLE_PROBE_S)
        cores = (_busy_cpu_seconds() - busy) / IDLE_PROBE_S
        waited = time.perf_counter() - start
        if cores < IDLE_CORES:
            return waited
        if waited >= max_wait:
            progress(f"machine still busy ({cores:.2f} cores used) after {waited:.0f} s: going on")
            return waited
        if waited - noted >= HEARTBEAT_S:
            progress(f"machine busy ({cores:.2f} cores used by others): waiting ({waited:.0f} s)")
            noted = waited


def run_timed(
    program: Program, what: str, log: Path, args: argparse.Namespace, timing: Timing, fmt: str
) -> None:
    """One timed run, after waiting for an idle machine, run again (at most --retries times)
    while others disturbed it; a disturbed run kept for lack of retries is marked in the tables.
    `fmt` is the seconds' format in the progress line."""
    for attempt in range(args.retries + 1):
        if program.clear_output:
            shutil.rmtree(program.output, ignore_errors=True)
        waited = wait_for_idle(args.idle_wait)
        progress(f"{what}: started (load {os.getloadavg()[0]:.2f})")
        retry = f"_retry{attempt}" if attempt else ""
        run = measure(program, log.with_name(f"{log.name}{retry}.log"), what)
        run.waited_for_idle_s = waited
        progress(
            f"{what}: {run.seconds:{fmt}} s, peak {run.peak_mb:,.0f} MB, others used "
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


def warm_up(program: Program, log_dir: Path) -> None:
    """One untimed process of `program` (JVM jars, Python modules into the OS page cache)."""
    progress(f"warm-up: one untimed {program.name} process")
    if program.clear_output:
        shutil.rmtree(program.output, ignore_errors=True)
    measure(program, log_dir / "warmup.log", "warm-up")


def run_programs(
    data: Dataset, programs: Sequence[Program], args: argparse.Namespace, log_dir: Path, fmt: str
) -> dict[str, Timing]:
    """Every program's runs on one size, interleaved round by round in the order given (the next
    starts only when the previous one's processes are gone). A program that fails is reported
    and not run again at this size; the others go on."""
    warm_page_cache(data)
    timings = {p.name: Timing(data.label, data.rows, p.name, p.shown) for p in programs}
    for i in range(max(p.repeat for p in programs)):
        for program in programs:
            timing = timings[program.name]
            if i >= program.repeat or timing.failure is not None:
                continue
            what = f"{data.label}: {program.name} run {i + 1}/{program.repeat}"
            slug = re.sub(r"[^a-z0-9]+", "_", program.name.lower()).strip("_")
            log = log_dir / f"{data.label}_{slug}_{i + 1}"
            try:
                run_timed(program, what, log, args, timing, fmt)
            except ProgramError as exc:
                timing.failure = str(exc)
                progress(f"error: {exc}")
    return timings


def read_release(program: Program, timing: Timing) -> pd.DataFrame | None:
    """A program's last output (per terminal), or None when it did not run or cannot be read."""
    if not timing.runs or timing.failure is not None:
        return None
    try:
        return pd.read_parquet(program.output)
    except (OSError, KeyError, ValueError) as exc:
        progress(f"{timing.label}: cannot read {program.output} back ({type(exc).__name__}: {exc})")
        return None


def sanity_check(
    data: Dataset,
    keys: Path,
    progs: dict[str, Program],
    timings: dict[str, Timing],
    released: dict[str, tuple[str, str]],
    baseline: str,
) -> dict[str, object]:
    """The sanity and accuracy check of one size (not timed). For each `released` program (JSON
    prefix -> program, name in the printed line), read back from its last output: the mean
    released count per terminal against the exact bounded mean before noise, in noise standard
    errors; and the root mean squared error of the released count and sum per terminal against
    the exact bounded values, beside the noise's own standard deviation (what an exact bounding
    would give). Also the baseline's raw mean count. Printed as soon as the size is done."""
    progress(f"{data.label}: reading the outputs back; bounded reference on the local engine")
    reference = bounded_reference(data, keys)
    bounded = None if reference is None else reference.mean_count
    noise_se = None if reference is None else reference.count_noise_se
    frames = {
        prefix: read_release(progs[p], timings[p]) if p in progs else None
        for prefix, (p, _) in released.items()
    }
    raw_frame = read_release(progs[baseline], timings[baseline])
    raw = None if raw_frame is None else float(raw_frame["count"].mean())
    record: dict[str, object] = {"label": data.label, "rows": data.rows}
    for prefix, frame in frames.items():
        mean = None if frame is None else float(frame["count"].mean())
        record[f"{prefix}_mean_count"] = mean
        record[f"{prefix}_z"] = z_score(mean, bounded, noise_se)
        record[f"{prefix}_partitions"] = None if frame is None else len(frame)
        for metric in ("count", "sum"):
            error = None
            if frame is not None and reference is not None:
                error = rmse(frame, reference, metric)
            record[f"{prefix}_{metric}_rmse"] = error
    record["bounded_exact_mean_count"] = bounded
    record["noise_standard_error_of_mean_count"] = noise_se
    record["count_noise_sd"] = None if reference is None else reference.count_noise_sd
    record["sum_noise_sd"] = None if reference is None else reference.sum_noise_sd
    record["baseline_raw_mean_count"] = raw

    def show(value: object) -> str:
        return "n/a" if value is None else f"{value:,.1f}"

    shown = ", ".join(
        f"{name} {show(record[f'{prefix}_mean_count'])}" for prefix, (_, name) in released.items()
    )
    print(
        f"sanity {data.label}: mean released count per terminal: {shown} (bounded before noise "
        f"{show(bounded)}, noise s.e. {show(noise_se)}; raw {show(raw)})",
        flush=True,
    )
    errors = ", ".join(
        f"{name} {show(record[f'{prefix}_count_rmse'])} / {show(record[f'{prefix}_sum_rmse'])}"
        for prefix, (_, name) in released.items()
    )
    print(
        f"accuracy {data.label}: count / sum RMSE per terminal vs exact bounded: {errors} "
        f"(noise alone: {show(record['count_noise_sd'])} / {show(record['sum_noise_sd'])})",
        flush=True,
    )
    return record


def run_benchmark(
    report: Any,
    args: argparse.Namespace,
    programs: Callable[[Dataset, Path, argparse.Namespace], dict[str, Program]],
    released: dict[str, tuple[str, str]],
    baseline: str,
    log_dir: Path,
    seconds_format: str,
) -> int:
    """A benchmark of programs from start to end: one untimed `baseline` process (modules and
    jars into the OS page cache), then per size every program's runs and the sanity check, then
    the report (`bench._report.ProcessReport`). Returns the exit status: 1 if a program failed."""
    keys = write_public_keys()
    started = time.perf_counter()
    try:
        warm_up(programs(ensure_dataset(args.sizes[0]), keys, args)[baseline], log_dir)
    except ProgramError as exc:  # the baseline cannot run: nothing else will
        print(f"bench.{report.NAME}: error: {exc}", file=sys.stderr)
        return 1
    for label in args.sizes:
        data = ensure_dataset(label)
        progs = programs(data, keys, args)
        timings = run_programs(data, list(progs.values()), args, log_dir, seconds_format)
        report.timings.extend(timings[p] for p in report.PROGRAMS if p in timings)
        report.sanity.append(sanity_check(data, keys, progs, timings, released, baseline))
    report.finish(started)
    failed = [f"{t.label} {t.program}" for t in report.timings if t.failure]
    if failed:
        print(f"bench.{report.NAME}: error: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
