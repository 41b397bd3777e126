"""`dppipeline plan`: the budget split and what it means for accuracy, before any data is read.

Everything printed derives from public parameters only, so planning spends no budget.
"""

from __future__ import annotations

from dataclasses import replace

from dppipeline.core.extremes import BETA, EXTREME_METRICS, GRID_SIZE, margin
from dppipeline.core.intervals import (
    STD_BOUND_ROWS,
    metric_half_width,
    ratio_stddev_bound,
    ratio_stddev_times_rows,
)
from dppipeline.core.plan import BudgetPlan, JobPlan, privacy_units_needed
from dppipeline.spec.metrics import distinct_column_of, percentile_of
from dppipeline.spec.model import JobSpec, QuerySpec


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:,.4g}"


def render_plan(spec: JobSpec, plan: JobPlan, basic: JobPlan | None = None) -> str:
    """The whole job: budget, then per query its mechanisms, noise and selection; with
    `basic` (the same job under basic composition), each noise std beside what basic
    composition would have given."""
    eps_total, delta_total = plan.total_spent()
    lines = [
        f"job {spec.name}: {len(plan.queries)} quer{'y' if len(plan.queries) == 1 else 'ies'}, "
        f"privacy unit {spec.privacy_unit}",
        f"budget: epsilon={_num(plan.epsilon)} delta={_num(plan.delta)}, {spec.noise} noise, "
        + _accounting_text(plan),
    ]
    for query in spec.queries:
        lines += ["", *_render_query(spec, query, plan, basic)]
    if plan.selections and not spec.is_shorthand:
        lines += ["", "partition selections (each shared by the queries listed):"]
        for group in plan.selections:
            m = group.mechanism
            lines.append(
                f"  {group.name:20} {m.kind:22} {_num(m.epsilon):>10} {_num(m.delta):>10}   "
                f"{', '.join(group.queries)}"
            )
    lines += [
        "",
        f"total spent by the job: epsilon={_num(eps_total)} delta={_num(delta_total)}"
        " (the ledger charges this)",
    ]
    return "\n".join(lines)


def _accounting_text(plan: JobPlan) -> str:
    if plan.accounting == "basic":
        return "split by pipeline-dp NaiveBudgetAccountant (basic composition)"
    return (
        f"{plan.accounting} accounting (dp_accounting): the noise mechanisms composed tightly, "
        f"base noise multiplier {_num(plan.noise_multiplier)}; every mechanism is in the "
        "pool (selections, percentiles, max and min included); a mechanism's epsilon/delta "
        "is its share of the pool, not its own guarantee"
    )


def _render_query(
    spec: JobSpec, query: QuerySpec, job_plan: JobPlan, basic: JobPlan | None = None
) -> list[str]:
    query_plan = job_plan.query(query.name)
    plan = query_plan.plan
    params = plan.params
    keys = ", ".join(query.partition_by)
    eps, delta = query_plan.spent()
    width = max(24, *(len(m.name) for m in plan.mechanisms))  # count_distinct_<COLUMN> is long
    lines = [
        f"query {query.name}: {_what(params.metrics, query.value)} "
        + (f"per {keys}" if keys else "as one global total")
        + (f" where {query.filter}" if query.filter else ""),
        f"  share: epsilon={_num(eps)} delta={_num(delta)} (weight {query.budget_weight:g})"
        + (" + its partition selection" if query_plan.selection_group else ""),
        (
            f"  bounds: max_contributions={params.max_contributions} rows per privacy unit in "
            f"all (sampled rows; at most {params.max_partitions_contributed} partitions)"
            if params.max_contributions is not None
            else f"  bounds: L0 (max_partitions_contributed)={params.max_partitions_contributed}, "
            f"Linf (max_contributions_per_partition)={params.max_contributions_per_partition}"
            + (" (scaled pairs)" if query.bounds.linf_bounding == "scale" else " (sampled rows)")
        )
        + (
            f", values clipped to [{_num(params.min_value)}, {_num(params.max_value)}]"
            if params.min_value is not None
            else ""
        ),
        f"  {'mechanism':{width}} {'kind':22} {'epsilon':>10} {'delta':>10} {'noise std':>12}"
        + (f" {'basic: std':>12}" if basic is not None else ""),
    ]
    before = basic.query(query.name).plan if basic is not None else None
    for m in plan.mechanisms:
        was = before.mechanism(m.name).noise_stddev if before is not None else None
        lines.append(
            f"  {m.name:{width}} {m.mechanism:22} {_num(m.epsilon):>10} {_num(m.delta):>10} "
            f"{_num(m.noise_stddev):>12}" + (f" {_num(was):>12}" if before is not None else "")
        )
    if params.max_contributions is not None:
        lines.append(
            "  sensitivities (K rows may all fall in one partition): "
            + ", ".join(
                f"{m.name} L1={_num(m.l1_sensitivity)} L2={_num(m.l2_sensitivity)}"
                for m in plan.mechanisms
                if m.l1 is not None
            )
        )
    lines.append("  released metrics (noise on each released value):")
    for metric in params.metrics:
        lines.append("    " + _metric_line(plan, metric))
    lines += _selection_lines(spec, query, plan)
    return lines


def _metric_line(plan: BudgetPlan, metric: str) -> str:
    params = plan.params
    if metric in ("mean", "variance"):
        bound = (
            f"[{_num(params.min_value)}, {_num(params.max_value)}]"
            if metric == "mean"
            else f"[0, {_num(params.half_range**2)}]"
        )
        at = ", ".join(
            f"{_num(ratio_stddev_bound(plan, metric, n))} at n={n:,}" for n in STD_BOUND_ROWS
        )
        return (
            f"{metric:17} std <= {_num(ratio_stddev_times_rows(plan, metric))} / n for a "
            f"partition of n rows (n large; clamped to {bound})\n"
            f"{'':22}worst case over the data, count noise included: {at}"
        )
    if metric in EXTREME_METRICS:
        scale = plan.mechanism(metric).noise_scale
        assert scale is not None
        m = margin(scale)
        side = "above" if metric == "max" else "below"
        return (
            f"{metric:17} exponential mechanism over {GRID_SIZE:,} candidates in "
            f"[{_num(params.min_value)}, {_num(params.max_value)}], Gumbel scale "
            f"{_num(scale)} rows, margin m={m:,}\n"
            f"{'':22}with probability >= {1 - BETA:.0%} per partition the answer has 1 to "
            f"{2 * m - 1:,} kept rows at or {side} it (when a candidate has exactly m);\n"
            f"{'':22}reliable where a partition keeps well over 2m = {2 * m:,} rows"
        )
    if percentile_of(metric) is not None:
        return (
            f"{metric:17} PyDP quantile tree over [{_num(params.min_value)}, "
            f"{_num(params.max_value)}]; all percentiles of the query share one mechanism"
        )
    return (
        f"{metric:17} std {_num(plan.metric_noise_stddev(metric)):>10}, "
        f"95% of values within +/- {_num(metric_half_width(plan, metric))}"
    )


def _selection_lines(spec: JobSpec, query: QuerySpec, plan: BudgetPlan) -> list[str]:
    selection = plan.selection
    if not query.partition_by:
        return ["  partition selection: none (a global total is one public partition)"]
    if selection is None and not query.listed_keys:
        return [
            "  partition selection: none (bucket keys: every bucket of the public edges is "
            "released, also when empty)"
        ]
    if selection is None:
        return [
            f"  partition selection: public keys {query.partition_selection.public_partitions} "
            "(every listed key released, also when empty; no budget spent on selection)"
        ]
    p50 = privacy_units_needed(plan, 0.5)
    p95 = privacy_units_needed(plan, 0.95)
    lines = [
        f"  partition selection: private, {selection.kind}, epsilon={_num(selection.epsilon)} "
        f"delta={_num(selection.delta)}"
        + (f", pre_threshold={plan.params.pre_threshold}" if plan.params.pre_threshold else ""),
        f"    a key ({', '.join(query.partition_by)}) needs {p50} distinct "
        f"{spec.privacy_unit} (after bounding) to be released with probability 50%, "
        f"{p95} for 95%",
        "    with fewer, it is likely dropped: give a public key list when you have one",
    ]
    threshold = plan.params.pre_threshold
    if threshold:
        unthresholded = replace(plan, params=replace(plan.params, pre_threshold=None))
        noise_alone = privacy_units_needed(unthresholded, 0.95)
        if noise_alone is not None and threshold > noise_alone:
            lines.append(
                f"    warning: pre_threshold={threshold} exceeds the {noise_alone} "
                f"{spec.privacy_unit} the noise alone needs for a 95% release, and adds to "
                f"it (PyDP's pre-threshold): a key needs {p95}; lower it unless you mean it"
            )
    return lines


def _what(metrics: tuple[str, ...], value: str) -> str:
    """`count, privacy_id_count of rows; sum, mean of TX_AMOUNT`: counts count rows or units,
    not a column's values."""
    counted = [
        m
        for m in metrics
        if m in ("count", "privacy_id_count") or distinct_column_of(m) is not None
    ]
    valued = [m for m in metrics if m not in counted]
    parts = [f"{', '.join(counted)} of rows"] if counted else []
    parts += [f"{', '.join(valued)} of {value}"] if valued else []
    return "; ".join(parts)
