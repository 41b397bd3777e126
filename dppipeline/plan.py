"""`dppipeline plan`: the budget split and what it means for accuracy, before any data is read.

Everything printed derives from public parameters only, so planning spends no budget.
"""

from __future__ import annotations

from dppipeline.core.budget import BudgetPlan, privacy_units_needed
from dppipeline.spec import JobSpec


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:,.4g}"


def render_plan(spec: JobSpec, plan: BudgetPlan) -> str:
    params = plan.params
    b = spec.bounds
    lines = [
        f"job {spec.name}: {', '.join(params.metrics)} of {spec.value} per {spec.partition_key}, "
        f"privacy unit {spec.privacy_unit}",
        f"budget: epsilon={_num(plan.epsilon)} delta={_num(plan.delta)}, {params.noise} noise, "
        "split by pipeline-dp NaiveBudgetAccountant (basic composition)",
        f"bounds: L0 (max_partitions_contributed)={b.max_partitions_contributed}, "
        f"Linf (max_contributions_per_partition)={b.max_contributions_per_partition}"
        + (
            f", values clipped to [{_num(b.min_value)}, {_num(b.max_value)}]"
            if b.min_value is not None
            else ""
        ),
        "",
        f"  {'mechanism':20} {'kind':22} {'epsilon':>10} {'delta':>10} {'noise std':>12}",
    ]
    for m in plan.mechanisms:
        lines.append(
            f"  {m.name:20} {m.kind:22} {_num(m.epsilon):>10} {_num(m.delta):>10} "
            f"{_num(m.noise_stddev):>12}"
        )
    eps_total, delta_total = plan.total_spent()
    lines += [f"  {'total':20} {'':22} {_num(eps_total):>10} {_num(delta_total):>10}", ""]
    lines.append("released metrics (noise on each released value):")
    for metric in params.metrics:
        if metric == "mean":
            count_std = plan.mechanism("count").noise_stddev or 0.0
            centred_std = plan.mechanism("centred_sum").noise_stddev or 0.0
            lines.append(
                f"  mean              std ~ {_num(centred_std)} / n for a partition of n rows "
                f"(n >> {_num(count_std)}); clamped to [{_num(b.min_value)}, {_num(b.max_value)}]"
            )
            continue
        lines.append(
            f"  {metric:17} std {_num(plan.metric_noise_stddev(metric)):>10}, "
            f"95% of values within +/- {_num(plan.metric_ci95_half_width(metric))}"
        )
    selection = plan.selection
    lines.append("")
    if selection is None:
        lines.append(
            f"partition selection: public list {spec.partition_selection.public_partitions} "
            "(every listed key released, also when empty; no budget spent on selection)"
        )
    else:
        p50 = privacy_units_needed(plan, 0.5)
        p95 = privacy_units_needed(plan, 0.95)
        lines += [
            f"partition selection: private, {selection.kind}, epsilon={_num(selection.epsilon)} "
            f"delta={_num(selection.delta)}"
            + (f", pre_threshold={params.pre_threshold}" if params.pre_threshold else ""),
            f"  a {spec.partition_key} needs {p50} distinct {spec.privacy_unit} (after bounding) "
            f"to be released with probability 50%, {p95} for 95%",
            "  with fewer, it is likely dropped: give a public key list when you have one",
        ]
    return "\n".join(lines)
