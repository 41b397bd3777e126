"""The privacy-budget ledger: every release's spend, across runs and nights, in SQLite.

Why: the same customers appear in every nightly release, so their privacy loss adds up
(sequential composition), and a retried job that drew fresh noise for an already published day
would let anyone average the two releases. The ledger makes both impossible:

- `reserve` checks the scope's cap and records the spend in one `BEGIN IMMEDIATE` transaction,
  so two concurrent runs can never both pass the check;
- a release is keyed by (scope, spec hash, input fingerprint, date range); the same key again
  returns the committed release: same files, no new noise, no new spend;
- a run killed mid-way leaves a `reserved` row; `repair` settles it: committed when its release
  folder exists with its run id in the manifest (it may have been read), aborted otherwise
  (nothing was published, since publication is one atomic rename).

Composition is basic (sums of epsilon and delta), the accounting pipeline-dp's naive
accountant uses within a run.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import socket
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dppipeline.core.manifest import published_run_id
from dppipeline.errors import DPPipelineError, UsageError

SCHEMA_VERSION = 1
_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE releases (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL UNIQUE,
        scope TEXT NOT NULL,
        job TEXT NOT NULL,
        spec_hash TEXT NOT NULL,
        input_fingerprint TEXT NOT NULL,
        start_date TEXT NOT NULL,
        end_date TEXT NOT NULL,
        release_key TEXT NOT NULL,
        epsilon REAL NOT NULL CHECK (epsilon >= 0),
        delta REAL NOT NULL CHECK (delta >= 0),
        state TEXT NOT NULL CHECK (state IN ('reserved', 'committed', 'aborted')),
        output TEXT NOT NULL,
        pid INTEGER,
        host TEXT,
        reserved_at TEXT NOT NULL,
        finished_at TEXT,
        note TEXT
    );
    CREATE INDEX releases_scope_state ON releases (scope, state);
    CREATE INDEX releases_key ON releases (release_key, state);
    """,
}
CAP_TOLERANCE = 1e-9  # relative: float sums of shares (0.1 + 0.2) must fit a cap of 0.3
# A reservation made on another host is settled only when older than this: its process cannot
# be checked from here, and settling a live run would free budget still in use.
FOREIGN_RESERVATION_TTL = dt.timedelta(hours=24)


class BudgetExceededError(DPPipelineError):
    """The release would exceed the scope's cap; nothing was read or spent (exit code 3)."""

    exit_code = 3


@dataclass(frozen=True)
class BudgetPolicy:
    """A cap on a scope's total spend, for all time or per rolling window of data days."""

    cap_epsilon: float | None = None
    cap_delta: float | None = None
    window_days: int | None = None

    def describe(self) -> str:
        caps = []
        if self.cap_epsilon is not None:
            caps.append(f"epsilon {self.cap_epsilon:g}")
        if self.cap_delta is not None:
            caps.append(f"delta {self.cap_delta:g}")
        if not caps:
            return "no cap"
        span = f" per {self.window_days} days of data" if self.window_days else " for all time"
        return "cap " + ", ".join(caps) + span


@dataclass(frozen=True)
class ReleaseKey:
    """What makes two runs the same release."""

    scope: str
    spec_hash: str
    input_fingerprint: str
    start_date: dt.date
    end_date: dt.date

    @property
    def digest(self) -> str:
        blob = json.dumps(
            [
                self.scope,
                self.spec_hash,
                self.input_fingerprint,
                self.start_date.isoformat(),
                self.end_date.isoformat(),
            ]
        )
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class LedgerRow:
    id: int
    run_id: str
    scope: str
    job: str
    start_date: dt.date
    end_date: dt.date
    epsilon: float
    delta: float
    state: str
    output: str
    reserved_at: str
    finished_at: str | None
    release_key: str
    note: str | None


def input_fingerprint(files: list[Path], root: Path) -> str:
    """sha256 of each selected file's path (relative to the input root), size and mtime:
    cheap on any size of data, and changes when a file is rewritten."""
    digest = hashlib.sha256()
    for path in sorted(files):
        stat = path.stat()
        rel = os.path.relpath(path, root)
        digest.update(f"{rel}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def ledger_path(url: str) -> Path:
    """`sqlite:///relative/path`, `sqlite:////absolute/path`, or a plain file path."""
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///") :])
    if "://" in url:
        raise UsageError(f"--ledger: only sqlite:///PATH ledgers are supported, got {url!r}")
    return Path(url)


class Ledger:
    """One SQLite file; safe for concurrent processes (WAL, immediate transactions)."""

    def __init__(self, url: str | Path):
        self.path = ledger_path(str(url))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA busy_timeout=60000")
        self._migrate()

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the lock at once: check-then-insert is atomic."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _migrate(self) -> None:
        with self._transaction() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise UsageError(
                    f"ledger {self.path} has schema version {version}, newer than this "
                    f"dppipeline ({SCHEMA_VERSION}): upgrade dppipeline"
                )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in filter(str.strip, _MIGRATIONS[target].split(";")):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {target}")

    @property
    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    # -- queries ------------------------------------------------------------------------------

    def rows(self, scope: str | None = None) -> list[LedgerRow]:
        query = "SELECT * FROM releases" + (" WHERE scope = ?" if scope else "") + " ORDER BY id"
        return [_row(r) for r in self._db.execute(query, (scope,) if scope else ())]

    def scopes(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT DISTINCT scope FROM releases ORDER BY 1")]

    def committed(self, key: ReleaseKey) -> LedgerRow | None:
        """The newest committed release with this key, if any."""
        found = self._db.execute(
            "SELECT * FROM releases WHERE release_key = ? AND state = 'committed' "
            "ORDER BY id DESC LIMIT 1",
            (key.digest,),
        ).fetchone()
        return _row(found) if found else None

    def spent(
        self, scope: str, policy: BudgetPolicy, start: dt.date, end: dt.date
    ) -> tuple[float, float]:
        """The most epsilon and delta any policy window touching [start, end] has spent
        (reserved counts as spent)."""
        rows = [r for r in self.rows(scope) if r.state in ("reserved", "committed")]
        return _window_spend(rows, policy, start, end)

    # -- the release protocol -----------------------------------------------------------------

    def check(self, key: ReleaseKey, *, epsilon: float, delta: float, policy: BudgetPolicy) -> None:
        """Raises BudgetExceededError if `reserve` would refuse this spend now; writes nothing
        (a scheduler's fail-fast check; `reserve` still decides atomically)."""
        used = self.spent(key.scope, policy, key.start_date, key.end_date)
        _check_cap(key.scope, policy, used, epsilon, delta)

    def reserve(
        self,
        key: ReleaseKey,
        *,
        run_id: str,
        job: str,
        epsilon: float,
        delta: float,
        output: str,
        policy: BudgetPolicy,
    ) -> None:
        """Records the spend as reserved, or raises BudgetExceededError; atomic across processes."""
        with self._transaction() as db:
            rows = [
                _row(r)
                for r in db.execute(
                    "SELECT * FROM releases WHERE scope = ? AND state IN ('reserved', 'committed')",
                    (key.scope,),
                )
            ]
            used_eps, used_delta = _window_spend(rows, policy, key.start_date, key.end_date)
            _check_cap(key.scope, policy, (used_eps, used_delta), epsilon, delta)
            db.execute(
                "INSERT INTO releases (run_id, scope, job, spec_hash, input_fingerprint, "
                "start_date, end_date, release_key, epsilon, delta, state, output, pid, host, "
                "reserved_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'reserved', ?, ?, ?, ?)",
                (
                    run_id,
                    key.scope,
                    job,
                    key.spec_hash,
                    key.input_fingerprint,
                    key.start_date.isoformat(),
                    key.end_date.isoformat(),
                    key.digest,
                    epsilon,
                    delta,
                    output,
                    os.getpid(),
                    socket.gethostname(),
                    _now(),
                ),
            )

    @contextmanager
    def spending(
        self,
        key: ReleaseKey,
        *,
        run_id: str,
        job: str,
        epsilon: float,
        delta: float,
        output: str,
        policy: BudgetPolicy,
        failure_note: str,
    ) -> Iterator[None]:
        """Reserves the spend, runs the body, commits; aborts if the body fails (a release
        is published by one rename at its end, so a failed body published nothing)."""
        self.reserve(
            key, run_id=run_id, job=job, epsilon=epsilon, delta=delta, output=output,
            policy=policy,
        )  # fmt: skip
        try:
            yield
        except BaseException:
            self.abort(run_id, note=failure_note)
            raise
        self.commit(run_id)

    def commit(self, run_id: str, note: str | None = None) -> None:
        self._finish(run_id, "committed", note)

    def abort(self, run_id: str, note: str | None = None) -> None:
        self._finish(run_id, "aborted", note)

    def _finish(self, run_id: str, state: str, note: str | None) -> None:
        with self._transaction() as db:
            updated = db.execute(
                "UPDATE releases SET state = ?, finished_at = ?, note = ? "
                "WHERE run_id = ? AND state = 'reserved'",
                (state, _now(), note, run_id),
            ).rowcount
        if updated != 1:
            raise RuntimeError(f"ledger: run {run_id} is not reserved")

    def repair(self, scope: str | None = None) -> list[tuple[str, str]]:
        """Settles reservations of runs that are gone (killed, crashed, lost their machine).

        A reservation counts as spent (committed) when its release folder exists with its run
        id in the manifest: it was published and may have been read. Otherwise nothing was
        published (publication is one atomic rename), and it is aborted, freeing its budget.
        Runs whose process is still alive on this host are left alone, and so are runs from
        other hosts younger than FOREIGN_RESERVATION_TTL (their process cannot be checked).
        """
        settled = []
        host = socket.gethostname()
        for row in self.rows(scope):
            if row.state != "reserved":
                continue
            record = self._db.execute(
                "SELECT pid, host FROM releases WHERE run_id = ?", (row.run_id,)
            ).fetchone()
            if record["host"] == host and _alive(record["pid"]):
                continue
            if record["host"] != host:
                reserved = dt.datetime.fromisoformat(row.reserved_at)
                if dt.datetime.now(dt.UTC) - reserved < FOREIGN_RESERVATION_TTL:
                    continue
            published = published_run_id(Path(row.output)) == row.run_id
            state = "committed" if published else "aborted"
            note = "repaired: " + ("release found" if published else "no release published")
            try:
                self._finish(row.run_id, state, note)
                settled.append((row.run_id, state))
            except RuntimeError:
                continue  # another process settled it first
        return settled


def _check_cap(
    scope: str, policy: BudgetPolicy, used: tuple[float, float], eps: float, delta: float
) -> None:
    used_eps, used_delta = used
    problems = []
    if policy.cap_epsilon is not None and used_eps + eps > policy.cap_epsilon * (1 + CAP_TOLERANCE):
        left = max(policy.cap_epsilon - used_eps, 0.0)
        problems.append(f"epsilon {eps:g} needed, {left:g} left of {policy.cap_epsilon:g}")
    if policy.cap_delta is not None and used_delta + delta > policy.cap_delta * (1 + CAP_TOLERANCE):
        left = max(policy.cap_delta - used_delta, 0.0)
        problems.append(f"delta {delta:g} needed, {left:g} left of {policy.cap_delta:g}")
    if problems:
        span = f" in a {policy.window_days}-day window" if policy.window_days else ""
        raise BudgetExceededError(
            f"privacy budget of scope {scope!r} exhausted{span}: " + "; ".join(problems)
        )


def _window_spend(
    rows: list[LedgerRow], policy: BudgetPolicy, start: dt.date, end: dt.date
) -> tuple[float, float]:
    """All-time sums, or the largest sums over every window of `window_days` data days that
    overlaps [start, end] (each release counts in every window its date range touches)."""
    if not policy.window_days:
        return sum(r.epsilon for r in rows), sum(r.delta for r in rows)
    n = policy.window_days
    worst = (0.0, 0.0)
    first = start - dt.timedelta(days=n - 1)
    for offset in range((end - first).days + 1):
        lo = first + dt.timedelta(days=offset)
        hi = lo + dt.timedelta(days=n - 1)
        inside = [r for r in rows if r.start_date <= hi and r.end_date >= lo]
        sums = (sum(r.epsilon for r in inside), sum(r.delta for r in inside))
        worst = (max(worst[0], sums[0]), max(worst[1], sums[1]))
    return worst


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _row(r: sqlite3.Row) -> LedgerRow:
    return LedgerRow(
        id=r["id"],
        run_id=r["run_id"],
        scope=r["scope"],
        job=r["job"],
        start_date=dt.date.fromisoformat(r["start_date"]),
        end_date=dt.date.fromisoformat(r["end_date"]),
        epsilon=r["epsilon"],
        delta=r["delta"],
        state=r["state"],
        output=r["output"],
        reserved_at=r["reserved_at"],
        finished_at=r["finished_at"],
        release_key=r["release_key"],
        note=r["note"],
    )
