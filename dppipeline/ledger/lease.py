"""Leases: how the ledger knows a run is alive, on any host; and when a run is provably dead.

A reservation carries `lease_expires_at`; the running job renews it from a heartbeat thread.
`repair` settles a reservation once its lease has expired, by the database's clock where it has
one (PostgreSQL's `clock_timestamp()`), so hosts with skewed clocks agree. Containers that share
a hostname, reused pids and hosts that cannot see each other's processes make no difference: a
lease either is renewed or runs out.

A run killed on this machine need not wait for its lease: its row also records the process
that reserved (`this_process`: the kernel's boot id, the pid namespace, the pid and the
process's start time). A process of the same boot and pid namespace that no longer exists, has
exited (a zombie), or whose pid now belongs to a process started at another time, is gone
(`process_gone`), and `repair` settles its reservation at once. Anything else (another host,
another container, a reboot, no /proc) proves nothing, and the lease decides.

Settings (environment, read and checked by dppipeline.settings; tests shorten them):
- `DPPIPELINE_LEASE_SECONDS` (default 120): how long a reservation lives without a renewal;
- `DPPIPELINE_LEASE_RENEW_SECONDS` (default a sixth of the lease): the heartbeat's interval;
- `DPPIPELINE_HOST_ID`: this process's host id (default `<hostname>/<random per process>`),
  recorded for operators beside the hostname and pid.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from dppipeline import settings
from dppipeline.ledger.records import LedgerRow, parse_time
from dppipeline.ledger.tables import stamp

log = logging.getLogger(__name__)
_PROCESS_TOKEN = uuid.uuid4().hex[:12]


def host_id() -> str:
    """$DPPIPELINE_HOST_ID, else the hostname plus a random id of this process."""
    return settings.host_id() or f"{socket.gethostname()}/{_PROCESS_TOKEN}"


def this_process() -> str | None:
    """`<boot id>/<pid namespace>/<pid>/<start time in clock ticks>` of this process, or None
    where the kernel does not say (no Linux /proc, or a /proc of another pid namespace)."""
    machine = _machine()
    start = _start_ticks(os.getpid()) if machine is not None else None
    if machine is None or start is None:
        return None
    return f"{machine}/{os.getpid()}/{start}"


def process_gone(process: str | None) -> bool:
    """Is the process recorded as `process` (by `this_process`) provably gone? True only on
    the same boot and pid namespace, when its pid no longer exists, has exited (a zombie not
    yet reaped), or belongs to a process started at another time (a reused pid)."""
    parts = (process or "").split("/")
    machine = _machine()
    if len(parts) != 4 or machine is None or "/".join(parts[:2]) != machine:
        return False
    try:
        pid = int(parts[2])
    except ValueError:
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # no signal sent: does the pid exist in this namespace?
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists, another user's: its start time below, if /proc shows it
    status = _status(pid)
    if status is None:  # hidden (hidepid) or gone in between: no proof either way
        return False
    state, start = status
    return state in ("Z", "X") or start != parts[3]


def why_dead(row: LedgerRow, now: dt.datetime) -> str | None:
    """Why a live row's run is known to be gone (for its note), or None while it may live:
    its lease ran out, or its process is provably dead on this host."""
    who = f"host {row.host_id or row.host}"
    if row.lease_expires_at is None or parse_time(row.lease_expires_at) <= now:
        return f"lease of {who} expired"
    if process_gone(row.process):
        return f"process {row.pid} of {who} ended"
    return None


def expiry(now: dt.datetime) -> str:
    """When a lease taken or renewed at `now` runs out (`DPPIPELINE_LEASE_SECONDS`)."""
    return stamp(now + dt.timedelta(seconds=settings.lease_seconds()))


@functools.cache
def _machine() -> str | None:
    """This boot and pid namespace, when /proc is this namespace's (its pids are ours)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")  # pid:[4026531836]
        own = Path("/proc/self/stat").read_text().split(" ", 1)[0]
    except (OSError, ValueError):
        return None
    if not boot or own != str(os.getpid()):
        return None
    return f"{boot}/{namespace.removeprefix('pid:[').removesuffix(']')}"


def _status(pid: int) -> tuple[str, str] | None:
    """(state letter, start time in clock ticks since boot) of a process, from /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()  # the name before ")" may hold spaces
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _start_ticks(pid: int) -> str | None:
    status = _status(pid)
    return status[1] if status is not None else None


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
