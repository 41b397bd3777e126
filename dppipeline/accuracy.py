"""`dppipeline evaluate`: how accurate a job is at several epsilons, on non-sensitive data.

It runs the job (every query) at each epsilon, compares the released values with the true
values computed from the same rows, and draws error against epsilon and, under private
selection, the share of true partitions released. True values are not private: the command
refuses to run unless the user states that the input is synthetic or otherwise not sensitive.
Runs are experiments, never releases: they go to scratch folders and no ledger.

The error is measured against the raw truth (no contribution bounding, no clipping), so it
shows both what the bounds cost (bias) and what the noise costs; `bias` rows give the first
part alone, from one sample of the local engine's exact bounded aggregates.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl

from dppipeline.engines.local import aggregate_task, key_expr
from dppipeline.engines.local_read import read_validated
from dppipeline.engines.polars_filter import to_polars
from dppipeline.errors import UsageError
from dppipeline.queries import AggregationTask, canonical_keys, task_for, validated_value
from dppipeline.runner import input_days, run_job
from dppipeline.schemas import transactions_schema
from dppipeline.spec import JobSpec, QuerySpec, metric_column, percentile_of

NOT_SENSITIVE_FLAG = "--data-is-not-sensitive"
DEFAULT_EPSILONS = (0.1, 0.3, 1.0, 3.0, 10.0)


def refuse_unless_not_sensitive(confirmed: bool) -> None:
    if not confirmed:
        raise UsageError(
            f"evaluate prints true values: run it only on synthetic or otherwise non-sensitive "
            f"data, and say so with {NOT_SENSITIVE_FLAG}"
        )


def true_values(rows: pl.DataFrame, query: QuerySpec, unit: str) -> pd.DataFrame:
    """Per partition the raw truth of every metric the query releases (no bounding, no
    clipping), keyed like the release."""
    task = task_for(query)
    if task.filter is not None:
        rows = rows.filter(to_polars(task.filter))
    keys = [key_expr(k) for k in task.keys]
    value = pl.col(query.value).cast(pl.Float64)
    aggregates = [
        pl.len().cast(pl.Float64).alias("count"),
        value.sum().alias("sum"),
        value.mean().alias("mean"),
        value.var(ddof=0).alias("variance"),
        pl.col(unit).n_unique().cast(pl.Float64).alias("privacy_id_count"),
    ]
    for metric in query.metrics:
        p = percentile_of(metric)
        if p is not None:
            aggregates.append(value.quantile(p / 100).alias(metric_column(metric)))
    if keys:
        truth = rows.group_by(keys).agg(aggregates).to_pandas()
    else:
        truth = rows.select(aggregates).to_pandas()
    return canonical_keys(truth, task.keys)


def bounded_values(rows: pl.DataFrame, task: AggregationTask, unit: str) -> pd.DataFrame:
    """One sample of the exact aggregates after bounding and clipping (no noise)."""
    exact = aggregate_task(rows, replace(task, public_keys=None), unit, np.random.default_rng(0))
    exact = exact.assign(mean=exact["sum"] / exact["count"].clip(lower=1))
    return exact.astype({"count": "float64", "privacy_id_count": "float64"})


def compare(
    estimate: pd.DataFrame,
    truth: pd.DataFrame,
    keys: list[str],
    metrics: Sequence[str],
    *,
    missing_is_zero: bool = False,
) -> dict[str, float]:
    """Error statistics over the partitions that hold data (the truth's keys). A partition
    the estimate lacks counts as 0 when `missing_is_zero` (bounding dropped all its rows),
    else it is left out (private selection did not release it: see the released share)."""
    stats: dict[str, float] = {}
    if keys:
        how = "left" if missing_is_zero else "inner"
        merged = truth.merge(estimate, on=keys, how=how, suffixes=("_true", ""))
        true_keys = set(map(tuple, truth[keys].to_numpy()))
        released_keys = set(map(tuple, estimate[keys].to_numpy()))
        stats["partitions_released"] = float(len(released_keys))
        stats["true_partitions_released_share"] = (
            len(released_keys & true_keys) / len(true_keys) if true_keys else math.nan
        )
    else:
        merged = estimate.join(truth, rsuffix="_true")
    for metric in metrics:
        column = metric_column(metric)
        if column not in merged or merged.empty:
            continue
        error = merged[column].fillna(0.0).to_numpy(dtype=np.float64) - merged[
            f"{column}_true"
        ].to_numpy(dtype=np.float64)
        true_values_ = merged[f"{column}_true"].to_numpy(dtype=np.float64)
        stats[f"{metric}:median_abs_error"] = float(np.median(np.abs(error)))
        stats[f"{metric}:mean_abs_error"] = float(np.mean(np.abs(error)))
        stats[f"{metric}:median_rel_error"] = float(
            np.median(np.abs(error) / np.maximum(np.abs(true_values_), 1.0))
        )
    return stats


def evaluate(
    spec: JobSpec,
    output: Path,
    *,
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
    repeats: int = 2,
    engine: str = "local",
    progress: Callable[[str], None] = print,
) -> Path:
    """Runs the job at each epsilon `repeats` times; writes evaluation.csv/.json, charts and
    index.html into `output`; returns the page's path."""
    if spec.input.path is None:
        raise UsageError("--input: required (or input.path in the job spec)")
    if repeats < 1 or not epsilons or any(not e > 0 for e in epsilons):
        raise UsageError("--epsilons must be > 0 and --repeats >= 1")
    output.mkdir(parents=True, exist_ok=True)
    days = input_days(spec)
    tasks = [task_for(q) for q in spec.query_specs]
    rows = read_validated(
        days, spec.input.format, transactions_schema(), validated_value(tasks)
    ).rows
    unit = spec.privacy_unit
    truths = {q.name: true_values(rows, q, unit) for q in spec.query_specs}
    records: list[dict] = []
    for query, task in zip(spec.query_specs, tasks, strict=True):
        bounded = bounded_values(rows, task, unit)
        bias = compare(
            bounded, truths[query.name], task.key_names,
            [m for m in query.metrics if m in ("count", "sum", "mean", "privacy_id_count")],
            missing_is_zero=True,
        )  # fmt: skip
        records += [
            {"query": query.name, "epsilon": None, "repeat": None, "stat": f"bias|{k}", "value": v}
            for k, v in bias.items()
            if ":" in k
        ]
    for epsilon in epsilons:
        for repeat in range(repeats):
            run_dir = output / "runs" / f"epsilon_{epsilon:g}_run_{repeat + 1}"
            progress(f"[evaluate] epsilon={epsilon:g} run {repeat + 1}/{repeats}")
            run_spec = replace(
                spec,
                budget=replace(spec.budget, epsilon=epsilon),
                output=str(run_dir / "release"),
            )
            result = run_job(run_spec, engine, overwrite=True, echo=lambda _: None, ledger=None)
            for query, task in zip(spec.query_specs, tasks, strict=True):
                released = pd.read_parquet(result.output / query.name)
                released = canonical_keys(released, task.keys)
                stats = compare(released, truths[query.name], task.key_names, query.metrics)
                records += [
                    {"query": query.name, "epsilon": epsilon, "repeat": repeat + 1,
                     "stat": k, "value": v}
                    for k, v in stats.items()
                ]  # fmt: skip
    table = pd.DataFrame.from_records(records)
    table.to_csv(output / "evaluation.csv", index=False)
    (output / "evaluation.json").write_text(
        json.dumps(
            {
                "job": spec.name,
                "epsilons": list(epsilons),
                "repeats": repeats,
                "engine": engine,
                "records": records,
            },
            indent=1,
        )
        + "\n"
    )
    charts = {q.name: error_chart(table, q, output) for q in spec.query_specs}
    return write_page(spec, table, charts, output)


def _pyplot():
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def error_chart(table: pd.DataFrame, query: QuerySpec, output: Path) -> Path:
    """Median absolute error against epsilon (log-log), one line per metric, min-max band over
    repeats, the bounding bias as a dashed level; and the share of partitions released."""
    plt = _pyplot()
    runs = table[(table["query"] == query.name) & table["epsilon"].notna()]
    private = not query.is_public
    fig, axes = plt.subplots(1, 2 if private else 1, figsize=(11 if private else 6.5, 4), dpi=100)
    ax = axes[0] if private else axes
    for metric in query.metrics:
        stat = runs[runs["stat"] == f"{metric}:median_abs_error"]
        if stat.empty:
            continue
        by_eps = stat.groupby("epsilon")["value"]
        line = ax.plot(by_eps.median().index, by_eps.median(), marker="o", label=metric)[0]
        ax.fill_between(by_eps.min().index, by_eps.min(), by_eps.max(), alpha=0.2,
                        color=line.get_color())  # fmt: skip
        bias = table[
            (table["query"] == query.name) & (table["stat"] == f"bias|{metric}:median_abs_error")
        ]
        if not bias.empty and bias["value"].iloc[0] > 0:
            ax.axhline(bias["value"].iloc[0], linestyle="--", color=line.get_color(), alpha=0.7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("epsilon (whole job)")
    ax.set_ylabel("median |released - true|")
    ax.set_title(f"{query.name}: error (dashed: bounding alone)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    if private:
        share = runs[runs["stat"] == "true_partitions_released_share"].groupby("epsilon")["value"]
        axes[1].plot(share.median().index, share.median(), marker="o", color="#228833")
        axes[1].set_xscale("log")
        axes[1].set_ylim(0, 1.05)
        axes[1].set_xlabel("epsilon (whole job)")
        axes[1].set_ylabel("share of true partitions released")
        axes[1].set_title("private partition selection", fontsize=10)
        axes[1].grid(alpha=0.3, which="both")
    fig.tight_layout()
    path = output / f"{query.name}_error.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def write_page(spec: JobSpec, table: pd.DataFrame, charts: dict[str, Path], output: Path) -> Path:
    summary = (
        table[table["epsilon"].notna()]
        .groupby(["query", "stat", "epsilon"])["value"]
        .median()
        .unstack("epsilon")
    )
    images = "".join(f'<h2>{name}</h2><img src="{path.name}">' for name, path in charts.items())
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>Accuracy of {spec.name}</title></head><body style='font-family:sans-serif'>"
        f"<h1>Accuracy of {spec.name} against epsilon</h1>"
        "<p>Synthetic or non-sensitive data only: this page shows errors against TRUE values."
        "</p>" + images + "<h2>Medians over repeats</h2>" + summary.to_html(float_format="%.4g")
        + "</body></html>"
    )  # fmt: skip
    index = output / "index.html"
    index.write_text(page)
    return index
