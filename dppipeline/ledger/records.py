"""What the ledger's tables hold, as values: a release's row, a scope's stored cap and its
history, the data a scope read; and the ledger's own errors.

Rows are read into frozen values once (`row_of`); everything above the SQL works on these.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass

import sqlalchemy as sa

from dppipeline.core.events import PrivacyEvent, from_json
from dppipeline.errors import DPPipelineError
from dppipeline.ledger.caps import CHARGED_STATES, BudgetPolicy

LIVE_STATES = ("reserved", "reading")


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


def stored_of(row: sa.RowMapping) -> StoredCap:
    """A `scopes` row as its stored cap."""
    return StoredCap(
        scope=row["scope"],
        policy=BudgetPolicy(row["cap_epsilon"], row["cap_delta"], row["window_days"]),
        updated_at=row["updated_at"],
        updated_by=row["updated_by"],
    )


def row_of(r: sa.RowMapping) -> LedgerRow:
    """A `releases` row as a value."""
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
        events=events_of_text(r.get("events")),
        process=r.get("process"),
    )


@functools.lru_cache(maxsize=1024)
def events_of_text(text: str | None) -> tuple[PrivacyEvent, ...] | None:
    """A row's stored events; a row whose text cannot be read counts as one (epsilon,
    delta) mechanism, which is what its sums already say (never less). Cached by the text
    (the events are immutable values): a nightly scope stores the same text night after
    night, and every admission reads all of the scope's rows."""
    if not text:
        return None
    try:
        return from_json(text)
    except (ValueError, KeyError, TypeError):
        return None


def day_of(text: str | None) -> dt.date | None:
    return dt.date.fromisoformat(text) if text else None


def parse_time(text: str) -> dt.datetime:
    """A stored timestamp; one without a zone is UTC."""
    moment = dt.datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
