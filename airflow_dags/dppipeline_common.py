"""Settings and task bodies shared by the dppipeline DAGs (not a DAG file: see .airflowignore).

Everything here is light to import: the DAG processor parses DAG files often, so the work of a
task (the dppipeline CLI, Spark, Beam) runs in the project's own virtualenv as a subprocess and
nothing heavy is imported at parse time. Airflow itself lives in a virtualenv of its own.

Parsing a DAG file reads no Variable, no Connection and no database, as Airflow's best practices
ask. Settings come in two kinds:

- The DAG's shape (`DagShape`: schedule, start date, catchup, retries, ...) cannot change per
  run, so it is read when the file is parsed, from the environment variable
  `DPPIPELINE_DAG_SETTINGS` (JSON, any subset of the keys; the same on the DAG processor and
  every worker).
- What a run does (`RunSettings`: paths, the job spec, the sensor's timeout and poke interval,
  Spark `--archives`/`--conf`, the Beam runner) is read when a task runs: the JSON Airflow
  Variable `dppipeline_terminal_stats` over the defaults, then the run's params over that.
  Task bodies call `run_settings(params)`; operator fields reach it through the template macro
  `dppipeline_settings(params)`:

    airflow variables set dppipeline_terminal_stats \\
        '{"input_root": "/data/tx", "release_root": "/data/releases"}'

Paths of a run come from its data interval (`ds`), never from the current time: the input is
the day's partition `<input_root>/date=<ds>` (CSV: `<input_root>/<ds>.csv`) and the release is
`<release_root>/<ds>`. Both roots may be local paths or URIs (`s3://`, `gs://`, `hdfs://`,
`abfs://`): the sensor and the marker go through `pyarrow.fs`, as the jobs do, with the
credentials of the worker's environment.

The privacy-budget ledger is the Airflow connection `dppipeline_ledger`, read inside the tasks
when they run (never when the DAG file is parsed), so every worker on every host uses the one
ledger it names; without that connection, the demo's SQLite file `<project>/state/ledger.sqlite`
(one host only). A PostgreSQL connection (`postgresql://user:password@host:5432/db`, or the
fields of a `postgres` connection) is the ledger for several workers; a `sqlite` connection's
host is the file; `{"url": "..."}` in the extra gives any URL `dppipeline --ledger` takes. The
URL reaches the jobs through the environment (`DPPIPELINE_LEDGER`) where the operator allows it
(the checks, Spark) and as `--ledger` for Beam; Airflow masks the connection's password in logs.

Every line the jobs write reaches the task log: the checks stream the CLI's output line by line
here, the Spark and Beam operators stream their subprocess themselves.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from airflow.sdk import BaseSensorOperator

SETTINGS_VARIABLE = "dppipeline_terminal_stats"
SHAPE_ENVIRONMENT = "DPPIPELINE_DAG_SETTINGS"
PROJECT = Path(os.environ.get("DPPIPELINE_HOME", Path(__file__).resolve().parent.parent))
PUBLISHED_MARKER = "_PUBLISHED"
BUDGET_REFUSED = 3  # dppipeline's exit code when the ledger refuses the spend: final
BUDGET_HELD = 75  # live reservations of other runs hold the budget: retry later
LEDGER_CONNECTION = "dppipeline_ledger"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DagShape:
    """What shapes the DAG itself, read when the file is parsed (from the environment)."""

    schedule: str = "@daily"
    start_date: str = "2026-01-01"
    catchup: bool = False
    max_active_runs: int = 1
    owner: str = "dp-platform"
    retries: int = 2
    retry_delay_minutes: int = 5


@dataclass(frozen=True)
class RunSettings:
    """What a run does, read when its tasks run: the Variable, then the run's params."""

    project: str = str(PROJECT)  # checkout with jobs/ and the .venv that runs them
    python: str = str(PROJECT / ".venv" / "bin" / "python")
    config: str = str(PROJECT / "jobs" / "configs" / "terminal_stats.yaml")
    input_root: str = str(PROJECT / "data" / "transactions")
    input_format: str = "parquet"
    release_root: str = str(PROJECT / "data" / "releases")
    sensor_timeout_seconds: int = 6 * 3600
    sensor_poke_seconds: int = 300
    spark_archives: str | None = None  # spark-submit --archives (the packed executor env)
    spark_conf: dict[str, str] = field(default_factory=dict)  # spark-submit --conf entries
    beam_runner: str = "DirectRunner"
    beam_options: dict[str, Any] = field(default_factory=dict)  # extra Beam pipeline options


# The settings a triggered run may override, with the JSON schema of their params.
RUN_PARAMS: dict[str, dict[str, Any]] = {
    "config": {"type": ["null", "string"]},
    "input_root": {"type": ["null", "string"]},
    "input_format": {"type": ["null", "string"], "enum": [None, "parquet", "csv"]},
    "release_root": {"type": ["null", "string"]},
    "sensor_timeout_seconds": {"type": ["null", "integer"], "minimum": 0},
    "sensor_poke_seconds": {"type": ["null", "integer"], "minimum": 1},
}


def _names(kind: type) -> set[str]:
    return {f.name for f in fields(kind)}


def load_shape(environ: Mapping[str, str] = os.environ) -> DagShape:
    """The DAG's shape: defaults, overridden by `$DPPIPELINE_DAG_SETTINGS` (JSON). Reads no
    Variable and no database: this runs every time the DAG processor parses the file."""
    overrides = json.loads(environ.get(SHAPE_ENVIRONMENT) or "{}")
    unknown = sorted(set(overrides) - _names(DagShape))
    if unknown:
        raise ValueError(
            f"${SHAPE_ENVIRONMENT}: unknown keys {unknown}; known: {sorted(_names(DagShape))} "
            f"(what a run does goes in the Variable {SETTINGS_VARIABLE})"
        )
    return replace(DagShape(), **overrides)


def run_settings(params: Mapping[str, Any] | None = None) -> RunSettings:
    """This run's settings: defaults, the Variable's JSON keys, then the run's params (those not
    None). Called only while a task runs (a task body or a template macro)."""
    from airflow.sdk import Variable

    overrides = Variable.get(SETTINGS_VARIABLE, default=None, deserialize_json=True) or {}
    if "ledger" in overrides:
        raise ValueError(
            f"Variable {SETTINGS_VARIABLE}: 'ledger' is no longer a setting; set the Airflow "
            f"connection {LEDGER_CONNECTION} instead (read by the tasks on every worker)"
        )
    shape = sorted(set(overrides) & _names(DagShape))
    if shape:
        raise ValueError(
            f"Variable {SETTINGS_VARIABLE}: {shape} shape the DAG and are read when its file is "
            f"parsed; set them in ${SHAPE_ENVIRONMENT} on the DAG processor and the workers"
        )
    unknown = sorted(set(overrides) - _names(RunSettings))
    if unknown:
        raise ValueError(
            f"Variable {SETTINGS_VARIABLE}: unknown keys {unknown}; "
            f"known: {sorted(_names(RunSettings))}"
        )
    per_run = {k: v for k, v in (params or {}).items() if k in RUN_PARAMS and v is not None}
    return replace(RunSettings(), **{**overrides, **per_run})


def default_args(shape: DagShape) -> dict[str, Any]:
    import datetime as dt

    return {
        "owner": shape.owner,
        "retries": shape.retries,
        "retry_delay": dt.timedelta(minutes=shape.retry_delay_minutes),
    }


# -------------------------------------------------------------------------------------------------
# Paths of one data interval


def _join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}" if "://" in root else str(Path(root) / name)


def input_partition(settings: RunSettings, ds: str) -> str:
    name = f"{ds}.csv" if settings.input_format == "csv" else f"date={ds}"
    return _join(settings.input_root, name)


def release_dir(settings: Any, ds: str) -> str:
    return _join(settings.release_root, ds)


def _filesystem(where: str) -> tuple[Any, str]:
    """pyarrow's file system for a local path or a URI, and the path within it."""
    import pyarrow.fs as pafs

    if "://" not in where:
        return pafs.LocalFileSystem(), str(Path(where).absolute())
    return pafs.FileSystem.from_uri(where)


def _read_text(where: str) -> str:
    fs, path = _filesystem(where)
    with fs.open_input_stream(path) as stream:
        return bytes(stream.read()).decode()


def job_args(settings: Any, ds: str) -> list[str]:
    """`dppipeline run` flags for the day `ds` (the same for Spark, Beam and the checks), from
    `RunSettings` or from `TEMPLATED` (templates rendered when the task runs); the ledger comes
    from the connection (`ledger_url`), not from here."""
    return [
        "--config", settings.config,
        "--input", settings.input_root,
        "--format", settings.input_format,
        "--start-date", ds,
        "--end-date", ds,
        "--output", str(release_dir(settings, ds)),
    ]  # fmt: skip


class _Templated:
    """Each run setting as a Jinja template of the macro `dppipeline_settings(params)`."""

    def __getattr__(self, name: str) -> str:
        if name not in _names(RunSettings):
            raise AttributeError(name)
        return f"{{{{ dppipeline_settings(params).{name} }}}}"


TEMPLATED: Any = _Templated()


# -------------------------------------------------------------------------------------------------
# The ledger: an Airflow connection, read when a task runs


def demo_ledger() -> str:
    """Where `make demo` and a checkout's `dppipeline run` keep their ledger (one host only)."""
    return str(PROJECT / "state" / "ledger.sqlite")


def connection_url(conn: Any) -> str:
    """A `dppipeline --ledger` URL from an Airflow connection: `extra.url` as it is; a
    `postgres` connection from its fields (extra keys such as `sslmode` as URL parameters); a
    `sqlite` connection's host as the file."""
    extra = conn.extra_dejson if conn.extra else {}
    if extra.get("url"):
        return str(extra["url"])
    kind = (conn.conn_type or "").lower()
    if kind in ("postgres", "postgresql"):
        user = quote(conn.login or "", safe="")
        secret = f":{quote(conn.password, safe='')}" if conn.password else ""
        at = f"{user}{secret}@" if user else ""
        port = f":{conn.port}" if conn.port else ""
        query = f"?{urlencode(extra)}" if extra else ""
        return f"postgresql://{at}{conn.host or 'localhost'}{port}/{conn.schema or ''}{query}"
    if kind == "sqlite" and conn.host:
        return str(conn.host)  # a file path: what `--ledger PATH` takes
    raise ValueError(
        f"connection {LEDGER_CONNECTION}: type {conn.conn_type!r} is not a ledger; use a "
        'postgres or sqlite connection, or put the URL in its extra as {"url": "..."}'
    )


def ledger_url() -> str:
    """The ledger of this task: connection `dppipeline_ledger`, else the demo's SQLite file.
    Called only while a task runs (a template macro or a task body)."""
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = Connection.get(LEDGER_CONNECTION)
    except AirflowNotFoundException:
        return demo_ledger()
    return connection_url(conn)


# -------------------------------------------------------------------------------------------------
# Task bodies


def input_is_ready(settings: RunSettings, ds: str) -> bool:
    """The day's partition exists and holds at least one non-empty data file."""
    import pyarrow.fs as pafs

    fs, path = _filesystem(input_partition(settings, ds))
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return bool(info.size)
    if info.type != pafs.FileType.Directory:
        return False
    return any(
        entry.type == pafs.FileType.File
        and entry.size
        and not entry.base_name.startswith((".", "_"))
        for entry in fs.get_file_info(pafs.FileSelector(path))
    )


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    last_error: str  # the last line the CLI wrote on stderr (its one-line error, if it failed)


def _level(line: str) -> int:
    """The CLI's own levels (`error: ...`, `warning: ...`) kept in the task log."""
    if line.startswith("error: ") or (line.startswith("dppipeline") and ": error: " in line):
        return logging.ERROR
    return logging.WARNING if line.startswith("warning: ") else logging.INFO


def _stream(pipe: Any, tail: deque[str]) -> None:
    for raw in pipe:
        line = raw.rstrip("\n")
        if line.strip():
            log.log(_level(line), "%s", line)
            tail.append(line)


def dppipeline(settings: RunSettings, *args: str) -> CliResult:
    """Runs the dppipeline CLI of the project's virtualenv with this task's ledger (in the
    environment, so no password is on a command line). Every line it logs on stderr goes to the
    task log as it comes; its stdout (the result) is returned; a failure is returned, not
    raised."""
    tail: deque[str] = deque(maxlen=1)
    with subprocess.Popen(
        [settings.python, "-m", "dppipeline", *args],
        cwd=settings.project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
        env={**os.environ, "DPPIPELINE_LEDGER": ledger_url()},
    ) as process:
        reader = threading.Thread(target=_stream, args=(process.stderr, tail), daemon=True)
        reader.start()
        stdout = process.stdout.read() if process.stdout else ""
        returncode = process.wait()
        reader.join()
    for line in stdout.splitlines():
        if line.strip():
            log.info("%s", line)
    return CliResult(returncode, stdout, tail[0] if tail else "")


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def check_budget(settings: RunSettings, ds: str) -> str:
    """Fails fast, without retries, when the ledger refuses the release (exit 3: more attempts
    cannot create budget); passes when the budget is available or the day is already released
    (a rerun spends nothing). Exit 75 (live reservations of other runs hold the budget; they
    may still give it back) and any other failure fail this try, and the task's retries try
    again."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    done = dppipeline(settings, "run", *job_args(settings, ds), "--check-budget")
    if done.returncode == BUDGET_REFUSED:
        raise AirflowFailException(done.last_error)
    if done.returncode == BUDGET_HELD:
        raise AirflowException(f"budget held, retrying later: {done.last_error}")
    if done.returncode != 0:
        raise AirflowException(done.last_error or f"exit code {done.returncode}")
    return last_line(done.stdout)


def validate_release(settings: RunSettings, ds: str) -> str:
    """Manifest present, schema as schemas/terminal_stats.json says, ledger committed."""
    from airflow.sdk.exceptions import AirflowFailException

    done = dppipeline(settings, "check-release", release_dir(settings, ds))
    if done.returncode != 0:
        raise AirflowFailException(done.last_error or f"exit code {done.returncode}")
    return last_line(done.stdout)


def mark_published(settings: RunSettings, ds: str) -> str:
    """Writes `_PUBLISHED` (the run id of the validated release) into the release folder, for
    partners' readers to wait on. Idempotent: an unchanged release keeps its marker untouched.
    On a store the run is the one `RELEASE.json` names and the marker is one PUT (whole or absent);
    on local disk it is renamed into place."""
    release = release_dir(settings, ds)
    if "://" in release:
        run_id = json.loads(_read_text(_join(release, "RELEASE.json")))["run_id"]
    else:
        run_id = json.loads((Path(release) / "manifest.json").read_text())["run_id"]
    content = json.dumps({"run_id": run_id}) + "\n"
    marker = _join(release, PUBLISHED_MARKER)
    try:
        unchanged = _read_text(marker) == content
    except (FileNotFoundError, OSError):
        unchanged = False
    if unchanged:
        return release
    if "://" in release:
        fs, path = _filesystem(marker)
        with fs.open_output_stream(path) as stream:
            stream.write(content.encode())
    else:
        temporary = Path(release) / f".{PUBLISHED_MARKER}.tmp"
        temporary.write_text(content)
        temporary.replace(marker)
    return release


def shape_doc(shape: DagShape) -> str:
    return (
        f"Shape (`${SHAPE_ENVIRONMENT}`):\n```json\n{json.dumps(asdict(shape), indent=2)}\n```\n"
        f"Defaults of the run settings (the Variable `{SETTINGS_VARIABLE}` and params override "
        f"them when a task runs):\n```json\n{json.dumps(asdict(RunSettings()), indent=2)}\n```"
    )


# -------------------------------------------------------------------------------------------------
# The DAG shape both engines share


LEDGER_TEMPLATE = "{{ dppipeline_ledger_url() }}"  # the connection, looked up at render time
MACROS = {
    "dppipeline_ledger_url": ledger_url,  # the macros run when a task renders its templates
    "dppipeline_settings": run_settings,
}


class InputPartitionSensor(BaseSensorOperator):
    """Waits for the day's input partition, in reschedule mode, with the timeout and poke
    interval of this run's settings (`sensor_timeout_seconds`, `sensor_poke_seconds`), read each
    time the sensor starts: they are per-run params, not values fixed when the file is parsed."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(mode="reschedule", **kwargs)

    def execute(self, context: Any) -> Any:
        self.settings = run_settings(context["params"])
        self.timeout = float(self.settings.sensor_timeout_seconds)
        self.poke_interval = float(self.settings.sensor_poke_seconds)
        self._validate_input_values()
        return super().execute(context)

    def poke(self, context: Any) -> bool:
        ready = input_is_ready(self.settings, context["ds"])
        if not ready:
            log.info(
                "waiting for input partition %s (poke every %g s, timeout %g s)",
                input_partition(self.settings, context["ds"]),
                self.poke_interval,
                self.timeout,
            )
        return ready


def release_dag(
    dag_id: str,
    *,
    engine: str,
    doc_md: str,
    make_job: Callable[[], Any],
    shape: DagShape | None = None,
):
    """wait_for_input >> check_budget >> <the engine's job> >> validate_release >>
    mark_published, for one data interval per run."""
    import datetime as dt

    from airflow.sdk import DAG, Asset, Param, task

    shape = shape or load_shape()
    with DAG(
        dag_id=dag_id,
        description=f"Nightly DP per-terminal count, sum and mean on {engine}",
        schedule=shape.schedule,
        start_date=dt.datetime.fromisoformat(shape.start_date).replace(tzinfo=dt.UTC),
        catchup=shape.catchup,
        max_active_runs=shape.max_active_runs,
        default_args=default_args(shape),
        # None: the Variable's value (or the default), looked up when the tasks run
        params={key: Param(None, **schema) for key, schema in RUN_PARAMS.items()},
        user_defined_macros=MACROS,
        tags=["dppipeline", "differential-privacy", engine.lower()],
        doc_md=doc_md + "\n#### Settings\n" + shape_doc(shape),
    ) as dag:

        @task(task_id="check_budget")  # exit 3 fails it for good; 75 (held) is retried
        def check_budget_task(params=None, ds=None) -> str:
            return check_budget(run_settings(params), ds)

        @task(task_id="validate_release")
        def validate_release_task(params=None, ds=None) -> str:
            return validate_release(run_settings(params), ds)

        @task(task_id="mark_published", outlets=[Asset(f"dppipeline://{dag_id}")])
        def mark_published_task(params=None, ds=None) -> str:
            return mark_published(run_settings(params), ds)

        (
            InputPartitionSensor(task_id="wait_for_input")
            >> check_budget_task()
            >> make_job()
            >> validate_release_task()
            >> mark_published_task()
        )
    return dag
