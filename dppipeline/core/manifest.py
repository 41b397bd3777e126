"""What a release states about itself: parameters, budget split and noise, never data counts.

Everything here is either part of the job spec or derived from public parameters (noise scales
depend only on epsilon, delta and the bounds), so publishing it costs no privacy. Row counts of
the input, rejected rows and true values stay out: they go to the operator's console only.

The manifest is a typed model (`Manifest`), built and parsed here, read and written by the
layers that do I/O (`storage.releases` names the files; `report`, `check-release` and the
runner read it back with `lifecycle.manifests.read_manifest`), by attribute, never by
string key. Sections whose content is descriptive (the spec, the budget split, noise bounds)
stay JSON mappings; a field a later version adds is kept when an older one reads it.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import platform
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from dppipeline.core.extremes import BETA, EXTREME_METRICS, GRID_SIZE, margin
from dppipeline.core.intervals import (
    LEVEL,
    STD_BOUND_ROWS,
    has_interval,
    metric_half_width,
    ratio_stddev_bound,
    ratio_stddev_times_rows,
)
from dppipeline.core.plan import BudgetPlan, JobPlan, privacy_units_needed
from dppipeline.core.tasks import KeyColumn, key_columns
from dppipeline.errors import InputError
from dppipeline.spec.hashing import key_sources_by_content
from dppipeline.spec.metrics import VARIANCE_METRICS, metric_column, percentile_of
from dppipeline.spec.model import JobSpec, QuerySpec
from dppipeline.spec.vocabulary import LinfBounding
from dppipeline.version import __version__

MANIFEST_VERSION = 2


class _Entry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")


class BoundsEntry(_Entry):
    """Under `max_contributions` K, L0 and Linf hold K (what K rows imply); each noise
    mechanism's `budget_split` entry then gives its explicit L1 and L2 sensitivities."""

    max_partitions_contributed: int
    max_contributions_per_partition: int
    min_value: float | None
    max_value: float | None
    max_contributions: int | None = None
    # How Linf bounded the query's pairs, as resolved from the spec (`scale` where allowed
    # unless stated); manifests written before every query recorded it lack it (then: sample).
    linf_bounding: LinfBounding | None = None


class SelectionEntry(_Entry):
    """How a query's keys were chosen: `global` (one total), `public` keys, or `private`
    selection (then the group it shares, its strategy and budget)."""

    type: Literal["global", "public", "private"]
    empty_partitions_released: bool | None = None
    public_partitions: Any = None
    public_partitions_count: int | None = None
    selection: str | None = None
    shared_with: list[str] | None = None
    strategy: str | None = None
    pre_threshold: int | None = None
    epsilon: float | None = None
    delta: float | None = None
    privacy_units_needed_p50: int | None = None
    privacy_units_needed_p95: int | None = None


class MetricEntry(_Entry):
    column: str
    noise_stddev: float | None
    ci95_half_width: float | None
    mechanisms: list[str]
    noise_stddev_bound: dict[str, Any] | None = None
    confidence_interval: dict[str, Any] | None = None


class QueryEntry(_Entry):
    dataset: str
    partition_by: list[str]
    key_types: dict[str, str] | None = None  # release key column -> Arrow type (since 0.9)
    filter: str | None
    value: str
    bounds: BoundsEntry
    partition_selection: SelectionEntry
    metrics: dict[str, MetricEntry]
    budget_weight: float
    epsilon: float
    delta: float
    budget_split: dict[str, dict[str, Any]]
    released_partitions: int


class SharedSelectionEntry(_Entry):
    """One private selection and the queries that use its keys (the mechanism's fields)."""

    epsilon: float
    delta: float
    queries: list[str]


class InputEntry(_Entry):
    format: str
    start_date: str
    end_date: str
    files: int


class Manifest(_Entry):
    """A release's description of itself (`manifest.json`)."""

    manifest_version: Literal[2]
    job: str
    run_id: str
    created_at: str
    engine: str
    privacy_unit: str
    epsilon: float
    delta: float
    noise: str
    # discrete: count and privacy_id_count are int64, drawn by OpenDP (budget_split names the
    # discrete_laplace / discrete_gaussian mechanism and its noise_scale); absent: continuous
    count_noise: Literal["discrete", "continuous"] = "continuous"
    accountant: str
    noise_multiplier: float | None = None  # tight accounting: the pool's base multiplier
    queries: dict[str, QueryEntry]
    selections: dict[str, SharedSelectionEntry]
    post_processing: list[str]
    input: InputEntry
    released_partitions: int
    spec_hash: str
    ledger: str | None
    spec: dict[str, Any]
    versions: dict[str, str | None]
    query: str | None = None  # the DP SQL text of a `sql` job (not hashed; absent for YAML)

    def to_json(self) -> str:
        """As written next to the release: the fields it was built with, nothing added."""
        return self.model_dump_json(indent=2, exclude_unset=True) + "\n"


def parse_manifest(text: str, where: str) -> Manifest:
    """A manifest's text as the model; InputError naming `where` (the file) and the first
    field that breaks the model (a version this code does not read, a wrong type)."""
    try:
        version = json.loads(text).get("manifest_version")
    except (ValueError, AttributeError):  # AttributeError: not a JSON object
        raise InputError(f"{where}: not a JSON object") from None
    if version != MANIFEST_VERSION:
        raise InputError(
            f"{where}: manifest_version {version!r}, this dppipeline reads {MANIFEST_VERSION}"
        )
    try:
        return Manifest.model_validate_json(text)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        field = ".".join(str(part) for part in error["loc"])
        raise InputError(f"{where}: {field}: {error['msg']}") from None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def build_manifest(
    spec: JobSpec,
    plan: JobPlan,
    *,
    run_id: str,
    engine: str,
    days: tuple[dt.date, dt.date],
    input_files: int,
    released_partitions: Mapping[str, int],
    public_keys: Mapping[str, int | None],
    created_at: dt.datetime | None = None,
    spec_hash: str | None = None,
    ledger: str | None = None,
) -> Manifest:
    """The release's own description: the job, then per query its dataset, keys, filter,
    bounds, selection, metrics with their noise, and its share of the budget. `spec_hash`:
    the one its ledger key used (default: computed now); `ledger`: where its spend is
    recorded (a file path, or a PostgreSQL URL without credentials), None without one."""
    created = created_at or dt.datetime.now(dt.UTC)
    queries = {
        query.name: _query_entry(
            query,
            plan,
            released_partitions[query.name],
            public_keys.get(query.name),
            key_columns(query, spec.source_schema),
        )
        for query in spec.queries
    }
    return Manifest.model_validate({
        "manifest_version": MANIFEST_VERSION,
        "job": spec.name,
        "run_id": run_id,
        "created_at": created.isoformat(timespec="seconds"),
        "engine": engine,
        "privacy_unit": spec.privacy_unit,
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "noise": spec.noise,
        "count_noise": spec.count_noise,
        "accountant": _accountant_text(plan),
        **({} if plan.noise_multiplier is None else {"noise_multiplier": plan.noise_multiplier}),
        "queries": queries,
        "selections": {
            group.name: {**group.mechanism.to_dict(), "queries": list(group.queries)}
            for group in plan.selections
        },
        "post_processing": [
            "mean = midpoint + noisy centred sum / max(1, noisy count), clamped to "
            "[min_value, max_value]",
            "sum (with mean or variance) = noisy centred sum + midpoint * noisy count",
            "variance = noisy centred sum of squares / max(1, noisy count) + r^2/2 - "
            "(centred mean)^2, clamped to [0, r^2], r = (max_value - min_value) / 2",
            "percentiles: PyDP QuantileTree (height 4, branching 16) over [min_value, "
            "max_value]; ranks clamped to [0.5%, 99.5%]",
            "max, min: a candidate of the public grid chosen by the exponential mechanism "
            "(no post-processing)",
            "counts are not clamped at zero (unbiased)",
            "private selection: the keys one selection releases are used by every query of "
            "its group; a released key without rows in a query gets noise on zeros",
        ],
        "input": {
            "format": spec.input.format,
            "start_date": days[0].isoformat(),
            "end_date": days[1].isoformat(),
            "files": input_files,
        },
        "released_partitions": sum(released_partitions.values()),
        "spec_hash": spec_hash or spec.spec_hash(),
        "ledger": ledger,
        "spec": _public_spec(spec),
        "versions": {
            "dppipeline": __version__,
            "pipeline-dp": _version("pipeline-dp"),
            "python-dp": _version("python-dp"),
            **({"opendp": _version("opendp")} if spec.count_noise == "discrete" else {}),
            "python": platform.python_version(),
        },
        **({} if spec.query_text is None else {"query": spec.query_text}),
    })  # fmt: skip


def _accountant_text(plan: JobPlan) -> str:
    if plan.accounting == "basic":
        return (
            "pipeline_dp.NaiveBudgetAccountant (basic composition): every query's mechanisms "
            "and every partition selection share the job's budget"
        )
    tools = {"pld": "privacy loss distributions", "zcdp": "Renyi DP (zCDP)"}
    if plan.noise_multiplier is None:
        return f"{plan.accounting}: no mechanisms to compose"
    return (
        f"{plan.accounting}: every mechanism of every query and every partition selection "
        f"composed tightly by dp_accounting (bound proved with "
        f"{tools.get(plan.certified_by or '', '?')}), each with noise multiplier "
        "noise_multiplier / its weight (std / L2 sensitivity for Gaussian, scale / L1 for "
        "Laplace; max, min and truncated geometric selections as L0 pure draws of epsilon "
        "1 / (multiplier L0); selections' thresholds add their delta). A query's epsilon and "
        "delta are its attributed share of the job's budget, not a per-query guarantee"
    )


def _query_entry(
    query: QuerySpec,
    job_plan: JobPlan,
    released: int,
    public_count: int | None,
    keys: Sequence[KeyColumn],
) -> dict[str, Any]:
    query_plan = job_plan.query(query.name)
    plan = query_plan.plan
    params = plan.params
    selection: dict[str, Any]
    if not query.partition_by:
        selection = {"type": "global", "empty_partitions_released": True}
    elif query_plan.selection_group is None:
        selection = {
            "type": "public",
            "public_partitions": key_sources_by_content(
                query.partition_selection.public_partitions
            ),
            "public_partitions_count": public_count,
            "empty_partitions_released": True,
        }
    else:
        group = job_plan.selection_group(query_plan.selection_group)
        selection = {
            "type": "private",
            "selection": group.name,
            "shared_with": [q for q in group.queries if q != query.name],
            "strategy": params.selection_strategy,
            "pre_threshold": params.pre_threshold,
            "epsilon": group.mechanism.epsilon,
            "delta": group.mechanism.delta,
            "privacy_units_needed_p50": privacy_units_needed(plan, 0.5),
            "privacy_units_needed_p95": privacy_units_needed(plan, 0.95),
        }
    eps, delta = query_plan.spent()
    return {
        "dataset": query.name,
        "partition_by": list(query.partition_by),
        "key_types": {key.name: str(key.arrow_type) for key in keys},
        "filter": query.filter,
        "value": query.value,
        "bounds": {
            "max_partitions_contributed": params.max_partitions_contributed,
            "max_contributions_per_partition": params.max_contributions_per_partition,
            "min_value": params.min_value,
            "max_value": params.max_value,
            **(
                {}
                if params.max_contributions is None
                else {"max_contributions": params.max_contributions}
            ),
            "linf_bounding": query.bounds.linf_bounding,  # as resolved for this query
        },
        "partition_selection": selection,
        "metrics": {
            metric: {
                "column": metric_column(metric),
                "noise_stddev": plan.metric_noise_stddev(metric),
                "ci95_half_width": metric_half_width(plan, metric),
                **_ratio_noise_entry(plan, metric),
                "mechanisms": _metric_mechanisms(plan, metric),
                **_interval_entry(plan, metric),
                **_extreme_entry(plan, metric),
            }
            for metric in params.metrics
        },
        "budget_weight": query.budget_weight,
        "epsilon": eps,
        "delta": delta,
        "budget_split": {m.name: m.to_dict() for m in query_plan.own_mechanisms()},
        "released_partitions": released,
    }


def _public_spec(spec: JobSpec) -> dict[str, Any]:
    """The spec without the operator's paths (not the partner's business): no input,
    quarantine or release folder; public key files by the sha256 of their bytes."""
    content = spec.to_dict()
    content.pop("output", None)
    content["input"].pop("path", None)
    content["input"].pop("quarantine", None)
    for section in (content, *(content.get("queries") or ())):
        selection = section.get("partition_selection") or {}
        if selection.get("public_partitions") is not None:
            selection["public_partitions"] = key_sources_by_content(selection["public_partitions"])
    return content


def _extreme_entry(plan: BudgetPlan, metric: str) -> dict[str, Any]:
    """Max and min: the exponential mechanism's public grid, scale, margin and promise."""
    if metric not in EXTREME_METRICS:
        return {}
    scale = plan.mechanism(metric).noise_scale
    assert scale is not None
    m = margin(scale)
    side = "above" if metric == "max" else "below"
    return {
        "exponential_mechanism": {
            "implementation": "OpenDP make_noisy_max (Gumbel report-noisy-max)",
            "candidates": GRID_SIZE,
            "grid": f"{GRID_SIZE} evenly spaced values from min_value to max_value",
            "score": f"-|kept rows at or {side} the candidate - m|",
            "gumbel_scale_rows": scale,
            "margin_m": m,
            "beta": BETA,
            "promise": (
                f"with probability >= {1 - BETA:g} per partition the answer has 1 to "
                f"{2 * m - 1} kept rows at or {side} it when some candidate has exactly m; "
                f"reliable where a partition keeps well over 2m = {2 * m} rows; an empty "
                "partition gets a uniform draw from the grid"
            ),
        }
    }


def _ratio_noise_entry(plan: BudgetPlan, metric: str) -> dict[str, Any]:
    """Mean and variance (ratios: no additive std): a bound on their noise's std for a
    partition of n rows, worst case over the data (see `core.intervals`)."""
    if metric not in ("mean", "variance"):
        return {}
    return {
        "noise_stddev_bound": {
            "n": list(STD_BOUND_ROWS),
            "stddev": [ratio_stddev_bound(plan, metric, n) for n in STD_BOUND_ROWS],
            "stddev_times_n_for_large_n": ratio_stddev_times_rows(plan, metric),
        }
    }


def _interval_entry(plan: BudgetPlan, metric: str) -> dict[str, Any]:
    """Where a metric's released 95% interval is and what it means (when released)."""
    if not plan.params.confidence_intervals or not has_interval(metric):
        return {}
    column = metric_column(metric)
    discrete = plan.has(column) and plan.mechanism(column).discrete
    ratio = (
        "plug-in: the released value -/+ the certified 95% quantile of the linearised error "
        "(the noises' distributions convolved) over the noisy count; the whole range where "
        "the noisy count is within twice its noise's 95% half-width of 0"
    )
    method = {
        "mean": ratio,
        "variance": ratio,
        "stddev": "square roots of the variance's interval",
        "sum": (
            "certified quantile of the sum of the centred sum's and the count's noises"
            if plan.has("centred_sum")
            else "exact quantile of the noise"
        ),
    }.get(
        metric,
        "the narrowest integer interval from the discrete noise's exact quantiles"
        if discrete
        else "exact quantile of the noise",
    )
    return {
        "confidence_interval": {
            "columns": [f"{column}_ci_low", f"{column}_ci_high"],
            "level": f"at least {LEVEL}" if discrete else LEVEL,
            "method": method,
            "covers": "the exact value after contribution bounding and clipping",
        }
    }


def _metric_mechanisms(plan: BudgetPlan, metric: str) -> list[str]:
    """Names of the budget_split mechanisms a metric's value is computed from."""
    if metric == "mean":
        return ["count", "centred_sum"]
    if metric in VARIANCE_METRICS:
        return ["count", "centred_sum", "centred_sum_of_squares"]
    if metric == "sum" and plan.has("centred_sum"):
        return ["count", "centred_sum"]
    if percentile_of(metric) is not None:
        return ["percentile"]
    return [metric_column(metric)]
