"""The ledger itself: reservations, their states and leases, stored caps, on SQLite or
PostgreSQL through SQLAlchemy Core.

Concurrency: a reservation decides outside any write lock and records under it. It reads the
scope's cap and charged releases, checks the cap (sums, or the composition of privacy events,
which may load dp_accounting and take seconds) without holding anything, then opens a short
write transaction that locks the scope, checks that nothing changed since (the same cap, no
release newer than the newest it read: releases of a scope are inserted one at a time under
this lock, so ids grow in commit order) and inserts its row; when the scope changed it decides
again. After a few such rounds it decides inside the lock, so a run always gets an answer. The
lock is the database's write lock on SQLite (`BEGIN IMMEDIATE`: one host, the embedded
default); on PostgreSQL it is the scope's row in `scopes`, created if missing with `INSERT ...
ON CONFLICT DO NOTHING` and then locked with `SELECT ... FOR UPDATE`, so other scopes do not
wait. Every other write is a single-row update conditional on the row's state, so it needs no
lock: a reservation settled by someone else simply matches no row.

Waiting: SQLite's writers wait for its write lock while other processes make progress; a wait
gives up (`DPPIPELINE_LEDGER_TIMEOUT`, default 10 s) only when no other process committed
anything for that long: a burst of runs on one host queues instead of timing out. A run that
has read data waits for its commit (or its `failed`) as long as it takes, on both databases:
it never ends on a lock timeout with its budget charged and no release.

Trust: before a reservation relies on a SQLite ledger's sums, `PRAGMA integrity_check` must
pass (an index that lost rows would hide spends); a damaged file is refused. A `-shm` or
`-wal` file that a run created while the database was read-only keeps that mode after the
database is writable again; one this user owns is given the database's mode on opening.

The same data in two scopes: a file run's reservation records its files' content fingerprints
(`charged_files`) and is refused when any was charged for the same privacy unit in another
scope. On PostgreSQL that lookup and the insert also hold a transaction-level advisory lock
per privacy unit (taken after the scope's row), so two scopes racing for the same files cannot
both pass; reservations of file runs with the same privacy unit queue on it for the few
milliseconds of their transaction.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import logging
import math
import os
import re
import shlex
import socket
import sqlite3
import stat
import time
import unicodedata
import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection, Engine

from dppipeline.core.events import PrivacyEvent, approx_dp, from_json, merged, to_json
from dppipeline.errors import BudgetExceededError, BudgetHeldError, DPPipelineError, UsageError
from dppipeline.ledger.caps import (
    CHARGED_STATES,
    BudgetPolicy,
    ScopeSpend,
    check_cap,
    governed_policy,
    spend_of,
    window_spend,
)
from dppipeline.ledger.keys import InputContent, ReleaseKey
from dppipeline.ledger.lease import (
    host_id,
    process_gone,
    this_process,
)
from dppipeline.ledger.location import LedgerLocation, parse_ledger_url
from dppipeline.ledger.schema import (
    SCHEMA_VERSION,
    cap_changes,
    charged_files,
    current_version,
    migrate,
    releases,
    scopes,
    stamp,
)
from dppipeline.settings import lease_seconds, ledger_timeout

log = logging.getLogger(__name__)
LIVE_STATES = ("reserved", "reading")
# SQLite: how long its own busy handler waits for the write lock before the ledger looks
# whether another process made progress (and waits on) or none did (`ledger_timeout`).
_BUSY_SLICE = 0.25
# Rounds of deciding outside the lock before a reservation decides under it.
_OPTIMISTIC_ROUNDS = 4
# Files found whole by `PRAGMA integrity_check` in this process: path -> their state then.
_CHECKED: dict[Path, tuple[tuple[int, int, int], ...]] = {}
# pg_advisory_xact_lock(int4, int4) class of the per-privacy-unit content lock (`reserve`).
_CONTENT_LOCK = 0x64705F63  # "dp_c"
_IN_BATCH = 500  # fingerprints per IN (...) list on SQLite


class LedgerError(DPPipelineError):
    """The ledger cannot be used now (unreachable, locked, corrupt, read-only): exit code 1,
    worth a retry once the cause is gone. `cause`: "locked" (a lock wait ran out),
    "unreachable" (PostgreSQL's connection failed), else "other"."""

    def __init__(self, message: str, *, cause: str = "other"):
        super().__init__(message)
        self.cause = cause


class ReservationLostError(LedgerError):
    """This run's reservation was settled by another process (its lease expired): the run
    must stop, and publishes nothing."""


@dataclass(frozen=True)
class LedgerRow:
    """One reservation: a release, a tune, or a run that failed or was abandoned."""

    id: int
    run_id: str
    scope: str
    job: str
    spec_hash: str
    input_fingerprint: str
    start_date: dt.date
    end_date: dt.date
    release_key: str
    epsilon: float
    delta: float
    state: str
    output: str
    pid: int | None
    host: str | None
    host_id: str | None
    reserved_at: str
    reading_at: str | None
    finished_at: str | None
    lease_expires_at: str | None
    note: str | None
    events: tuple[PrivacyEvent, ...] | None = None  # None: recorded before schema v3
    process: str | None = None  # `lease.this_process` of the run (schema v5), None if unknown

    @property
    def charged(self) -> bool:
        return self.state in CHARGED_STATES


@dataclass(frozen=True)
class ScopeData:
    """What a scope's charged releases read, by content (recorded since schema v4): the span
    of their days, how many distinct days and distinct files."""

    first_day: dt.date | None  # None: only files without a day (layout `files`)
    last_day: dt.date | None
    days: int
    files: int


@dataclass(frozen=True)
class StoredCap:
    scope: str
    policy: BudgetPolicy
    updated_at: str
    updated_by: str


@dataclass(frozen=True)
class CapChange:
    id: int
    scope: str
    changed_at: str
    changed_by: str
    policy: BudgetPolicy
    previous: str


class Ledger:
    """One ledger database; safe for concurrent processes and, on PostgreSQL, hosts."""

    def __init__(self, url: str | Path | LedgerLocation, *, timeout: float | None = None):
        self.location = url if isinstance(url, LedgerLocation) else parse_ledger_url(url)
        self.timeout = ledger_timeout() if timeout is None else timeout
        self.host_id = host_id()
        if self.location.path is not None:
            try:
                self.location.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise LedgerError(
                    f"cannot create the folder of ledger {self.location}: {exc.strerror}"
                ) from None
            _heal_read_only_sidecars(self.location.path)
        self._engine = _engine(self.location, self.timeout)
        # Connections close when the ledger is dropped or, at the latest, at exit (the CLI
        # exits without finalizing objects): SQLite then checkpoints its WAL into the file,
        # so that ledger.sqlite alone holds every commit.
        self._closer = weakref.finalize(self, self._engine.dispose)
        self._migrate()

    @property
    def path(self) -> Path | None:
        """The SQLite file; None for PostgreSQL."""
        return self.location.path

    def close(self) -> None:
        self._closer()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions -------------------------------------------------------------------------

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Database errors as one line naming the ledger, never a traceback or a password."""
        try:
            yield
        except sa.exc.DBAPIError as exc:
            message, cause = self._describe(exc)
            raise LedgerError(message, cause=cause) from None

    @contextmanager
    def _transaction(self, write: bool, patient: bool = False) -> Iterator[Connection]:
        with self._guard(), self._engine.connect() as conn:
            conn.execution_options(ledger_write=write, ledger_patient=patient)
            with conn.begin():
                yield conn

    def _write(self, *, patient: bool = False) -> AbstractContextManager[Connection]:
        """A write transaction; on SQLite it takes the database's write lock at once, waiting
        while other processes make progress (`patient`: however long it takes)."""
        return self._transaction(True, patient)

    def _read(self) -> AbstractContextManager[Connection]:
        return self._transaction(False)

    def _now(self, conn: Connection) -> dt.datetime:
        """The database's clock where it has one (PostgreSQL), so hosts agree on leases;
        SQLite lives on one host, whose clock it is."""
        if conn.dialect.name == "postgresql":
            return conn.execute(sa.select(sa.func.clock_timestamp())).scalar_one()
        return dt.datetime.now(dt.UTC)

    def _migrate(self) -> None:
        with self._read() as conn:
            version = current_version(conn)
        if version == SCHEMA_VERSION:
            return
        with self._write() as conn:
            migrate(conn, str(self.location), stamp(self._now(conn)))

    @property
    def schema_version(self) -> int:
        with self._read() as conn:
            return current_version(conn)

    def _describe(self, exc: sa.exc.DBAPIError) -> tuple[str, str]:
        """(one line, its cause for LedgerError)."""
        orig = exc.orig
        lines = str(orig if orig is not None else exc).strip().splitlines()
        text = lines[0] if lines else type(orig).__name__
        password = self.location.url.password
        if password:
            text = text.replace(str(password), "***")
        low = text.lower()
        where = self.location
        if getattr(orig, "sqlstate", None) == "55P03" or "locked" in low or "lock timeout" in low:
            waited = (
                f"waited {self.timeout:g} s in which no other process wrote to it"
                if self.location.backend == "sqlite"
                else f"waited {self.timeout:g} s"
            )
            return (
                f"ledger {where} is locked by another process ({waited}; "
                "DPPIPELINE_LEDGER_TIMEOUT sets the wait): retry later"
            ), "locked"
        if "not a database" in low or "malformed" in low:
            return f"ledger {where} is not a SQLite database or is corrupt", "other"
        if "readonly" in low or "read-only" in low:
            why = _read_only_part(self.location.path) if self.location.path else None
            return (
                f"ledger {where} is read-only{why or ''}: it must be writable to record spends",
                "other",
            )
        if "unable to open" in low:
            return f"cannot open ledger {where} (a missing or unwritable folder?)", "other"
        if "disk is full" in low or "disk i/o error" in low:
            return f"ledger {where}: {text} (a full disk?)", "other"
        if self.location.backend == "postgresql" and isinstance(exc, sa.exc.OperationalError):
            state = getattr(orig, "sqlstate", None) or ""
            lost = not state or state.startswith(("08", "57P"))  # connection, shutdown
            return f"cannot use ledger {where}: {text}", "unreachable" if lost else "other"
        return f"ledger {where}: {text}", "other"

    def _trust(self) -> None:
        """Refuses a damaged SQLite ledger before a reservation relies on its sums: an index
        that lost entries hides the releases it indexed (`PRAGMA quick_check` does not see
        that; `integrity_check` does). Checked once per process and state of the files."""
        path = self.location.path
        if path is None:
            return
        state = _file_state(path)
        if state and _CHECKED.get(path) == state:
            return
        with self._read() as conn:
            found = [str(r[0]) for r in conn.exec_driver_sql("PRAGMA integrity_check(1)")]
        if found != ["ok"]:
            first = " ".join((found[0] if found else "no answer").split())[:200]
            raise LedgerError(
                f"ledger {self.location} is damaged: PRAGMA integrity_check reports {first!r}; "
                "its spends cannot be trusted: restore it from a backup"
            )
        _CHECKED[path] = state

    # -- queries ------------------------------------------------------------------------------

    def rows(self, scope: str | None = None) -> list[LedgerRow]:
        query = sa.select(releases).order_by(releases.c.id)
        if scope is not None:
            query = query.where(releases.c.scope == scope)
        with self._read() as conn:
            return [_row(r) for r in conn.execute(query).mappings()]

    def row(self, run_id: str) -> LedgerRow | None:
        with self._read() as conn:
            found = conn.execute(sa.select(releases).where(releases.c.run_id == run_id))
            record = found.mappings().first()
        return _row(record) if record is not None else None

    def scopes(self) -> list[str]:
        """Every scope with a stored cap or a recorded release."""
        with self._read() as conn:
            named = set(conn.execute(sa.select(scopes.c.scope)).scalars())
            named |= set(conn.execute(sa.select(releases.c.scope).distinct()).scalars())
        return sorted(named)

    def scope_data(self) -> dict[str, ScopeData]:
        """Per scope, the data its charged releases read, by content; scopes whose releases
        recorded none (in-memory rows, releases before schema v4) are absent."""
        c = charged_files
        query = (
            sa.select(
                releases.c.scope,
                sa.func.min(c.c.day),
                sa.func.max(c.c.day),
                sa.func.count(sa.distinct(c.c.day)),
                sa.func.count(sa.distinct(c.c.fingerprint)),
            )
            .join_from(c, releases, releases.c.run_id == c.c.run_id)
            .where(releases.c.state.in_(CHARGED_STATES))
            .group_by(releases.c.scope)
        )
        with self._read() as conn:
            found = conn.execute(query).all()
        return {
            scope: ScopeData(_day(first), _day(last), days, files)
            for scope, first, last, days, files in found
        }

    def cap(self, scope: str) -> StoredCap | None:
        """The scope's stored cap; None when it has none."""
        return self.caps().get(scope)

    def caps(self) -> dict[str, StoredCap]:
        with self._read() as conn:
            found = conn.execute(sa.select(scopes)).mappings().all()
        stored = {r["scope"]: _stored(r) for r in found}
        return {name: cap for name, cap in stored.items() if cap.policy.is_capped}

    def cap_history(self, scope: str | None = None) -> list[CapChange]:
        query = sa.select(cap_changes).order_by(cap_changes.c.id)
        if scope is not None:
            query = query.where(cap_changes.c.scope == scope)
        with self._read() as conn:
            return [
                CapChange(
                    id=r["id"],
                    scope=r["scope"],
                    changed_at=r["changed_at"],
                    changed_by=r["changed_by"],
                    policy=BudgetPolicy(r["cap_epsilon"], r["cap_delta"], r["window_days"]),
                    previous=r["previous"],
                )
                for r in conn.execute(query).mappings()
            ]

    def committed(self, key: ReleaseKey) -> LedgerRow | None:
        """The newest committed release with this key, if any."""
        query = (
            sa.select(releases)
            .where(releases.c.release_key == key.digest, releases.c.state == "committed")
            .order_by(releases.c.id.desc())
            .limit(1)
        )
        with self._read() as conn:
            found = conn.execute(query).mappings().first()
        return _row(found) if found is not None else None

    def spent(
        self, scope: str, policy: BudgetPolicy, start: dt.date, end: dt.date
    ) -> tuple[float, float]:
        """By sums, the most epsilon and delta any policy window touching [start, end] has
        charged (reserved, reading, committed and failed all count)."""
        with self._read() as conn:
            charged = _charged(conn, scope)
        return window_spend(charged, policy, start, end)

    def composed(self, scope: str, policy: BudgetPolicy) -> ScopeSpend:
        """Every charged release of the scope, by sums and composed (`caps.spend_of`)."""
        with self._read() as conn:
            charged = _charged(conn, scope)
        return spend_of(charged, policy)

    # -- caps -----------------------------------------------------------------------------------

    def set_cap(self, scope: str, policy: BudgetPolicy, changed_by: str) -> CapChange:
        """Stores (or replaces) a scope's cap and records the change."""
        if not policy.is_capped:
            raise UsageError("budget set-cap: --epsilon is required")
        with self._write() as conn:
            now = stamp(self._now(conn))
            row = self._lock_scope(conn, scope, now, changed_by)
            previous = _stored(row).policy
            return self._store_cap(
                conn, scope=scope, policy=policy, now=now, changed_by=changed_by, previous=previous
            )

    def _store_cap(
        self,
        conn: Connection,
        *,
        scope: str,
        policy: BudgetPolicy,
        now: str,
        changed_by: str,
        previous: BudgetPolicy,
    ) -> CapChange:
        conn.execute(
            scopes.update()
            .where(scopes.c.scope == scope)
            .values(
                cap_epsilon=policy.cap_epsilon,
                cap_delta=policy.cap_delta,
                window_days=policy.window_days,
                updated_at=now,
                updated_by=changed_by,
            )
        )
        change_id = conn.execute(
            cap_changes.insert().values(
                scope=scope,
                changed_at=now,
                changed_by=changed_by,
                cap_epsilon=policy.cap_epsilon,
                cap_delta=policy.cap_delta,
                window_days=policy.window_days,
                previous=previous.describe(),
            )
        ).inserted_primary_key[0]
        return CapChange(change_id, scope, now, changed_by, policy, previous.describe())

    def _lock_scope(self, conn: Connection, scope: str, now: str, by: str) -> sa.RowMapping:
        """The scope's row, created when missing, locked until the transaction ends."""
        insert = (pg_dialect if conn.dialect.name == "postgresql" else sqlite_dialect).insert
        created = conn.execute(
            insert(scopes)
            .values(scope=scope, created_at=now, updated_at=now, updated_by=by)
            .on_conflict_do_nothing(index_elements=["scope"])
            .returning(scopes.c.scope)  # a row only when inserted (rowcount is -1 on psycopg)
        )
        if created.first() is not None:  # a new scope: refused (rolled back) if a variant
            _refuse_near_duplicate(conn, scope)
        query = sa.select(scopes).where(scopes.c.scope == scope).with_for_update()
        return conn.execute(query).mappings().one()

    def effective_policy(self, scope: str, requested: BudgetPolicy) -> BudgetPolicy:
        """The cap a run with these spec fields would be held to; raises
        BudgetExceededError when the spec's fields differ from the stored cap. Writes nothing."""
        stored = self.cap(scope)
        stored_policy = stored.policy if stored is not None else None
        if governed_policy(scope, stored_policy, requested):
            return requested
        return stored_policy or BudgetPolicy()

    # -- the release protocol -----------------------------------------------------------------

    def check(
        self,
        key: ReleaseKey,
        *,
        epsilon: float,
        delta: float,
        policy: BudgetPolicy,
        events: Sequence[PrivacyEvent] | None = None,
    ) -> BudgetPolicy:
        """Raises BudgetExceededError (or BudgetHeldError) if `reserve` would refuse this spend
        now; returns the cap it would apply. Writes nothing (a scheduler's fail-fast check;
        `reserve` still decides atomically); reservations of dead runs count as settled, as
        `reserve` would settle them."""
        self._trust()
        with self._read() as conn:
            known = conn.execute(sa.select(scopes.c.scope).where(scopes.c.scope == key.scope))
            if known.first() is None:
                _refuse_near_duplicate(conn, key.scope)
            _refuse_content_of_other_scopes(conn, key)
            view = self._view(conn, key.scope, policy)
        return _decide(key.scope, view, policy, _new_spend(key, epsilon, delta, events)).policy

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
        events: Sequence[PrivacyEvent] | None = None,
    ) -> BudgetPolicy:
        """Records the spend as `reserved` with a fresh lease, or raises BudgetExceededError
        (BudgetHeldError when only live reservations of other runs that read nothing yet stand
        in the way); atomic across processes and hosts. `policy`: the job spec's cap fields,
        checked against (or, for a scope without a cap, stored as) the scope's cap. `events`:
        the release's mechanisms (`core.events`), which the scope composes; without them the
        release counts as one (epsilon, delta) mechanism. `key.content`: the files a file run
        reads, by content; refused when any was charged for the same privacy unit in another
        scope, and recorded. Reservations of runs that are provably dead on this host, or
        whose lease ran out, are settled first. Returns the cap applied.

        The decision is made outside the write lock and re-made when the scope changed before
        the lock was taken (see the module's docstring); the last round decides under it."""
        if not (math.isfinite(epsilon) and epsilon >= 0 and 0 <= delta <= 1):
            # An infinite spend would exhaust its scope forever, recorded as a failure.
            raise UsageError(
                f"a spend must be a finite epsilon >= 0 and a delta in [0, 1], got "
                f"epsilon {epsilon:g}, delta {delta:g}"
            )
        self._trust()
        new = _new_spend(key, epsilon, delta, events)
        for round_ in itertools.count():
            try:
                return self._reserve_round(
                    key, new, policy, run_id=run_id, job=job, output=output,
                    inside=round_ >= _OPTIMISTIC_ROUNDS,
                )  # fmt: skip
            except _StaleError:
                continue  # another run reserved or moved on, or the cap changed: decide again
        raise AssertionError("unreachable")  # pragma: no cover

    def _reserve_round(
        self,
        key: ReleaseKey,
        new: _NewSpend,
        policy: BudgetPolicy,
        *,
        run_id: str,
        job: str,
        output: str,
        inside: bool,
    ) -> BudgetPolicy:
        """One round of `reserve`: decide (outside the lock unless `inside`), then record
        under it; raises _StaleError when the scope changed in between."""
        epsilon, delta = new.epsilon, new.delta
        decision = view = None
        if not inside:
            with self._read() as conn:
                view = self._view(conn, key.scope, policy)
            decision = _decide(key.scope, view, policy, new)
        with self._write() as conn:
            now = self._now(conn)
            row = self._lock_scope(conn, key.scope, stamp(now), f"run {run_id} ({job})")
            if decision is None or view is None:  # the last round: decide under the lock
                decision = _decide(key.scope, self._view(conn, key.scope, policy), policy, new)
            elif _changed(conn, key.scope, view, row):
                raise _StaleError()
            _refuse_content_of_other_scopes(conn, key, lock=True)
            if not all(self._settle(conn, r, why, stamp(now)) for r, why in decision.settle):
                raise _StaleError()  # a row it took for dead moved on (its run committed first)
            if decision.store:
                self._store_cap(
                    conn,
                    scope=key.scope,
                    policy=policy,
                    now=stamp(now),
                    changed_by=f"job {job}, run {run_id}",
                    previous=_stored(row).policy,
                )
            conn.execute(
                releases.insert().values(
                    run_id=run_id,
                    scope=key.scope,
                    job=job,
                    spec_hash=key.spec_hash,
                    input_fingerprint=key.input_fingerprint,
                    start_date=key.start_date.isoformat(),
                    end_date=key.end_date.isoformat(),
                    release_key=key.digest,
                    epsilon=epsilon,
                    delta=delta,
                    events=to_json(new.events or ()),
                    state="reserved",
                    output=output,
                    pid=os.getpid(),
                    host=socket.gethostname(),
                    host_id=self.host_id,
                    process=this_process(),
                    reserved_at=stamp(now),
                    lease_expires_at=_expiry(now),
                )
            )
            if key.content is not None:
                _record_content(conn, run_id, key.content)
        return decision.policy

    def _view(self, conn: Connection, scope: str, requested: BudgetPolicy) -> _ScopeView:
        """What a reservation in `scope` decides on: the stored cap and, when a cap applies,
        the charged releases and the newest release id read before them."""
        found = conn.execute(sa.select(scopes).where(scopes.c.scope == scope)).mappings().first()
        stored = _stored(found).policy if found is not None else None
        capped = (stored is not None and stored.is_capped) or requested.is_capped
        last_id, charged = None, []
        if capped:
            last_id = conn.execute(
                sa.select(sa.func.max(releases.c.id)).where(releases.c.scope == scope)
            ).scalar()
            charged = _charged(conn, scope)
        return _ScopeView(stored, last_id or 0, tuple(charged), self._now(conn), capped)

    def _settle(self, conn: Connection, row: LedgerRow, why: str, now: str) -> bool:
        """A dead run's `reserved` row -> `aborted`, in the caller's transaction (by the
        charge rules: it read nothing). False when the row is no longer `reserved`."""
        done = conn.execute(
            releases.update()
            .where(releases.c.run_id == row.run_id, releases.c.state == "reserved")
            .values(state="aborted", note=f"repaired: {why} before reading", finished_at=now)
        )
        return done.rowcount == 1

    def mark_reading(self, run_id: str) -> None:
        """`reserved` -> `reading`, just before the first byte of input is read: from here
        on the budget stays charged whatever happens."""
        self._transition(run_id, ("reserved",), "reading", None, reading=True)

    def commit(self, run_id: str, note: str | None = None) -> None:
        """`reading` -> `committed`: only while the row is still this run's live
        reservation; raises ReservationLostError if someone settled it. Waits for the lock
        as long as it takes: the run has read its data."""
        self._transition(run_id, ("reading",), "committed", note, patient=True)

    def fail(self, run_id: str, note: str | None = None) -> None:
        """-> `failed`: the run may have read data and did not publish; still charged. Waits
        for the lock as long as it takes, like `commit`."""
        self._transition(run_id, LIVE_STATES, "failed", note, patient=True)

    def abort(self, run_id: str, note: str | None = None) -> None:
        """`reserved` -> `aborted`: the run failed before reading anything; budget freed."""
        self._transition(run_id, ("reserved",), "aborted", note)

    def renew(self, run_id: str) -> bool:
        """Extends the lease; False when the row is no longer a live reservation."""
        with self._write() as conn:
            done = conn.execute(
                releases.update()
                .where(releases.c.run_id == run_id, releases.c.state.in_(LIVE_STATES))
                .values(lease_expires_at=_expiry(self._now(conn)))
            )
            return done.rowcount == 1

    def _transition(
        self,
        run_id: str,
        sources: Sequence[str],
        target: str,
        note: str | None,
        *,
        reading: bool = False,
        patient: bool = False,
    ) -> None:
        """One conditional update. `patient` (a run that has read its data): a lock wait that
        runs out is retried without end (SQLite's wait is patient itself), and a PostgreSQL
        that cannot be reached is retried for up to a lease (`lease_seconds`), after which
        the row may be settled by others anyway; the run says so every 10 s."""
        deadline = noted = None
        while True:
            try:
                record = self._update_state(
                    run_id, sources, target, note, reading=reading, patient=patient
                )
                break
            except LedgerError as exc:
                if not patient or exc.cause not in ("locked", "unreachable"):
                    raise
                now = time.monotonic()
                if exc.cause == "unreachable":
                    deadline = deadline or now + lease_seconds()
                    if now >= deadline:
                        raise
                    time.sleep(0.5)
                if noted is None or now - noted >= 10:
                    noted = now
                    log.warning("%s; still trying to record run %s as %s", exc, run_id, target)
        if record is None:
            return
        if not record:
            raise ReservationLostError(f"ledger {self.location}: run {run_id} is not recorded")
        why = f" ({record['note']})" if record["note"] else ""
        if record["state"] in LIVE_STATES:  # a caller's mistake, not a lost reservation
            raise LedgerError(
                f"ledger {self.location}: run {run_id} is {record['state']}; it cannot become "
                f"{target} from there"
            )
        raise ReservationLostError(
            f"ledger {self.location}: run {run_id} is {record['state']}{why}, not "
            f"{' or '.join(sources)}: another process settled it (its lease ran out, or its "
            f"process looked dead), so this run cannot become {target} and publishes nothing"
        )

    def _update_state(
        self,
        run_id: str,
        sources: Sequence[str],
        target: str,
        note: str | None,
        *,
        reading: bool,
        patient: bool,
    ) -> sa.RowMapping | dict[str, object] | None:
        """None when the row moved to `target`, else the row as it is (or {} if absent)."""
        with self._write(patient=patient) as conn:
            now = self._now(conn)
            values: dict[str, object] = {"state": target}
            if reading:
                values |= {"reading_at": stamp(now), "lease_expires_at": _expiry(now)}
            else:
                values |= {"finished_at": stamp(now), "note": note}
            done = conn.execute(
                releases.update()
                .where(releases.c.run_id == run_id, releases.c.state.in_(sources))
                .values(**values)
            )
            if done.rowcount == 1:
                return None
            found = conn.execute(sa.select(releases).where(releases.c.run_id == run_id))
            return found.mappings().first() or {}

    def repair(self, scope: str | None = None) -> list[tuple[str, str]]:
        """Settles reservations whose run is gone: its lease expired (killed, crashed, or lost
        its host, anywhere), or its process is provably dead on this host (`lease.
        process_gone`: no need to wait for the lease). By the charge rules:

        - `reserved` (nothing read) -> `aborted`, budget freed;
        - `reading` -> `committed` when the release at its output carries its run id (a
          release published by a version that committed after publishing), else `failed`:
          it may have read data, so its budget stays charged.

        Each update is conditional on the lease the check saw, so a renewal in between wins.
        """
        query = sa.select(releases).where(releases.c.state.in_(LIVE_STATES))
        if scope is not None:
            query = query.where(releases.c.scope == scope)
        with self._read() as conn:
            now = self._now(conn)
            candidates = [_row(r) for r in conn.execute(query).mappings()]
        settled = []
        for row in candidates:
            why = _why_dead(row, now)
            if why is None:
                continue  # alive, wherever it runs
            from dppipeline.storage.releases import published_run_id  # noqa: PLC0415 (rare path)

            if row.state == "reserved":
                state, note = "aborted", f"repaired: {why} before reading"
            elif published_run_id(row.output) == row.run_id:
                state, note = "committed", f"repaired: {why}; release found"
            else:
                state, note = "failed", f"repaired: {why} while reading; charged"
            lease = releases.c.lease_expires_at
            with self._write() as conn:
                done = conn.execute(
                    releases.update()
                    .where(
                        releases.c.run_id == row.run_id,
                        releases.c.state == row.state,
                        lease.is_(None)
                        if row.lease_expires_at is None
                        else lease == row.lease_expires_at,
                    )
                    .values(state=state, note=note, finished_at=stamp(self._now(conn)))
                )
            if done.rowcount == 1:
                settled.append((row.run_id, state))
        return settled

    def lease_alive(self, row: LedgerRow) -> bool:
        """Is this live-state row's lease still running, by the database's clock?"""
        if row.state not in LIVE_STATES or row.lease_expires_at is None:
            return False
        with self._read() as conn:
            now = self._now(conn)
        return _parse(row.lease_expires_at) > now


def _engine(location: LedgerLocation, timeout: float) -> Engine:
    if location.backend == "sqlite":
        engine = sa.create_engine(location.url, connect_args={"timeout": timeout})

        @sa.event.listens_for(engine, "connect")
        def _connect(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
            dbapi_connection.isolation_level = None  # SQLAlchemy's "begin" below decides
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")  # a commit is on disk before publishing
            cursor.close()

        @sa.event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            options = conn.get_execution_options()
            if not options.get("ledger_write"):
                conn.exec_driver_sql("BEGIN")
                return
            db = conn.connection.dbapi_connection
            assert isinstance(db, sqlite3.Connection)
            _begin_immediate(db, timeout, bool(options.get("ledger_patient")), str(location))

        return engine
    wait_ms = int(timeout * 1000)
    return sa.create_engine(
        location.url,
        pool_pre_ping=True,
        connect_args={
            "connect_timeout": max(1, math.ceil(timeout)),
            "options": f"-c lock_timeout={wait_ms}",
            "application_name": "dppipeline",
        },
    )


def _begin_immediate(db: sqlite3.Connection, timeout: float, patient: bool, where: str) -> None:
    """`BEGIN IMMEDIATE` (SQLite's write lock), waiting as long as other processes make
    progress: SQLite's busy handler waits a short slice at a time, and between slices `PRAGMA
    data_version` says whether another connection committed meanwhile. The wait gives up
    after `timeout` seconds without any commit by another process (a holder that is stuck,
    not busy); a `patient` one (a run that has read its data) never gives up and says so
    every `timeout` seconds."""
    slice_ms = max(1, int(min(_BUSY_SLICE, timeout) * 1000))
    db.execute(f"PRAGMA busy_timeout = {slice_ms}")
    try:
        version = _data_version(db)
        idle_since = noted = time.monotonic()
        while True:
            try:
                db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if (
                    getattr(exc, "sqlite_errorcode", sqlite3.SQLITE_BUSY) & 0xFF
                    != sqlite3.SQLITE_BUSY
                ):
                    raise sa.exc.OperationalError("BEGIN IMMEDIATE", None, exc) from None
                busy = exc
            now, seen = time.monotonic(), _data_version(db)
            if seen is not None and seen != version:
                version, idle_since = seen, now  # another process committed: keep waiting
            elif now - idle_since >= timeout:
                if not patient:
                    raise sa.exc.OperationalError("BEGIN IMMEDIATE", None, busy) from None
                if now - noted >= timeout:
                    noted = now
                    log.warning(
                        "ledger %s: its write lock has been held for %.0f s without progress; "
                        "this run has read its data and waits to record its outcome", where,
                        now - idle_since,
                    )  # fmt: skip
    finally:
        db.execute(f"PRAGMA busy_timeout = {max(1, int(timeout * 1000))}")


def _data_version(db: sqlite3.Connection) -> int | None:
    """SQLite's counter of commits by other connections; None when it cannot be read now."""
    try:
        return int(db.execute("PRAGMA data_version").fetchone()[0])
    except sqlite3.Error:
        return None


def _expiry(now: dt.datetime) -> str:
    return stamp(now + dt.timedelta(seconds=lease_seconds()))


def _why_dead(row: LedgerRow, now: dt.datetime) -> str | None:
    """Why a live row's run is known to be gone (for its note), or None while it may live:
    its lease ran out, or its process is provably dead on this host."""
    who = f"host {row.host_id or row.host}"
    if row.lease_expires_at is None or _parse(row.lease_expires_at) <= now:
        return f"lease of {who} expired"
    if process_gone(row.process):
        return f"process {row.pid} of {who} ended"
    return None


class _StaleError(Exception):
    """The scope changed between a reservation's decision and its lock: decide again."""


@dataclass(frozen=True)
class _ScopeView:
    """A scope as a reservation reads it before deciding (`Ledger._view`)."""

    stored: BudgetPolicy | None  # None: the scope has no row yet
    last_id: int  # the newest release id of the scope, read before `charged`
    charged: tuple[LedgerRow, ...]  # empty when no cap applies
    now: dt.datetime
    capped: bool


@dataclass(frozen=True)
class _Decision:
    policy: BudgetPolicy  # the cap applied
    store: bool  # store `policy` as the scope's cap (it has none)
    settle: tuple[tuple[LedgerRow, str], ...] = ()  # dead runs' reservations, and why


def _decide(scope: str, view: _ScopeView, requested: BudgetPolicy, new: _NewSpend) -> _Decision:
    """Admits `new` or raises: BudgetExceededError when the scope's cap is exhausted whatever
    its live reservations do, BudgetHeldError when it would fit but for reservations of live
    runs that have read nothing yet (they may abort). Reservations of dead runs (`_why_dead`)
    count as settled, and are returned to be settled with the insert. Reads nothing: the
    caller holds the view (and, if it must be exact, the lock)."""
    store = governed_policy(scope, view.stored, requested)
    if store:
        effective = requested
    else:
        effective = (
            view.stored if view.stored is not None and view.stored.is_capped else BudgetPolicy()
        )
    charged = list(view.charged)
    settle: list[tuple[LedgerRow, str]] = []
    while True:
        try:
            check_cap(scope, effective, charged, new)
            return _Decision(effective, store, tuple(settle))
        except BudgetExceededError as refused:
            holders = [r for r in charged if r.state == "reserved" and _touches(r, effective, new)]
            if not holders:
                raise
            held = {r.run_id for r in holders}
            try:
                check_cap(scope, effective, [r for r in charged if r.run_id not in held], new)
            except BudgetExceededError:
                raise refused from None  # exhausted, whatever the live reservations do
            dead = [(r, why) for r in holders if (why := _why_dead(r, view.now)) is not None]
            if not dead:
                raise _held(scope, holders, refused) from None
            settle += dead
            gone = {r.run_id for r, _ in dead}
            charged = [r for r in charged if r.run_id not in gone]


def _touches(row: LedgerRow, policy: BudgetPolicy, new: _NewSpend) -> bool:
    """Does `row` count in a window the new release's dates touch (every row without one)?"""
    if not policy.window_days:
        return True
    reach = dt.timedelta(days=policy.window_days - 1)
    return row.start_date <= new.end_date + reach and row.end_date >= new.start_date - reach


def _held(scope: str, holders: list[LedgerRow], refused: BudgetExceededError) -> BudgetHeldError:
    """The refusal while live reservations hold the budget: which run, until when (the latest
    of their leases), and what the cap says meanwhile."""
    latest = max(holders, key=lambda r: r.lease_expires_at or "")
    until = _parse(latest.lease_expires_at) if latest.lease_expires_at else None
    when = f"{until:%H:%M:%S}" if until is not None else "its lease ends"
    more = f" (and {len(holders) - 1} more live reservations)" if len(holders) > 1 else ""
    text = str(refused)
    cut = text.find(" exhausted", len(f"privacy budget of scope {scope!r}"))
    detail = text[cut + 1 :] if cut >= 0 else text
    return BudgetHeldError(
        f"privacy budget of scope {scope!r} held by run {latest.run_id}{more} until {when} "
        f"(UTC); retry then ({detail}, counting live reservations that have read nothing yet "
        "and may still give their budget back)",
        held_by=latest.run_id,
        retry_at=latest.lease_expires_at or "",
        remaining_epsilon=refused.remaining_epsilon,
        remaining_delta=refused.remaining_delta,
    )


def _changed(conn: Connection, scope: str, view: _ScopeView, row: sa.RowMapping) -> bool:
    """Under the scope's lock: did the scope change since `view` was read (another cap, or a
    release newer than the newest it read)? Releases of a scope are inserted one at a time
    under this lock, so a release the view missed has a larger id."""
    if _stored(row).policy != (view.stored or BudgetPolicy()):
        return True
    if not view.capped:
        return False
    newer = conn.execute(
        sa.select(releases.c.id)
        .where(releases.c.scope == scope, releases.c.id > view.last_id)
        .limit(1)
    )
    return newer.first() is not None


def _file_state(path: Path) -> tuple[tuple[int, int, int], ...]:
    """(inode, size, mtime) of the database and its WAL: what a write changes."""
    found = []
    for name in (path, path.with_name(path.name + "-wal")):
        try:
            st = name.stat()
        except OSError:
            continue
        found.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(found)


def _heal_read_only_sidecars(path: Path) -> None:
    """After a read-only incident. SQLite creates `-shm` and `-wal` with the database file's
    mode, so a run that opened the ledger while the file was read-only left a read-only
    `-shm`; once the file is writable again, every writer still failed "read-only". When this
    user can write the database and owns such a file, it gets the database's write bits
    (a mode change: harmless to any process that has the file open)."""
    if not _writable(path):
        return
    mode = stat.S_IMODE(path.stat().st_mode)
    for side in (path.with_name(path.name + "-shm"), path.with_name(path.name + "-wal")):
        try:
            found = side.lstat()
        except OSError:
            continue
        if not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid() or _writable(side):
            continue
        try:
            os.chmod(side, stat.S_IMODE(found.st_mode) | (mode & 0o222) | stat.S_IWUSR)
        except OSError:
            continue  # the read-only error will name it
        log.warning("ledger %s: %s was read-only (left so while the ledger was); made writable",
                    path, side.name)  # fmt: skip


def _writable(path: Path) -> bool:
    """Can this process open `path` for writing (its real permissions, not a guess)?"""
    try:
        os.close(os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0)))
    except OSError:
        return False
    return True


def _read_only_part(path: Path) -> str | None:
    """Which of the ledger's files this process cannot write, for the read-only message."""
    if not _writable(path):
        return None  # the database itself: the message says so
    for side in (path.with_name(path.name + "-shm"), path.with_name(path.name + "-wal")):
        if side.exists() and not _writable(side):
            owner = side.stat().st_uid
            return (
                f" ({side.name} is not writable by this user; its owner, uid {owner}, must make "
                "it writable, or remove it while no process uses the ledger)"
            )
    if not os.access(path.parent, os.W_OK | os.X_OK):
        return f" (its folder {path.parent} is not writable: SQLite creates files beside it)"
    return None


def _day(text: str | None) -> dt.date | None:
    return dt.date.fromisoformat(text) if text else None


def _parse(text: str) -> dt.datetime:
    moment = dt.datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def scope_form(scope: str) -> str:
    """What scope names that read as one share: case, spaces and repeated or outer slashes
    removed (`tx/CUSTOMER_ID`, `TX/customer_id `, `tx//CUSTOMER_ID`)."""
    text = "".join(unicodedata.normalize("NFKC", scope).casefold().split())
    return re.sub("/+", "/", text).strip("/")


def _refuse_near_duplicate(conn: Connection, scope: str) -> None:
    """A new scope whose name differs from an existing one only by case, spaces or slashes
    is refused: it would hold the same data without the existing scope's cap."""
    form = scope_form(scope)
    for other in conn.execute(sa.select(scopes.c.scope)).scalars():
        if other != scope and scope_form(other) == form:
            raise UsageError(
                f"budget scope {scope!r} differs from the ledger's scope {other!r} only by "
                f"case, spaces or slashes: use {other!r} (a near-duplicate scope would escape "
                "its cap)"
            )


def _refuse_content_of_other_scopes(conn: Connection, key: ReleaseKey, lock: bool = False) -> None:
    """Raises BudgetExceededError when any file this run reads was charged (by a release that
    is not `aborted`) for the same privacy unit in another scope: the same data, copied,
    linked, renamed or named by another scope, stays held to its first scope's cap. `lock`:
    on PostgreSQL, hold the privacy unit's content lock until the transaction ends."""
    content = key.content
    files = [f for f in content.files if f.fingerprint is not None] if content else []
    if content is None or not files:
        return
    if lock and conn.dialect.name == "postgresql":
        unit = int.from_bytes(hashlib.sha256(content.privacy_unit.encode()).digest()[:4], "big")
        conn.execute(
            sa.text("SELECT pg_advisory_xact_lock(CAST(:kind AS integer), CAST(:unit AS integer))"),
            {"kind": _CONTENT_LOCK, "unit": unit - (1 << 32) if unit >= 1 << 31 else unit},
        )
    wanted = sorted({f.fingerprint for f in files if f.fingerprint is not None})
    first_charge: dict[str, tuple[int, str, str]] = {}  # fingerprint -> (id, scope, run id)
    for matching in _any_of(conn, charged_files.c.fingerprint, wanted):
        query = (
            sa.select(releases.c.id, releases.c.scope, releases.c.run_id)
            .add_columns(charged_files.c.fingerprint)
            .join_from(charged_files, releases, releases.c.run_id == charged_files.c.run_id)
            .where(
                charged_files.c.privacy_unit == content.privacy_unit,
                matching,
                releases.c.scope != key.scope,
                releases.c.state.in_(CHARGED_STATES),
            )
        )
        for found in conn.execute(query):
            known = first_charge.get(found.fingerprint)
            if known is None or found.id < known[0]:
                first_charge[found.fingerprint] = (found.id, found.scope, found.run_id)
    clashes = [f for f in files if f.fingerprint in first_charge]
    if not clashes:
        return
    first = clashes[0]
    _, scope, run_id = first_charge[first.fingerprint]  # type: ignore[index]
    what = f"day {first.day} ({first.name})" if first.day else f"file {first.name}"
    more = f" and {len(clashes) - 1} more of its files were" if len(clashes) > 1 else " was"
    raise BudgetExceededError(
        f"the input's {what}{more} already charged in scope {scope!r} (run {run_id}, privacy "
        f"unit {content.privacy_unit}); the same data stays in that scope: run with --scope "
        f"{shlex.quote(scope)} (budget.scope)"
    )


def _any_of(conn: Connection, column: sa.Column, values: list[str]) -> list[sa.ColumnElement[bool]]:
    """`column` among `values`, as conditions whose queries together cover them: one array
    parameter on PostgreSQL (one round trip; 500-value IN lists took it 0.4 s each on a fresh
    table), IN lists of at most 500 values on SQLite (under its parameter limit, 999 in
    older builds)."""
    if conn.dialect.name == "postgresql":
        return [column == sa.any_(sa.literal(values, pg_dialect.ARRAY(sa.Text)))]
    return [column.in_(values[i : i + _IN_BATCH]) for i in range(0, len(values), _IN_BATCH)]


def _record_content(conn: Connection, run_id: str, content: InputContent) -> None:
    """The reservation's files by content, with its privacy unit (files without rows have no
    fingerprint and are not recorded)."""
    rows = [
        {
            "run_id": run_id,
            "privacy_unit": content.privacy_unit,
            "fingerprint": f.fingerprint,
            "day": f.day.isoformat() if f.day is not None else None,
            "file": f.name,
        }
        for f in content.files
        if f.fingerprint is not None
    ]
    if rows:
        conn.execute(charged_files.insert(), rows)


def _new_spend(
    key: ReleaseKey, epsilon: float, delta: float, events: Sequence[PrivacyEvent] | None
) -> _NewSpend:
    return _NewSpend(
        epsilon,
        delta,
        key.start_date,
        key.end_date,
        merged(events) if events is not None else (approx_dp(epsilon, delta),),
    )


@dataclass(frozen=True)
class _NewSpend:
    """The release being reserved, as the cap check sees it."""

    epsilon: float
    delta: float
    start_date: dt.date
    end_date: dt.date
    events: tuple[PrivacyEvent, ...] | None


def _charged(conn: Connection, scope: str) -> list[LedgerRow]:
    query = sa.select(releases).where(
        releases.c.scope == scope, releases.c.state.in_(CHARGED_STATES)
    )
    return [_row(r) for r in conn.execute(query).mappings()]


def _stored(row: sa.RowMapping) -> StoredCap:
    return StoredCap(
        scope=row["scope"],
        policy=BudgetPolicy(row["cap_epsilon"], row["cap_delta"], row["window_days"]),
        updated_at=row["updated_at"],
        updated_by=row["updated_by"],
    )


def _row(r: sa.RowMapping) -> LedgerRow:
    return LedgerRow(
        id=r["id"],
        run_id=r["run_id"],
        scope=r["scope"],
        job=r["job"],
        spec_hash=r["spec_hash"],
        input_fingerprint=r["input_fingerprint"],
        start_date=dt.date.fromisoformat(r["start_date"]),
        end_date=dt.date.fromisoformat(r["end_date"]),
        release_key=r["release_key"],
        epsilon=r["epsilon"],
        delta=r["delta"],
        state=r["state"],
        output=r["output"],
        pid=r["pid"],
        host=r["host"],
        host_id=r["host_id"],
        reserved_at=r["reserved_at"],
        reading_at=r["reading_at"],
        finished_at=r["finished_at"],
        lease_expires_at=r["lease_expires_at"],
        note=r["note"],
        events=_events(r),
        process=r.get("process"),
    )


def _events(r: sa.RowMapping) -> tuple[PrivacyEvent, ...] | None:
    """The row's stored events; a row whose text cannot be read counts as one (epsilon,
    delta) mechanism, which is what its sums already say (never less)."""
    text = r.get("events")
    if not text:
        return None
    try:
        return from_json(text)
    except (ValueError, KeyError, TypeError):
        return None
