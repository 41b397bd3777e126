"""Reading the ledger: its rows, scopes, caps and their history, what a scope's releases read
and spent. Each function reads in the caller's transaction and writes nothing (`budget show`,
`budget history`, reports, audits; and the charged rows a reservation decides on).
"""

from __future__ import annotations

import functools

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dppipeline.ledger.caps import CHARGED_STATES, BudgetPolicy
from dppipeline.ledger.keys import ReleaseKey
from dppipeline.ledger.records import (
    CapChange,
    LedgerRow,
    ScopeData,
    StoredCap,
    day_of,
    row_of,
    stored_of,
)
from dppipeline.ledger.tables import cap_changes, charged_files, releases, scopes


def rows(conn: Connection, scope: str | None = None) -> list[LedgerRow]:
    query = sa.select(releases).order_by(releases.c.id)
    if scope is not None:
        query = query.where(releases.c.scope == scope)
    return [row_of(r) for r in conn.execute(query).mappings()]


def row(conn: Connection, run_id: str) -> LedgerRow | None:
    found = conn.execute(sa.select(releases).where(releases.c.run_id == run_id))
    record = found.mappings().first()
    return row_of(record) if record is not None else None


def charged(conn: Connection, scope: str) -> list[LedgerRow]:
    """The scope's charged releases (`caps.CHARGED_STATES`), what its caps count."""
    query = sa.select(releases).where(
        releases.c.scope == scope, releases.c.state.in_(CHARGED_STATES)
    )
    return [_charged_row(r) for r in conn.execute(query)]


@functools.lru_cache(maxsize=8192)
def _charged_row(values: sa.Row[tuple[object, ...]]) -> LedgerRow:
    """`row_of`, remembered by every column's value (a row that changed in any column is a
    new key): every reservation reads all of its scope's charged releases, which are the
    same rows as the last time but for the newest and any that changed state."""
    return row_of(values._mapping)


def scope_names(conn: Connection) -> list[str]:
    """Every scope with a stored cap or a recorded release."""
    named = set(conn.execute(sa.select(scopes.c.scope)).scalars())
    named |= set(conn.execute(sa.select(releases.c.scope).distinct()).scalars())
    return sorted(named)


def scope_data(conn: Connection) -> dict[str, ScopeData]:
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
    found = conn.execute(query).all()
    return {
        scope: ScopeData(day_of(first), day_of(last), days, files)
        for scope, first, last, days, files in found
    }


def stored_caps(conn: Connection) -> dict[str, StoredCap]:
    """Every scope's stored cap, scopes without one left out."""
    found = conn.execute(sa.select(scopes)).mappings().all()
    stored = {r["scope"]: stored_of(r) for r in found}
    return {name: cap for name, cap in stored.items() if cap.policy.is_capped}


def cap_history(conn: Connection, scope: str | None = None) -> list[CapChange]:
    query = sa.select(cap_changes).order_by(cap_changes.c.id)
    if scope is not None:
        query = query.where(cap_changes.c.scope == scope)
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


def committed(conn: Connection, key: ReleaseKey) -> LedgerRow | None:
    """The newest committed release with this key, if any."""
    query = (
        sa.select(releases)
        .where(releases.c.release_key == key.digest, releases.c.state == "committed")
        .order_by(releases.c.id.desc())
        .limit(1)
    )
    found = conn.execute(query).mappings().first()
    return row_of(found) if found is not None else None
