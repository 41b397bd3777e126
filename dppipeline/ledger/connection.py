"""The ledger's database: its engine, transactions, clock, schema version, integrity check,
and errors as one line.

Waiting: SQLite's writers wait for its write lock while other processes make progress; a wait
gives up (`DPPIPELINE_LEDGER_TIMEOUT`, default 10 s) only when no other process committed
anything for that long: a burst of runs on one host queues instead of timing out. A run that
has read data waits for its commit (or its `failed`) as long as it takes, on both databases:
it never ends on a lock timeout with its budget charged and no release.

Trust: before a reservation relies on a SQLite ledger's sums, `PRAGMA integrity_check` must
pass (an index that lost rows would hide spends); a damaged file is refused. A `-shm` or
`-wal` file that a run created while the database was read-only keeps that mode after the
database is writable again; one this user owns is given the database's mode on opening.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import sqlite3
import stat
import time
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dppipeline.ledger.records import LedgerError
from dppipeline.ledger.tables import SCHEMA_VERSION, current_version, migrate, stamp
from dppipeline.ledger.url import LedgerLocation

log = logging.getLogger(__name__)
# SQLite: how long its own busy handler waits for the write lock before the ledger looks
# whether another process made progress (and waits on) or none did (`ledger_timeout`).
_BUSY_SLICE = 0.25
# Files found whole by `PRAGMA integrity_check` in this process: path -> their state then.
_CHECKED: dict[Path, tuple[tuple[int, int, int], ...]] = {}


class Database:
    """One ledger database, opened (its folder created, its schema migrated)."""

    def __init__(self, location: LedgerLocation, timeout: float):
        self.location = location
        self.timeout = timeout
        if location.path is not None:
            try:
                location.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise LedgerError(
                    f"cannot create the folder of ledger {location}: {exc.strerror}"
                ) from None
            _heal_read_only_sidecars(location.path)
        self.engine = _engine(location, timeout)
        # Connections close when the ledger is dropped or, at the latest, at exit (the CLI
        # exits without finalizing objects): SQLite then checkpoints its WAL into the file,
        # so that ledger.sqlite alone holds every commit.
        self.close = weakref.finalize(self, self.engine.dispose)
        self._migrate()

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Database errors as one line naming the ledger, never a traceback or a password."""
        try:
            yield
        except sa.exc.DBAPIError as exc:
            message, cause = self.describe(exc)
            raise LedgerError(message, cause=cause) from None

    @contextmanager
    def _transaction(self, write: bool, patient: bool = False) -> Iterator[Connection]:
        with self.guard(), self.engine.connect() as conn:
            conn.execution_options(ledger_write=write, ledger_patient=patient)
            with conn.begin():
                yield conn

    def write(self, *, patient: bool = False) -> AbstractContextManager[Connection]:
        """A write transaction; on SQLite it takes the database's write lock at once, waiting
        while other processes make progress (`patient`: however long it takes)."""
        return self._transaction(True, patient)

    def read(self) -> AbstractContextManager[Connection]:
        return self._transaction(False)

    @staticmethod
    def now(conn: Connection) -> dt.datetime:
        """The database's clock where it has one (PostgreSQL), so hosts agree on leases;
        SQLite lives on one host, whose clock it is."""
        if conn.dialect.name == "postgresql":
            return conn.execute(sa.select(sa.func.clock_timestamp())).scalar_one()
        return dt.datetime.now(dt.UTC)

    def _migrate(self) -> None:
        with self.read() as conn:
            version = current_version(conn)
        if version == SCHEMA_VERSION:
            return
        with self.write() as conn:
            migrate(conn, str(self.location), stamp(self.now(conn)))

    def version(self) -> int:
        with self.read() as conn:
            return current_version(conn)

    def describe(self, exc: sa.exc.DBAPIError) -> tuple[str, str]:
        """(one line, its cause for LedgerError)."""
        orig = exc.orig
        lines = str(orig if orig is not None else exc).strip().splitlines()
        text = lines[0] if lines else type(orig).__name__
        password = self.location.url.password
        if password:
            text = text.replace(str(password), "***")
        low = text.lower()
        where = self.location
        if getattr(orig, "sqlstate", None) == "55P03" or "locked" in low or "lock timeout" in low:
            waited = (
                f"waited {self.timeout:g} s in which no other process wrote to it"
                if self.location.backend == "sqlite"
                else f"waited {self.timeout:g} s"
            )
            return (
                f"ledger {where} is locked by another process ({waited}; "
                "DPPIPELINE_LEDGER_TIMEOUT sets the wait): retry later"
            ), "locked"
        if "not a database" in low or "malformed" in low:
            return f"ledger {where} is not a SQLite database or is corrupt", "other"
        if "readonly" in low or "read-only" in low:
            why = _read_only_part(self.location.path) if self.location.path else None
            return (
                f"ledger {where} is read-only{why or ''}: it must be writable to record spends",
                "other",
            )
        if "unable to open" in low:
            return f"cannot open ledger {where} (a missing or unwritable folder?)", "other"
        if "disk is full" in low or "disk i/o error" in low:
            return f"ledger {where}: {text} (a full disk?)", "other"
        if self.location.backend == "postgresql" and isinstance(exc, sa.exc.OperationalError):
            state = getattr(orig, "sqlstate", None) or ""
            lost = not state or state.startswith(("08", "57P"))  # connection, shutdown
            return f"cannot use ledger {where}: {text}", "unreachable" if lost else "other"
        return f"ledger {where}: {text}", "other"

    def trust(self) -> None:
        """Refuses a damaged SQLite ledger before a reservation relies on its sums: an index
        that lost entries hides the releases it indexed (`PRAGMA quick_check` does not see
        that; `integrity_check` does). Checked once per process and state of the files."""
        path = self.location.path
        if path is None:
            return
        state = _file_state(path)
        if state and _CHECKED.get(path) == state:
            return
        with self.read() as conn:
            found = [str(r[0]) for r in conn.exec_driver_sql("PRAGMA integrity_check(1)")]
        if found != ["ok"]:
            first = " ".join((found[0] if found else "no answer").split())[:200]
            raise LedgerError(
                f"ledger {self.location} is damaged: PRAGMA integrity_check reports {first!r}; "
                "its spends cannot be trusted: restore it from a backup"
            )
        _CHECKED[path] = state


def _engine(location: LedgerLocation, timeout: float) -> Engine:
    if location.backend == "sqlite":
        engine = sa.create_engine(location.url, connect_args={"timeout": timeout})

        @sa.event.listens_for(engine, "connect")
        def _connect(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
            dbapi_connection.isolation_level = None  # SQLAlchemy's "begin" below decides
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")  # a commit is on disk before publishing
            cursor.close()

        @sa.event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            options = conn.get_execution_options()
            if not options.get("ledger_write"):
                conn.exec_driver_sql("BEGIN")
                return
            db = conn.connection.dbapi_connection
            assert isinstance(db, sqlite3.Connection)
            _begin_immediate(db, timeout, bool(options.get("ledger_patient")), str(location))

        return engine
    wait_ms = int(timeout * 1000)
    return sa.create_engine(
        location.url,
        pool_pre_ping=True,
        connect_args={
            "connect_timeout": max(1, math.ceil(timeout)),
            "options": f"-c lock_timeout={wait_ms}",
            "application_name": "dppipeline",
        },
    )


def _begin_immediate(db: sqlite3.Connection, timeout: float, patient: bool, where: str) -> None:
    """`BEGIN IMMEDIATE` (SQLite's write lock), waiting as long as other processes make
    progress: SQLite's busy handler waits a short slice at a time, and between slices `PRAGMA
    data_version` says whether another connection committed meanwhile. The wait gives up
    after `timeout` seconds without any commit by another process (a holder that is stuck,
    not busy); a `patient` one (a run that has read its data) never gives up and says so
    every `timeout` seconds."""
    slice_ms = max(1, int(min(_BUSY_SLICE, timeout) * 1000))
    db.execute(f"PRAGMA busy_timeout = {slice_ms}")
    try:
        version = _data_version(db)
        idle_since = noted = time.monotonic()
        while True:
            try:
                db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if (
                    getattr(exc, "sqlite_errorcode", sqlite3.SQLITE_BUSY) & 0xFF
                    != sqlite3.SQLITE_BUSY
                ):
                    raise sa.exc.OperationalError("BEGIN IMMEDIATE", None, exc) from None
                busy = exc
            now, seen = time.monotonic(), _data_version(db)
            if seen is not None and seen != version:
                version, idle_since = seen, now  # another process committed: keep waiting
            elif now - idle_since >= timeout:
                if not patient:
                    raise sa.exc.OperationalError("BEGIN IMMEDIATE", None, busy) from None
                if now - noted >= timeout:
                    noted = now
                    log.warning(
                        "ledger %s: its write lock has been held for %.0f s without progress; "
                        "this run has read its data and waits to record its outcome", where,
                        now - idle_since,
                    )  # fmt: skip
    finally:
        db.execute(f"PRAGMA busy_timeout = {max(1, int(timeout * 1000))}")


def _data_version(db: sqlite3.Connection) -> int | None:
    """SQLite's counter of commits by other connections; None when it cannot be read now."""
    try:
        return int(db.execute("PRAGMA data_version").fetchone()[0])
    except sqlite3.Error:
        return None


def _file_state(path: Path) -> tuple[tuple[int, int, int], ...]:
    """(inode, size, mtime) of the database and its WAL: what a write changes."""
    found = []
    for name in (path, path.with_name(path.name + "-wal")):
        try:
            st = name.stat()
        except OSError:
            continue
        found.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(found)


def _heal_read_only_sidecars(path: Path) -> None:
    """After a read-only incident. SQLite creates `-shm` and `-wal` with the database file's
    mode, so a run that opened the ledger while the file was read-only left a read-only
    `-shm`; once the file is writable again, every writer still failed "read-only". When this
    user can write the database and owns such a file, it gets the database's write bits
    (a mode change: harmless to any process that has the file open)."""
    if not _writable(path):
        return
    mode = stat.S_IMODE(path.stat().st_mode)
    for side in (path.with_name(path.name + "-shm"), path.with_name(path.name + "-wal")):
        try:
            found = side.lstat()
        except OSError:
            continue
        if not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid() or _writable(side):
            continue
        try:
            os.chmod(side, stat.S_IMODE(found.st_mode) | (mode & 0o222) | stat.S_IWUSR)
        except OSError:
            continue  # the read-only error will name it
        log.warning("ledger %s: %s was read-only (left so while the ledger was); made writable",
                    path, side.name)  # fmt: skip


def _writable(path: Path) -> bool:
    """Can this process open `path` for writing (its real permissions, not a guess)?"""
    try:
        os.close(os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0)))
    except OSError:
        return False
    return True


def _read_only_part(path: Path) -> str | None:
    """Which of the ledger's files this process cannot write, for the read-only message."""
    if not _writable(path):
        return None  # the database itself: the message says so
    for side in (path.with_name(path.name + "-shm"), path.with_name(path.name + "-wal")):
        if side.exists() and not _writable(side):
            owner = side.stat().st_uid
            return (
                f" ({side.name} is not writable by this user; its owner, uid {owner}, must make "
                "it writable, or remove it while no process uses the ledger)"
            )
    if not os.access(path.parent, os.W_OK | os.X_OK):
        return f" (its folder {path.parent} is not writable: SQLite creates files beside it)"
    return None
