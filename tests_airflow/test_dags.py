"""The DAGs on a real Airflow: DagBag, task graph, and dag.test() runs with real Spark/Beam."""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
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


CONSOLE_LINE = re.compile(r"^\S+ \[(\w+)\s*\] (.*) \[([\w.]+)\] loc=\S+$")


class TaskLog:
    """What dag.test()'s tasks logged, as (level, logger, message): the lines Airflow's console
    renderer wrote for structlog loggers (the providers' hooks) and the standard-library records
    (dppipeline_common), which Airflow's root handler sends to the task log. A line a job wrote
    straight to the terminal has no logger and never counts."""

    def __init__(self, capfd, caplog) -> None:
        self.capfd, self.caplog = capfd, caplog

    def records(self) -> list[tuple[str, str, str]]:
        """(level, logger, message) of every record logged since the last call."""
        found = [
            (match[1], match[3], match[2])
            for match in map(CONSOLE_LINE.match, self.capfd.readouterr().out.splitlines())
            if match
        ]
        found += [(r.levelname.lower(), r.name, r.getMessage()) for r in self.caplog.records]
        self.caplog.clear()
        self._seen = getattr(self, "_seen", []) + found
        return found

    def lines(self, logger: str, message: str) -> list[tuple[str, str]]:
        """(level, message) of the records whose logger name ends with `logger` and whose
        message matches the regular expression `message`."""
        self.records()
        return [
            (level, text)
            for level, name, text in self._seen
            if name.endswith(logger) and re.search(message, text)
        ]


@pytest.fixture
def task_log(capfd, caplog) -> TaskLog:
    return TaskLog(capfd, caplog)


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
    # a refusal (exit 3) is final by AirflowFailException; a held budget (75) is retried
    assert dag.get_task("check_budget").retries == dag.default_args["retries"]


def test_spark_dag_releases_a_day_and_a_rerun_changes_nothing(dagbag, transactions, task_log):
    dag = dagbag.get_dag("dp_terminal_stats_spark")
    run = dag.test(logical_date=day("2026-01-02"))
    assert states(run) == dict.fromkeys(states(run), "success"), states(run)
    # Every line of the job reaches the task log, through spark-submit's output and the
    # checks' streamed stderr: the job's progress, not only its last line.
    spark = "SparkSubmitHook"
    assert task_log.lines(spark, r"\[spark\] reading 1 daily partitions")
    assert task_log.lines(spark, r"\[spark\] read [\d,]+ rows; rejected [\d,]+")
    assert task_log.lines(spark, r"\[ledger\] reserved epsilon=")
    assert task_log.lines(spark, r"\[ledger\] committed run \S+")
    assert task_log.lines(spark, r"release written to \S+2026-01-02")
    # the budget check and the release check, streamed line by line by dppipeline_common
    assert task_log.lines("dppipeline_common", r"budget available: epsilon=1")
    assert task_log.lines("dppipeline_common", r"2026-01-02: valid release of run")
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


def reschedules(run, task_id: str) -> list:
    """The sensor's reschedule requests, as Airflow recorded them."""
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session
    from sqlalchemy import select

    (ti,) = [ti for ti in run.get_task_instances() if ti.task_id == task_id]
    with create_session() as session:
        rows = session.scalars(select(TaskReschedule).where(TaskReschedule.ti_id == ti.id))
        return sorted(rows, key=lambda row: row.id)


@pytest.mark.parametrize(
    ("run_conf", "timeout", "poke"),
    [(None, 4, 1), ({"sensor_timeout_seconds": 3, "sensor_poke_seconds": 5}, 3, 5)],
    ids=["settings", "params"],
)
def test_missing_input_fails_at_the_sensor(dagbag, transactions, task_log, run_conf, timeout, poke):
    """The sensor times out with the timeout and poke interval of the run: the Variable's, or
    the params a triggered run gives (which are not known when the DAG file is parsed)."""
    dag = dagbag.get_dag("dp_terminal_stats_spark")
    run = dag.test(logical_date=day("2026-03-01"), run_conf=run_conf)
    found = states(run)
    assert found["wait_for_input"] == "failed"
    assert found["check_budget"] != "success" and found["submit_spark_job"] != "success"
    assert not (DATA / "releases" / "2026-03-01").exists()
    # What the sensor did: each poke logged the timeout and poke interval it ran with (those
    # its own timeout check and reschedule use); the last poke found the timeout passed and
    # failed instead of asking for another reschedule.
    pokes = task_log.lines(
        "dppipeline_common", r"waiting for input partition \S+date=2026-03-01 \(poke every"
    )
    assert {text.rsplit("(", 1)[1] for _, text in pokes} == {
        f"poke every {poke} s, timeout {timeout} s)"
    }
    asked = reschedules(run, "wait_for_input")
    assert len(pokes) == len(asked) + 1 and len(asked) <= timeout // poke + 1
    # Each reschedule it asked Airflow for is `poke` seconds after the poke, which happened
    # just before the end of the try that Airflow recorded (within a second: bookkeeping).
    for row in asked:
        after_end = (row.reschedule_date - row.end_date).total_seconds()
        assert poke - 1 < after_end <= poke


def capped_config(folder: Path, scope: str = "capped") -> Path:
    """The job spec with its own ledger scope capped at the job's epsilon: one release uses
    it up."""
    text = (PROJECT / "jobs" / "configs" / "terminal_stats.yaml").read_text()
    cap = yaml.safe_load(text)["budget"]["epsilon"]
    text = text.replace("budget:\n", f"budget:\n  scope: {scope}\n  cap_epsilon: {cap}\n", 1)
    text = text.replace("../../schemas/", f"{PROJECT}/schemas/")
    path = folder / f"{scope}.yaml"
    path.write_text(text)
    return path


def test_no_budget_left_fails_at_the_check(dagbag, transactions, tmp_path, task_log):
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
    # the CLI's one-line refusal, streamed from its stderr into the task log at error level
    (refusal,) = task_log.lines("dppipeline_common", "budget")
    assert refusal[0] == "error" and "scope 'capped' exhausted" in refusal[1]
    assert not (DATA / "releases" / "2026-01-03").exists()


HOLDER = """
import datetime as dt, sys
from dppipeline.ledger import BudgetPolicy, Ledger, ReleaseKey
day = dt.date(2026, 1, 5)
cap = float(sys.argv[2])  # the job's epsilon, its scope's cap (capped_config)
Ledger(sys.argv[1]).reserve(
    ReleaseKey("held", "holder", "holder", day, day), run_id="holder", job="holder", epsilon=cap,
    delta=0.0, output="/nowhere", policy=BudgetPolicy(cap_epsilon=cap))
print("reserved", flush=True)
sys.stdin.read()
"""


def test_a_budget_held_by_a_live_run_is_retried_not_final(airflow_db, tmp_path):
    """Issue 32 case 4: a live reservation that has read nothing holds the whole cap. The
    check exits 75, a retryable failure (the task's retries try again), not 3, which fails
    the run for good; once the holder is gone, its reservation is settled and the budget is
    there."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    module = common()
    data = tmp_path / "tx"  # data of its own: no other scope charged these files
    subprocess.run(
        [str(MAIN_PYTHON), "-m", "dppipeline", "generate", "--output", str(data), "--days", "1",
         "--start-date", "2026-01-05", "--seed", "7", "--customers", "50", "--terminals", "20",
         "--tx-per-day", "200"],
        check=True, capture_output=True, cwd=PROJECT,
    )  # fmt: skip
    settings = module.run_settings(
        {"config": str(capped_config(tmp_path, "held")), "input_root": str(data)}
    )
    config = yaml.safe_load(capped_config(tmp_path, "held").read_text())
    cap = float(config["budget"]["cap_epsilon"])
    holder = subprocess.Popen(
        [str(MAIN_PYTHON), "-c", HOLDER, str(LEDGER), str(cap)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=PROJECT,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "reserved"
        with pytest.raises(AirflowException) as held:
            module.check_budget(settings, "2026-01-05")
        assert not isinstance(held.value, AirflowFailException)
        assert "held by run holder until" in str(held.value)
    finally:
        holder.kill()
        holder.wait()
    assert "budget available" in module.check_budget(settings, "2026-01-05")
    assert ("holder", "2026-01-05", "aborted", cap) in ledger_rows()


def test_beam_dag_releases_a_day_on_the_direct_runner(dagbag, transactions, task_log):
    dag = dagbag.get_dag("dp_terminal_stats_beam")
    run = dag.test(
        logical_date=day("2026-01-03"),
        run_conf={"release_root": str(DATA / "beam_releases")},
    )
    assert set(states(run).values()) == {"success"}, states(run)
    release = DATA / "beam_releases" / "2026-01-03"
    manifest = (release / "manifest.json").read_text()
    assert '"engine": "beam"' in manifest and (release / "_PUBLISHED").is_file()
    # the pipeline's progress lines, streamed by the Beam operator (stderr lines as warnings)
    assert task_log.lines("BeamHook", r"\[beam\] read [\d,]+ rows; rejected [\d,]+")
    assert task_log.lines("BeamHook", r"\[ledger\] committed run \S+")
    assert task_log.lines("BeamHook", r"release written to \S+2026-01-03")


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


def parse_dags() -> BundleDagBag:
    """A fresh parse of the folder, as the DAG processor does it (the shared module too)."""
    sys.modules.pop("dppipeline_common", None)
    folder = PROJECT / "airflow_dags"
    return BundleDagBag(dag_folder=str(folder), bundle_path=folder)


def test_parsing_the_dags_reads_no_variable_and_no_connection(airflow_db, monkeypatch):
    """Airflow's best practice: no Variable or Connection lookup at the top level of a DAG file.
    Every lookup is counted and refused while the files are parsed; unreadable values would
    fail a lookup that slipped past the guard."""
    from airflow.sdk import Connection, Variable

    lookups: list[str] = []

    def refuse(kind: str):
        def lookup(*args, **kwargs):
            lookups.append(f"{kind} {args[:1]}")
            raise AssertionError(f"{kind} lookup while parsing a DAG file: {args[:1]}")

        return classmethod(lambda cls, *args, **kwargs: lookup(*args, **kwargs))

    monkeypatch.setenv("AIRFLOW_CONN_DPPIPELINE_LEDGER", "{this is not a connection")
    monkeypatch.setenv("AIRFLOW_VAR_DPPIPELINE_TERMINAL_STATS", "{this is not JSON")
    with monkeypatch.context() as guard:
        guard.setattr(Variable, "get", refuse("Variable"))
        guard.setattr(Connection, "get", refuse("Connection"))
        bag = parse_dags()
        assert bag.import_errors == {}
        assert lookups == []
        # the guard is live: what the tasks do when they run is refused here
        with pytest.raises(AssertionError, match="Variable lookup"):
            common().run_settings({})
    assert set(DAG_IDS) <= set(bag.dag_ids)
    dag = bag.get_dag("dp_terminal_stats_spark")
    assert dag.get_task("check_budget").retries == 0 and dag.default_args["retries"] == 0


def test_the_dag_shape_comes_from_the_environment_and_run_settings_from_the_variable(
    airflow_db, monkeypatch
):
    module = common()
    monkeypatch.setenv(module.SHAPE_ENVIRONMENT, json.dumps({"retries": 1, "schedule": "@hourly"}))
    dag = parse_dags().get_dag("dp_terminal_stats_beam")
    assert dag.default_args["retries"] == 1 and dag.schedule == "@hourly"
    monkeypatch.setenv(module.SHAPE_ENVIRONMENT, json.dumps({"input_root": "/x"}))
    with pytest.raises(ValueError, match=r"unknown keys \['input_root'\].*in the Variable"):
        module.load_shape()

    settings = {"input_root": "/var/tx", "sensor_poke_seconds": 7, "spark_conf": {"a": "b"}}
    monkeypatch.setenv("AIRFLOW_VAR_DPPIPELINE_TERMINAL_STATS", json.dumps(settings))
    found = module.run_settings({"input_root": "/run/tx", "release_root": None})
    assert found.input_root == "/run/tx"  # a run's param over the Variable
    assert found.sensor_poke_seconds == 7 and found.spark_conf == {"a": "b"}  # the Variable
    assert found.release_root == module.RunSettings().release_root  # None: not overridden
    monkeypatch.setenv("AIRFLOW_VAR_DPPIPELINE_TERMINAL_STATS", json.dumps({"retries": 0}))
    with pytest.raises(ValueError, match=r"\['retries'\] shape the DAG.*DPPIPELINE_DAG_SETTINGS"):
        module.run_settings({})
    monkeypatch.setenv("AIRFLOW_VAR_DPPIPELINE_TERMINAL_STATS", json.dumps({"inputroot": "/x"}))
    with pytest.raises(ValueError, match=r"unknown keys \['inputroot'\]"):
        module.run_settings({})


def test_spark_submit_command_carries_the_settings_archives_and_conf(airflow_db, monkeypatch):
    """The README's cluster recipe through the DAG: the Variable's `spark_archives` and
    `spark_conf` become spark-submit's --archives and --conf when the task renders its fields,
    next to the run's paths (a param) and the ledger connection."""
    settings = {
        "input_root": "/data/tx",
        "release_root": "/data/releases",
        "spark_archives": "build/executor-env.tar.gz#env",
        "spark_conf": {
            "spark.pyspark.python": "./env/bin/python",
            "spark.pyspark.driver.python": "/srv/dp/.venv/bin/python",
            "spark.executor.extraJavaOptions": "-XX:+UseParallelGC",
        },
    }
    monkeypatch.setenv("AIRFLOW_VAR_DPPIPELINE_TERMINAL_STATS", json.dumps(settings))
    dag = parse_dags().get_dag("dp_terminal_stats_spark")
    task = dag.get_task("submit_spark_job")
    params = {**dag.params.dump(), "release_root": "/run/releases"}
    task.render_template_fields({"params": params, "ds": "2026-01-02", "ds_nodash": "20260102"})

    command = task._get_hook()._build_spark_submit_command(task.application)
    assert command[command.index("--archives") + 1] == "build/executor-env.tar.gz#env"
    confs = [command[i + 1] for i, arg in enumerate(command) if arg == "--conf"]
    assert confs == [f"{key}={value}" for key, value in settings["spark_conf"].items()]
    assert command[command.index("--master") + 1] == "local[2]"  # the spark_default connection
    tail = command[command.index(f"{PROJECT}/jobs/spark_terminal_stats.py") + 1 :]
    assert tail[tail.index("--input") + 1] == "/data/tx"
    assert tail[tail.index("--output") + 1] == "/run/releases/2026-01-02"
    assert task.env_vars["DPPIPELINE_LEDGER"] == str(LEDGER)
    assert task.env_vars["PATH"].startswith(f"{PROJECT}/.venv/bin:")


def test_every_line_the_cli_writes_reaches_the_task_log(
    airflow_db, transactions, task_log, monkeypatch, tmp_path
):
    """The checks' subprocess (here a whole local run, which says more): each line of the
    CLI's stderr is a record of the task's logger, in order, not only the last one."""
    module = common()
    settings = module.RunSettings(
        input_root=str(transactions), release_root=str(tmp_path), python=str(MAIN_PYTHON)
    )
    ledger = tmp_path / "ledger.sqlite"
    monkeypatch.setenv(
        "AIRFLOW_CONN_DPPIPELINE_LEDGER", json.dumps({"conn_type": "sqlite", "host": str(ledger)})
    )
    done = module.dppipeline(
        settings, "run", *module.job_args(settings, "2026-01-01"), "--engine", "local"
    )
    assert done.returncode == 0, done.last_error
    lines = [text for _, text in task_log.lines("dppipeline_common", ".")]
    read = [
        i
        for i, text in enumerate(lines)
        if re.match(r"\[local\] read [\d,]+ rows; rejected [\d,]+$", text)
    ]
    committed = [i for i, text in enumerate(lines) if text.startswith("[ledger] committed run ")]
    written = [i for i, text in enumerate(lines) if text.startswith("[local] release written to")]
    assert len(read) == len(committed) == len(written) == 1
    assert read[0] < committed[0] < written[0]
    assert done.last_error == lines[written[0]]  # the last stderr line, also logged


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
        [str(MAIN_PYTHON), str(PROJECT / "tests" / "support" / "postgres_server.py"), "start"],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    server = json.loads(started.stdout)
    yield server["url"]
    subprocess.run(
        [str(MAIN_PYTHON), str(PROJECT / "tests" / "support" / "postgres_server.py"), "stop",
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


# -------------------------------------------------------------------------------------------------
# Roots on an object store: the sensor and the marker through pyarrow.fs


def test_the_beam_dag_runs_a_night_from_s3_to_s3(
    dagbag, transactions, monkeypatch, task_log, tmp_path
):
    """The Beam DAG with `input_root` and `release_root` on S3 (moto's server on 127.0.0.1,
    found through AWS_ENDPOINT_URL as on a worker with credentials in its environment): the
    sensor, the budget check, the pipeline, `check-release` and the marker all reach the
    store; the release is published by its pointer. Its own ledger: the shared one holds the
    same days charged under the local folder's scope, which refuses this copy."""
    ledger = tmp_path / "ledger.sqlite"
    monkeypatch.setenv(
        "AIRFLOW_CONN_DPPIPELINE_LEDGER", json.dumps({"conn_type": "sqlite", "host": str(ledger)})
    )
    sys.path.insert(0, str(PROJECT / "tests"))
    try:
        from support.s3_server import start
    finally:
        sys.path.pop(0)
    server = start(python=str(MAIN_PYTHON))
    try:
        for name, value in server.environment.items():
            monkeypatch.setenv(name, value)
        bucket = server.new_bucket("dag-nightly")
        server.upload(transactions, f"{bucket}/tx")
        run = dagbag.get_dag("dp_terminal_stats_beam").test(
            logical_date=day("2026-01-03"),
            run_conf={"input_root": f"{bucket}/tx", "release_root": f"{bucket}/releases"},
        )
        assert set(states(run).values()) == {"success"}, states(run)
        release = f"{bucket}/releases/2026-01-03"
        run_id = json.loads(server.read(f"{release}/RELEASE.json"))["run_id"]
        assert json.loads(server.read(f"{release}/_PUBLISHED")) == {"run_id": run_id}
        manifest = json.loads(server.read(f"{release}/_runs/{run_id}/manifest.json"))
        assert manifest["engine"] == "beam"
        assert task_log.lines("dppipeline_common", rf"{release}: valid release of run {run_id}")
    finally:
        server.stop()


def test_the_sensor_and_the_marker_work_on_s3_roots(airflow_db, monkeypatch, tmp_path):
    """With `input_root` and `release_root` on S3 (a real S3-compatible server, moto, on
    127.0.0.1): the sensor waits until the day's partition has a non-empty file, the release
    the CLI publishes there passes `check-release`, and `_PUBLISHED` names the run its
    `RELEASE.json` pointer names, written once."""
    sys.path.insert(0, str(PROJECT / "tests"))
    try:
        from support.s3_server import start
    finally:
        sys.path.pop(0)
    server = start(python=str(MAIN_PYTHON))
    try:
        for name, value in server.environment.items():
            monkeypatch.setenv(name, value)
        bucket = server.new_bucket("nightly")
        shared = common()
        settings = shared.run_settings({
            "input_root": f"{bucket}/tx", "release_root": f"{bucket}/releases",
        })  # fmt: skip
        assert shared.input_partition(settings, "2026-01-02") == f"{bucket}/tx/date=2026-01-02"
        assert not shared.input_is_ready(settings, "2026-01-02")
        generated = tmp_path / "tx"
        subprocess.run(
            [str(MAIN_PYTHON), "-m", "dppipeline", "generate", "--output", str(generated),
             "--customers", "50", "--terminals", "10", "--days", "2", "--tx-per-day", "100",
             "--start-date", "2026-01-01"],
            check=True, capture_output=True,
        )  # fmt: skip
        server.upload(generated / "date=2026-01-01", f"{bucket}/tx/date=2026-01-01")
        assert not shared.input_is_ready(settings, "2026-01-02")  # another day only
        server.upload(generated / "date=2026-01-02", f"{bucket}/tx/date=2026-01-02")
        assert shared.input_is_ready(settings, "2026-01-02")

        release = shared.release_dir(settings, "2026-01-02")
        done = subprocess.run(
            [str(MAIN_PYTHON), "-m", "dppipeline", "run", "--input", f"{bucket}/tx",
             "--output", release, "--metrics", "count", "--min-value", "0",
             "--max-value", "100", "--public-partitions", "0..9", "--no-ledger",
             "--max-partitions-contributed", "1", "--max-contributions-per-partition", "1"],
            check=False, capture_output=True, text=True,
            env={**os.environ, "DPPIPELINE_STATE_DIR": str(tmp_path / "state")},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        run_id = json.loads(server.read(f"{release}/RELEASE.json"))["run_id"]
        assert shared.mark_published(settings, "2026-01-02") == release
        marker = f"{release}/_PUBLISHED"
        assert json.loads(server.read(marker)) == {"run_id": run_id}
        assert shared.mark_published(settings, "2026-01-02") == release  # unchanged: kept
        assert "_PUBLISHED" in server.keys(release)
    finally:
        server.stop()


# -------------------------------------------------------------------------------------------------
# Neighbouring datasets through an Airflow task (tests/dp/exact/test_neighbours.py: every other
# surface)

_RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{8}")
_TIMING = re.compile(r"\s*\b\d+\.\d+s\b")
_ALLOWED = re.compile(r"\bread [\d,]+ rows; rejected [\d,]+")  # the operator's raw-input line
_PRIVATE = re.compile(r"\b(q_private): released [\d,]+ partitions")
_VOLATILE = re.compile(
    r"^(id|run_id|pid|process|host|host_id|note|release_key|input_fingerprint|fingerprint|.*_at)$"
)


def _neighbours(tmp: Path) -> tuple[Path, Path]:
    """A base input and the same input plus one adversarial customer (every kind of
    adversary of tests/dp/exact/test_neighbours.py), each under its own root with its job spec."""
    script = (
        "import sys; from pathlib import Path; sys.path[:0] = ['tests', 'tests/dp/exact']\n"
        "import test_neighbours as t\n"
        f"root = Path({str(tmp)!r})\n"
        "base = t._base(root / 'without', 'parquet')\n"
        "t.with_adversary(base, root / 'with' / 'input', 'all', 'parquet')\n"
        "for side in ('without', 'with'):\n"
        "    run = t.Run(root / side, 'parquet')\n"
        "    (run.root / 'job.yaml').write_text(run.job())\n"
    )
    subprocess.run([str(MAIN_PYTHON), "-c", script], check=True, capture_output=True, cwd=PROJECT)
    return tmp / "without", tmp / "with"


def _normalised(text: str, root: Path) -> str:
    text = text.replace(str(root), "<root>")
    return _PRIVATE.sub(r"\1: released <n>", _TIMING.sub(" <t>", _RUN_ID.sub("<run>", text)))


def _airflow_trace(dag, root: Path, task_log: TaskLog, monkeypatch) -> dict:
    """What one DAG run left: task states, the job's lines in the task log (the job's output
    streamed by the Beam operator, the checks' by dppipeline_common), the release's files and
    manifest, and its ledger's rows (the run's own ledger: the connection names it)."""
    ledger = root / "ledger.sqlite"
    connection = json.dumps({"conn_type": "sqlite", "host": str(ledger)})
    monkeypatch.setenv("AIRFLOW_CONN_DPPIPELINE_LEDGER", connection)
    run = dag.test(
        logical_date=day("2026-01-01"),
        run_conf={
            "input_root": str(root / "input"),
            "release_root": str(root / "releases"),
            "config": str(root / "job.yaml"),
        },
    )
    lines = [
        (level, name.rsplit(".", 1)[-1], _normalised(text, root))
        for level, name, text in task_log.records()
        if name.endswith(("BeamHook", "dppipeline_common")) and not _ALLOWED.search(text)
    ]
    release = root / "releases" / "2026-01-01"
    manifest = json.loads((release / "manifest.json").read_text()) if release.exists() else {}
    for name in ("run_id", "created_at", "released_partitions"):
        manifest.pop(name, None)
    manifest.get("queries", {}).get("q_private", {}).pop("released_partitions", None)
    return {
        "states": states(run),
        "log": lines,
        "files": sorted(str(p.relative_to(root)) for p in root.joinpath("releases").rglob("*")),
        "manifest": _normalised(json.dumps(manifest, sort_keys=True), root),
        "ledger": sorted(_normalised(row, root) for row in _ledger_dump(ledger)),
    }


def _ledger_dump(path: Path) -> list[str]:
    if not path.exists():
        return []
    rows = []
    with sqlite3.connect(path) as db:
        db.row_factory = sqlite3.Row
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'"):
            if table == "sqlite_sequence":
                continue
            for row in db.execute(f'SELECT * FROM "{table}"'):
                kept = {k: row[k] for k in row.keys() if not _VOLATILE.match(k)}  # noqa: SIM118
                rows.append(f"{table}: {json.dumps(kept, sort_keys=True, default=str)}")
    return rows


def test_an_airflow_task_does_not_depend_on_one_customer(dagbag, tmp_path, task_log, monkeypatch):
    """The Beam DAG releases one day of a base input and of the same input plus one
    adversarial customer (a NaN amount, 500 terminals, a terminal of their own, the only rows
    a filter keeps): task states, the job's lines in the task log, the release's files and
    manifest and the ledger rows it adds are the same."""
    without, with_ = _neighbours(tmp_path)
    dag = dagbag.get_dag("dp_terminal_stats_beam")
    first = _airflow_trace(dag, without, task_log, monkeypatch)
    assert set(first["states"].values()) == {"success"}, first["states"]
    assert any("committed run" in text for _, _, text in first["log"])
    assert first["ledger"] and first["files"]
    second = _airflow_trace(dag, with_, task_log, monkeypatch)
    assert {k: v for k, v in second.items() if v != first[k]} == {}
