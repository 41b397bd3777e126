"""`dppipeline evaluate`: how accurate a job is at several epsilons, on NON-SENSITIVE data only.

Choosing epsilon and bounds needs error figures, and error figures need true values. True
values are not private, so this command refuses to run unless the user states that the input
is synthetic or otherwise not sensitive (`--data-is-not-sensitive`), and its output (tables,
charts, page) must be treated like the data itself.

It runs the job (every query) at each epsilon, `repeats` times, with the job's own engine code
(`runner.run_job`), so what is measured is what `run` would release. The runs are experiments,
never releases: they go to scratch folders under the output folder and are recorded in no
ledger. Each release is compared with the *raw* truth of the same validated rows (filter and
keys only: no contribution bounding, no clipping), so the error covers both what the bounds
cost and what the noise costs; the `bounding_*` rows give the first part alone (one sample of
the exact bounded aggregates, no noise) and the `noise_median_abs` rows the second (expected,
from the plan's public noise parameters), so the user sees which one to act on.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl

from dppipeline.core.intervals import half_width, sum_half_width
from dppipeline.core.plan import BudgetPlan
from dppipeline.core.tasks import (
    AggregationTask,
    canonical_keys,
    covered_days,
    job_task,
    public_key_set,
)
from dppipeline.engines.in_process import (
    bounded_aggregates,
    filtered_rows,
    key_columns,
    validated_rows,
)
from dppipeline.errors import UsageError
from dppipeline.inputs.files import DailyPartition
from dppipeline.lifecycle.public_keys import read_key_files
from dppipeline.lifecycle.runner import input_days, make_plan, run_job
from dppipeline.reports.charts import pyplot
from dppipeline.spec.metrics import distinct_column_of, metric_column, percentile_of
from dppipeline.spec.model import JobSpec, QuerySpec
from dppipeline.storage.releases import MANIFEST_NAME

NOT_SENSITIVE_FLAG = "--data-is-not-sensitive"
DEFAULT_EPSILONS = (0.1, 0.3, 1.0, 3.0, 10.0)
DEFAULT_REPEATS = 3
CSV_COLUMNS = ["query", "metric", "epsilon", "repeat", "stat", "value"]
SELECTION = "partition_selection"  # the `metric` of the partition-selection rows
# Metrics whose bounded value (no noise) the local engine's exact aggregates give directly.
BOUNDED_METRICS = ("count", "sum", "mean", "privacy_id_count")
# Metrics that are 0, not undefined, on a partition without rows (and count_distinct_COLUMN).
ZERO_WHEN_EMPTY = ("count", "sum", "privacy_id_count")


def _zero_when_empty(columns: Sequence[str]) -> list[str]:
    return [c for c in columns if c in ZERO_WHEN_EMPTY or c.startswith("count_distinct_")]


RUNS_NOTE = (
    "Scratch runs of `dppipeline evaluate`: experiments on non-sensitive data, NOT releases.\n"
    "They are recorded in no budget ledger and must never be published.\n"
)


@dataclass(frozen=True)
class Evaluation:
    """What `evaluate` wrote: the tidy table and where each file is."""

    table: pd.DataFrame
    csv: Path
    json: Path
    charts: dict[str, Path]
    page: Path
    runs: Path


def refuse_unless_not_sensitive(confirmed: bool) -> None:
    """The command computes and prints true values: without the user's explicit statement
    that the data is not sensitive it must do nothing at all (not even create folders)."""
    if not confirmed:
        raise UsageError(
            f"evaluate computes and shows TRUE values, so it runs only on synthetic or "
            f"otherwise non-sensitive data; say so with {NOT_SENSITIVE_FLAG}"
        )


def parse_epsilons(text: str) -> list[float]:
    """`0.1,0.3,1` -> [0.1, 0.3, 1.0], sorted and without duplicates (charts need an order)."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--epsilons: not a comma list of numbers: {text!r}") from None
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
        raise UsageError(f"--epsilons: needs numbers > 0, got {text!r}")
    return sorted(set(values))


def check_arguments(spec: JobSpec, output: Path, epsilons: Sequence[float], repeats: int) -> None:
    """Fails before any work: no input, nonsense counts, or an output that is a release (the
    scratch runs and tables must never mix with something that may be published)."""
    if spec.input.path is None:
        raise UsageError("--input: required (or input.path in the job spec)")
    if repeats < 1:
        raise UsageError(f"--repeats: must be >= 1, got {repeats}")
    if not epsilons or any(not e > 0 for e in epsilons):
        raise UsageError("--epsilons: needs numbers > 0")
    if (output / MANIFEST_NAME).exists():
        raise UsageError(f"--output: {output} holds a release; give evaluate its own folder")


# ---------------------------------------------------------------------------------------------
# True values and the error statistics


def read_rows(spec: JobSpec, days: Sequence[DailyPartition]) -> pl.DataFrame:
    """The rows every engine keeps: read and validated by the same rules, so the truth is
    computed over exactly what the released values were computed from."""
    return validated_rows(spec, days, [job_task(spec, q) for q in spec.queries])


def true_values(
    rows: pl.DataFrame, task: AggregationTask, query: QuerySpec, unit: str
) -> pd.DataFrame:
    """Per partition with rows, the raw truth of every metric the query releases: the query's
    filter and keys only (`task`, its engine task), no contribution bounding and no clipping
    (what a non-private group-by would say), keyed like the release."""
    rows = filtered_rows(rows, task)
    aggregates = [
        pl.len().cast(pl.Float64).alias("count"),
        pl.col(unit).n_unique().cast(pl.Float64).alias("privacy_id_count"),
    ]
    value = pl.col(query.value).cast(pl.Float64)
    if task.clip is not None:  # else the value column was not read: nothing uses it
        aggregates += [
            value.sum().alias("sum"),
            value.mean().alias("mean"),
            value.var(ddof=0).alias("variance"),
            value.std(ddof=0).alias("stddev"),
            value.max().alias("max"),
            value.min().alias("min"),
        ]
    for metric in query.metrics:
        p = percentile_of(metric)
        if p is not None:
            aggregates.append(
                value.quantile(p / 100, interpolation="linear").alias(metric_column(metric))
            )
        column = distinct_column_of(metric)
        if column is not None:
            aggregates.append(
                pl.col(column).drop_nulls().n_unique().cast(pl.Float64).alias(metric_column(metric))
            )
    keys = key_columns(task)
    if keys:
        truth = rows.group_by(keys).agg(aggregates).to_pandas()
    else:
        truth = rows.select(aggregates).to_pandas()
    return canonical_keys(truth, task.keys)


def on_public_keys(frame: pd.DataFrame, public: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """`frame` restricted and extended to the public key set: a listed key without rows has a
    true count and sum of 0 (its mean is undefined), an unlisted key is never released."""
    aligned = public[keys].merge(frame, on=keys, how="left")
    for column in _zero_when_empty(list(aligned.columns)):
        aligned[column] = aligned[column].fillna(0.0)
    return aligned


def error_stats(
    estimate: pd.DataFrame, truth: pd.DataFrame, keys: list[str], metrics: Sequence[str]
) -> dict[str, dict[str, float]]:
    """Per metric: median and mean |estimate - truth| and the median of |error| / max(|truth|,
    1) (relative, but not exploding on tiny partitions), over the partitions both have where
    the truth is defined (a mean of no rows is not)."""
    if keys:
        merged = truth.merge(estimate, on=keys, how="inner", suffixes=("_true", ""))
    else:
        merged = estimate.reset_index(drop=True).join(truth.reset_index(drop=True), rsuffix="_true")
    out: dict[str, dict[str, float]] = {}
    for metric in metrics:
        column = metric_column(metric)
        if column not in merged or f"{column}_true" not in merged:
            continue
        pair = merged[[column, f"{column}_true"]].astype("float64").dropna()
        if pair.empty:
            continue
        true = pair[f"{column}_true"].to_numpy()
        error = np.abs(pair[column].to_numpy() - true)
        out[metric] = {
            "median_abs_error": float(np.median(error)),
            "mean_abs_error": float(np.mean(error)),
            "median_rel_error": float(np.median(error / np.maximum(np.abs(true), 1.0))),
        }
    return out


def selection_stats(released: pd.DataFrame, truth: pd.DataFrame, keys: list[str]) -> dict:
    """Private selection: the share of true partitions (keys with rows) released, and the
    number of released keys that have no rows at all, which must be 0: a key only the noise
    could have invented would reveal nothing, but one that is not in the data at all means
    the selection is broken."""
    true_keys = set(map(tuple, truth[keys].to_numpy().tolist()))
    released_keys = set(map(tuple, released[keys].to_numpy().tolist()))
    return {
        "true_partitions": float(len(true_keys)),
        "partitions_released": float(len(released_keys)),
        "true_partitions_released_share": (
            len(released_keys & true_keys) / len(true_keys) if true_keys else math.nan
        ),
        "released_not_in_truth": float(len(released_keys - true_keys)),
    }


def bounded_values(
    rows: pl.DataFrame, task: AggregationTask, unit: str, public: pd.DataFrame | None
) -> pd.DataFrame:
    """One sample of the exact aggregates after contribution bounding and clipping, with no
    noise: what the noise is added to. Same code as the local engine (unlisted public keys
    dropped before bounding, as it does)."""
    exact = bounded_aggregates(rows, replace(task, public_keys=public), unit, seed=0)
    exact = exact.astype({"count": "float64", "sum": "float64", "privacy_id_count": "float64"})
    exact["mean"] = (exact["sum"] / exact["count"]).where(exact["count"] > 0)
    return exact


def bounding_stats(
    rows: pl.DataFrame,
    task: AggregationTask,
    *,
    query: QuerySpec,
    truth: pd.DataFrame,
    unit: str,
    public: pd.DataFrame | None,
) -> dict[str, dict[str, float]]:
    """Error of bounding alone (bounded truth vs raw truth): the floor that more epsilon
    cannot lower, which only looser bounds can. A partition bounding empties counts as 0."""
    keys = task.key_names
    bounded = bounded_values(rows, task, unit, public if keys else None)
    if keys:
        bounded = truth[keys].merge(bounded, on=keys, how="left")
        for column in _zero_when_empty(list(bounded.columns)):
            bounded[column] = bounded[column].fillna(0.0)
    metrics = [
        m for m in query.metrics if m in BOUNDED_METRICS or distinct_column_of(m) is not None
    ]
    return error_stats(bounded, truth, keys, metrics)


def noise_median_abs(plan: BudgetPlan, metric: str, noise: str) -> float | None:
    """Expected median |noise| of a metric, from the plan's public parameters: the part of
    the error that epsilon controls. It is the half-width of the 50% noise interval: Laplace
    |X| has median b ln 2, Gaussian |X| 0.6745 sd, and the sum a job with mean releases (the
    centred sum plus midpoint x the count's noise) the closed form of `core.intervals`."""
    if plan.metric_noise_stddev(metric) is None:
        return None
    if metric == "sum" and plan.has("centred_sum"):
        return sum_half_width(
            plan.mechanism("centred_sum"), plan.mechanism("count"), plan.params.midpoint, 0.5
        )
    return half_width(plan.mechanism(metric_column(metric)), 0.5)


# ---------------------------------------------------------------------------------------------
# The runs


def _rows(query: str, metric: str, epsilon: float | None, repeat: int | None, stats: dict):
    return [
        {"query": query, "metric": metric, "epsilon": epsilon, "repeat": repeat, "stat": k,
         "value": v}
        for k, v in stats.items()
    ]  # fmt: skip


def run_dir(runs: Path, epsilon: float, repeat: int) -> Path:
    """Scratch folder of one run; its release is `<run_dir>/release/<query>`."""
    return runs / f"epsilon_{epsilon:g}_run_{repeat}"


def measure_run(
    spec: JobSpec,
    release: Path,
    truths: dict[str, pd.DataFrame],
    epsilon: float,
    repeat: int,
) -> list[dict]:
    """Error rows of one run, per query: every metric against the truth, and under private
    selection the released share and the keys outside the truth."""
    records: list[dict] = []
    for query in spec.queries:
        task = job_task(spec, query)
        keys = task.key_names
        released = canonical_keys(pd.read_parquet(release / query.name), task.keys)
        truth = truths[query.name]
        for metric, stats in error_stats(released, truth, keys, query.metrics).items():
            records += _rows(query.name, metric, epsilon, repeat, stats)
        if not query.is_public:
            stats = selection_stats(released, truth, keys)
            records += _rows(query.name, SELECTION, epsilon, repeat, stats)
    return records


def truths_and_bounding(
    spec: JobSpec, rows: pl.DataFrame, days: Sequence[DailyPartition]
) -> tuple[dict[str, pd.DataFrame], list[dict]]:
    """Per query the raw truth, on the public key set when there is one (that is what the
    release covers), and the rows of the error bounding alone causes."""
    unit = spec.privacy_unit
    truths: dict[str, pd.DataFrame] = {}
    records: list[dict] = []
    key_files = read_key_files(spec)
    for query in spec.queries:
        task = job_task(spec, query)
        truth = true_values(rows, task, query, unit)
        public = (
            public_key_set(query, task.keys, covered_days(spec, days), key_files)
            if query.is_public and task.keys
            else None
        )
        if public is not None:
            truth = on_public_keys(truth, public, task.key_names)
        truths[query.name] = truth
        for metric, stats in bounding_stats(
            rows, task, query=query, truth=truth, unit=unit, public=public
        ).items():
            renamed = {f"bounding_{k}": v for k, v in stats.items()}
            records += _rows(query.name, metric, None, None, renamed)
    return truths, records


def noise_rows(spec: JobSpec) -> list[dict]:
    """The expected median |noise| of every additive metric at the spec's epsilon: public
    parameters, so it costs nothing and needs no run."""
    plan = make_plan(spec)
    records: list[dict] = []
    for query in spec.queries:
        for metric in query.metrics:
            expected = noise_median_abs(plan.query(query.name).plan, metric, spec.noise)
            if expected is not None:
                stats = {"noise_median_abs": expected}
                records += _rows(query.name, metric, spec.budget.epsilon, None, stats)
    return records


def evaluate(
    spec: JobSpec,
    output: Path,
    *,
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
    repeats: int = DEFAULT_REPEATS,
    engine: str = "local",
    progress: Callable[[str], None] = print,
) -> Evaluation:
    """Runs the job at each epsilon (the spec's delta kept) `repeats` times into scratch
    folders without a ledger, measures each run against the raw truth, and writes
    evaluation.csv, evaluation.json, one chart per query and index.html into `output`."""
    output = Path(output)
    epsilons = sorted(set(epsilons))
    check_arguments(spec, output, epsilons, repeats)
    make_plan(spec)  # a bad job fails here, before anything is read or written
    days = input_days(spec)
    rows = read_rows(spec, days)
    truths, records = truths_and_bounding(spec, rows, days)
    runs = output / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    (runs / "README.txt").write_text(RUNS_NOTE)
    total = len(epsilons) * repeats
    for i, epsilon in enumerate(epsilons):
        # An experiment: no ledger, so no scope or cap either (they govern a ledger).
        budget = spec.budget.model_copy(
            update={
                "epsilon": epsilon,
                "scope": None,
                "cap_epsilon": None,
                "cap_delta": None,
                "window_days": None,
            }
        )
        run_spec = spec.model_copy(update={"budget": budget})
        records += noise_rows(run_spec)
        for repeat in range(1, repeats + 1):
            folder = run_dir(runs, epsilon, repeat)
            result = run_job(
                run_spec.model_copy(update={"output": str(folder / "release")}),
                engine,
                overwrite=True,
                echo=lambda _line: None,
                ledger=None,  # an experiment: never spends a real budget, never a release
            )
            found = measure_run(spec, result.output, truths, epsilon, repeat)
            records += found
            progress(_progress_line(i * repeats + repeat, total, epsilon, repeat, found))
    table = pd.DataFrame.from_records(records, columns=CSV_COLUMNS)
    csv = output / "evaluation.csv"
    table.to_csv(csv, index=False)
    json_path = write_json(spec, table, output, epsilons=epsilons, repeats=repeats, engine=engine)
    charts = {q.name: error_chart(table, q, output) for q in spec.queries}
    page = write_page(
        spec, table, charts, output, epsilons=epsilons, repeats=repeats, engine=engine
    )
    return Evaluation(table, csv, json_path, charts, page, runs)


def _progress_line(done: int, total: int, epsilon: float, repeat: int, found: list[dict]) -> str:
    """One stderr line per run: where it is, and the first query's median |error|s."""
    first = found[0]["query"] if found else ""
    errors = ", ".join(
        f"{r['metric']} {r['value']:.3g}"
        for r in found
        if r["query"] == first and r["stat"] == "median_abs_error"
    )
    return (
        f"[evaluate] run {done}/{total}: epsilon={epsilon:g} repeat {repeat}: "
        f"{first} median |error| {errors}"
    )


# ---------------------------------------------------------------------------------------------
# Summaries: JSON, charts, page


def summarise(table: pd.DataFrame) -> pd.DataFrame:
    """Median, min and max over repeats per query, metric, stat and epsilon."""
    runs = table[table["repeat"].notna()]
    return (
        runs.groupby(["query", "metric", "stat", "epsilon"], sort=False)["value"]
        .agg(["median", "min", "max"])
        .reset_index()
    )


def write_json(
    spec: JobSpec,
    table: pd.DataFrame,
    output: Path,
    *,
    epsilons: Sequence[float],
    repeats: int,
    engine: str,
) -> Path:
    """The parameters, per query the summaries and the bounding and noise parts, and every
    row of the CSV: for scripts that pick epsilon and bounds."""
    summary = summarise(table)
    queries: dict[str, dict] = {}
    for query in spec.queries:
        mine = table[table["query"] == query.name]
        parts = mine[mine["repeat"].isna()]
        queries[query.name] = {
            "partition_selection": "public" if query.is_public else "private",
            "metrics": list(query.metrics),
            "bounding": {
                m: dict(zip(g["stat"], g["value"], strict=True))
                for m, g in parts[parts["epsilon"].isna()].groupby("metric")
            },
            "noise_median_abs": {
                m: {f"{e:g}": v for e, v in zip(g["epsilon"], g["value"], strict=True)}
                for m, g in parts[parts["stat"] == "noise_median_abs"].groupby("metric")
            },
            "over_repeats": summary[summary["query"] == query.name]
            .drop(columns="query")
            .to_dict(orient="records"),
        }
    document = {
        "job": spec.name,
        "warning": "computed from TRUE values: as sensitive as the input data",
        "engine": engine,
        "epsilons": list(epsilons),
        "delta": spec.budget.delta,
        "noise": spec.noise,
        "repeats": repeats,
        "queries": queries,
        "rows": json.loads(table.to_json(orient="records")),
    }
    path = output / "evaluation.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    return path


def error_chart(table: pd.DataFrame, query: QuerySpec, output: Path) -> Path:
    """One PNG per query: median |error| against epsilon (log-log, one line per metric, median
    over repeats with a min-max band; dashed: bounding alone, dotted: expected noise alone),
    the median relative error likewise, and under private selection the share of true
    partitions released."""
    plt = pyplot("evaluate")
    mine = table[table["query"] == query.name]
    runs = mine[mine["repeat"].notna()]
    private = not query.is_public
    panels = 3 if private else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.3), dpi=100, sharex=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    metrics = [m for m in query.metrics if not runs[runs["metric"] == m].empty]
    for n, metric in enumerate(metrics):
        colour = colours[n % len(colours)]
        for ax, stat in zip(axes[:2], ("median_abs_error", "median_rel_error"), strict=True):
            _band(ax, runs[(runs["metric"] == metric) & (runs["stat"] == stat)], colour, metric)
        floor = mine[(mine["metric"] == metric) & (mine["stat"] == "bounding_median_abs_error")]
        if not floor.empty and floor["value"].iloc[0] > 0:
            axes[0].axhline(floor["value"].iloc[0], linestyle="--", color=colour, alpha=0.8)
        noise = mine[(mine["metric"] == metric) & (mine["stat"] == "noise_median_abs")]
        if not noise.empty:
            axes[0].plot(noise["epsilon"], noise["value"], linestyle=":", color=colour)
    axes[0].plot([], [], "k--", label="bounding alone")
    axes[0].plot([], [], "k:", label="noise alone (expected)")
    axes[0].fill_between([], [], [], color="grey", alpha=0.3, label="min-max over repeats")
    titles = ("median |released - true|", "median |released - true| / max(true, 1)")
    for ax, title in zip(axes[:2], titles, strict=True):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("epsilon (whole job)")
        ax.set_ylabel(title)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_title(f"{query.name}: absolute error per partition", fontsize=10)
    axes[1].set_title(f"{query.name}: relative error per partition", fontsize=10)
    if private:
        selection = runs[runs["metric"] == SELECTION]
        share = selection[selection["stat"] == "true_partitions_released_share"]
        _band(axes[2], share, "#228833", "share released")
        axes[2].set_xscale("log")
        axes[2].set_ylim(0, 1.05)
        axes[2].set_xlabel("epsilon (whole job)")
        axes[2].set_ylabel("share of true partitions released")
        axes[2].set_title(f"{query.name}: private partition selection", fontsize=10)
        axes[2].grid(alpha=0.3, which="both")
    fig.suptitle("Synthetic / non-sensitive data only: errors against TRUE values", fontsize=9)
    # One legend for all panels, below them: inside an axis it would hide lines.
    handles, labels = axes[0].get_legend_handles_labels()
    if private:
        more = axes[2].get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path = output / f"{query.name}_error.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def _band(ax, rows: pd.DataFrame, colour: str, label: str) -> None:
    """Median over repeats as a line, min to max as a shaded band."""
    if rows.empty:
        return
    by_eps = rows.groupby("epsilon")["value"]
    ax.plot(by_eps.median().index, by_eps.median(), marker="o", color=colour, label=label)
    ax.fill_between(by_eps.min().index, by_eps.min(), by_eps.max(), color=colour, alpha=0.2)


def write_page(
    spec: JobSpec,
    table: pd.DataFrame,
    charts: dict[str, Path],
    output: Path,
    *,
    epsilons: Sequence[float],
    repeats: int,
    engine: str,
) -> Path:
    """index.html beside the charts (relative image paths, no external files): the
    parameters, each query's chart, and the medians over repeats per epsilon."""
    summary = summarise(table)
    wide = (
        summary.pivot_table(
            index=["query", "metric", "stat"], columns="epsilon", values="median", sort=False
        )
        if not summary.empty
        else pd.DataFrame()
    )
    parts = table[table["repeat"].isna()]
    bounding = parts[parts["epsilon"].isna()].pivot_table(
        index=["query", "metric"], columns="stat", values="value", sort=False
    )
    noise = parts[parts["stat"] == "noise_median_abs"].pivot_table(
        index=["query", "metric"], columns="epsilon", values="value", sort=False
    )
    charts_html = "".join(
        f"<h2>{html.escape(name)}</h2><img src='{html.escape(path.name)}' "
        f"alt='error against epsilon for {html.escape(name)}' style='max-width:100%'>"
        for name, path in charts.items()
    )
    eps_text = ", ".join(f"{e:g}" for e in epsilons)
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>Accuracy of {html.escape(spec.name)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;"
        "font-size:0.85em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
        ".warn{background:#fff3cd;padding:0.6em;border:1px solid #e0c060}</style></head><body>"
        f"<h1>Accuracy of {html.escape(spec.name)} against epsilon</h1>"
        "<p class='warn'>Synthetic or non-sensitive data only: this page shows errors against "
        "TRUE values. The runs behind it are experiments, recorded in no ledger.</p>"
        f"<p>epsilons {eps_text}; delta {spec.budget.delta:g}; noise {spec.noise}; "
        f"{repeats} repeat(s) each; engine {html.escape(engine)}. Errors are per partition, "
        "against the raw truth (no bounding, no clipping).</p>"
        + charts_html
        + "<h2>Medians over repeats, per epsilon</h2>"
        + wide.to_html(float_format="%.4g", na_rep="")
        + "<h2>Error of contribution bounding alone (no noise)</h2>"
        + bounding.to_html(float_format="%.4g", na_rep="")
        + "<h2>Expected median |noise| alone, per epsilon</h2>"
        + noise.to_html(float_format="%.4g", na_rep="")
        + "</body></html>\n"
    )
    path = output / "index.html"
    path.write_text(page)
    return path
