"""A reservation's states after `reserved`: each move is one update conditional on the row's
state, so it needs no lock: a reservation settled by someone else simply matches no row, and
the run learns it lost its reservation (`ReservationLostError`). A run that has read its data
waits for its `committed` or `failed` as long as it takes (`patient`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import sqlalchemy as sa

from dppipeline.ledger.connection import Database
from dppipeline.ledger.lease import expiry
from dppipeline.ledger.records import LIVE_STATES, LedgerError, ReservationLostError
from dppipeline.ledger.tables import releases, stamp
from dppipeline.settings import lease_seconds

log = logging.getLogger(__name__)


def transition(
    db: Database,
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
            record = _update_state(
                db, run_id, sources, target, note, reading=reading, patient=patient
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
    if record is not None:
        raise _refusal(db, run_id, sources, target, record)


def _refusal(
    db: Database, run_id: str, sources: Sequence[str], target: str, record: Mapping[str, object]
) -> LedgerError:
    """Why the row did not move: absent or settled by another process (the reservation is
    lost), or still live in another state (a caller's mistake)."""
    if not record:
        return ReservationLostError(f"ledger {db.location}: run {run_id} is not recorded")
    why = f" ({record['note']})" if record["note"] else ""
    if record["state"] in LIVE_STATES:  # a caller's mistake, not a lost reservation
        return LedgerError(
            f"ledger {db.location}: run {run_id} is {record['state']}; it cannot become "
            f"{target} from there"
        )
    return ReservationLostError(
        f"ledger {db.location}: run {run_id} is {record['state']}{why}, not "
        f"{' or '.join(sources)}: another process settled it (its lease ran out, or its "
        f"process looked dead), so this run cannot become {target} and publishes nothing"
    )


def _update_state(
    db: Database,
    run_id: str,
    sources: Sequence[str],
    target: str,
    note: str | None,
    *,
    reading: bool,
    patient: bool,
) -> Mapping[str, object] | None:
    """None when the row moved to `target`, else the row as it is (or {} if absent)."""
    with db.write(patient=patient) as conn:
        now = db.now(conn)
        values: dict[str, object] = {"state": target}
        if reading:
            values |= {"reading_at": stamp(now), "lease_expires_at": expiry(now)}
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


def renew(db: Database, run_id: str) -> bool:
    """Extends the lease; False when the row is no longer a live reservation."""
    with db.write() as conn:
        done = conn.execute(
            releases.update()
            .where(releases.c.run_id == run_id, releases.c.state.in_(LIVE_STATES))
            .values(lease_expires_at=expiry(db.now(conn)))
        )
        return done.rowcount == 1
