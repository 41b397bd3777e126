"""The budget charge sequence, written once: every spend of the ledger goes through `charged`.

`dppipeline run`, the Python API and the Beam transform (through the runner) and `tune` all
spend budget by these steps, in this order:

1. reserve (`Reservation`: budget held, a lease renewed by a heartbeat thread); failpoint
   `reserved`. The output's `prepare` runs here: a failure up to this point releases the
   budget (`aborted`).
2. `reading`, immediately before the first byte of input is read: from here on the spend stays
   charged whatever happens (`failed` if the output is not committed); failpoint `reading`.
3. `stage`: the output reads the data and writes its complete result where no one sees it yet;
   failpoint `staged`; then `seal`, its last checks while the result can still be withdrawn.
4. commit, only while the reservation is still this run's (a run whose lease ran out and was
   settled by another process gets ReservationLostError and publishes nothing); failpoint
   `committed`.
5. `publish`: the committed result becomes visible; failpoint `published`. SIGINT and SIGTERM
   are held back from the start of 4 to the end of 5, so a committed result is always
   published, and the signal takes effect right after.

On a failure before the commit the output's `discard` removes what `stage` wrote, and the
reservation is settled by the ledger's rules (`aborted` before `reading`, `failed` after).
Without a ledger (`--no-ledger`, `ledger=False`) the same steps run and nothing is recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from dppipeline.lifecycle.failpoints import failpoint
from dppipeline.lifecycle.signals import signals_deferred

if TYPE_CHECKING:  # SQLAlchemy: imported only for a run with a ledger
    from dppipeline.ledger import Reservation

Staged_co = TypeVar("Staged_co", covariant=True)


class Output(Protocol[Staged_co]):
    """What a spend pays for (a release, a tune result), as the charge sequence drives it."""

    def prepare(self) -> None:
        """Reserved, nothing read: e.g. make the staging folder. A failure here charges nothing."""

    def stage(self) -> Staged_co:
        """From `reading` on: read the data and write the complete result where no one sees it."""

    def seal(self) -> None:
        """Staged, not committed: the last checks before the commit (the result can still be
        withdrawn)."""

    def publish(self) -> None:
        """Committed: make the result visible (signals are held back meanwhile)."""

    def discard(self) -> None:
        """Not committed: remove what `prepare` and `stage` made."""


def charged(
    spend: Reservation | None,
    output: Output[Staged_co],
    *,
    reserved: Callable[[Reservation], None] | None = None,
) -> Staged_co:
    """Runs `output` by the charge sequence (module docstring) and returns what its `stage`
    made. `spend`: the reservation to make (not yet entered), None for a run without a ledger;
    `reserved`: called once the budget is reserved (the runner's `[ledger] reserved` line)."""
    with spend if spend is not None else _Unrecorded() as reservation:
        if reserved is not None and not isinstance(reservation, _Unrecorded):
            reserved(reservation)
        failpoint("reserved")
        output.prepare()
        committed = False
        try:
            reservation.reading()
            failpoint("reading")
            staged = output.stage()
            failpoint("staged")
            output.seal()
            with signals_deferred():
                reservation.commit()  # ReservationLostError unless the row is still ours
                committed = True
                failpoint("committed")
                output.publish()
                failpoint("published")
        except BaseException:
            if not committed:
                output.discard()
            raise
    return staged


class _Unrecorded:
    """The reservation of a run without a ledger: every step is a no-op."""

    def __enter__(self) -> _Unrecorded:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def reading(self) -> None:
        return None

    def commit(self) -> None:
        return None
