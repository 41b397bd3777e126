"""The ledger itself: reservations, their states and leases, stored caps, on SQLite or
PostgreSQL through SQLAlchemy Core.

Concurrency: a reservation checks the scope's cap and records the spend in one transaction that
holds the scope's lock, so two runs can never both pass the check. On SQLite that lock is the
database's write lock (`BEGIN IMMEDIATE`: one host, the embedded default). On PostgreSQL it is
the scope's row in `scopes`, created if missing with `INSERT ... ON CONFLICT DO NOTHING` and then
locked with `SELECT ... FOR UPDATE`: runs in one scope queue one behind the other for a few
milliseconds, runs in other scopes do not wait, and no transaction is ever retried. (A
serializable transaction would give the same guarantee but abort one of two racers with a
serialization failure, which every caller would have to retry: more code, and under a burst of
racers, more work.) Every other write is a single-row update conditional on the row's state,
so it needs no lock: a reservation settled by someone else simply matches no row.

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
import math
import os
import re
import shlex
import socket
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
from dppipeline.errors import BudgetExceededError, DPPipelineError, UsageError
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
from dppipeline.ledger.lease import host_id, lease_seconds, seconds_setting
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

DEFAULT_TIMEOUT_SECONDS = 10.0
LIVE_STATES = ("reserved", "reading")
# pg_advisory_xact_lock(int4, int4) class of the per-privacy-unit content lock (`reserve`).
_CONTENT_LOCK = 0x64705F63  # "dp_c"
_IN_BATCH = 500  # fingerprints per IN (...) list on SQLite


class LedgerError(DPPipelineError):
    """The ledger cannot be used now (unreachable, locked, corrupt, read-only): exit code 1,
    worth a retry once the cause is gone."""


class ReservationLostError(LedgerError):
    """This run's reservation was settled by another process (its lease expired): the run
    must stop, and publishes nothing."""


def ledger_timeout() -> float:
    """$DPPIPELINE_LEDGER_TIMEOUT: seconds to wait for a lock or a connection (default 10)."""
    return seconds_setting("DPPIPELINE_LEDGER_TIMEOUT", DEFAULT_TIMEOUT_SECONDS)


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
            raise LedgerError(self._describe(exc)) from None

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Connection]:
        with self._guard(), self._engine.connect() as conn:
            conn.execution_options(ledger_write=write)
            with conn.begin():
                yield conn

    def _write(self) -> AbstractContextManager[Connection]:
        """A write transaction; on SQLite it takes the database's write lock at once."""
        return self._transaction(True)

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

    def _describe(self, exc: sa.exc.DBAPIError) -> str:
        orig = exc.orig
        lines = str(orig if orig is not None else exc).strip().splitlines()
        text = lines[0] if lines else type(orig).__name__
        password = self.location.url.password
        if password:
            text = text.replace(str(password), "***")
        low = text.lower()
        where = self.location
        if getattr(orig, "sqlstate", None) == "55P03" or "locked" in low or "lock timeout" in low:
            return (
                f"ledger {where} is locked by another process (waited {self.timeout:g} s; "
                "DPPIPELINE_LEDGER_TIMEOUT sets the wait): retry later"
            )
        if "not a database" in low or "malformed" in low:
            return f"ledger {where} is not a SQLite database or is corrupt"
        if "readonly" in low or "read-only" in low:
            return f"ledger {where} is read-only: it must be writable to record spends"
        if "unable to open" in low:
            return f"cannot open ledger {where} (a missing or unwritable folder?)"
        if self.location.backend == "postgresql" and isinstance(exc, sa.exc.OperationalError):
            return f"cannot use ledger {where}: {text}"
        return f"ledger {where}: {text}"

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
        """Raises BudgetExceededError if `reserve` would refuse this spend now; returns the
        cap it would apply. Writes nothing (a scheduler's fail-fast check; `reserve` still
        decides atomically)."""
        with self._read() as conn:
            known = conn.execute(sa.select(scopes.c.scope).where(scopes.c.scope == key.scope))
            if known.first() is None:
                _refuse_near_duplicate(conn, key.scope)
            _refuse_content_of_other_scopes(conn, key)
        effective = self.effective_policy(key.scope, policy)
        with self._read() as conn:
            charged = _charged(conn, key.scope)
        check_cap(key.scope, effective, charged, _new_spend(key, epsilon, delta, events))
        return effective

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
        """Records the spend as `reserved` with a fresh lease, or raises BudgetExceededError;
        atomic across processes and hosts. `policy`: the job spec's cap fields, checked
        against (or, for a scope without a cap, stored as) the scope's cap. `events`: the
        release's mechanisms (`core.events`), which the scope composes; without them the
        release counts as one (epsilon, delta) mechanism. `key.content`: the files a file run
        reads, by content; refused when any was charged for the same privacy unit in another
        scope, and recorded. Returns the cap applied."""
        if not (math.isfinite(epsilon) and epsilon >= 0 and 0 <= delta <= 1):
            # An infinite spend would exhaust its scope forever, recorded as a failure.
            raise UsageError(
                f"a spend must be a finite epsilon >= 0 and a delta in [0, 1], got "
                f"epsilon {epsilon:g}, delta {delta:g}"
            )
        with self._write() as conn:
            now = self._now(conn)
            row = self._lock_scope(conn, key.scope, stamp(now), f"run {run_id} ({job})")
            _refuse_content_of_other_scopes(conn, key, lock=True)
            stored = _stored(row).policy
            if governed_policy(key.scope, stored, policy):
                self._store_cap(
                    conn,
                    scope=key.scope,
                    policy=policy,
                    now=stamp(now),
                    changed_by=f"job {job}, run {run_id}",
                    previous=stored,
                )
                effective = policy
            else:
                effective = stored if stored.is_capped else BudgetPolicy()
            new = _new_spend(key, epsilon, delta, events)
            check_cap(key.scope, effective, _charged(conn, key.scope), new)
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
                    reserved_at=stamp(now),
                    lease_expires_at=_expiry(now),
                )
            )
            if key.content is not None:
                _record_content(conn, run_id, key.content)
        return effective

    def mark_reading(self, run_id: str) -> None:
        """`reserved` -> `reading`, just before the first byte of input is read: from here
        on the budget stays charged whatever happens."""
        self._transition(run_id, ("reserved",), "reading", None, reading=True)

    def commit(self, run_id: str, note: str | None = None) -> None:
        """`reading` -> `committed`: only while the row is still this run's live
        reservation; raises ReservationLostError if someone settled it."""
        self._transition(run_id, ("reading",), "committed", note)

    def fail(self, run_id: str, note: str | None = None) -> None:
        """-> `failed`: the run may have read data and did not publish; still charged."""
        self._transition(run_id, LIVE_STATES, "failed", note)

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
    ) -> None:
        with self._write() as conn:
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
                return
            found = conn.execute(sa.select(releases).where(releases.c.run_id == run_id))
            record = found.mappings().first()
        if record is None:
            raise ReservationLostError(f"ledger {self.location}: run {run_id} is not recorded")
        why = f" ({record['note']})" if record["note"] else ""
        if record["state"] in LIVE_STATES:  # a caller's mistake, not a lost reservation
            raise LedgerError(
                f"ledger {self.location}: run {run_id} is {record['state']}; it cannot become "
                f"{target} from there"
            )
        raise ReservationLostError(
            f"ledger {self.location}: run {run_id} is {record['state']}{why}, not "
            f"{' or '.join(sources)}: another process settled it (its lease ran out), so this "
            f"run cannot become {target} and publishes nothing"
        )

    def repair(self, scope: str | None = None) -> list[tuple[str, str]]:
        """Settles reservations whose lease expired (their run is gone: killed, crashed, or
        lost its host), by the charge rules:

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
            if row.lease_expires_at is not None and _parse(row.lease_expires_at) > now:
                continue  # alive, wherever it runs
            who = f"host {row.host_id or row.host}"
            from dppipeline.core.manifest import published_run_id  # noqa: PLC0415 (heavy)

            if row.state == "reserved":
                state, note = "aborted", f"repaired: lease of {who} expired before reading"
            elif published_run_id(row.output) == row.run_id:
                state, note = "committed", f"repaired: lease of {who} expired; release found"
            else:
                state = "failed"
                note = f"repaired: lease of {who} expired while reading; charged"
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
            write = conn.get_execution_options().get("ledger_write")
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

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


def _expiry(now: dt.datetime) -> str:
    return stamp(now + dt.timedelta(seconds=lease_seconds()))


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
