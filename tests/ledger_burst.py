"""A burst of real `dppipeline run` processes racing for one capped scope, on a loaded machine
(issue 32 case 1): shared by the burst tests and `python tests/ledger_burst.py` (numbers).

Each racer is the CLI itself (local engine, the small input, a new release of epsilon 1), all
started at once with the default lock wait, while busy processes keep the cores loaded; a few
runs in another scope (other data) run at the same time.
"""

from __future__ import annotations

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


@dataclass
class Burst:
    """What the racers did: exit codes and last stderr lines per run, the ledger's rows."""

    codes: dict[str, int]
    last_lines: dict[str, str]
    states: dict[str, dict[str, str]]  # scope -> run id -> state
    outputs: dict[str, str]  # run id -> output recorded
    seconds: float
    tracebacks: list[str] = field(default_factory=list)

    def of(self, prefix: str) -> dict[str, int]:
        return {name: code for name, code in self.codes.items() if name.startswith(prefix)}


def job(input_dir: Path, output: Path, ledger: str, scope: str) -> list[str]:
    return [
        "run", "--input", str(input_dir), "--output", str(output), "--ledger", ledger,
        "--scope", scope, "--epsilon", "1", "--metrics", "count", "--min-value", "0",
        "--max-value", "100", "--max-partitions-contributed", "5",
        "--max-contributions-per-partition", "2", "--new-release",
    ]  # fmt: skip


def race(
    ledger: str,
    inputs: tuple[Path, Path],
    folder: Path,
    *,
    racers: int = 16,
    others: int = 2,
    busy: int = 2,
    env: dict[str, str] | None = None,
) -> Burst:
    """`racers` runs in SCOPE (capped at CAP) and `others` in OTHER (uncapped, other data),
    all started at once while `busy` processes spin; returns what happened."""
    from dppipeline.ledger import BudgetPolicy, Ledger

    with Ledger(ledger) as book:
        book.set_cap(SCOPE, BudgetPolicy(cap_epsilon=CAP), "burst test")
    base = {k: v for k, v in os.environ.items() if k not in ("DPPIPELINE_DEBUG",)}
    base.pop("DPPIPELINE_LEDGER_TIMEOUT", None)  # the default wait, as an operator has it
    base.update(env or {})
    spinners = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
    procs: dict[str, subprocess.Popen[str]] = {}
    started = time.monotonic()
    try:
        names = [f"racer-{n:02d}" for n in range(racers)] + [f"other-{n}" for n in range(others)]
        for name in names:
            source, scope = (inputs[0], SCOPE) if name.startswith("racer") else (inputs[1], OTHER)
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "dppipeline", *job(source, folder / name, ledger, scope)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=base,
            )  # fmt: skip
        errors = {name: proc.communicate(timeout=600)[1] for name, proc in procs.items()}
        seconds = time.monotonic() - started
    finally:
        for proc in [*procs.values(), *spinners]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    with Ledger(ledger) as book:
        rows = book.rows()
    states: dict[str, dict[str, str]] = {}
    for row in rows:
        states.setdefault(row.scope, {})[row.run_id] = row.state
    return Burst(
        codes={name: proc.returncode for name, proc in procs.items()},
        last_lines={n: (e.strip().splitlines() or [""])[-1] for n, e in errors.items()},
        states=states,
        outputs={row.run_id: row.output for row in rows},
        seconds=seconds,
        tracebacks=[n for n, e in errors.items() if "Traceback" in e],
    )


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


if __name__ == "__main__":  # numbers: python tests/ledger_burst.py sqlite|postgresql [runs]
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    from dppipeline.commands.generate import generate

    backend = sys.argv[1] if len(sys.argv) > 1 else "sqlite"
    repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    base = Path(tempfile.mkdtemp(prefix="burst-"))
    small = {"customers": 200, "terminals": 50, "days": 3, "tx_per_day": 500}
    import datetime as dt

    data = tuple(
        generate(base / name, fmt="parquet", start_date=dt.date(2026, 1, 1), seed=seed, **small)
        .output
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
            result = race(url, data, base / f"out-{n}")
            print(summary(result), flush=True)
            import collections
            import re

            lines = collections.Counter(
                re.sub(r"run \S+|/\S+|\d+(\.\d+)? s", "…", line) for line in result.last_lines.values()
            )
            for line, count in lines.items():
                print(f"  {count} x {line[:220]}")
    finally:
        if server is not None:
            server.stop()
