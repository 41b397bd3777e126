"""The Ledger: one ledger database behind the methods runs, tunes and `budget` commands call.
Each job lives in its own module; the Ledger holds the database and delegates:

- `connection`: the engine, transactions and their waits, the clock, migrations, trust;
- `views`: reading rows, scopes, caps and their history (writes nothing);
- `scope_rows`: a scope's row: its lock, its stored cap, near-duplicate names;
- `admission`: does a release fit its scope's cap (`caps`: sums or composition);
- `reserving`: a reservation decided outside the write lock and recorded under it;
- `content`: the same files charged in two scopes;
- `transitions`: `reading`, `committed`, `failed`, `aborted`, lease renewals;
- `repair`: settling the reservations of runs that are gone.

Concurrency in one paragraph: a reservation decides outside any write lock and records under
it, deciding again when the scope changed in between (`reserving`); every other write is a
single-row update conditional on the row's state, so it needs no lock (`transitions`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dppipeline.core.events import PrivacyEvent
from dppipeline.errors import UsageError
from dppipeline.ledger import repair as repairing
from dppipeline.ledger import reserving, transitions, views
from dppipeline.ledger.caps import BudgetPolicy, ScopeSpend, governed_policy, spend_of, window_spend
from dppipeline.ledger.connection import Database
from dppipeline.ledger.keys import ReleaseKey
from dppipeline.ledger.lease import host_id
from dppipeline.ledger.records import (
    LIVE_STATES,
    CapChange,
    LedgerError,
    LedgerRow,
    ReservationLostError,
    ScopeData,
    StoredCap,
    stored_of,
)
from dppipeline.ledger.scope_rows import lock_scope, store_cap
from dppipeline.ledger.tables import stamp
from dppipeline.ledger.url import LedgerLocation, parse_ledger_url
from dppipeline.settings import ledger_timeout

__all__ = [
    "LIVE_STATES",
    "CapChange",
    "Ledger",
    "LedgerError",
    "LedgerRow",
    "ReservationLostError",
    "ScopeData",
    "StoredCap",
]


class Ledger:
    """One ledger database; safe for concurrent processes and, on PostgreSQL, hosts."""

    def __init__(self, url: str | Path | LedgerLocation, *, timeout: float | None = None):
        self.location = url if isinstance(url, LedgerLocation) else parse_ledger_url(url)
        self.timeout = ledger_timeout() if timeout is None else timeout
        self.host_id = host_id()
        self._db = Database(self.location, self.timeout)

    @property
    def path(self) -> Path | None:
        """The SQLite file; None for PostgreSQL."""
        return self.location.path

    @property
    def _engine(self) -> Engine:
        return self._db.engine

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        return self._db.version()

    # -- reading ------------------------------------------------------------------------------

    def rows(self, scope: str | None = None) -> list[LedgerRow]:
        with self._db.read() as conn:
            return views.rows(conn, scope)

    def row(self, run_id: str) -> LedgerRow | None:
        with self._db.read() as conn:
            return views.row(conn, run_id)

    def scopes(self) -> list[str]:
        """Every scope with a stored cap or a recorded release."""
        with self._db.read() as conn:
            return views.scope_names(conn)

    def scope_data(self) -> dict[str, ScopeData]:
        """Per scope, the data its charged releases read, by content (`views.scope_data`)."""
        with self._db.read() as conn:
            return views.scope_data(conn)

    def cap(self, scope: str) -> StoredCap | None:
        """The scope's stored cap; None when it has none."""
        return self.caps().get(scope)

    def caps(self) -> dict[str, StoredCap]:
        with self._db.read() as conn:
            return views.stored_caps(conn)

    def cap_history(self, scope: str | None = None) -> list[CapChange]:
        with self._db.read() as conn:
            return views.cap_history(conn, scope)

    def committed(self, key: ReleaseKey) -> LedgerRow | None:
        """The newest committed release with this key, if any."""
        with self._db.read() as conn:
            return views.committed(conn, key)

    def spent(
        self, scope: str, policy: BudgetPolicy, start: dt.date, end: dt.date
    ) -> tuple[float, float]:
        """By sums, the most epsilon and delta any policy window touching [start, end] has
        charged (reserved, reading, committed and failed all count)."""
        with self._db.read() as conn:
            charged = views.charged(conn, scope)
        return window_spend(charged, policy, start, end)

    def composed(self, scope: str, policy: BudgetPolicy) -> ScopeSpend:
        """Every charged release of the scope, by sums and composed (`caps.spend_of`)."""
        with self._db.read() as conn:
            charged = views.charged(conn, scope)
        return spend_of(charged, policy)

    # -- caps -----------------------------------------------------------------------------------

    def set_cap(self, scope: str, policy: BudgetPolicy, changed_by: str) -> CapChange:
        """Stores (or replaces) a scope's cap and records the change."""
        if not policy.is_capped:
            raise UsageError("budget set-cap: --epsilon is required")
        with self._db.write() as conn:
            now = stamp(self._db.now(conn))
            row = lock_scope(conn, scope, now, changed_by)
            return store_cap(
                conn,
                scope=scope,
                policy=policy,
                now=now,
                changed_by=changed_by,
                previous=stored_of(row).policy,
            )

    def _lock_scope(self, conn: Connection, scope: str, now: str, by: str) -> sa.RowMapping:
        """The scope's row, created when missing, locked until the transaction ends."""
        return lock_scope(conn, scope, now, by)

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
        return reserving.check(
            self._db, key, epsilon=epsilon, delta=delta, policy=policy, events=events
        )

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
        the lock was taken (`reserving`); the last round decides under it."""
        return reserving.reserve(
            self._db, key, run_id=run_id, job=job, output=output, epsilon=epsilon,
            delta=delta, policy=policy, events=events, host_id=self.host_id,
        )  # fmt: skip

    def mark_reading(self, run_id: str) -> None:
        """`reserved` -> `reading`, just before the first byte of input is read: from here
        on the budget stays charged whatever happens."""
        transitions.transition(self._db, run_id, ("reserved",), "reading", None, reading=True)

    def commit(self, run_id: str, note: str | None = None) -> None:
        """`reading` -> `committed`: only while the row is still this run's live
        reservation; raises ReservationLostError if someone settled it. Waits for the lock
        as long as it takes: the run has read its data."""
        transitions.transition(self._db, run_id, ("reading",), "committed", note, patient=True)

    def fail(self, run_id: str, note: str | None = None) -> None:
        """-> `failed`: the run may have read data and did not publish; still charged. Waits
        for the lock as long as it takes, like `commit`."""
        transitions.transition(self._db, run_id, LIVE_STATES, "failed", note, patient=True)

    def abort(self, run_id: str, note: str | None = None) -> None:
        """`reserved` -> `aborted`: the run failed before reading anything; budget freed."""
        transitions.transition(self._db, run_id, ("reserved",), "aborted", note)

    def renew(self, run_id: str) -> bool:
        """Extends the lease; False when the row is no longer a live reservation."""
        return transitions.renew(self._db, run_id)

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
        return repairing.repair(self._db, scope)

    def lease_alive(self, row: LedgerRow) -> bool:
        """Is this live-state row's lease still running, by the database's clock?"""
        return repairing.lease_alive(self._db, row)
