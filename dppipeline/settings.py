"""Settings read from the environment: where the operator's state and the ledger live.

One place decides these for every entry point (the CLI, the Python API, the Beam transform,
the Airflow tasks through the CLI), so that a release from any of them is charged to the same
ledger.
"""

from __future__ import annotations

import os
from pathlib import Path

LEDGER_VARIABLE = "DPPIPELINE_LEDGER"
STATE_DIR_VARIABLE = "DPPIPELINE_STATE_DIR"


def state_dir() -> Path:
    """The operator's state folder: $DPPIPELINE_STATE_DIR, default ./state."""
    return Path(os.environ.get(STATE_DIR_VARIABLE) or "state")


def default_ledger() -> str:
    """$DPPIPELINE_LEDGER, else ledger.sqlite in the state folder."""
    return os.environ.get(LEDGER_VARIABLE) or os.path.join(state_dir(), "ledger.sqlite")
