"""A real Airflow for the DAG tests: its own home, SQLite metadata database and settings.

Runs under `.venv-airflow` (make test does it). The environment is set before Airflow is
imported, since Airflow reads its configuration on import. The DAGs' jobs run with the
project's `.venv` Python, as in a deployment; `PYTHONPATH` (inherited by every job) chooses which
dppipeline source they import when `.venv` holds an editable install of another checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
MAIN_PYTHON = PROJECT / ".venv" / "bin" / "python"
HOME = Path(tempfile.mkdtemp(prefix="dppipeline-airflow-"))
DATA = HOME / "data"
LEDGER = DATA / "ledger.sqlite"  # the connection dppipeline_ledger names it
SETTINGS = {
    "input_root": str(DATA / "transactions"),
    "release_root": str(DATA / "releases"),
    "sensor_timeout_seconds": 4,
    "sensor_poke_seconds": 1,
}
SHAPE = {"retries": 0}  # the DAG's shape: read from the environment when the file is parsed

os.environ.update(
    {
        "AIRFLOW_HOME": str(HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT / "airflow_dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{HOME / 'airflow.db'}",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "AIRFLOW_VAR_DPPIPELINE_TERMINAL_STATS": json.dumps(SETTINGS),
        "DPPIPELINE_DAG_SETTINGS": json.dumps(SHAPE),
        "AIRFLOW_CONN_DPPIPELINE_LEDGER": json.dumps({"conn_type": "sqlite", "host": str(LEDGER)}),
        "DPPIPELINE_SPARK_MASTER": "local[2]",
        # the jobs' operator state (quarantine, staging) in the test's home, not the checkout
        "DPPIPELINE_STATE_DIR": str(HOME / "state"),
        # the jobs import this checkout's dppipeline, whatever .venv's editable install names
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")])),
    }
)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """`airflow db migrate` once per session (SQLite)."""
    subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
        check=True,
        capture_output=True,
    )
    return HOME


@pytest.fixture(scope="session")
def transactions() -> Path:
    """Three days of generated transactions, 2026-01-01..03, written by the project's CLI."""
    out = Path(SETTINGS["input_root"])
    subprocess.run(
        [str(MAIN_PYTHON), "-m", "dppipeline", "generate", "--output", str(out), "--days", "3",
         "--tx-per-day", "3000", "--customers", "600", "--terminals", "1000"],
        check=True,
        capture_output=True,
        cwd=PROJECT,
    )  # fmt: skip
    return out
