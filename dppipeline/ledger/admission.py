"""Admission: does a new release fit its scope's cap? Decided on a view of the scope (its
stored cap and charged releases), by the cap's sums or the composition of privacy events
(`caps.check_cap`), counting reservations of dead runs as settled. Reads only the view; the
caller (`reserving`) holds what it must hold for the decision to be exact.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dppipeline.core.events import PrivacyEvent, approx_dp, merged
from dppipeline.errors import BudgetExceededError, BudgetHeldError
from dppipeline.ledger.caps import BudgetPolicy, check_cap, governed_policy
from dppipeline.ledger.connection import Database
from dppipeline.ledger.keys import ReleaseKey
from dppipeline.ledger.lease import why_dead
from dppipeline.ledger.records import LedgerRow, parse_time, stored_of
from dppipeline.ledger.tables import releases, scopes
from dppipeline.ledger.views import charged


@dataclass(frozen=True)
class NewSpend:
    """The release being reserved, as the cap check sees it."""

    epsilon: float
    delta: float
    start_date: dt.date
    end_date: dt.date
    events: tuple[PrivacyEvent, ...] | None


def new_spend(
    key: ReleaseKey, epsilon: float, delta: float, events: Sequence[PrivacyEvent] | None
) -> NewSpend:
    """Without events, the release counts as one (epsilon, delta) mechanism."""
    return NewSpend(
        epsilon,
        delta,
        key.start_date,
        key.end_date,
        merged(events) if events is not None else (approx_dp(epsilon, delta),),
    )


@dataclass(frozen=True)
class ScopeView:
    """A scope as a reservation reads it before deciding (`read_view`)."""

    stored: BudgetPolicy | None  # None: the scope has no row yet
    last_id: int  # the newest release id of the scope, read before `charged`
    charged: tuple[LedgerRow, ...]  # empty when no cap applies
    now: dt.datetime
    capped: bool


@dataclass(frozen=True)
class Decision:
    policy: BudgetPolicy  # the cap applied
    store: bool  # store `policy` as the scope's cap (it has none)
    settle: tuple[tuple[LedgerRow, str], ...] = ()  # dead runs' reservations, and why


def read_view(conn: Connection, scope: str, requested: BudgetPolicy) -> ScopeView:
    """What a reservation in `scope` decides on: the stored cap and, when a cap applies,
    the charged releases and the newest release id read before them."""
    found = conn.execute(sa.select(scopes).where(scopes.c.scope == scope)).mappings().first()
    stored = stored_of(found).policy if found is not None else None
    capped = (stored is not None and stored.is_capped) or requested.is_capped
    last_id, rows = None, []
    if capped:
        last_id = conn.execute(
            sa.select(sa.func.max(releases.c.id)).where(releases.c.scope == scope)
        ).scalar()
        rows = charged(conn, scope)
    return ScopeView(stored, last_id or 0, tuple(rows), Database.now(conn), capped)


def changed(conn: Connection, scope: str, view: ScopeView, row: sa.RowMapping) -> bool:
    """Under the scope's lock: did the scope change since `view` was read (another cap, or a
    release newer than the newest it read)? Releases of a scope are inserted one at a time
    under this lock, so a release the view missed has a larger id."""
    if stored_of(row).policy != (view.stored or BudgetPolicy()):
        return True
    if not view.capped:
        return False
    newer = conn.execute(
        sa.select(releases.c.id)
        .where(releases.c.scope == scope, releases.c.id > view.last_id)
        .limit(1)
    )
    return newer.first() is not None


def decide(scope: str, view: ScopeView, requested: BudgetPolicy, new: NewSpend) -> Decision:
    """Admits `new` or raises: BudgetExceededError when the scope's cap is exhausted whatever
    its live reservations do, BudgetHeldError when it would fit but for reservations of live
    runs that have read nothing yet (they may abort). Reservations of dead runs (`lease.why_dead`)
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
            return Decision(effective, store, tuple(settle))
        except BudgetExceededError as refused:
            holders = [r for r in charged if r.state == "reserved" and _touches(r, effective, new)]
            if not holders:
                raise
            held = {r.run_id for r in holders}
            try:
                check_cap(scope, effective, [r for r in charged if r.run_id not in held], new)
            except BudgetExceededError:
                raise refused from None  # exhausted, whatever the live reservations do
            dead = [(r, why) for r in holders if (why := why_dead(r, view.now)) is not None]
            if not dead:
                raise _held(scope, holders, refused) from None
            settle += dead
            gone = {r.run_id for r, _ in dead}
            charged = [r for r in charged if r.run_id not in gone]


def _touches(row: LedgerRow, policy: BudgetPolicy, new: NewSpend) -> bool:
    """Does `row` count in a window the new release's dates touch (every row without one)?"""
    if not policy.window_days:
        return True
    reach = dt.timedelta(days=policy.window_days - 1)
    return row.start_date <= new.end_date + reach and row.end_date >= new.start_date - reach


def _held(scope: str, holders: list[LedgerRow], refused: BudgetExceededError) -> BudgetHeldError:
    """The refusal while live reservations hold the budget: which run, until when (the latest
    of their leases), and what the cap says meanwhile."""
    latest = max(holders, key=lambda r: r.lease_expires_at or "")
    until = parse_time(latest.lease_expires_at) if latest.lease_expires_at else None
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
