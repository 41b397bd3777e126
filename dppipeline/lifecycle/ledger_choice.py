"""Which ledger a release is charged to: one rule for every entry point.

The CLI (`--ledger`, `--no-ledger`), the Python API (`ledger=`), the Beam transform and the
Airflow tasks (which run the CLI) all resolve it here:

- a ledger named by the caller (a URL or a path) is used;
- nothing named: `$DPPIPELINE_LEDGER`, else `ledger.sqlite` in `$DPPIPELINE_STATE_DIR`
  (default `./state`), the same file for every entry point;
- no ledger only when the caller says so (`--no-ledger`, `ledger=False`), and never for a job
  that states what only a ledger can enforce (a scope, a cap or a window): such a job is
  refused, not released unrecorded.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeAlias

from dppipeline.errors import UsageError
from dppipeline.settings import default_ledger
from dppipeline.spec.model import JobSpec

if TYPE_CHECKING:  # SQLAlchemy: imported only for a run with a ledger
    from dppipeline.ledger import Ledger

# Budget fields that only a ledger can enforce.
LEDGER_FIELDS = ("scope", "cap_epsilon", "cap_delta", "window_days")

LedgerChoice: TypeAlias = "Ledger | str | Path | Literal[False] | None"


def ledger_only_fields(spec: JobSpec) -> list[str]:
    """The budget fields of `spec` that govern a ledger (`budget.scope`, caps, window)."""
    return [f"budget.{name}" for name in LEDGER_FIELDS if getattr(spec.budget, name) is not None]


def refuse_unrecorded(spec: JobSpec, how: str) -> None:
    """A job with a scope, cap or window cannot be released without a ledger (`how`: what
    the caller wrote to go without one, for the message)."""
    stated = ledger_only_fields(spec)
    if stated:
        raise UsageError(
            f"{stated[0]}: only a ledger enforces it, and {how} releases without one; use a "
            f"ledger (the default is $DPPIPELINE_LEDGER, else state/ledger.sqlite) or remove "
            f"{', '.join(stated)} from the job"
        )


def choose_ledger(requested: LedgerChoice, spec: JobSpec, how: str) -> Ledger | str | Path | None:
    """The ledger to charge: `requested` when named, the default when None, no ledger for
    False (refused when the job states a scope, cap or window)."""
    if requested is False:
        refuse_unrecorded(spec, how)
        return None
    if requested is None or requested is True:
        return default_ledger()
    return requested
