"""Reserving a release's spend: decided outside any write lock, recorded under it.

A reservation reads the scope's cap and charged releases, checks the cap (sums, or the
composition of privacy events, which may load dp_accounting and take seconds) without holding
anything, then opens a short write transaction that locks the scope (`scope_rows.lock_scope`),
checks that nothing changed since (the same cap, no release newer than the newest it read:
releases of a scope are inserted one at a time under this lock, so ids grow in commit order)
and inserts its row; when the scope changed it decides again. After a few such rounds it
decides inside the lock, so a run always gets an answer. The lock is the database's write lock
on SQLite (`BEGIN IMMEDIATE`: one host, the embedded default); on PostgreSQL the scope's row,
so other scopes do not wait.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dppipeline.core.events import PrivacyEvent, to_json
from dppipeline.errors import UsageError
from dppipeline.ledger.admission import (
    NewSpend,
    changed,
    decide,
    new_spend,
    read_view,
)
from dppipeline.ledger.caps import BudgetPolicy
from dppipeline.ledger.connection import Database
from dppipeline.ledger.content import record_content, refuse_content_of_other_scopes
from dppipeline.ledger.keys import ReleaseKey
from dppipeline.ledger.lease import expiry, this_process
from dppipeline.ledger.records import LedgerRow, stored_of
from dppipeline.ledger.scope_rows import lock_scope, refuse_near_duplicate, store_cap
from dppipeline.ledger.tables import releases, scopes, stamp

# Rounds of deciding outside the lock before a reservation decides under it.
_OPTIMISTIC_ROUNDS = 4


@dataclass(frozen=True)
class _Run:
    """Who reserves: recorded with the reservation."""

    run_id: str
    job: str
    output: str
    host_id: str


class _StaleError(Exception):
    """The scope changed between a reservation's decision and its lock: decide again."""


def check(
    db: Database,
    key: ReleaseKey,
    *,
    epsilon: float,
    delta: float,
    policy: BudgetPolicy,
    events: Sequence[PrivacyEvent] | None,
) -> BudgetPolicy:
    """`Ledger.check`: what `reserve` would decide now, writing nothing."""
    db.trust()
    with db.read() as conn:
        known = conn.execute(sa.select(scopes.c.scope).where(scopes.c.scope == key.scope))
        if known.first() is None:
            refuse_near_duplicate(conn, key.scope)
        refuse_content_of_other_scopes(conn, key)
        view = read_view(conn, key.scope, policy)
    return decide(key.scope, view, policy, new_spend(key, epsilon, delta, events)).policy


def reserve(
    db: Database,
    key: ReleaseKey,
    *,
    run_id: str,
    job: str,
    output: str,
    epsilon: float,
    delta: float,
    policy: BudgetPolicy,
    events: Sequence[PrivacyEvent] | None,
    host_id: str,
) -> BudgetPolicy:
    """`Ledger.reserve`."""
    if not (math.isfinite(epsilon) and epsilon >= 0 and 0 <= delta <= 1):
        # An infinite spend would exhaust its scope forever, recorded as a failure.
        raise UsageError(
            f"a spend must be a finite epsilon >= 0 and a delta in [0, 1], got "
            f"epsilon {epsilon:g}, delta {delta:g}"
        )
    db.trust()
    new = new_spend(key, epsilon, delta, events)
    run = _Run(run_id, job, output, host_id)
    for round_ in itertools.count():
        try:
            return _round(db, key, new, policy, run, inside=round_ >= _OPTIMISTIC_ROUNDS)
        except _StaleError:
            continue  # another run reserved or moved on, or the cap changed: decide again
    raise AssertionError("unreachable")  # pragma: no cover


def _round(
    db: Database,
    key: ReleaseKey,
    new: NewSpend,
    policy: BudgetPolicy,
    run: _Run,
    *,
    inside: bool,
) -> BudgetPolicy:
    """One round of `reserve`: decide (outside the lock unless `inside`), then record
    under it; raises _StaleError when the scope changed in between."""
    decision = view = None
    if not inside:
        with db.read() as conn:
            view = read_view(conn, key.scope, policy)
        decision = decide(key.scope, view, policy, new)
    with db.write() as conn:
        now = db.now(conn)
        row = lock_scope(conn, key.scope, stamp(now), f"run {run.run_id} ({run.job})")
        if decision is None or view is None:  # the last round: decide under the lock
            decision = decide(key.scope, read_view(conn, key.scope, policy), policy, new)
        elif changed(conn, key.scope, view, row):
            raise _StaleError()
        refuse_content_of_other_scopes(conn, key, lock=True)
        if not all(settle(conn, r, why, stamp(now)) for r, why in decision.settle):
            raise _StaleError()  # a row it took for dead moved on (its run committed first)
        if decision.store:
            store_cap(
                conn,
                scope=key.scope,
                policy=policy,
                now=stamp(now),
                changed_by=f"job {run.job}, run {run.run_id}",
                previous=stored_of(row).policy,
            )
        _insert(conn, key, new, run, now)
    return decision.policy


def _insert(
    conn: Connection,
    key: ReleaseKey,
    new: NewSpend,
    run: _Run,
    now: dt.datetime,
) -> None:
    """The reservation's row, `reserved` with a fresh lease, and its files by content."""
    conn.execute(
        releases.insert().values(
            run_id=run.run_id,
            scope=key.scope,
            job=run.job,
            spec_hash=key.spec_hash,
            input_fingerprint=key.input_fingerprint,
            start_date=key.start_date.isoformat(),
            end_date=key.end_date.isoformat(),
            release_key=key.digest,
            epsilon=new.epsilon,
            delta=new.delta,
            events=to_json(new.events or ()),
            state="reserved",
            output=run.output,
            pid=os.getpid(),
            host=socket.gethostname(),
            host_id=run.host_id,
            process=this_process(),
            reserved_at=stamp(now),
            lease_expires_at=expiry(now),
        )
    )
    if key.content is not None:
        record_content(conn, run.run_id, key.content)


def settle(conn: Connection, row: LedgerRow, why: str, now: str) -> bool:
    """A dead run's `reserved` row -> `aborted`, in the caller's transaction (by the
    charge rules: it read nothing). False when the row is no longer `reserved`."""
    done = conn.execute(
        releases.update()
        .where(releases.c.run_id == row.run_id, releases.c.state == "reserved")
        .values(state="aborted", note=f"repaired: {why} before reading", finished_at=now)
    )
    return done.rowcount == 1
