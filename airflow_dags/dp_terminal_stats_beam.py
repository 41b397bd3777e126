"""
### dp_terminal_stats_beam: the nightly DP release of per-terminal statistics, on Beam

The same tasks as `dp_terminal_stats_spark`, with the job step **run_beam_pipeline**:
`jobs/beam_terminal_stats.py` through the Beam provider's `BeamHook` (the command line
`BeamRunPythonPipelineOperator` builds), on the DirectRunner by default. The operator itself is
not used: in apache-airflow-providers-apache-beam 6.3 it cannot be built without the Google
provider (its Dataflow mixin), a large install this deployment does not need.

Settings `beam_runner` and `beam_options` (e.g. `{"runner": ...}`,
`{"direct_running_mode": "multi_processing", "direct_num_workers": 2}`, or a Flink master and
`setup_file`) choose where it runs. The pipeline runs with the project's virtualenv Python
(`python` setting), which has dppipeline and Beam installed.

Every task is idempotent per data interval: a retried or re-triggered run for a day already
released draws no new noise and spends no budget (the ledger returns the published release).
Settings: the JSON Variable `dppipeline_terminal_stats` (see `dppipeline_common.py`).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import task
from dppipeline_common import job_args, load_settings, release_dag

SETTINGS = load_settings()


def job_options(params: dict[str, Any], ds: str) -> dict[str, Any]:
    """`dppipeline run` flags as Beam-style options (the hook turns each into --key=value),
    then the deployment's own Beam options."""
    args = job_args(params, ds)
    flags = {
        flag.removeprefix("--"): value for flag, value in zip(args[::2], args[1::2], strict=True)
    }
    return {**flags, **(SETTINGS.beam_options or {})}


def run_beam_pipeline():
    @task(task_id="run_beam_pipeline")
    def run(params=None, ds=None) -> None:
        from airflow.providers.apache.beam.hooks.beam import BeamHook

        BeamHook(runner=SETTINGS.beam_runner).start_python_pipeline(
            variables=job_options(params, ds),
            py_file=f"{SETTINGS.project}/jobs/beam_terminal_stats.py",
            py_options=[],
            py_interpreter=SETTINGS.python,
        )

    return run()


dag = release_dag(
    "dp_terminal_stats_beam",
    engine="Beam",
    doc_md=__doc__,
    settings=SETTINGS,
    make_job=run_beam_pipeline,
)
