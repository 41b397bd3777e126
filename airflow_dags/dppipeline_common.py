"""Settings and task bodies shared by the dppipeline DAGs (not a DAG file: see .airflowignore).

Everything here is light to import: the DAG processor parses DAG files often, so the work of a
task (the dppipeline CLI, Spark, Beam) runs in the project's own virtualenv as a subprocess and
nothing heavy is imported at parse time. Airflow itself lives in a virtualenv of its own.

Settings come from the JSON Airflow Variable `dppipeline_terminal_stats` (any subset of the keys
of `DagSettings`), over defaults that work for a checkout of this project:

    airflow variables set dppipeline_terminal_stats \\
        '{"input_root": "/data/tx", "release_root": "/data/releases", "catchup": true}'

Paths of a run come from its data interval (`ds`), never from the current time: the input is
the day's partition `<input_root>/date=<ds>` (CSV: `<input_root>/<ds>.csv`) and the release is
`<release_root>/<ds>`. Params (`input_root`, `release_root`, ...) override the settings per
triggered run.

The privacy-budget ledger is the Airflow connection `dppipeline_ledger`, read inside the tasks
when they run (never when the DAG file is parsed), so every worker on every host uses the one
ledger it names; without that connection, the demo's SQLite file `<project>/state/ledger.sqlite`
(one host only). A PostgreSQL connection (`postgresql://user:password@host:5432/db`, or the
fields of a `postgres` connection) is the ledger for several workers; a `sqlite` connection's
host is the file; `{"url": "..."}` in the extra gives any URL `dppipeline --ledger` takes. The
URL reaches the jobs through the environment (`DPPIPELINE_LEDGER`) where the operator allows it
(the checks, Spark) and as `--ledger` for Beam; Airflow masks the connection's password in logs.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

SETTINGS_VARIABLE = "dppipeline_terminal_stats"
PROJECT = Path(os.environ.get("DPPIPELINE_HOME", Path(__file__).resolve().parent.parent))
PUBLISHED_MARKER = "_PUBLISHED"
BUDGET_REFUSED = 3  # dppipeline's exit code when the ledger refuses the spend
LEDGER_CONNECTION = "dppipeline_ledger"


@dataclass(frozen=True)
class DagSettings:
    """What an operator sets once per deployment (the Variable) or per run (params)."""

    project: str = str(PROJECT)  # checkout with jobs/ and the .venv that runs them
    python: str = str(PROJECT / ".venv" / "bin" / "python")
    config: str = str(PROJECT / "jobs" / "configs" / "terminal_stats.yaml")
    input_root: str = str(PROJECT / "data" / "transactions")
    input_format: str = "parquet"
    release_root: str = str(PROJECT / "data" / "releases")
    schedule: str = "@daily"
    start_date: str = "2026-01-01"
    catchup: bool = False
    max_active_runs: int = 1
    owner: str = "dp-platform"
    retries: int = 2
    retry_delay_minutes: int = 5
    sensor_timeout_seconds: int = 6 * 3600
    sensor_poke_seconds: int = 300
    beam_runner: str = "DirectRunner"
    beam_options: dict[str, Any] | None = None  # extra Beam pipeline options

    @property
    def run_params(self) -> dict[str, Any]:
        """The settings a triggered run may override (DAG params)."""
        keys = ("config", "input_root", "input_format", "release_root")
        keys += ("sensor_timeout_seconds", "sensor_poke_seconds")
        return {key: getattr(self, key) for key in keys}


def load_settings() -> DagSettings:
    """Defaults, overridden by the Variable's JSON keys (unknown keys are an error)."""
    from airflow.sdk import Variable

    overrides = Variable.get(SETTINGS_VARIABLE, default=None, deserialize_json=True) or {}
    if "ledger" in overrides:
        raise ValueError(
            f"Variable {SETTINGS_VARIABLE}: 'ledger' is no longer a setting; set the Airflow "
            f"connection {LEDGER_CONNECTION} instead (read by the tasks on every worker)"
        )
    known = {f.name for f in fields(DagSettings)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"Variable {SETTINGS_VARIABLE}: unknown keys {unknown}; known: {known}")
    return replace(DagSettings(), **overrides)


def default_args(settings: DagSettings) -> dict[str, Any]:
    import datetime as dt

    return {
        "owner": settings.owner,
        "retries": settings.retries,
        "retry_delay": dt.timedelta(minutes=settings.retry_delay_minutes),
    }


# -------------------------------------------------------------------------------------------------
# Paths of one data interval


def input_partition(params: dict[str, Any], ds: str) -> Path:
    root = Path(params["input_root"])
    return root / f"{ds}.csv" if params["input_format"] == "csv" else root / f"date={ds}"


def release_dir(params: dict[str, Any], ds: str) -> Path:
    return Path(params["release_root"]) / ds


def job_args(params: dict[str, Any], ds: str) -> list[str]:
    """`dppipeline run` flags for the day `ds` (the same for Spark, Beam and the checks); the
    ledger comes from the connection (`ledger_url`), not from here."""
    return [
        "--config", params["config"],
        "--input", params["input_root"],
        "--format", params["input_format"],
        "--start-date", ds,
        "--end-date", ds,
        "--output", str(release_dir(params, ds)),
    ]  # fmt: skip


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


def input_is_ready(params: dict[str, Any], ds: str) -> bool:
    """The day's partition exists and holds at least one non-empty data file."""
    path = input_partition(params, ds)
    if path.is_file():
        return path.stat().st_size > 0
    return path.is_dir() and any(
        p.stat().st_size > 0 for p in path.iterdir() if not p.name.startswith((".", "_"))
    )


def dppipeline(settings: DagSettings, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs the dppipeline CLI of the project's virtualenv with this task's ledger (in the
    environment, so no password is on a command line); output is returned, not raised."""
    return subprocess.run(
        [settings.python, "-m", "dppipeline", *args],
        cwd=settings.project,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "DPPIPELINE_LEDGER": ledger_url()},
    )


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def check_budget(settings: DagSettings, params: dict[str, Any], ds: str) -> str:
    """Fails fast, without retries, when the ledger would refuse the release; passes when the
    budget is available or the day is already released (a rerun spends nothing)."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    done = dppipeline(settings, "run", *job_args(params, ds), "--check-budget")
    if done.returncode == BUDGET_REFUSED:
        raise AirflowFailException(last_line(done.stderr))
    if done.returncode != 0:
        raise AirflowException(last_line(done.stderr) or f"exit code {done.returncode}")
    return last_line(done.stdout)


def validate_release(settings: DagSettings, params: dict[str, Any], ds: str) -> str:
    """Manifest present, schema as schemas/terminal_stats.json says, ledger committed."""
    from airflow.sdk.exceptions import AirflowFailException

    done = dppipeline(settings, "check-release", str(release_dir(params, ds)))
    if done.returncode != 0:
        raise AirflowFailException(last_line(done.stderr))
    return last_line(done.stdout)


def mark_published(params: dict[str, Any], ds: str) -> str:
    """Writes `_PUBLISHED` (the run id of the validated release) into the release folder, for
    partners' readers to wait on. Idempotent: an unchanged release keeps its marker untouched."""
    release = release_dir(params, ds)
    run_id = json.loads((release / "manifest.json").read_text())["run_id"]
    marker = release / PUBLISHED_MARKER
    content = json.dumps({"run_id": run_id}) + "\n"
    if not marker.is_file() or marker.read_text() != content:
        temporary = release / f".{PUBLISHED_MARKER}.tmp"
        temporary.write_text(content)
        temporary.replace(marker)
    return str(release)


def settings_doc(settings: DagSettings) -> str:
    return "```json\n" + json.dumps(asdict(settings), indent=2) + "\n```"


# -------------------------------------------------------------------------------------------------
# The DAG shape both engines share


def templated_params(settings: DagSettings) -> dict[str, str]:
    """Jinja references to the run's params, for operator fields rendered at run time."""
    return {key: f"{{{{ params.{key} }}}}" for key in settings.run_params}


LEDGER_TEMPLATE = "{{ dppipeline_ledger_url() }}"  # the connection, looked up at render time


def release_dag(
    dag_id: str,
    *,
    engine: str,
    doc_md: str,
    settings: DagSettings,
    make_job: Callable[[], Any],
):
    """wait_for_input >> check_budget >> <the engine's job> >> validate_release >>
    mark_published, for one data interval per run."""
    import datetime as dt

    from airflow.sdk import DAG, Asset, PokeReturnValue, task

    with DAG(
        dag_id=dag_id,
        description=f"Nightly DP per-terminal count, sum and mean on {engine}",
        schedule=settings.schedule,
        start_date=dt.datetime.fromisoformat(settings.start_date).replace(tzinfo=dt.UTC),
        catchup=settings.catchup,
        max_active_runs=settings.max_active_runs,
        default_args=default_args(settings),
        params=settings.run_params,
        user_defined_macros={"dppipeline_ledger_url": ledger_url},  # rendered when tasks run
        tags=["dppipeline", "differential-privacy", engine.lower()],
        doc_md=doc_md + "\n#### Settings in effect\n" + settings_doc(settings),
    ) as dag:

        @task.sensor(
            task_id="wait_for_input",
            poke_interval=settings.sensor_poke_seconds,
            timeout=settings.sensor_timeout_seconds,
            mode="reschedule",
        )
        def wait_for_input(params=None, ds=None) -> PokeReturnValue:
            ready = input_is_ready(params, ds)
            if not ready:
                print(f"waiting for input partition {input_partition(params, ds)}")
            return PokeReturnValue(is_done=ready)

        @task(task_id="check_budget", retries=0)
        def check_budget_task(params=None, ds=None) -> str:
            return check_budget(settings, params, ds)

        @task(task_id="validate_release")
        def validate_release_task(params=None, ds=None) -> str:
            return validate_release(settings, params, ds)

        @task(task_id="mark_published", outlets=[Asset(f"dppipeline://{dag_id}")])
        def mark_published_task(params=None, ds=None) -> str:
            return mark_published(params, ds)

        (
            wait_for_input()
            >> check_budget_task()
            >> make_job()
            >> validate_release_task()
            >> mark_published_task()
        )
    return dag
