"""SIGTERM handled like SIGINT, and a critical section that signals cannot cut short.

Airflow and Kubernetes stop a task with SIGTERM; Ctrl-C sends SIGINT. Both raise an exception in
the main thread (`Terminated`, `KeyboardInterrupt`), so a run cleans up its staging folder and
settles its reservation by the charge rules. Between the ledger commit and the end of
publication they are held back (`signals_deferred`): a committed release is always published,
and the signal takes effect right after.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Terminated(BaseException):
    """SIGTERM: stop as on Ctrl-C (exit code 143)."""


def _raise_for(signum: int) -> None:
    """Raised with a message: Beam re-raises an exception from a DoFn as the same type with
    its step appended to `args[0]`, and one without args as a RuntimeError (exit 70)."""
    if signum == signal.SIGTERM:
        raise Terminated("terminated")
    raise KeyboardInterrupt("interrupted")


def signal_behind(exc: BaseException) -> BaseException | None:
    """The Terminated or KeyboardInterrupt that `exc` stands for, when a library wrapped it
    (Beam turns what a DoFn raises into its own error; a thread pool re-raises it): searched
    along `__cause__` and `__context__`, a few links deep; None for any other failure."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if isinstance(current, Terminated | KeyboardInterrupt):
            return current
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    _raise_for(signum)


def handle_sigterm() -> None:
    """SIGTERM raises Terminated in the main thread (no-op elsewhere). Beam's log line with
    a traceback for an exception out of a DoFn is dropped when that exception is a signal:
    the CLI says `terminated` or `interrupted` in one line."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_signal)
    beam_steps = logging.getLogger("apache_beam.runners.common")
    if not any(isinstance(f, _SignalRecords) for f in beam_steps.filters):
        beam_steps.addFilter(_SignalRecords())


class _SignalRecords(logging.Filter):
    """Drops a log record whose exception is (or wraps) a signal's."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or signal_behind(error) is None


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM received inside the block are delivered again when it ends normally,
    to whatever handler was in place (if the block fails, its own exception goes on and they
    are dropped). Outside the main thread no signal reaches this code, and the block runs as
    it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, _frame: FrameType | None) -> None:
        pending.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in EXIT_CODES}
    try:
        yield
    except BaseException:
        _restore(previous)
        raise
    _restore(previous)
    for signum in dict.fromkeys(pending):
        signal.raise_signal(signum)


def _restore(handlers: dict[int, object]) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]
