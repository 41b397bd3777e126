"""
### dp_terminal_stats_beam: the nightly DP release of per-terminal statistics, on Beam

The same tasks as `dp_terminal_stats_spark`, with the job step **run_beam_pipeline**:
`jobs/beam_terminal_stats.py` through `BeamRunPythonPipelineOperator`, on the DirectRunner by
default. (In apache-airflow-providers-apache-beam 6.3 the operator needs the Google provider
installed even off Dataflow; the project's Airflow environment has it.)

Settings `beam_runner` and `beam_options` (e.g. `{"direct_running_mode": "multi_processing",
"direct_num_workers": 2}`, or a Flink master and `setup_file`) choose where it runs. The
pipeline runs with the project's virtualenv Python (`python` setting), which has dppipeline
and Beam installed.

Every task is idempotent per data interval: a retried or re-triggered run for a day already
released draws no new noise and spends no budget (the ledger returns the published release).
Settings: the JSON Variable `dppipeline_terminal_stats` (see `dppipeline_common.py`). Ledger:
the Airflow connection `dppipeline_ledger` (PostgreSQL for workers on several hosts), read when
the tasks run; without it, the project's `state/ledger.sqlite`.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator
from dppipeline_common import (
    LEDGER_TEMPLATE,
    job_args,
    load_settings,
    release_dag,
    templated_params,
)

SETTINGS = load_settings()


def job_options() -> dict[str, Any]:
    """`dppipeline run` flags as Beam pipeline options (the operator passes each as
    --key=value; values are templates rendered per run), then the deployment's own options."""
    args = job_args(templated_params(SETTINGS), "{{ ds }}")
    flags = {
        flag.removeprefix("--"): value for flag, value in zip(args[::2], args[1::2], strict=True)
    }
    flags["ledger"] = LEDGER_TEMPLATE  # the connection dppipeline_ledger, rendered at run time
    return {**flags, **(SETTINGS.beam_options or {})}


def run_beam_pipeline() -> BeamRunPythonPipelineOperator:
    return BeamRunPythonPipelineOperator(
        task_id="run_beam_pipeline",
        runner=SETTINGS.beam_runner,
        py_file=f"{SETTINGS.project}/jobs/beam_terminal_stats.py",
        pipeline_options=job_options(),
        py_interpreter=SETTINGS.python,
        py_options=[],
    )


dag = release_dag(
    "dp_terminal_stats_beam",
    engine="Beam",
    doc_md=__doc__,
    settings=SETTINGS,
    make_job=run_beam_pipeline,
)
