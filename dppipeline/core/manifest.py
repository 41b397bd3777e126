"""What a release states about itself: parameters, budget split and noise, never data counts.

Everything here is either part of the job spec or derived from public parameters (noise scales
depend only on epsilon, delta and the bounds), so publishing it costs no privacy. Row counts of
the input, rejected rows and true values stay out: they go to the operator's console only.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import platform
from pathlib import Path
from typing import Any

from dppipeline import __version__
from dppipeline.core.budget import BudgetPlan, privacy_units_needed
from dppipeline.spec import JobSpec

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1


def published_run_id(release: Path) -> str | None:
    """The run id in a release folder's manifest; None when there is no readable manifest."""
    try:
        return json.loads((release / MANIFEST_NAME).read_text()).get("run_id")
    except (OSError, ValueError):
        return None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def build_manifest(
    spec: JobSpec,
    plan: BudgetPlan,
    *,
    run_id: str,
    engine: str,
    days: tuple[dt.date, dt.date],
    input_files: int,
    released_partitions: int,
    public_partitions_count: int | None,
    dataset: str,
    created_at: dt.datetime | None = None,
) -> dict[str, Any]:
    params = plan.params
    selection: dict[str, Any]
    if plan.selection is None:
        selection = {
            "type": "public",
            "public_partitions": spec.partition_selection.public_partitions,
            "public_partitions_count": public_partitions_count,
            "empty_partitions_released": True,
        }
    else:
        selection = {
            "type": "private",
            "strategy": params.selection_strategy,
            "pre_threshold": params.pre_threshold,
            "epsilon": plan.selection.epsilon,
            "delta": plan.selection.delta,
            "privacy_units_needed_p50": privacy_units_needed(plan, 0.5),
            "privacy_units_needed_p95": privacy_units_needed(plan, 0.95),
        }
    metrics: dict[str, Any] = {}
    for metric in params.metrics:
        metrics[metric] = {
            "noise_stddev": plan.metric_noise_stddev(metric),
            "ci95_half_width": plan.metric_ci95_half_width(metric),
            "mechanisms": _metric_mechanisms(plan, metric),
        }
    created = created_at or dt.datetime.now(dt.UTC)
    return {
        "manifest_version": MANIFEST_VERSION,
        "job": spec.name,
        "run_id": run_id,
        "created_at": created.isoformat(timespec="seconds"),
        "engine": engine,
        "dataset": dataset,
        "privacy_unit": spec.privacy_unit,
        "partition_key": spec.partition_key,
        "value": spec.value,
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "noise": params.noise,
        "accountant": "pipeline_dp.NaiveBudgetAccountant (basic composition)",
        "bounds": {
            "max_partitions_contributed": params.max_partitions_contributed,
            "max_contributions_per_partition": params.max_contributions_per_partition,
            "min_value": params.min_value,
            "max_value": params.max_value,
        },
        "partition_selection": selection,
        "metrics": metrics,
        "budget_split": {m.name: m.to_dict() for m in plan.mechanisms},
        "post_processing": [
            "mean = midpoint + noisy centred sum / max(1, noisy count), clamped to "
            "[min_value, max_value]",
            "sum (with mean) = noisy centred sum + midpoint * noisy count",
            "counts are not clamped at zero (unbiased)",
        ],
        "input": {
            "format": spec.input.format,
            "start_date": days[0].isoformat(),
            "end_date": days[1].isoformat(),
            "files": input_files,
        },
        "released_partitions": released_partitions,
        "spec_hash": spec.spec_hash(),
        "spec": _public_spec(spec),
        "versions": {
            "dppipeline": __version__,
            "pipeline-dp": _version("pipeline-dp"),
            "python-dp": _version("python-dp"),
            "python": platform.python_version(),
        },
    }


def _public_spec(spec: JobSpec) -> dict[str, Any]:
    """The spec without local paths of the input and the release (not the partner's business)."""
    content = spec.to_dict()
    content.pop("output", None)
    content["input"].pop("path", None)
    return content


def _metric_mechanisms(plan: BudgetPlan, metric: str) -> list[str]:
    """Names of the budget_split mechanisms a metric's value is computed from."""
    if metric == "mean":
        return ["count", "centred_sum"]
    if metric == "sum" and plan.has("centred_sum"):
        return ["count", "centred_sum"]
    return [metric]
