"""
### dp_terminal_stats_spark: the nightly DP release of per-terminal statistics, on Spark

For each day (the data interval), in order:

1. **wait_for_input**: the day's input partition exists (a sensor in reschedule mode; it logs
   the partition's path and fails after `sensor_timeout_seconds`).
2. **check_budget**: the privacy-budget ledger would accept the release, or already has it.
   A refusal fails the run at once, without retries: more attempts cannot create budget.
3. **submit_spark_job**: `jobs/spark_terminal_stats.py` with `spark-submit`, through the
   `spark_default` connection (`local[*]` out of the box: see the README).
4. **validate_release**: manifest present, schema as `schemas/terminal_stats.json`, ledger row
   committed.
5. **mark_published**: writes `_PUBLISHED` into the release folder and updates the
   `dppipeline://dp_terminal_stats_spark` asset.

Every task is idempotent per data interval: a retried or re-triggered run for a day already
released draws no new noise and spends no budget (the ledger returns the published release).
Settings: the JSON Variable `dppipeline_terminal_stats` (see `dppipeline_common.py`). Ledger:
the Airflow connection `dppipeline_ledger` (PostgreSQL for workers on several hosts), read when
the tasks run; without it, the project's `state/ledger.sqlite`.
"""

from __future__ import annotations

import os

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from dppipeline_common import (
    LEDGER_TEMPLATE,
    job_args,
    load_settings,
    release_dag,
    templated_params,
)

SETTINGS = load_settings()


def submit_spark_job() -> SparkSubmitOperator:
    return SparkSubmitOperator(
        task_id="submit_spark_job",
        conn_id="spark_default",
        application=f"{SETTINGS.project}/jobs/spark_terminal_stats.py",
        application_args=job_args(templated_params(SETTINGS), "{{ ds }}"),
        name="dp_terminal_stats_{{ ds_nodash }}",
        env_vars={
            "PYSPARK_PYTHON": SETTINGS.python,
            "PYSPARK_DRIVER_PYTHON": SETTINGS.python,
            # spark-submit and its pyspark come from the project's virtualenv
            "PATH": f"{os.path.dirname(SETTINGS.python)}:{os.environ.get('PATH', '')}",
            # the connection dppipeline_ledger, rendered when the task runs
            "DPPIPELINE_LEDGER": LEDGER_TEMPLATE,
        },
    )


dag = release_dag(
    "dp_terminal_stats_spark",
    engine="Spark",
    doc_md=__doc__,
    settings=SETTINGS,
    make_job=submit_spark_job,
)
