"""One run's spend, start to finish, by the charge rules (a context manager).

    with ledger.reservation(key, ...) as spend:   # reserved: budget held, lease renewed
        spend.reading()                           # reading: from here on it stays charged
        ...                                       # the engine reads and writes the release
        spend.commit()                            # committed: before the release is published

On leaving the block without a commit, the reservation is settled by what happened: `reserved`
(nothing read) -> `aborted`, budget released; `reading` -> `failed`, budget kept (whether a run
fails can depend on the data, so the failure itself is an output). After the commit nothing
changes the ledger: an error, a broken pipe or a signal that comes later leaves it committed.
If this process dies instead, its lease runs out and `Ledger.repair` applies the same rules.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import TracebackType

from dppipeline.core.events import PrivacyEvent
from dppipeline.ledger.book import Ledger
from dppipeline.ledger.caps import BudgetPolicy
from dppipeline.ledger.keys import ReleaseKey
from dppipeline.ledger.lease import Heartbeat
from dppipeline.ledger.records import LedgerError, ReservationLostError
from dppipeline.settings import renew_seconds

log = logging.getLogger(__name__)


class Reservation:
    def __init__(
        self,
        ledger: Ledger,
        key: ReleaseKey,
        *,
        run_id: str,
        job: str,
        epsilon: float,
        delta: float,
        output: str,
        policy: BudgetPolicy,
        events: Sequence[PrivacyEvent] | None = None,
    ):
        self.ledger = ledger
        self.key = key
        self.run_id = run_id
        self._reserve = {
            "run_id": run_id,
            "job": job,
            "epsilon": epsilon,
            "delta": delta,
            "output": output,
            "policy": policy,
            "events": events,
        }
        self.state = "new"
        self.policy: BudgetPolicy | None = None  # the cap applied, once reserved
        self._heartbeat: Heartbeat | None = None

    def __enter__(self) -> Reservation:
        renew = renew_seconds()  # a bad setting fails before anything is reserved
        self.policy = self.ledger.reserve(self.key, **self._reserve)
        self.state = "reserved"
        self._heartbeat = Heartbeat(
            lambda: self.ledger.renew(self.run_id), renew, f"lease-{self.run_id}"
        ).start()
        return self

    def reading(self) -> None:
        """Call immediately before the first byte of input is read."""
        self.ledger.mark_reading(self.run_id)
        self.state = "reading"

    def commit(self) -> None:
        """Call when the complete release is staged, before it is published."""
        self.ledger.commit(self.run_id)
        self.state = "committed"

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self.state not in ("reserved", "reading"):
            return
        what = _describe(kind)
        try:
            if self.state == "reserved":
                self.ledger.abort(self.run_id, note=f"{what} before reading")
                self.state = "aborted"
            else:
                self.ledger.fail(self.run_id, note=f"{what} after reading; charged")
                self.state = "failed"
        except ReservationLostError:
            pass  # settled by `repair` already, by the same rules
        except LedgerError as exc:  # the ledger is unreachable: its lease will settle it
            log.warning("ledger: could not settle run %s now (%s)", self.run_id, exc)


def _describe(kind: type[BaseException] | None) -> str:
    """What ended the run, without its message (which may name input files or rows)."""
    if kind is None:
        return "ended without a commit"
    if issubclass(kind, KeyboardInterrupt):
        return "interrupted"
    if kind.__name__ == "Terminated":
        return "terminated"
    return f"failed ({kind.__name__})"
