"""The ledger under faults (issue 32): each numbered case of the issue, then the fault matrix
whose table is in docs/explanation/operations.md ("What a fault leaves").

Cases: (2) a damaged SQLite ledger whose index hid committed releases admitted a run past its
cap; (3) after a read-only incident, a read-only `-shm` left by SQLite failed every run once the
file was writable again; (4) a killed run's reservation looked like spent budget until its lease
ran out, exit 3 ("do not retry"); (10) a test that ran the CLI as `nobody` failed from a checkout
in a private folder. Case 1 (bursts) is test_ledger_burst.py.

Everything is real: CLI processes, SQLite files, a PostgreSQL server of the test's own (stopped
and started again), small tmpfs mounts for a full disk (skipped where mounting is not allowed).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import REPO as ROOT
from support.cli import one_error_line
from support.cli import run_cli as cli

from dppipeline.ledger import (
    BudgetExceededError,
    BudgetHeldError,
    BudgetPolicy,
    Ledger,
    LedgerError,
    ReleaseKey,
    Reservation,
)
from dppipeline.ledger import tables as ledger_tables
from dppipeline.ledger.lease import this_process

SCOPE = "faults/CUSTOMER_ID"
JOB = ["--metrics", "count", "--min-value", "0", "--max-value", "100",
       "--max-partitions-contributed", "5", "--max-contributions-per-partition", "2"]  # fmt: skip
DAY = dt.date(2026, 1, 1)
STOPPER = """
import signal, sys
import dppipeline.lifecycle.failpoints as failpoints
failpoints._SIGNALS["stop"] = signal.SIGSTOP  # the run stops itself at a stage
from dppipeline.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    return (result.stderr.strip().splitlines() or [""])[-1]


def run_args(source: Path, output: Path, url: str) -> list[object]:
    return ["run", "--input", source, "--output", output, "--ledger", url, "--scope", SCOPE, *JOB]


def spend(ledger: Ledger, run_id: str, policy: BudgetPolicy) -> None:
    """One committed release of epsilon 1 in SCOPE, through the ledger's API."""
    key = ReleaseKey(SCOPE, run_id, "input", DAY, DAY)
    with Reservation(ledger, key, run_id=run_id, job="job", epsilon=1.0, delta=0.0,
                     output="/nowhere", policy=policy) as held:  # fmt: skip
        held.reading()
        held.commit()


def reserve(ledger: Ledger, run_id: str) -> None:
    """A reservation of epsilon 1 in SCOPE that reads nothing (yet)."""
    key = ReleaseKey(SCOPE, run_id, "input", DAY, DAY)
    ledger.reserve(key, run_id=run_id, job="job", epsilon=1.0, delta=0.0, output="/nowhere",
                   policy=BudgetPolicy())  # fmt: skip


def damage_index(path: Path, index: str) -> None:
    """Overwrites the root page of `index` with a valid, empty leaf page: SQLite then reads an
    index without entries, while the table keeps its rows (`quick_check` sees nothing)."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    (root,) = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)).fetchone()
    db.close()
    leaf = bytes([0x0A, 0, 0, 0, 0]) + (page_size % 65536).to_bytes(2, "big") + b"\x00"
    with path.open("r+b") as file:
        file.seek((root - 1) * page_size)
        file.write(leaf + bytes(page_size - len(leaf)))


def table_rows(path: Path) -> list[tuple[str, str]]:
    """(run id, state) of every release, read from the table itself (no index)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT run_id, state FROM releases NOT INDEXED ORDER BY id").fetchall()


def states(url: str) -> tuple[str, ...]:
    with Ledger(url) as ledger:
        return tuple(row.state for row in ledger.rows(SCOPE))


# --------------------------------------------------------------------------- 2. damage


def test_a_damaged_sqlite_ledger_is_refused_not_undercounted(tmp_path, small_inputs):
    """Case 2: with a cap of 2 and 2 committed, the scope's index page overwritten with an
    empty leaf hid both releases from the cap check, and a third run was admitted. Now
    `PRAGMA integrity_check` refuses the file first, naming it, in one line; nothing is read."""
    path = tmp_path / "ledger.sqlite"
    url = f"sqlite:///{path}"
    with Ledger(url) as ledger:
        for run_id in ("first", "second"):
            spend(ledger, run_id, BudgetPolicy(cap_epsilon=2.0))
    damage_index(path, "releases_scope_state")
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA quick_check").fetchone() == ("ok",)  # it sees nothing
        hidden = db.execute(
            "SELECT count(*) FROM releases INDEXED BY releases_scope_state WHERE scope = ? "
            "AND state = 'committed'", (SCOPE,),
        ).fetchone()  # fmt: skip
        assert hidden == (0,)  # what a cap check reading the index would count

    with pytest.raises(LedgerError) as refused:
        Ledger(url).reserve(
            ReleaseKey(SCOPE, "third", "input", DAY, DAY), run_id="third", job="job",
            epsilon=1.0, delta=0.0, output="/nowhere", policy=BudgetPolicy(),
        )  # fmt: skip
    assert f"ledger {path} is damaged: PRAGMA integrity_check" in str(refused.value)

    result = cli(*run_args(small_inputs["parquet"], tmp_path / "release", url))
    assert result.returncode == 1
    line = one_error_line(result)
    assert str(path) in line and "PRAGMA integrity_check" in line, line
    assert not (tmp_path / "release").exists()
    assert table_rows(path) == [("first", "committed"), ("second", "committed")]


# --------------------------------------------------------------------------- 3. read-only


@pytest.mark.slow
def test_the_ledger_works_again_after_a_read_only_incident(tmp_path):
    """Case 3: a run that opened the ledger while its file was read-only left `-shm` read-only
    (SQLite gives it the file's mode); once the file was writable again, every write still
    failed "read-only". Now the next process makes its own `-shm` writable again."""
    path = tmp_path / "ledger.sqlite"
    with Ledger(f"sqlite:///{path}") as ledger:
        spend(ledger, "before", BudgetPolicy())
    path.chmod(0o444)  # the incident: the file is read-only for a while ...
    shown = cli("budget", "show", "--ledger", path, bound=True)
    assert shown.returncode == 0, shown.stderr  # ... reading it works, and leaves -shm behind
    shm = path.with_name("ledger.sqlite-shm")
    assert shm.exists() and not shm.stat().st_mode & 0o222
    path.chmod(0o644)  # ... and is over

    changed = cli("budget", "set-cap", SCOPE, "--epsilon", "5", "--ledger", path, bound=True)
    assert changed.returncode == 0, changed.stderr
    assert "ledger.sqlite-shm was read-only" in changed.stderr
    with Ledger(f"sqlite:///{path}") as ledger:
        assert ledger.cap(SCOPE).policy == BudgetPolicy(cap_epsilon=5.0)


def test_a_read_only_ledger_is_one_line_from_a_private_checkout(tmp_path):
    """Case 10: the read-only test ran the CLI as `nobody`, who cannot enter a checkout in a
    private folder (`mktemp -d`, mode 0700), and failed with "No module named dppipeline".
    Here the CLI runs from such a checkout (its package and a virtualenv inside the private
    folder) and still meets the read-only file as a user would (`file_modes`)."""
    private = Path(tempfile.mkdtemp(prefix="dppipeline-private-"))
    try:
        assert private.stat().st_mode & 0o777 == 0o700
        checkout = private / "checkout"
        shutil.copytree(ROOT / "dppipeline", checkout / "dppipeline",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        venv = checkout / ".venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").symlink_to(Path(sys.executable).resolve())
        shutil.copy(Path(sys.prefix) / "pyvenv.cfg", venv / "pyvenv.cfg")
        (venv / "lib").symlink_to(Path(sys.prefix) / "lib")
        folder = tmp_path / "ro"
        path = folder / "ledger.sqlite"
        with Ledger(f"sqlite:///{path}") as ledger:
            spend(ledger, "before", BudgetPolicy())
        path.chmod(0o444)
        folder.chmod(0o555)
        try:
            result = cli(
                "budget", "set-cap", SCOPE, "--epsilon", "5", "--ledger", path,
                python=str(venv / "bin" / "python"), bound=True,
                env={"PYTHONPATH": str(checkout)},
            )  # fmt: skip
        finally:
            folder.chmod(0o755)
        assert result.returncode == 1, result.stderr
        line = one_error_line(result)
        assert f"ledger {path} is read-only" in line, line
    finally:
        shutil.rmtree(private, ignore_errors=True)


# --------------------------------------------------------------------------- 4. dead or alive


@pytest.mark.slow
def test_a_run_killed_after_reserving_is_settled_at_once(tmp_path, small_inputs):
    """Case 4: cap 1; a run killed right after reserving. Its immediate rerun exited 3,
    "exhausted: epsilon 1 needed, 0 left of 1", until the lease (120 s) ran out. Its process
    is gone from this host: the rerun settles the reservation at once and publishes."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    args = [*run_args(small_inputs["parquet"], tmp_path / "release", url), "--cap-epsilon", "1"]
    killed = cli(*args, env={"DPPIPELINE_FAILPOINT": "reserved:kill"})
    assert killed.returncode == -signal.SIGKILL
    (row,) = Ledger(url).rows()
    assert row.state == "reserved" and Ledger(url).lease_alive(row)

    rerun = cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    expected = f"settled reservation of run {row.run_id} (its process ended on this host): aborted"
    assert expected in rerun.stderr
    first, second = Ledger(url).rows()
    assert (first.state, second.state) == ("aborted", "committed")
    assert first.note == f"repaired: process {row.pid} of host {row.host_id} ended before reading"


HOLDER = """
import datetime as dt, pathlib, sys, time
from dppipeline.ledger import BudgetPolicy, Ledger, ReleaseKey, Reservation
url, ready, done = sys.argv[1:]
day = dt.date(2026, 1, 1)
with Reservation(Ledger(url), ReleaseKey("faults/CUSTOMER_ID", "holder", "h", day, day),
                 run_id="holder", job="holder", epsilon=1.0, delta=0.0, output="/nowhere",
                 policy=BudgetPolicy(cap_epsilon=1.0)):
    pathlib.Path(ready).touch()
    while not pathlib.Path(done).exists():
        time.sleep(0.02)
"""


@contextlib.contextmanager
def live_holder(url: str, folder: Path) -> Iterator[subprocess.Popen[str]]:
    """A live run holding the whole cap (epsilon 1 of 1), reserved and not reading."""
    ready, done = folder / "ready", folder / "done"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, url, str(ready), str(done)],
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the holder did not reserve"
            time.sleep(0.02)
        yield proc
    finally:
        done.touch()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)


@pytest.mark.slow
def test_a_budget_held_by_a_live_run_is_a_temporary_refusal(tmp_path, small_inputs):
    """Case 4, the other half: while a live run holds the budget and has read nothing, the
    refusal names it and its lease's end, exit 75 (retry then), for `run` and for `run
    --check-budget`; once it is gone (killed), the same command succeeds at once."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    args = run_args(small_inputs["parquet"], tmp_path / "release", url)
    with live_holder(url, tmp_path) as holder:
        lease_end = dt.datetime.fromisoformat(Ledger(url).row("holder").lease_expires_at)
        for extra in ([], ["--check-budget"]):
            refused = cli(*args, *extra)
            assert refused.returncode == 75, refused.stderr
            line = one_error_line(refused)
            assert f"held by run holder until {lease_end:%H:%M:%S} (UTC); retry then" in line
            assert "epsilon 1 needed, 0 left of 1" in line
        assert [r.run_id for r in Ledger(url).rows()] == ["holder"]
        holder.kill()
    rerun = cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    assert states(url) == ("aborted", "committed")


def test_only_a_provably_dead_process_is_settled_before_its_lease(tmp_path):
    """The proof: the row's process (boot id, pid namespace, pid, start time) is this host's
    and its pid is gone or belongs to a process started at another time. A row of another
    host, or of a live process, waits for its lease; an exhausted cap stays exit 3."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    ledger = Ledger(url)
    mine = this_process()
    assert mine is not None, "this test needs Linux /proc"
    machine = mine.rsplit("/", 2)[0]
    live_pid, my_start = os.getpid(), mine.rsplit("/", 1)[1]
    gone_pid = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    processes = {
        "gone": f"{machine}/{gone_pid}/1",
        "reused": f"{machine}/{live_pid}/{int(my_start) + 1}",  # our pid, another start
        "alive": mine,
        "other-host": f"another-boot-id/4026531836/{gone_pid}/1",
        "unknown": None,  # recorded before schema v5
    }
    for run_id in processes:
        reserve(ledger, run_id)
    table = ledger_tables.releases
    with ledger._engine.begin() as conn:
        for run_id, process in processes.items():
            conn.execute(table.update().where(table.c.run_id == run_id).values(process=process))
    assert sorted(ledger.repair()) == [("gone", "aborted"), ("reused", "aborted")]
    left = {r.run_id: r.state for r in ledger.rows()}
    assert left == {"gone": "aborted", "reused": "aborted", "alive": "reserved",
                    "other-host": "reserved", "unknown": "reserved"}  # fmt: skip

    ledger.set_cap(SCOPE, BudgetPolicy(cap_epsilon=3.0), "test")
    with pytest.raises(BudgetHeldError) as held:  # 3 live reservations hold all of it
        reserve(ledger, "new")
    assert held.value.exit_code == 75
    ledger.mark_reading("alive")
    ledger.commit("alive")
    with ledger._engine.begin() as conn:  # they read: their budget stays spent
        conn.execute(table.update().where(table.c.state == "reserved").values(state="failed"))
    with pytest.raises(BudgetExceededError) as exhausted:
        reserve(ledger, "new")
    assert not isinstance(exhausted.value, BudgetHeldError)
    assert exhausted.value.exit_code == 3


# --------------------------------------------------------------------------- the fault matrix


@dataclass(frozen=True)
class Fault:
    """One row of the matrix: what is done, what happens, the ledger's rows of the scope
    right after the faulty run and after the next run, the two runs' exit codes, and what
    the faulty run's last line says."""

    case: str
    outcome: str
    after: tuple[str, ...]
    final: tuple[str, ...]
    codes: tuple[int, ...]
    says: str = ""

    def row(self) -> str:
        def shown(found: tuple[str, ...]) -> str:
            return ", ".join(f"`{s}`" for s in found) or "none"

        codes = " / ".join(str(c) if c >= 0 else "killed" for c in self.codes)
        state = shown(self.after) + (f" → {shown(self.final)}" if self.final != self.after else "")
        says = f"; its error line says `...{self.says}...`" if self.says else ""
        return f"| {self.case} | {self.outcome}{says} | {state} | {codes} |"


KILLED = "killed (SIGKILL) at `{}`"
SETTLED = "the next run settles it at once (its process is gone) and publishes"
MATRIX = {
    "kill-reserved": Fault(KILLED.format("reserved"), SETTLED + "; budget freed",
                           ("reserved",), ("aborted", "committed"), (-9, 0)),
    **{
        f"kill-{stage}": Fault(KILLED.format(stage), SETTLED + "; the killed run stays charged",
                               ("reading",), ("failed", "committed"), (-9, 0))
        for stage in ("reading", "written", "staged")
    },
    **{
        f"kill-{stage}": Fault(KILLED.format(stage),
                               "the next run returns the committed release (finishing its "
                               "publication if it was cut)",
                               ("committed",), ("committed",), (-9, 0))
        for stage in ("committed", "exchanged", "published")
    },
    "damaged": Fault("SQLite ledger damaged (an index page emptied)",
                     "refused before reading", ("committed", "committed"),
                     ("committed", "committed"), (1,), "PRAGMA integrity_check"),
    "read-only": Fault("SQLite ledger read-only (file 0444, folder 0555)",
                       "refused before reading; the next run, writable again, publishes",
                       (), ("committed",), (1, 0), "is read-only"),
    "read-only-shm": Fault("a read-only `-shm` left by a read-only incident",
                           "healed (made writable), the run publishes", ("committed",),
                           ("committed",), (0,)),
    "full-output": Fault("output's disk full", "refused before reading (its staging record "
                         "cannot be written); nothing charged; the next run, with space again, "
                         "publishes", ("aborted",), ("aborted", "committed"), (1, 0),
                         "No space left on device"),
    "full-ledger": Fault("ledger's disk full", "refused before reading; the next run, with "
                         "space again, publishes", (), ("committed",), (1, 0), "a full disk?"),
    "pg-down": Fault("PostgreSQL stopped before the run", "refused before reading; the next "
                     "run, PostgreSQL up again, publishes", (), ("committed",), (1, 0),
                     "cannot use ledger"),
    "pg-down-reading": Fault("PostgreSQL stopped while the run reads, up again within its "
                             "lease", "the run waits for it, commits and publishes",
                             ("committed",), ("committed",), (0,)),
    "pg-gone-reading": Fault("PostgreSQL stopped while the run reads, down for its whole "
                             "lease (3 s here)", "fails; charged; the next run settles it and "
                             "publishes", ("reading",), ("failed", "committed"), (1, 0),
                             "cannot use ledger"),
}  # fmt: skip


def test_the_matrix_in_the_docs_is_the_tested_one():
    """docs/explanation/operations.md shows exactly these rows, in this order."""
    text = (ROOT / "docs" / "explanation" / "operations.md").read_text()
    rows = [fault.row() for fault in MATRIX.values()]
    head = (
        "| case | outcome | ledger rows (after the fault → after the next run) "
        "| exit codes (faulty run / next run) |"
    )
    table = "\n".join([head, "|---|---|---|---|", *rows])
    assert table in text, "\n" + table


@dataclass
class Setting:
    """Where a matrix case runs: its ledger, input and output, and its runs' last lines."""

    tmp: Path
    source: Path
    url: str
    output: Path = field(init=False)
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.output = self.tmp / "dest" / "release"

    def run(self, *extra: object, env: dict | None = None, bound: bool = False) -> int:
        done = cli(*run_args(self.source, self.output, self.url), *extra, env=env, bound=bound)
        self.lines.append(last_line(done) if done.returncode else "")
        return done.returncode

    @property
    def path(self) -> Path:
        return Path(self.url.removeprefix("sqlite:///"))

    def seen(self, after: tuple[str, ...] | None, *codes: int) -> Seen:
        """What the case saw, the next run's outcome read now."""
        return Seen(after, codes, states(self.url), published_run(self.output))


@dataclass(frozen=True)
class Seen:
    after: tuple[str, ...] | None  # None: not observable (the run went on by itself)
    codes: tuple[int, ...]
    final: tuple[str, ...]
    published: bool


def published_run(output: Path) -> bool:
    from dppipeline.storage.releases import published_run_id

    return published_run_id(output) is not None


def _kill(stage: str) -> Callable[[Setting], Seen]:
    def case(s: Setting) -> Seen:
        code = s.run(env={"DPPIPELINE_FAILPOINT": f"{stage}:kill"})
        after = states(s.url)
        again = s.run()  # at once: the killed run's lease is still running
        assert sorted(p.name for p in s.output.parent.iterdir()) == ["release"]  # no leftovers
        return s.seen(after, code, again)

    return case


def _damaged(s: Setting) -> Seen:
    with Ledger(s.url) as ledger:
        for run_id in ("first", "second"):
            spend(ledger, run_id, BudgetPolicy(cap_epsilon=2.0))
    damage_index(s.path, "releases_scope_state")
    code = s.run()
    rows = tuple(state for _, state in table_rows(s.path))  # the table, not the index
    return Seen(rows, (code,), rows, published_run(s.output))


def _read_only(s: Setting) -> Seen:
    s.path.chmod(0o444)
    s.path.parent.chmod(0o555)
    try:
        code = s.run(bound=True)
    finally:
        s.path.parent.chmod(0o755)
        s.path.chmod(0o644)
    assert not s.output.exists()
    after = states(s.url)
    return s.seen(after, code, s.run(bound=True))


def _read_only_shm(s: Setting) -> Seen:
    s.path.chmod(0o444)
    shown = cli("budget", "show", "--ledger", s.path, bound=True)
    assert shown.returncode == 0, shown.stderr
    assert not s.path.with_name(s.path.name + "-shm").stat().st_mode & 0o222
    s.path.chmod(0o644)
    return s.seen(None, s.run(bound=True))


@contextlib.contextmanager
def small_disk(folder: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs of `size` mounted on `folder` (skips the test where mounting is not allowed)."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True, check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"a full disk needs a small tmpfs, and mounting one failed: {mounted.stderr}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, capture_output=True)


def fill(folder: Path) -> Path:
    """Fills the file system of `folder`; returns the filler to remove."""
    filler = folder / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as out:
        while True:
            out.write(b"\0" * 4096)
            out.flush()
    return filler


def _full_output(s: Setting) -> Seen:
    with small_disk(s.output.parent):
        filler = fill(s.output.parent)
        code = s.run()
        after = states(s.url)
        filler.unlink()
        return s.seen(after, code, s.run())


def _full_ledger(s: Setting) -> Seen:
    disk = s.tmp / "ledger-disk"
    with small_disk(disk):
        s.url = f"sqlite:///{disk / 'ledger.sqlite'}"
        with Ledger(s.url) as ledger:
            ledger.set_cap(SCOPE, BudgetPolicy(cap_epsilon=2.0), "test")
        filler = fill(disk)
        code = s.run()
        assert not s.output.exists()
        filler.unlink()
        after = states(s.url)
        return s.seen(after, code, s.run())


class Postgres:
    """A PostgreSQL server of this module's own, which cases stop and start again."""

    def __init__(self, server) -> None:
        from support.postgres_server import install_dir

        self.server = server
        copied = server.folder / "site" / "pgserver" / "pginstall" / "bin"
        self.bin = copied if copied.is_dir() else install_dir() / "bin"

    def pg_ctl(self, *args: str) -> None:
        from support.postgres_server import _as_user

        done = subprocess.run(
            _as_user([str(self.bin / "pg_ctl"), "-D", str(self.server.folder / "data"), *args]),
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    def stop(self) -> None:
        self.pg_ctl("-m", "fast", "-w", "stop")

    def start(self) -> None:
        options = f"-h 127.0.0.1 -p {self.server.port} -k '' -c fsync=off -c max_connections=60"
        self.pg_ctl("-l", str(self.server.folder / "log"), "-o", options, "-w", "start")


@pytest.fixture(scope="module")
def private_postgres() -> Iterator[Postgres]:
    from support.postgres_server import start

    server = start()
    try:
        yield Postgres(server)
    finally:
        server.stop()


def _pg_down(s: Setting, pg: Postgres) -> Seen:
    pg.stop()
    try:
        code = s.run()
    finally:
        pg.start()
    assert not s.output.exists()
    after = states(s.url)
    return s.seen(after, code, s.run())


def stopped_at_reading(s: Setting, env: dict[str, str]) -> subprocess.Popen[str]:
    """A run that stops itself (SIGSTOP) right after its reservation became `reading`."""
    driver = s.tmp / "stopper.py"
    driver.write_text(STOPPER)
    base = {k: v for k, v in os.environ.items() if k != "DPPIPELINE_DEBUG"}
    proc = subprocess.Popen(
        [sys.executable, str(driver), *map(str, run_args(s.source, s.output, s.url))],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**base, "DPPIPELINE_FAILPOINT": "reading:stop", **env},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never stopped"
        time.sleep(0.02)
    return proc


def _pg_down_reading(s: Setting, pg: Postgres) -> Seen:
    proc = stopped_at_reading(s, {"DPPIPELINE_LEASE_SECONDS": "60"})
    pg.stop()
    try:
        proc.send_signal(signal.SIGCONT)
        assert proc.stderr is not None
        for line in proc.stderr:  # the run has read its data and keeps trying to commit
            if "still trying to record run" in line:
                break
    finally:
        pg.start()
    proc.communicate(timeout=120)
    return s.seen(None, proc.returncode)


def _pg_gone_reading(s: Setting, pg: Postgres) -> Seen:
    proc = stopped_at_reading(s, {"DPPIPELINE_LEASE_SECONDS": "3"})
    pg.stop()
    try:
        proc.send_signal(signal.SIGCONT)
        _, err = proc.communicate(timeout=120)
    finally:
        pg.start()
    assert "Traceback" not in err
    s.lines.append(err.strip().splitlines()[-1])
    after = states(s.url)
    return s.seen(after, proc.returncode, s.run())


CASES: dict[str, Callable[..., Seen]] = {
    **{f"kill-{stage}": _kill(stage) for stage in
       ("reserved", "reading", "written", "staged", "committed", "exchanged", "published")},
    "damaged": _damaged,
    "read-only": _read_only,
    "read-only-shm": _read_only_shm,
    "full-output": _full_output,
    "full-ledger": _full_ledger,
    "pg-down": _pg_down,
    "pg-down-reading": _pg_down_reading,
    "pg-gone-reading": _pg_gone_reading,
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MATRIX))
def test_fault_matrix(name, tmp_path, small_inputs, request):
    """Each fault of the matrix, then (most) the same command again: the ledger's rows, the
    exit codes and what the faulty run says are the docs' row; a scope whose last row is
    committed has its release published, and nothing else is."""
    fault = MATRIX[name]
    source = tmp_path / "tx"
    shutil.copytree(small_inputs["parquet"], source)
    args: tuple = ()
    if name.startswith("pg-"):
        pg = request.getfixturevalue("private_postgres")
        url = pg.server.new_database()
        args = (pg,)
    else:
        url = f"sqlite:///{tmp_path / 'ledger' / 'ledger.sqlite'}"
    if name not in ("damaged", "full-ledger"):
        with Ledger(url) as ledger:
            ledger.set_cap(SCOPE, BudgetPolicy(cap_epsilon=2.0), "test")
    setting = Setting(tmp_path, source, url)
    seen = CASES[name](setting, *args)
    assert seen.codes == fault.codes, setting.lines
    if seen.after is not None:
        assert seen.after == fault.after
    assert seen.final == fault.final
    if fault.says:
        failed = [line for line in setting.lines if line]
        assert failed and fault.says in failed[0], failed
    assert seen.published == (seen.final[-1:] == ("committed",) and name != "damaged")
