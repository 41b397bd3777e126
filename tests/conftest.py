"""Shared fixtures (one small synthetic input per layout, generated once per session; Spark, a
PostgreSQL and an S3 server, one per test process) and the markers that say what a test starts.

Tests must treat the input folders as read-only; a test that corrupts data copies them first.
Helpers that are not fixtures live in `support/`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from support.data import SMALL, START

from dppipeline.synthetic.transactions import generate


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

    from dppipeline.engines.spark.spark_session import get_spark

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


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL 16 server on 127.0.0.1, one per test process (see postgres_server)."""
    from support.postgres_server import start

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
    from support.s3_server import start

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


# --------------------------------------------------------------------------- markers

# What each marker stands for: fixtures that start it, and engine names it runs on.
FIXTURE_MARKS = {"spark": "spark", "postgres": "postgres", "s3": "s3", "s3_server": "s3"}
ENGINE_MARKS = ("spark", "beam")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks each test spark / beam / postgres / s3 by what it uses: the fixtures it requests
    (`spark`, `postgres`, `s3`, `s3_server`), a parameter value "postgresql" (`ledger_url` or a
    test's own), and a parameter named like engine whose value is a Spark or Beam engine (a name
    such as "spark" or "beam-many-shards", or an engine object). Tests that start a JVM or a
    server another way (a CLI subprocess with --engine spark, a Beam engine built in the test)
    carry explicit marks; under a selection without spark, the check below catches a miss."""
    for item in items:
        for mark in sorted(_uses(item)):
            item.add_marker(getattr(pytest.mark, mark))


def _uses(item: pytest.Item) -> set[str]:
    names = set(getattr(item, "fixturenames", ()))
    marks = {mark for fixture, mark in FIXTURE_MARKS.items() if fixture in names}
    params = getattr(getattr(item, "callspec", None), "params", {})
    if any(isinstance(value, str) and value == "postgresql" for value in params.values()):
        marks.add("postgres")
    for name, value in params.items():
        if "engine" not in name:
            continue
        text = (value if isinstance(value, str) else type(value).__name__).lower()
        marks.update(engine for engine in ENGINE_MARKS if text.startswith(engine))
    return marks


NO_JAVA = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Under a selection that deselects spark (`make test-fast`), JAVA_HOME and PATH lead to a
    `java` that records its call and fails, in this process and every process a test starts."""
    if "not spark" not in " ".join((config.getoption("markexpr") or "").split()):
        return
    home = Path(tempfile.mkdtemp(prefix="dppipeline-no-java-"))
    (home / "bin").mkdir()
    java = home / "bin" / "java"
    java.write_text(
        f'#!/bin/sh\necho "java $*" >> "{home / "started"}"\n'
        'echo "java: this selection excludes spark (tests/conftest.py)" >&2\nexit 1\n'
    )
    java.chmod(0o755)
    os.environ["JAVA_HOME"] = str(home)
    os.environ["PATH"] = f"{home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    config.stash[NO_JAVA] = home / "started"


def pytest_unconfigure(config: pytest.Config) -> None:
    record = config.stash.get(NO_JAVA, None)
    if record is not None:
        shutil.rmtree(record.parent, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    try:
        return (yield)
    finally:
        _no_java_started(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    try:
        return (yield)
    finally:
        _no_java_started(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    try:
        return (yield)
    finally:
        _no_java_started(item)


def _no_java_started(item: pytest.Item) -> None:
    """Fails the phase of a test (its fixtures included) that tried to start Java under a
    selection without spark: the test lacks its `spark` mark."""
    record = item.config.stash.get(NO_JAVA, None)
    if record is None or not record.exists():
        return
    tried = record.read_text().strip()
    record.unlink()
    pytest.fail(
        "this test started Java under a selection that excludes spark; mark it "
        f"@pytest.mark.spark ({tried[:160]})"
    )
