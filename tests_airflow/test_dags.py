"""The DAGs on a real Airflow: DagBag, task graph, and dag.test() runs with real Spark/Beam."""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import BundleDagBag
from conftest import DATA, LEDGER, MAIN_PYTHON, PROJECT

DAG_IDS = ("dp_terminal_stats_spark", "dp_terminal_stats_beam")
CHAIN = {
    "dp_terminal_stats_spark": "submit_spark_job",
    "dp_terminal_stats_beam": "run_beam_pipeline",
}


@pytest.fixture(scope="module")
def dagbag(airflow_db) -> BundleDagBag:
    """As Airflow 3's DAG processor parses a bundle: its folder is importable."""
    folder = PROJECT / "airflow_dags"
    return BundleDagBag(dag_folder=str(folder), bundle_path=folder)


def day(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def ledger_rows(path: Path = LEDGER) -> list[tuple]:
    if not path.exists():
        return []
    with sqlite3.connect(path) as db:
        return db.execute("SELECT run_id, start_date, state, epsilon FROM releases").fetchall()


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file under folder: modification time (ns) and content hash."""
    return {
        str(p.relative_to(folder)): (
            p.stat().st_mtime_ns,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def states(run) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def test_dagbag_loads_every_dag_without_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(DAG_IDS) <= set(dagbag.dag_ids)
    for dag_id in DAG_IDS:
        dag = dagbag.get_dag(dag_id)
        assert dag.doc_md and "dppipeline" in dag.tags
        assert dag.max_active_runs == 1 and dag.catchup is False
        assert all(task.owner == "dp-platform" for task in dag.tasks)


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_task_graph_is_a_chain(dagbag, dag_id):
    dag = dagbag.get_dag(dag_id)
    chain = ["wait_for_input", "check_budget", CHAIN[dag_id], "validate_release", "mark_published"]
    assert sorted(dag.task_ids) == sorted(chain)
    for upstream, downstream in itertools.pairwise(chain):
        assert dag.get_task(downstream).upstream_task_ids == {upstream}
    assert dag.get_task("check_budget").retries == 0  # a refusal is final


def test_spark_dag_releases_a_day_and_a_rerun_changes_nothing(dagbag, transactions):
    dag = dagbag.get_dag("dp_terminal_stats_spark")
    run = dag.test(logical_date=day("2026-01-02"))
    assert states(run) == dict.fromkeys(states(run), "success"), states(run)
    release = DATA / "releases" / "2026-01-02"
    assert (release / "manifest.json").is_file() and (release / "_PUBLISHED").is_file()
    assert (release / "terminal_stats").is_dir()
    rows = [r for r in ledger_rows() if r[1] == "2026-01-02"]
    assert len(rows) == 1 and rows[0][2] == "committed"

    before, ledger_before = snapshot(release), ledger_rows()
    again = dag.test(
        logical_date=day("2026-01-02"), run_after=day("2026-01-02") + dt.timedelta(hours=1)
    )
    assert set(states(again).values()) == {"success"}
    assert snapshot(release) == before  # no new noise, not even a rewritten marker
    assert ledger_rows() == ledger_before  # nothing spent


def test_missing_input_fails_at_the_sensor(dagbag, transactions):
    dag = dagbag.get_dag("dp_terminal_stats_spark")
    run = dag.test(logical_date=day("2026-03-01"))
    found = states(run)
    assert found["wait_for_input"] == "failed"
    assert found["check_budget"] != "success" and found["submit_spark_job"] != "success"
    assert not (DATA / "releases" / "2026-03-01").exists()


def capped_config(folder: Path) -> Path:
    """The job spec with its own ledger scope capped at epsilon 1: one release uses it up."""
    text = (PROJECT / "jobs" / "configs" / "terminal_stats.yaml").read_text()
    text = text.replace("budget:\n", "budget:\n  scope: capped\n  cap_epsilon: 1.0\n", 1)
    text = text.replace("../../schemas/", f"{PROJECT}/schemas/")
    path = folder / "capped.yaml"
    path.write_text(text)
    return path


def test_no_budget_left_fails_at_the_check(dagbag, transactions, tmp_path):
    config = capped_config(tmp_path)
    subprocess.run(  # another day's release spends the whole cap (the project's CLI)
        [str(MAIN_PYTHON), "-m", "dppipeline", "run", "--config", str(config), "--input",
         str(transactions), "--start-date", "2026-01-01", "--end-date", "2026-01-01",
         "--output", str(tmp_path / "other"), "--ledger", str(LEDGER)],
        check=True, capture_output=True, cwd=PROJECT,
    )  # fmt: skip
    ledger_before = ledger_rows()
    dag = dagbag.get_dag("dp_terminal_stats_spark")
    run = dag.test(logical_date=day("2026-01-03"), run_conf={"config": str(config)})
    found = states(run)
    assert found["wait_for_input"] == "success"
    assert found["check_budget"] == "failed"
    assert found["submit_spark_job"] != "success"
    assert ledger_rows() == ledger_before
    assert not (DATA / "releases" / "2026-01-03").exists()


def test_beam_dag_releases_a_day_on_the_direct_runner(dagbag, transactions):
    dag = dagbag.get_dag("dp_terminal_stats_beam")
    run = dag.test(
        logical_date=day("2026-01-03"),
        run_conf={"release_root": str(DATA / "beam_releases")},
    )
    assert set(states(run).values()) == {"success"}, states(run)
    release = DATA / "beam_releases" / "2026-01-03"
    manifest = (release / "manifest.json").read_text()
    assert '"engine": "beam"' in manifest and (release / "_PUBLISHED").is_file()


# -------------------------------------------------------------------------------------------------
# The ledger: the connection dppipeline_ledger, read when tasks run


def common():
    """dppipeline_common, as the DAG files import it (the bundle folder is importable)."""
    sys.path.insert(0, str(PROJECT / "airflow_dags"))
    try:
        import dppipeline_common
    finally:
        sys.path.pop(0)
    return dppipeline_common


def test_the_ledger_connection_is_not_read_when_dags_are_parsed(airflow_db, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_DPPIPELINE_LEDGER", "{this is not a connection")
    folder = PROJECT / "airflow_dags"
    bag = BundleDagBag(dag_folder=str(folder), bundle_path=folder)
    assert bag.import_errors == {}
    assert set(DAG_IDS) <= set(bag.dag_ids)


def test_ledger_urls_from_airflow_connections(airflow_db, monkeypatch):
    from airflow.sdk import Connection

    module = common()
    postgres = Connection(
        conn_id="dppipeline_ledger", conn_type="postgres", host="db.example", login="dp",
        password="p@ss:word", port=5432, schema="ledger", extra=json.dumps({"sslmode": "require"}),
    )  # fmt: skip
    assert module.connection_url(postgres) == (
        "postgresql://dp:p%40ss%3Aword@db.example:5432/ledger?sslmode=require"
    )
    sqlite = Connection(conn_id="x", conn_type="sqlite", host="/srv/dp/ledger.sqlite")
    assert module.connection_url(sqlite) == "/srv/dp/ledger.sqlite"
    given = Connection(conn_id="x", conn_type="generic", extra=json.dumps({"url": "sqlite:///a"}))
    assert module.connection_url(given) == "sqlite:///a"
    with pytest.raises(ValueError, match="is not a ledger"):
        module.connection_url(Connection(conn_id="x", conn_type="http", host="example.com"))
    # A URI given in the environment, as a deployment sets it; none: the demo's file.
    monkeypatch.setenv("AIRFLOW_CONN_DPPIPELINE_LEDGER", "postgresql://dp:pw@db:5433/ledger")
    assert module.ledger_url() == "postgresql://dp:pw@db:5433/ledger"
    monkeypatch.delenv("AIRFLOW_CONN_DPPIPELINE_LEDGER")
    assert module.ledger_url() == str(PROJECT / "state" / "ledger.sqlite")


@pytest.fixture
def postgres_ledger():
    """A real PostgreSQL server (the project's test helper, run with the project's Python,
    which has the pgserver wheel) and an empty database on it."""
    started = subprocess.run(
        [str(MAIN_PYTHON), str(PROJECT / "tests" / "postgres_server.py"), "start"],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    server = json.loads(started.stdout)
    yield server["url"]
    subprocess.run(
        [str(MAIN_PYTHON), str(PROJECT / "tests" / "postgres_server.py"), "stop",
         server["folder"]],
        capture_output=True, check=False, timeout=120,
    )  # fmt: skip


def test_spark_dag_records_in_the_postgresql_ledger_of_the_connection(
    dagbag, transactions, postgres_ledger, monkeypatch, tmp_path
):
    """Workers on several hosts share one ledger by sharing one connection: every task of
    the run (the budget check, the Spark job, the release check) uses the PostgreSQL ledger
    the connection names, and the SQLite file sees nothing."""
    monkeypatch.setenv("AIRFLOW_CONN_DPPIPELINE_LEDGER", postgres_ledger)
    before = ledger_rows()
    dag = dagbag.get_dag("dp_terminal_stats_spark")
    run = dag.test(
        logical_date=day("2026-01-01"), run_conf={"release_root": str(tmp_path / "releases")}
    )
    assert set(states(run).values()) == {"success"}, states(run)
    history = subprocess.run(
        [str(MAIN_PYTHON), "-m", "dppipeline", "budget", "history", "--ledger", postgres_ledger],
        capture_output=True, text=True, check=True, cwd=PROJECT,
    )  # fmt: skip
    (row,) = [line for line in history.stdout.splitlines() if " committed " in line]
    assert "2026-01-01..2026-01-01" in row
    manifest = json.loads((tmp_path / "releases" / "2026-01-01" / "manifest.json").read_text())
    assert manifest["ledger"] == postgres_ledger  # no password in this URL to mask
    assert manifest["run_id"] in row
    assert ledger_rows() == before
