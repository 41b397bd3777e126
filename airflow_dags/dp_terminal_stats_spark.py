"""
### dp_terminal_stats_spark: the nightly DP release of per-terminal statistics, on Spark

For each day (the data interval), in order:

1. **wait_for_input**: the day's input partition exists (a sensor in reschedule mode; it logs
   the partition's path and fails after `sensor_timeout_seconds`).
2. **check_budget**: the privacy-budget ledger would accept the release, or already has it.
   A refusal fails the run at once, without retries: more attempts cannot create budget. A
   budget held by live reservations of other runs (exit 75) is tried again (the task's retries).
3. **submit_spark_job**: `jobs/spark_terminal_stats.py` with `spark-submit`, through the
   `spark_default` connection (`local[*]` out of the box: see the README).
4. **validate_release**: manifest present, schema as `schemas/terminal_stats.json`, ledger row
   committed.
5. **mark_published**: writes `_PUBLISHED` into the release folder and updates the
   `dppipeline://dp_terminal_stats_spark` asset.

Settings: `spark_archives` and `spark_conf` in the Variable `dppipeline_terminal_stats` become
spark-submit's `--archives` and `--conf` entries (the packed executor environment of the README's
"Submitting to a Spark cluster"); they are read when the task renders its fields, like every run
setting (see `dppipeline_common.py`). The job's log lines stream into the task log.

Every task is idempotent per data interval: a retried or re-triggered run for a day already
released draws no new noise and spends no budget (the ledger returns the published release).
Ledger: the Airflow connection `dppipeline_ledger` (PostgreSQL for workers on several hosts),
read when the tasks run; without it, the project's `state/ledger.sqlite`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from dppipeline_common import LEDGER_TEMPLATE, TEMPLATED, job_args, release_dag, run_settings


class ReleaseSparkSubmitOperator(SparkSubmitOperator):
    """SparkSubmitOperator with the run's Spark settings: `--archives` (not a templated field)
    and `--conf` entries (keys chosen by the deployment, so not a template) are added when the
    task renders its templates, as is the worker's PATH behind the project's virtualenv."""

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        super().render_template_fields(context, jinja_env)
        settings = run_settings(context["params"])
        self.conf = {**(self.conf or {}), **settings.spark_conf}
        self._archives = settings.spark_archives or self._archives
        # spark-submit and its pyspark come from the project's virtualenv
        path = os.environ.get("PATH", "")
        self.env_vars = {**self.env_vars, "PATH": f"{Path(settings.python).parent}:{path}"}


def submit_spark_job() -> SparkSubmitOperator:
    return ReleaseSparkSubmitOperator(
        task_id="submit_spark_job",
        conn_id="spark_default",
        application=f"{TEMPLATED.project}/jobs/spark_terminal_stats.py",
        application_args=job_args(TEMPLATED, "{{ ds }}"),
        name="dp_terminal_stats_{{ ds_nodash }}",
        env_vars={
            "PYSPARK_PYTHON": TEMPLATED.python,
            "PYSPARK_DRIVER_PYTHON": TEMPLATED.python,
            # the connection dppipeline_ledger, rendered when the task runs
            "DPPIPELINE_LEDGER": LEDGER_TEMPLATE,
        },
    )


dag = release_dag(
    "dp_terminal_stats_spark",
    engine="Spark",
    doc_md=__doc__,
    make_job=submit_spark_job,
)
