"""The ledger's tables (SQLAlchemy Core, one schema for SQLite and PostgreSQL) and their
versioned migrations.

The applied versions are rows of `ledger_schema_versions`. Version 1 is the schema the first
dppipeline wrote to SQLite, versioned by `PRAGMA user_version` (kept below, as history, for the
upgrade test); a SQLite ledger also gets `user_version` set to the current version, so that an
older dppipeline refuses it instead of writing rows it cannot read. Every migration runs in one
transaction (SQLite: `BEGIN IMMEDIATE`; PostgreSQL: under an advisory lock), so processes that
open a new or old ledger at once migrate it once.

Timestamps are ISO 8601 text in UTC with microseconds (`2026-01-02T03:04:05.000006+00:00`): the
same on both databases, and ordered as text.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dppipeline.errors import UsageError

SCHEMA_VERSION = 5
STATES = ("reserved", "reading", "committed", "failed", "aborted")
# pg_advisory_xact_lock key for migrations: any constant shared by every dppipeline.
_MIGRATION_LOCK = 0x64705F6C6564  # "dp_led"

# Version 1, exactly as dppipeline 0.1 created it on SQLite (history: the upgrade test builds
# a version-1 ledger from this text).
V1_SQLITE_DDL = """
    CREATE TABLE releases (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL UNIQUE,
        scope TEXT NOT NULL,
        job TEXT NOT NULL,
        spec_hash TEXT NOT NULL,
        input_fingerprint TEXT NOT NULL,
        start_date TEXT NOT NULL,
        end_date TEXT NOT NULL,
        release_key TEXT NOT NULL,
        epsilon REAL NOT NULL CHECK (epsilon >= 0),
        delta REAL NOT NULL CHECK (delta >= 0),
        state TEXT NOT NULL CHECK (state IN ('reserved', 'committed', 'aborted')),
        output TEXT NOT NULL,
        pid INTEGER,
        host TEXT,
        reserved_at TEXT NOT NULL,
        finished_at TEXT,
        note TEXT
    );
    CREATE INDEX releases_scope_state ON releases (scope, state);
    CREATE INDEX releases_key ON releases (release_key, state);
    """

metadata = sa.MetaData()

versions = sa.Table(
    "ledger_schema_versions",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("applied_at", sa.Text, nullable=False),
    sa.Column("description", sa.Text, nullable=False),
)


def _release_columns() -> list[sa.Column]:
    """The version-1 columns of `releases`, shared by both versions' tables."""
    return [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Text, nullable=False, unique=True),
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("job", sa.Text, nullable=False),
        sa.Column("spec_hash", sa.Text, nullable=False),
        sa.Column("input_fingerprint", sa.Text, nullable=False),
        sa.Column("start_date", sa.Text, nullable=False),
        sa.Column("end_date", sa.Text, nullable=False),
        sa.Column("release_key", sa.Text, nullable=False),
        sa.Column("epsilon", sa.Float, sa.CheckConstraint("epsilon >= 0"), nullable=False),
        sa.Column("delta", sa.Float, sa.CheckConstraint("delta >= 0"), nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("output", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer),
        sa.Column("host", sa.Text),
        sa.Column("reserved_at", sa.Text, nullable=False),
        sa.Column("finished_at", sa.Text),
        sa.Column("note", sa.Text),
    ]


def releases_table(meta: sa.MetaData, name: str = "releases", version: int = 5) -> sa.Table:
    """`releases` as of `version`: 2 added five states, a lease, the host id and the reading
    time; 3 the release's privacy events (`core.events`, JSON), which caps compose; 5 the
    process that reserved (`lease.this_process`), which lets a dead run be settled at once."""
    states = ", ".join(f"'{s}'" for s in STATES)
    events = [sa.Column("events", sa.Text)] if version >= 3 else []
    process = [sa.Column("process", sa.Text)] if version >= 5 else []
    return sa.Table(
        name,
        meta,
        *_release_columns(),
        sa.Column("host_id", sa.Text),
        sa.Column("reading_at", sa.Text),
        sa.Column("lease_expires_at", sa.Text),
        *events,
        *process,
        sa.CheckConstraint(f"state IN ({states})", name=f"{name}_state"),
        sqlite_autoincrement=True,
    )


releases = releases_table(metadata)

scopes = sa.Table(
    "scopes",
    metadata,
    sa.Column("scope", sa.Text, primary_key=True),
    sa.Column("cap_epsilon", sa.Float, sa.CheckConstraint("cap_epsilon >= 0")),
    sa.Column("cap_delta", sa.Float, sa.CheckConstraint("cap_delta >= 0")),
    sa.Column("window_days", sa.Integer, sa.CheckConstraint("window_days >= 1")),
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Text, nullable=False),
    sa.Column("updated_by", sa.Text, nullable=False),
)

cap_changes = sa.Table(
    "scope_cap_changes",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("scope", sa.Text, nullable=False, index=True),
    sa.Column("changed_at", sa.Text, nullable=False),
    sa.Column("changed_by", sa.Text, nullable=False),
    sa.Column("cap_epsilon", sa.Float),
    sa.Column("cap_delta", sa.Float),
    sa.Column("window_days", sa.Integer),
    sa.Column("previous", sa.Text, nullable=False),  # the cap it replaced, described
    sqlite_autoincrement=True,
)


# Version 4: what each reservation of a file run reads, by content (`inputs.fingerprints`),
# with its privacy unit: the same data is charged in one scope only (`Ledger.reserve`).
charged_files = sa.Table(
    "charged_files",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.Text, nullable=False),  # releases.run_id
    sa.Column("privacy_unit", sa.Text, nullable=False),
    sa.Column("fingerprint", sa.Text, nullable=False),
    sa.Column("day", sa.Text),  # ISO date; NULL for layout `files`
    sa.Column("file", sa.Text, nullable=False),  # relative to the run's input, for messages
    sa.Index("charged_files_content", "privacy_unit", "fingerprint"),
    sa.Index("charged_files_run", "run_id"),
    sqlite_autoincrement=True,
)


def stamp(moment: dt.datetime) -> str:
    """A timestamp as the ledger stores it."""
    return moment.astimezone(dt.UTC).isoformat(timespec="microseconds")


# -------------------------------------------------------------------------------------------
# Migrations: version -> (description, function(connection, now))


def _v1(conn: Connection, now: str) -> None:
    """The first schema: `releases` with three states (portable DDL for a new ledger)."""
    meta = sa.MetaData()
    states = "state IN ('reserved', 'committed', 'aborted')"
    table = sa.Table(
        "releases", meta, *_release_columns(), sa.CheckConstraint(states), sqlite_autoincrement=True
    )
    sa.Index("releases_scope_state", table.c.scope, table.c.state)
    sa.Index("releases_key", table.c.release_key, table.c.state)
    meta.create_all(conn)


def _v2(conn: Connection, now: str) -> None:
    """States reading and failed, leases and host ids; caps stored per scope, with history.

    A version-1 `reserved` row may have read data (version 1 reserved before reading and had
    no separate reading state): it becomes `reading`, with a lease that ends `lease` seconds
    from the migration, so that `repair` settles it by the version-2 rules (committed if its
    release is published, failed otherwise) once it is sure the run is gone.
    """
    from dppipeline.settings import lease_seconds  # noqa: PLC0415

    new = releases_table(sa.MetaData(), "releases_new", version=2)
    new.create(conn)
    old_columns = [c.name for c in _release_columns()]
    selected = ", ".join(
        "CASE state WHEN 'reserved' THEN 'reading' ELSE state END" if c == "state" else c
        for c in old_columns
    )
    expiry = stamp(dt.datetime.fromisoformat(now) + dt.timedelta(seconds=lease_seconds()))
    conn.execute(
        sa.text(
            f"INSERT INTO releases_new ({', '.join(old_columns)}, lease_expires_at) "
            f"SELECT {selected}, CASE state WHEN 'reserved' THEN :expiry END FROM releases"
        ),
        {"expiry": expiry},
    )
    conn.execute(sa.text("DROP TABLE releases"))
    conn.execute(sa.text("ALTER TABLE releases_new RENAME TO releases"))
    if conn.dialect.name == "postgresql":  # ids were copied: the sequence continues after them
        conn.execute(
            sa.text(
                "SELECT setval(pg_get_serial_sequence('releases', 'id'), "
                "COALESCE(MAX(id), 0) + 1, false) FROM releases"
            )
        )
    conn.execute(sa.text("CREATE INDEX releases_scope_state ON releases (scope, state)"))
    conn.execute(sa.text("CREATE INDEX releases_key ON releases (release_key, state)"))
    scopes.create(conn)
    cap_changes.create(conn)
    conn.execute(
        sa.text(
            "INSERT INTO scopes (scope, created_at, updated_at, updated_by) "
            "SELECT DISTINCT scope, :now, :now, 'migration to schema v2' FROM releases"
        ),
        {"now": now},
    )


def _v3(conn: Connection, now: str) -> None:
    """Each release's privacy events, so that a scope's spend is their composition. Releases
    recorded before have none and count as one (epsilon, delta) mechanism each."""
    conn.execute(sa.text("ALTER TABLE releases ADD COLUMN events TEXT"))


def _v4(conn: Connection, now: str) -> None:
    """The content fingerprints of the files each reservation charges. Releases recorded
    before have none: their data cannot be recognised under another scope."""
    charged_files.create(conn)


def _v5(conn: Connection, now: str) -> None:
    """The process that holds each reservation (boot id, pid namespace, pid, start time), so
    that a run killed on this machine is settled at once instead of after its lease. Rows
    recorded before have none and wait for their lease."""
    conn.execute(sa.text("ALTER TABLE releases ADD COLUMN process TEXT"))


MIGRATIONS: dict[int, tuple[str, Callable[[Connection, str], None]]] = {
    1: ("releases: reserved, committed, aborted", _v1),
    2: ("states reading and failed; leases and host ids; caps per scope with history", _v2),
    3: ("privacy events per release, composed by caps", _v3),
    4: ("content fingerprints of the files each release charges, with its privacy unit", _v4),
    5: ("the process holding each reservation, so a dead run is settled at once", _v5),
}
assert max(MIGRATIONS) == SCHEMA_VERSION


def current_version(conn: Connection) -> int:
    """The ledger's schema version: the version table's newest row; for a SQLite ledger of
    version 1 (no version table), `PRAGMA user_version`; 0 for an empty database."""
    inspector = sa.inspect(conn)
    if inspector.has_table(versions.name):
        return conn.execute(sa.select(sa.func.max(versions.c.version))).scalar() or 0
    if conn.dialect.name == "sqlite":
        return conn.exec_driver_sql("PRAGMA user_version").scalar() or 0
    return 0


def migrate(conn: Connection, where: str, now: str, target: int = SCHEMA_VERSION) -> list[int]:
    """Brings the ledger to `target` inside the caller's write transaction; returns the
    versions applied. A ledger newer than this dppipeline is refused (exit code 2)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
    version = current_version(conn)
    if version > SCHEMA_VERSION:
        raise UsageError(
            f"ledger {where} has schema version {version}, newer than this dppipeline "
            f"({SCHEMA_VERSION}): upgrade dppipeline"
        )
    if version >= target:
        return []
    if not sa.inspect(conn).has_table(versions.name):
        versions.create(conn)
        for legacy in range(1, version + 1):  # a version-1 SQLite ledger: record its past
            conn.execute(
                versions.insert().values(
                    version=legacy,
                    applied_at=now,
                    description=MIGRATIONS[legacy][0] + " (recorded from PRAGMA user_version)",
                )
            )
    applied = []
    for step in range(version + 1, target + 1):
        description, apply = MIGRATIONS[step]
        apply(conn, now)
        conn.execute(
            versions.insert().values(version=step, applied_at=now, description=description)
        )
        applied.append(step)
    if conn.dialect.name == "sqlite":  # an older dppipeline reads this and refuses the ledger
        conn.exec_driver_sql(f"PRAGMA user_version = {target}")
    return applied
