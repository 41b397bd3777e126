"""A burst of runs racing for one capped scope on a loaded machine (issue 32 case 1), shared by
the burst tests and `python tests/support/ledger_burst.py` (numbers).

Racers are real runs (`run_job`, local engine, the small input, a new release of epsilon 1 each;
the reservation, the `reading` mark, the engine, the commit and the publication), all released
at once with the default lock wait while busy processes keep the cores loaded; a few runs in
another scope (other data) run at the same time. So that sixteen runs fit a test's time on two
cores, a driver process imports dppipeline once, as the CLI does (dp_accounting's PLD code left
out until a cap needs composing, so each racer loads it lazily, as a CLI run would), and forks
the racers; `--cli` starts sixteen `dppipeline run` processes instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SCOPE = "burst/CUSTOMER_ID"
OTHER = "elsewhere/CUSTOMER_ID"
CAP = 3.0  # three releases of epsilon 1
BUSY = "while True:\n    pass\n"
JOB = {
    "budget.epsilon": 1.0,
    "metrics": ["count"],
    "bounds.min_value": 0.0,
    "bounds.max_value": 100.0,
    "bounds.max_partitions_contributed": 5,
    "bounds.max_contributions_per_partition": 2,
}


@dataclass
class Burst:
    """What the racers did: exit codes and last error lines per run, the ledger's rows."""

    codes: dict[str, int]
    last_lines: dict[str, str]
    states: dict[str, dict[str, str]]  # scope -> run id -> state
    outputs: dict[str, str]  # run id -> output recorded
    seconds: float
    tracebacks: list[str] = field(default_factory=list)

    def of(self, prefix: str) -> dict[str, int]:
        return {name: code for name, code in self.codes.items() if name.startswith(prefix)}


def plan(inputs: tuple[Path, Path], folder: Path, racers: int, others: int) -> dict[str, dict]:
    """name -> the job spec overrides of each run."""
    runs = {}
    for n in range(racers + others):
        racer = n < racers
        name = f"racer-{n:02d}" if racer else f"other-{n - racers}"
        runs[name] = {
            **JOB,
            "input.path": str(inputs[0] if racer else inputs[1]),
            "output": str(folder / name),
            "budget.scope": SCOPE if racer else OTHER,
        }
    return runs


def race(
    ledger: str,
    inputs: tuple[Path, Path],
    folder: Path,
    *,
    racers: int = 16,
    others: int = 2,
    busy: int = 2,
    cli: bool = False,
) -> Burst:
    """`racers` runs in SCOPE (capped at CAP) and `others` in OTHER (uncapped, other data),
    released at once while `busy` processes spin; returns what happened."""
    from dppipeline.ledger import BudgetPolicy, Ledger

    with Ledger(ledger) as book:
        book.set_cap(SCOPE, BudgetPolicy(cap_epsilon=CAP), "burst test")
    folder.mkdir(parents=True, exist_ok=True)
    runs = plan(inputs, folder, racers, others)
    env = {k: v for k, v in os.environ.items() if k not in ("DPPIPELINE_DEBUG",)}
    env.pop("DPPIPELINE_LEDGER_TIMEOUT", None)  # the default wait, as an operator has it
    spinners = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
    started = time.monotonic()
    try:
        if cli:
            results = _race_cli(ledger, runs, env)
        else:
            (folder / "runs.json").write_text(json.dumps(runs))
            driver = subprocess.run(
                [sys.executable, __file__, "drive", ledger, str(folder / "runs.json")],
                capture_output=True, text=True, env=env, timeout=600, check=False,
            )  # fmt: skip
            if driver.returncode != 0:
                raise RuntimeError(f"the burst driver failed: {driver.stderr[-3000:]}")
            results = json.loads(driver.stdout)
        seconds = time.monotonic() - started
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
    with Ledger(ledger) as book:
        rows = book.rows()
    states: dict[str, dict[str, str]] = {}
    for row in rows:
        states.setdefault(row.scope, {})[row.run_id] = row.state
    return Burst(
        codes={name: code for name, (code, _) in results.items()},
        last_lines={name: line for name, (_, line) in results.items()},
        states=states,
        outputs={row.run_id: row.output for row in rows},
        seconds=seconds,
        tracebacks=[name for name, (_, line) in results.items() if "Traceback" in line],
    )


def _race_cli(ledger: str, runs: dict[str, dict], env: dict[str, str]) -> dict[str, list]:
    procs = {}
    for name, job in runs.items():
        argv = [
            "run", "--input", job["input.path"], "--output", job["output"], "--ledger", ledger,
            "--scope", job["budget.scope"], "--epsilon", "1", "--metrics", "count",
            "--min-value", "0", "--max-value", "100", "--max-partitions-contributed", "5",
            "--max-contributions-per-partition", "2", "--new-release",
        ]  # fmt: skip
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "dppipeline", *argv],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
    results = {}
    for name, proc in procs.items():
        err = proc.communicate(timeout=600)[1]
        results[name] = [proc.returncode, (err.strip().splitlines() or [""])[-1]]
    return results


def _drive(ledger: str, runs_file: str) -> None:
    """The driver: imports once as the CLI does, forks one process per run, all released at
    once; prints name -> [exit code, the error line] as JSON."""
    sys.modules.setdefault("apache_beam", None)  # type: ignore[arg-type]
    sys.modules["dp_accounting.pld"] = None  # type: ignore[assignment]
    try:
        import pipeline_dp  # noqa: F401
    finally:
        del sys.modules["dp_accounting.pld"]
    from dppipeline.engines.local.engine import LocalEngine  # noqa: F401
    from dppipeline.errors import describe_failure
    from dppipeline.lifecycle.runner import run_job
    from dppipeline.spec.model import build_spec

    runs = json.loads(Path(runs_file).read_text())
    specs = {name: build_spec({}, job) for name, job in runs.items()}
    read_end, write_end = os.pipe()
    children = {}
    for name, spec in specs.items():
        pid = os.fork()
        if pid == 0:  # a racer: wait for the start, run, report
            os.close(write_end)
            os.read(read_end, 1)
            code, line = 0, ""
            try:
                run_job(spec, "local", echo=lambda _: None, ledger=ledger, new_release=True)
            except BaseException as exc:
                code, line = describe_failure(exc)
            Path(runs[name]["output"] + ".result").write_text(json.dumps([code, line]))
            os._exit(code)
        children[name] = pid
    os.close(read_end)
    os.write(write_end, b"x" * len(children))  # everyone at once
    os.close(write_end)
    results = {}
    for name, pid in children.items():
        _, status = os.waitpid(pid, 0)
        result = Path(runs[name]["output"] + ".result")
        if result.exists():
            results[name] = json.loads(result.read_text())
        else:
            results[name] = [-os.WTERMSIG(status) or os.WEXITSTATUS(status), "no result"]
    print(json.dumps(results))


def summary(result: Burst) -> str:
    racers = result.of("racer")
    states = result.states.get(SCOPE, {})
    count = {s: sum(v == s for v in states.values()) for s in sorted(set(states.values()))}
    codes = " ".join(str(c) for c in racers.values())
    others = " ".join(str(c) for c in result.of("other").values())
    return (
        f"racers exit codes {codes}; ledger rows {count}; other scope exit codes {others}; "
        f"{result.seconds:.1f} s"
    )


def _numbers(backend: str, repeat: int, cli: bool) -> None:
    import collections
    import datetime as dt
    import re
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    from dppipeline.synthetic.transactions import generate

    base = Path(tempfile.mkdtemp(prefix="burst-"))
    small = {"customers": 200, "terminals": 50, "days": 3, "tx_per_day": 500}
    data = tuple(
        generate(
            base / name, fmt="parquet", start_date=dt.date(2026, 1, 1), seed=seed, **small
        ).output
        for name, seed in (("a", 11), ("b", 12))
    )
    server = None
    if backend == "postgresql":
        from postgres_server import start

        server = start()
    try:
        for n in range(repeat):
            url = (
                server.new_database()
                if server is not None
                else f"sqlite:///{base / f'ledger-{n}.sqlite'}"
            )
            result = race(url, data, base / f"out-{n}", cli=cli)
            print(summary(result), flush=True)
            lines = collections.Counter(
                re.sub(r"run \S+|/\S+|\d+(\.\d+)? s", "...", line)
                for line in result.last_lines.values()
            )
            for line, count in lines.items():
                print(f"  {count} x {line[:200]}")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    # python tests/support/ledger_burst.py sqlite|postgresql [repeat] [--cli];
    # (internal) drive URL FILE
    if sys.argv[1] == "drive":
        _drive(sys.argv[2], sys.argv[3])
    else:
        arguments = [a for a in sys.argv[1:] if a != "--cli"]
        _numbers(arguments[0], int(arguments[1]) if len(arguments) > 1 else 1, "--cli" in sys.argv)
