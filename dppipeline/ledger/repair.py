"""Repair: settling the reservations of runs that are gone, by the charge rules, and asking
whether a run's lease still runs. `Ledger.repair` is called before a run reserves and by
`budget repair`; a reservation also settles the dead runs in its way (`admission.decide`).
"""

from __future__ import annotations

import sqlalchemy as sa

from dppipeline.ledger.connection import Database
from dppipeline.ledger.lease import why_dead
from dppipeline.ledger.records import LIVE_STATES, LedgerRow, parse_time, row_of
from dppipeline.ledger.tables import releases, stamp


def repair(db: Database, scope: str | None = None) -> list[tuple[str, str]]:
    """`Ledger.repair`: (run id, state it was settled as) of each reservation settled."""
    query = sa.select(releases).where(releases.c.state.in_(LIVE_STATES))
    if scope is not None:
        query = query.where(releases.c.scope == scope)
    with db.read() as conn:
        now = db.now(conn)
        candidates = [row_of(r) for r in conn.execute(query).mappings()]
    settled = []
    for row in candidates:
        why = why_dead(row, now)
        if why is None:
            continue  # alive, wherever it runs
        state, note = _outcome(row, why)
        if _settle(db, row, state, note):
            settled.append((row.run_id, state))
    return settled


def _outcome(row: LedgerRow, why: str) -> tuple[str, str]:
    """(state, note) of a dead run's row by the charge rules."""
    from dppipeline.storage.releases import published_run_id  # noqa: PLC0415 (rare path)

    if row.state == "reserved":
        return "aborted", f"repaired: {why} before reading"
    if published_run_id(row.output) == row.run_id:
        return "committed", f"repaired: {why}; release found"
    return "failed", f"repaired: {why} while reading; charged"


def _settle(db: Database, row: LedgerRow, state: str, note: str) -> bool:
    """The row -> `state`, only while it is in the state and lease the check saw (a renewal
    in between wins); False when it moved."""
    lease = releases.c.lease_expires_at
    with db.write() as conn:
        done = conn.execute(
            releases.update()
            .where(
                releases.c.run_id == row.run_id,
                releases.c.state == row.state,
                lease.is_(None) if row.lease_expires_at is None else lease == row.lease_expires_at,
            )
            .values(state=state, note=note, finished_at=stamp(db.now(conn)))
        )
    return done.rowcount == 1


def lease_alive(db: Database, row: LedgerRow) -> bool:
    """Is this live-state row's lease still running, by the database's clock?"""
    if row.state not in LIVE_STATES or row.lease_expires_at is None:
        return False
    with db.read() as conn:
        now = db.now(conn)
    return parse_time(row.lease_expires_at) > now
