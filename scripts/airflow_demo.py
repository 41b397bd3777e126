"""make airflow-demo: the Spark DAG for three days of generated data, with `dag.test()`.

Runs under .venv-airflow with its own AIRFLOW_HOME (build/airflow-demo); the jobs run with the
project's .venv. Prints where the releases and the ledger are.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
HOME = PROJECT / "build" / "airflow-demo"
DATA = HOME / "data"
DAYS = ("2026-01-01", "2026-01-02", "2026-01-03")
LEDGER = DATA / "ledger.sqlite"
SETTINGS = {
    "input_root": str(DATA / "transactions"),
    "release_root": str(DATA / "releases"),
    "sensor_timeout_seconds": 30,
    "sensor_poke_seconds": 5,
}
os.environ.update(
    {
        "AIRFLOW_HOME": str(HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT / "airflow_dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{HOME / 'airflow.db'}",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "AIRFLOW_VAR_DPPIPELINE_TERMINAL_STATS": json.dumps(SETTINGS),
        "DPPIPELINE_DAG_SETTINGS": json.dumps({"retries": 0}),  # the DAG's shape
        # The ledger is a connection (a PostgreSQL URL for workers on several hosts).
        "AIRFLOW_CONN_DPPIPELINE_LEDGER": json.dumps({"conn_type": "sqlite", "host": str(LEDGER)}),
    }
)


def main() -> int:
    HOME.mkdir(parents=True, exist_ok=True)
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], check=True, capture_output=True)
    if not (DATA / "transactions").exists():
        subprocess.run(
            [str(PROJECT / ".venv" / "bin" / "python"), "-m", "dppipeline", "generate",
             "--output", SETTINGS["input_root"], "--days", str(len(DAYS))],
            check=True, cwd=PROJECT,
        )  # fmt: skip
    from airflow.dag_processing.dagbag import BundleDagBag

    # As Airflow 3 parses a bundle: its folder is importable (dppipeline_common).
    folder = PROJECT / "airflow_dags"
    bag = BundleDagBag(dag_folder=str(folder), bundle_path=folder)
    if bag.import_errors:
        print(f"DAG import errors: {bag.import_errors}", file=sys.stderr)
        return 1
    dag = bag.get_dag("dp_terminal_stats_spark")
    failed = 0
    for day in DAYS:
        run = dag.test(logical_date=dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC))
        state = str(run.state)
        failed += state != "success"
        print(f"{day}: {state} -> {Path(SETTINGS['release_root']) / day}")
    print(f"ledger: {LEDGER}  (dppipeline budget history --ledger {LEDGER})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
