"""Shared fixtures: one small synthetic input per layout, generated once per session.

Tests must treat these folders as read-only; a test that corrupts data copies them first.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dppipeline.commands.generate import generate

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

    from dppipeline.engines.spark.session import get_spark

    return SparkSession.getActiveSession() or get_spark(
        app_name="dppipeline-tests",
        master="local[2]",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"},
    )


@pytest.fixture(params=["local", "spark", "beam"])
def engine(request) -> str:
    """Each engine by name, Spark's session started first (a test module may define its own
    `engine`, e.g. with engine objects or more variants)."""
    if request.param == "spark":
        request.getfixturevalue("spark")
    return request.param


def release_small(
    inputs: dict[str, Path],
    out: Path,
    engine,
    fmt: str = "parquet",
    ledger: str | None = None,
    **overrides,
):
    """One release of `inputs` into `out/release` with loose bounds and public terminals
    0..59 (50 with data, 10 empty), recorded in `ledger` if given; returns (released rows
    sorted by key, manifest)."""
    from dppipeline.orchestration.runner import run_job
    from dppipeline.spec.model import build_spec

    out.mkdir(parents=True, exist_ok=True)
    keys = out / "keys.csv"
    keys.write_text("TERMINAL_ID\n" + "\n".join(str(k) for k in range(60)) + "\n")
    base = {
        "input.path": str(inputs[fmt]),
        "input.format": fmt,
        "output": str(out / "release"),
        "metrics": ["count", "sum", "mean", "privacy_id_count"],
        "bounds.max_partitions_contributed": 50,
        "bounds.max_contributions_per_partition": 100,
        "bounds.min_value": 0.0,
        "bounds.max_value": 150.0,
        "partition_selection.public_partitions": str(keys),
    }
    base.update(overrides)
    result = run_job(build_spec({}, base), engine, echo=lambda _: None, ledger=ledger)
    released = pd.read_parquet(result.output / "terminal_stats")
    manifest = result.manifest.model_dump(mode="json", exclude_unset=True)  # as written
    return released.sort_values("TERMINAL_ID", ignore_index=True), manifest


def terminal_truth(rows, min_value: float, max_value: float) -> pd.DataFrame:
    """Exact count, sum (of values clipped to [min_value, max_value]) and distinct customers
    per TERMINAL_ID of a Polars frame of rows: the truth loose bounds must give."""
    import polars as pl

    clipped = rows.with_columns(pl.col("TX_AMOUNT").clip(min_value, max_value))
    return (
        clipped.group_by("TERMINAL_ID")
        .agg(
            pl.len().cast(pl.Float64).alias("count"),
            pl.col("TX_AMOUNT").sum().alias("sum"),
            pl.col("CUSTOMER_ID").n_unique().cast(pl.Float64).alias("privacy_id_count"),
        )
        .sort("TERMINAL_ID")
        .to_pandas()
    )


def check_count_noise_as_planned(release) -> None:
    """Released minus exact count over 60 public partitions (50 with data, 10 empty), 3
    draws at epsilon 1: the variance ratio to the manifest's std^2 is within
    Z * sqrt((kurtosis - 1) / n), kurtosis 6 (Laplace), failure rate 1e-6. Coarse, but it
    fails with no noise or noise 2x too large. `release(name, **overrides)` runs one release."""
    import math

    import numpy as np
    from scipy.stats import norm

    exact, _ = release("exact", **{"budget.epsilon": 1e7})
    draws, manifest = [], None
    for i in range(3):
        noisy, manifest = release(f"noisy{i}", **{"metrics": ["count"], "budget.epsilon": 1.0})
        draws.append(noisy["count"].to_numpy() - exact["count"].to_numpy())
    noise = np.concatenate(draws)
    sigma = manifest["queries"]["terminal_stats"]["metrics"]["count"]["noise_stddev"]
    ratio = np.mean(noise**2) / sigma**2
    assert abs(ratio - 1) <= float(norm.isf(0.5e-6)) * math.sqrt(5 / len(noise)), ratio


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL 16 server on 127.0.0.1, one per test process (see postgres_server)."""
    from postgres_server import start

    server = start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request, tmp_path) -> str:
    """An empty ledger on each backend: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    return request.getfixturevalue("postgres").new_database()


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server (moto) on 127.0.0.1, one per test process (see s3_server)."""
    from s3_server import start

    server = start()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The S3 server, with this test's environment (and the CLI processes it starts) pointed
    at it the usual way: AWS_ENDPOINT_URL and AWS_* credentials."""
    from dppipeline.storage import location as storage

    for name, value in s3_server.environment.items():
        monkeypatch.setenv(name, value)
    storage._remote_fs.cache_clear()  # clients built for another endpoint are not reused
    return s3_server


def with_ids_and_times(rows: pd.DataFrame, rng, start, days: int) -> pd.DataFrame:
    """`rows` (unit, terminal, amount) with TRANSACTION_ID 0..n-1 and a TX_DATETIME drawn
    uniformly over `days` days from `start` (microseconds, as the schema stores it)."""
    n = len(rows)
    rows = rows.reset_index(drop=True)
    rows.insert(0, "TRANSACTION_ID", np.arange(n, dtype=np.int64))
    moments = start + pd.to_timedelta(rng.integers(0, days * 86400, n), "s")
    rows.insert(1, "TX_DATETIME", moments.astype("datetime64[us]"))
    return rows


def write_daily_parquet(rows: pd.DataFrame, root: Path) -> Path:
    """Hand-made transactions (the transactions schema's columns, `TX_DATETIME` as datetime)
    written as `root/date=YYYY-MM-DD/part-0.parquet`, one folder per day; returns `root`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dppipeline.spec.schema import transactions_schema

    schema = transactions_schema().to_arrow()
    moments = rows["TX_DATETIME"].astype("datetime64[us]")
    for day, part in rows.assign(TX_DATETIME=moments).groupby(moments.dt.date):
        folder = root / f"date={day.isoformat()}"
        folder.mkdir(parents=True)
        table = pa.Table.from_pandas(part[schema.names], schema=schema, preserve_index=False)
        pq.write_table(table, folder / "part-0.parquet")
    return root
