"""
### dp_terminal_stats_beam: the nightly DP release of per-terminal statistics, on Beam

The same tasks as `dp_terminal_stats_spark`, with the job step **run_beam_pipeline**:
`jobs/beam_terminal_stats.py` through `BeamRunPythonPipelineOperator`, on the DirectRunner by
default. (In apache-airflow-providers-apache-beam 6.3 the operator needs the Google provider
installed even off Dataflow; the project's Airflow environment has it.)

Settings `beam_runner` and `beam_options` (e.g. `{"direct_running_mode": "multi_processing",
"direct_num_workers": 2}`, or a Flink master and `setup_file`) choose where it runs; like every
run setting they are read when the task runs (see `dppipeline_common.py`). The pipeline runs with
the project's virtualenv Python (`python` setting), which has dppipeline and Beam installed; its
log lines stream into the task log (those on stderr as warnings: the operator's choice).

Every task is idempotent per data interval: a retried or re-triggered run for a day already
released draws no new noise and spends no budget (the ledger returns the published release).
Ledger: the Airflow connection `dppipeline_ledger` (PostgreSQL for workers on several hosts),
read when the tasks run; without it, the project's `state/ledger.sqlite`.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator
from dppipeline_common import LEDGER_TEMPLATE, TEMPLATED, job_args, release_dag, run_settings


class ReleaseBeamOperator(BeamRunPythonPipelineOperator):
    """BeamRunPythonPipelineOperator with the run's Beam settings: the interpreter (not a
    templated field) and the deployment's own pipeline options (keys chosen by the deployment,
    so not a template) are set when the task renders its templates."""

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        super().render_template_fields(context, jinja_env)
        settings = run_settings(context["params"])
        self.py_interpreter = settings.python
        self.pipeline_options = {**self.pipeline_options, **settings.beam_options}


def job_options() -> dict[str, Any]:
    """`dppipeline run` flags as Beam pipeline options (the operator passes each as
    --key=value; values are templates rendered per run)."""
    args = job_args(TEMPLATED, "{{ ds }}")
    flags = {
        flag.removeprefix("--"): value for flag, value in zip(args[::2], args[1::2], strict=True)
    }
    flags["ledger"] = LEDGER_TEMPLATE  # the connection dppipeline_ledger, rendered at run time
    return flags


def run_beam_pipeline() -> BeamRunPythonPipelineOperator:
    return ReleaseBeamOperator(
        task_id="run_beam_pipeline",
        runner=TEMPLATED.beam_runner,
        py_file=f"{TEMPLATED.project}/jobs/beam_terminal_stats.py",
        pipeline_options=job_options(),
        py_options=[],
    )


dag = release_dag(
    "dp_terminal_stats_beam",
    engine="Beam",
    doc_md=__doc__,
    make_job=run_beam_pipeline,
)
