"""A scope's row in `scopes`: created and locked by every writer of the scope (`lock_scope`),
holding its stored cap, whose changes are recorded with their history (`store_cap`); and scope
names that read as one, refused (`refuse_near_duplicate`).

The lock: on SQLite the database's write lock is already held (`BEGIN IMMEDIATE`); on
PostgreSQL the scope's row, created if missing with `INSERT ... ON CONFLICT DO NOTHING` and
then locked with `SELECT ... FOR UPDATE`, so other scopes do not wait.
"""

from __future__ import annotations

import importlib
import re
import unicodedata

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dppipeline.errors import UsageError
from dppipeline.ledger.caps import BudgetPolicy
from dppipeline.ledger.records import CapChange
from dppipeline.ledger.tables import cap_changes, scopes


def lock_scope(conn: Connection, scope: str, now: str, by: str) -> sa.RowMapping:
    """The scope's row, created when missing, locked until the transaction ends."""
    # The connection's own dialect module (importing PostgreSQL's costs a SQLite run 60 ms).
    insert = importlib.import_module(f"sqlalchemy.dialects.{conn.dialect.name}").insert
    created = conn.execute(
        insert(scopes)
        .values(scope=scope, created_at=now, updated_at=now, updated_by=by)
        .on_conflict_do_nothing(index_elements=["scope"])
        .returning(scopes.c.scope)  # a row only when inserted (rowcount is -1 on psycopg)
    )
    if created.first() is not None:  # a new scope: refused (rolled back) if a variant
        refuse_near_duplicate(conn, scope)
    query = sa.select(scopes).where(scopes.c.scope == scope).with_for_update()
    return conn.execute(query).mappings().one()


def store_cap(
    conn: Connection,
    *,
    scope: str,
    policy: BudgetPolicy,
    now: str,
    changed_by: str,
    previous: BudgetPolicy,
) -> CapChange:
    """Stores `policy` in the (locked) scope's row and records the change."""
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


def scope_form(scope: str) -> str:
    """What scope names that read as one share: case, spaces and repeated or outer slashes
    removed (`tx/CUSTOMER_ID`, `TX/customer_id `, `tx//CUSTOMER_ID`)."""
    text = "".join(unicodedata.normalize("NFKC", scope).casefold().split())
    return re.sub("/+", "/", text).strip("/")


def refuse_near_duplicate(conn: Connection, scope: str) -> None:
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
