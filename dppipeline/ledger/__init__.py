"""The privacy-budget ledger: every release's spend, across runs, nights and hosts.

Why: the same customers appear in every nightly release, so their privacy loss accumulates
(each release records its privacy events; a scope's spend is their composition, never more
than the sums: `caps`), and a retried job that drew fresh noise for an already published day
would let anyone average the two releases. The ledger makes both impossible:

- caps belong to a scope and are stored in the ledger (`budget set-cap`, with history); a job
  spec can only restate them (or create one for a scope that has none);
- a release is reserved before any data is read, marked `reading` just before the first byte,
  and committed before it is published; a run that read data and failed stays charged;
- liveness is a lease renewed by the running job; a run whose process is provably gone from
  this host (pid and start time recorded) is settled at once, without waiting for its lease;
- a release is keyed by (scope, canonical spec hash, input fingerprint, date range); the same
  key again returns the committed release: same files, no new noise, no new spend;
- a file run's files are recorded by content (`inputs.fingerprints`) with the privacy unit:
  the same data, copied, linked, renamed or named by another scope, is refused there;
- SQLite is the embedded default (one host); PostgreSQL is one ledger for every host.

Modules: `url` (where a ledger is), `tables` (its SQL tables and migrations), `records` (rows
as values), `connection` (the database: transactions, waits, trust), `caps` (what a cap
admits: sums or composition), `keys`, `lease`, `scope_rows`, `admission`, `reserving`,
`content`, `transitions`, `repair`, `views`; `book` (the Ledger, the facade over them) and
`reservation` (one run's spend by the charge rules).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dppipeline.errors import BudgetHeldError
    from dppipeline.ledger.book import Ledger
    from dppipeline.ledger.caps import (
        CAP_TOLERANCE,
        CHARGED_STATES,
        BudgetExceededError,
        BudgetPolicy,
        left_of,
    )
    from dppipeline.ledger.keys import InputContent, ReleaseKey, input_fingerprint
    from dppipeline.ledger.lease import host_id
    from dppipeline.ledger.records import (
        CapChange,
        LedgerError,
        LedgerRow,
        ReservationLostError,
        ScopeData,
        StoredCap,
    )
    from dppipeline.ledger.reservation import Reservation
    from dppipeline.ledger.tables import SCHEMA_VERSION, STATES
    from dppipeline.ledger.url import LedgerLocation, parse_ledger_url
    from dppipeline.settings import lease_seconds, ledger_timeout, renew_seconds

# Where each name lives: imported on first use, so that a run without a ledger, which needs
# only `caps` and `keys`, does not import SQLAlchemy (`book`, `url`, `tables`: 0.4 s).
_HOMES = {
    "dppipeline.errors": ("BudgetHeldError",),
    "dppipeline.ledger.book": ("Ledger",),
    "dppipeline.ledger.caps": (
        "CAP_TOLERANCE",
        "CHARGED_STATES",
        "BudgetExceededError",
        "BudgetPolicy",
        "left_of",
    ),
    "dppipeline.ledger.keys": ("InputContent", "ReleaseKey", "input_fingerprint"),
    "dppipeline.ledger.lease": ("host_id",),
    "dppipeline.ledger.records": (
        "CapChange",
        "LedgerError",
        "LedgerRow",
        "ReservationLostError",
        "ScopeData",
        "StoredCap",
    ),
    "dppipeline.ledger.reservation": ("Reservation",),
    "dppipeline.ledger.tables": ("SCHEMA_VERSION", "STATES"),
    "dppipeline.ledger.url": ("LedgerLocation", "parse_ledger_url"),
    "dppipeline.settings": ("lease_seconds", "ledger_timeout", "renew_seconds"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    import importlib  # noqa: PLC0415

    home = _HOME_OF.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


__all__ = [
    "CAP_TOLERANCE",
    "CHARGED_STATES",
    "SCHEMA_VERSION",
    "STATES",
    "BudgetExceededError",
    "BudgetHeldError",
    "BudgetPolicy",
    "CapChange",
    "InputContent",
    "Ledger",
    "LedgerError",
    "LedgerLocation",
    "LedgerRow",
    "ReleaseKey",
    "Reservation",
    "ReservationLostError",
    "ScopeData",
    "StoredCap",
    "host_id",
    "input_fingerprint",
    "lease_seconds",
    "ledger_timeout",
    "left_of",
    "parse_ledger_url",
    "renew_seconds",
]
