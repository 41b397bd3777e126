"""Reading and ageing a ledger's rows directly, as no command does."""

from __future__ import annotations

from dppipeline.ledger import Ledger
from dppipeline.ledger import tables as ledger_tables

PAST = "2000-01-01T00:00:00.000000+00:00"


def states(ledger: Ledger) -> dict[str, str]:
    """run id -> state of every release the ledger holds."""
    return {row.run_id: row.state for row in ledger.rows()}


def expire(ledger: Ledger, run_id: str) -> None:
    """Ends a reservation's lease (as the passing of time would, without waiting for it)."""
    table = ledger_tables.releases
    with ledger._engine.begin() as conn:
        conn.execute(table.update().where(table.c.run_id == run_id).values(lease_expires_at=PAST))
