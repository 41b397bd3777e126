"""Leases: how the ledger knows a run is alive, on any host, without process ids.

A reservation carries `lease_expires_at`; the running job renews it from a heartbeat thread.
`repair` settles a reservation only once its lease has expired, by the database's clock where
it has one (PostgreSQL's `clock_timestamp()`), so hosts with skewed clocks agree. Containers that
share a hostname, reused pids and hosts that cannot see each other's processes make no
difference: a lease either is renewed or runs out.

Settings (environment; tests shorten them):
- `DPPIPELINE_LEASE_SECONDS` (default 120): how long a reservation lives without a renewal;
- `DPPIPELINE_LEASE_RENEW_SECONDS` (default a sixth of the lease): the heartbeat's interval;
- `DPPIPELINE_HOST_ID`: this process's host id (default `<hostname>/<random per process>`),
  recorded for operators beside the hostname and pid.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable

from dppipeline.errors import UsageError

log = logging.getLogger(__name__)
DEFAULT_LEASE_SECONDS = 120.0
_PROCESS_TOKEN = uuid.uuid4().hex[:12]


def seconds_setting(name: str, default: float) -> float:
    """A positive number of seconds from the environment variable `name` (unset: default)."""
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{name}: must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise UsageError(f"{name}: must be > 0 seconds, got {text!r}")
    return value


def lease_seconds() -> float:
    return seconds_setting("DPPIPELINE_LEASE_SECONDS", DEFAULT_LEASE_SECONDS)


def renew_seconds() -> float:
    lease = lease_seconds()
    renew = seconds_setting("DPPIPELINE_LEASE_RENEW_SECONDS", lease / 6)
    if renew >= lease:
        raise UsageError(
            f"DPPIPELINE_LEASE_RENEW_SECONDS ({renew:g}) must be shorter than the lease "
            f"({lease:g} s)"
        )
    return renew


def host_id() -> str:
    """$DPPIPELINE_HOST_ID, else the hostname plus a random id of this process."""
    return os.environ.get("DPPIPELINE_HOST_ID") or f"{socket.gethostname()}/{_PROCESS_TOKEN}"


class Heartbeat:
    """A daemon thread that calls `renew()` every `interval` seconds until stopped, or until
    `renew()` says the reservation is no longer this run's (settled by someone else)."""

    def __init__(self, renew: Callable[[], bool], interval: float, name: str):
        self._renew = renew
        self._interval = interval
        self._stop = threading.Event()
        self.lost = False
        self._thread = threading.Thread(target=self._beat, name=name, daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                if not self._renew():
                    self.lost = True
                    return
            except Exception as exc:  # the database may be back at the next beat
                log.warning("ledger lease renewal failed (retrying): %s", exc)
