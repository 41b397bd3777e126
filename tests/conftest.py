"""Shared fixtures: one small synthetic input per layout, generated once per session.

Tests must treat these folders as read-only; a test that corrupts data copies them first.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from dppipeline.synth import generate

SMALL = {"customers": 200, "terminals": 50, "days": 3, "tx_per_day": 500, "seed": 11}
START = dt.date(2026, 1, 1)
DAYS = [START + dt.timedelta(days=d) for d in range(SMALL["days"])]


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path, monkeypatch):
    """Each test (and the CLI processes it starts) gets its own ledger and state folder."""
    monkeypatch.setenv("DPPIPELINE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("DPPIPELINE_LEDGER", raising=False)


@pytest.fixture(scope="session")
def small_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"parquet": folder, "csv": folder}: the same transactions in both input layouts."""
    base = tmp_path_factory.mktemp("inputs")
    return {
        fmt: generate(base / fmt, fmt=fmt, start_date=START, **SMALL).output
        for fmt in ("parquet", "csv")
    }


@pytest.fixture(scope="session")
def spark():
    """One SparkSession per test process (local[2], UI off, few shuffle partitions)."""
    import shutil

    if shutil.which("java") is None:
        pytest.skip("Spark tests need Java on PATH")
    from pyspark.sql import SparkSession

    from dppipeline.engines.spark_session import get_spark

    return SparkSession.getActiveSession() or get_spark(
        app_name="dppipeline-tests",
        master="local[2]",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"},
    )
