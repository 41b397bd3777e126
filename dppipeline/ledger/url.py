"""Where a ledger is: `--ledger` text -> a SQLAlchemy URL, and the location shown to people.

Forms (SQLAlchemy's own URL rules, so a URL means here what it means to any SQLAlchemy tool):

- `sqlite:////abs/ledger.sqlite`: an absolute path (four slashes);
- `sqlite:///state/ledger.sqlite`: a path relative to the working folder (three slashes);
- `postgresql://user@host:5432/db` (also `postgres://` and `postgresql+psycopg://`): PostgreSQL
  through psycopg 3;
- anything without `://`: a file path (relative to the working folder), a SQLite ledger.

The location printed in `[ledger]` lines and stored in manifests is the absolute file path, or
the PostgreSQL URL with its password masked and credential-bearing query parameters dropped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL

from dppipeline.errors import UsageError

URL_FORMS = (
    "sqlite:////ABSOLUTE/PATH, sqlite:///RELATIVE/PATH, postgresql://USER@HOST:PORT/DB or a "
    "file path"
)
# Query parameters of a libpq URL that carry or point at a secret: never shown.
_SECRET_PARAMETERS = frozenset({"password", "sslpassword", "passfile", "sslkey", "sslcert"})
_POSTGRES_DRIVERS = {"postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2"}


@dataclass(frozen=True)
class LedgerLocation:
    """A parsed `--ledger`: the URL SQLAlchemy connects to and what people are shown."""

    url: URL
    path: Path | None  # the SQLite file (absolute); None for PostgreSQL

    @property
    def backend(self) -> str:
        return "sqlite" if self.path is not None else "postgresql"

    @property
    def display(self) -> str:
        """The absolute file, or the URL with no credential in it."""
        if self.path is not None:
            return str(self.path)
        query = {k: v for k, v in self.url.query.items() if k.lower() not in _SECRET_PARAMETERS}
        shown = self.url.set(drivername="postgresql", query=query)
        return shown.render_as_string(hide_password=True)

    def __str__(self) -> str:
        return self.display


def parse_ledger_url(text: str | Path) -> LedgerLocation:
    """`--ledger` text -> LedgerLocation; raises UsageError (exit 2) for other forms."""
    raw = str(text)
    if not raw.strip():
        raise UsageError(f"--ledger: empty; give {URL_FORMS}")
    if "://" not in raw:
        path = _absolute(raw)
        return LedgerLocation(sa.engine.URL.create("sqlite", database=str(path)), path)
    try:
        url = sa.engine.make_url(raw)
    except sa.exc.ArgumentError:
        raise UsageError(f"--ledger: not a database URL; give {URL_FORMS}") from None
    if url.drivername == "sqlite":
        if not url.database or url.database == ":memory:":
            raise UsageError(
                "--ledger: an in-memory SQLite ledger forgets every spend; give a file "
                f"({URL_FORMS})"
            )
        path = _absolute(url.database)  # relative to the working folder, as in SQLAlchemy
        return LedgerLocation(url.set(database=str(path)), path)
    if url.drivername in _POSTGRES_DRIVERS:
        return LedgerLocation(url.set(drivername="postgresql+psycopg"), None)
    shown = url.render_as_string(hide_password=True).split("://")[0]
    raise UsageError(f"--ledger: unsupported database {shown!r}; give {URL_FORMS}")


def _absolute(path: str) -> Path:
    """Absolute and normalised (`a/../b` -> `b`), symbolic links kept: what SQLite opens."""
    return Path(os.path.abspath(os.path.expanduser(path)))
