"""`dppipeline report RELEASE`: one self-contained HTML page (and its PNG charts) per release.

Built from the release folder and the ledger only, so it shows nothing that is not already
released or public: the manifest's parameters and noise scales, the released values (as
histograms, and their first rows), the intervals the release itself carries, and the budget
the ledger records for the release's scope. No input is read, no statistic of the input is
computed; every number on the page is copied from one of those sources.
"""

from __future__ import annotations

import base64
import html
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from dppipeline.core.manifest import Manifest, MetricEntry, QueryEntry
from dppipeline.errors import UsageError
from dppipeline.ledger import BudgetPolicy, Ledger, LedgerRow
from dppipeline.lifecycle.manifests import read_manifest
from dppipeline.reports.budget_views import spend_curve
from dppipeline.reports.charts import day_axis, pyplot
from dppipeline.storage import Location
from dppipeline.storage.releases import release_folder

PREVIEW_ROWS = 10  # released rows shown per dataset
METRIC_COLUMNS = ("count", "sum", "mean", "variance", "stddev", "privacy_id_count")


def fmt(value: Any) -> str:
    """Every number on the page goes through here (so tests can recognise them)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def load_release(release: str | Path) -> tuple[Manifest, dict[str, pd.DataFrame]]:
    """The manifest and every query's released rows (on a store: of the run `RELEASE.json`
    names)."""
    manifest = read_manifest(release)
    folder = release_folder(release)
    datasets = {}
    for name, query in manifest.queries.items():
        fs, path = folder.join(query.dataset).filesystem()
        datasets[name] = pd.read_parquet(path, filesystem=fs)
    return manifest, datasets


def ledger_rows(url: str | None, run_id: str) -> tuple[str | None, list[LedgerRow], BudgetPolicy]:
    """(scope, its rows, its stored cap) of the ledger row of this run; (None, [], no cap)
    without a ledger."""
    if url is None:
        return None, [], BudgetPolicy()
    book = Ledger(url)
    try:
        mine = [r for r in book.rows() if r.run_id == run_id]
        if not mine:
            return None, [], BudgetPolicy()
        stored = book.cap(mine[0].scope)
        policy = stored.policy if stored is not None else BudgetPolicy()
        return mine[0].scope, book.rows(mine[0].scope), policy
    finally:
        book.close()


# ---------------------------------------------------------------------------------------------
# Charts


def histogram_chart(name: str, rows: pd.DataFrame, query: QueryEntry, output: Path) -> Path | None:
    """One panel per released metric: the histogram of released values, with the typical
    95% interval width drawn as a bar, so a reader sees noise against spread."""
    metrics = [m.column for m in query.metrics.values() if m.column in rows]
    if len(rows) < 2 or not metrics:
        return None
    plt = pyplot("report")
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), dpi=100)
    axes = [axes] if len(metrics) == 1 else list(axes)
    for ax, (metric, entry) in zip(axes, query.metrics.items(), strict=False):
        column = entry.column
        ax.hist(rows[column], bins=40, color="#4477aa", alpha=0.85)
        width = entry.ci95_half_width
        if width:  # the interval of one value, drawn at the middle of the released values
            top = ax.get_ylim()[1] * 1.18
            ax.set_ylim(top=top)
            center = float(rows[column].median())
            ax.errorbar([center], [top * 0.9], xerr=[[width], [width]], color="crimson", capsize=4)
            ax.annotate(
                "95% interval of one value", (center, top * 0.9), xytext=(0, 5),
                textcoords="offset points", ha="center", fontsize=7, color="crimson",
            )  # fmt: skip
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))
        ax.set_title(metric, fontsize=10)
        ax.set_xlabel("released value")
        ax.set_ylabel("partitions")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{name}: released values", fontsize=11)
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)
    return output


def budget_chart(manifest: Manifest, output: Path) -> Path:
    """Epsilon per query (its own mechanisms) and per shared selection."""
    plt = pyplot("report")
    labels, values = [], []
    for name, query in manifest.queries.items():
        labels.append(name)
        values.append(query.epsilon)
    for name, selection in manifest.selections.items():
        labels.append(f"selection {name}")
        values.append(selection.epsilon)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(labels) + 1.2), dpi=100)
    ax.barh(labels[::-1], values[::-1], color="#228833")
    ax.set_xlabel("epsilon")
    ax.set_title(f"Budget split (total epsilon {fmt(manifest.epsilon)})")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)
    return output


def spend_chart(
    scope: str, rows: list[LedgerRow], policy: BudgetPolicy, run_id: str, output: Path
) -> Path | None:
    """The scope's spend up to each release, as its cap counts it (and by sums where
    composition counts less)."""
    days, sums, spent = spend_curve(rows, replace(policy, window_days=None))
    if not days:
        return None
    plt = pyplot("report")
    fig, ax = plt.subplots(figsize=(8, 3.4), dpi=100)
    ax.step(days, spent, where="post", marker="o", markersize=3, label="spent")
    if sums != spent:
        ax.step(days, sums, where="post", linestyle=":", label="by sums (basic composition)")
    mine = [r for r in rows if r.run_id == run_id]
    if mine:
        ax.axvline(mine[0].end_date, color="crimson", linestyle="--", label="this release")
    ax.legend(fontsize=8)
    day_axis(ax, days)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("last data day of the release")
    ax.set_ylabel("epsilon of all releases")
    ax.set_title(f"Budget spent in scope {scope}")
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)
    return output


# ---------------------------------------------------------------------------------------------
# The page


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(fmt(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _image(path: Path | None) -> str:
    if path is None:
        return ""
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _query_section(name: str, query: QueryEntry, rows: pd.DataFrame, chart: Path | None) -> str:
    selection = query.partition_selection
    bounds = query.bounds
    params = [
        ["partition_by", ", ".join(query.partition_by) or "(global total)"],
        ["filter", query.filter or "(all rows)"],
        ["value", query.value],
        *(
            [["max_contributions (rows per privacy unit)", bounds.max_contributions]]
            if bounds.max_contributions is not None
            else [
                ["max_partitions_contributed (L0)", bounds.max_partitions_contributed],
                ["max_contributions_per_partition (Linf)", bounds.max_contributions_per_partition],
            ]
        ),
        ["min_value", bounds.min_value],
        ["max_value", bounds.max_value],
        ["partition selection", selection.type],
        ["epsilon (this query's share)", query.epsilon],
        ["delta (this query's share)", query.delta],
        ["released partitions", query.released_partitions],
    ]
    metrics = [
        [
            metric,
            entry.noise_stddev if entry.noise_stddev_bound is None else _bound_text(entry),
            entry.ci95_half_width,
            " / ".join((entry.confidence_interval or {}).get("columns", [])) or "-",
        ]
        for metric, entry in query.metrics.items()
    ]
    preview = rows.head(PREVIEW_ROWS)
    preview_rows = [[_cell(v) for v in record] for record in preview.itertuples(index=False)]
    return (
        f"<h2>{html.escape(name)}</h2>"
        + _table(["parameter", "value"], params)
        + "<h3>Noise per released value</h3>"
        + _table(["metric", "noise std", "95% half-width", "interval columns"], metrics)
        + _image(chart)
        + f"<h3>First {len(preview)} released rows</h3>"
        + _table(list(preview.columns), preview_rows)
    )


def _bound_text(entry: MetricEntry) -> str:
    """Mean and variance: the manifest's bound on their noise std, for partitions of n rows."""
    bound = entry.noise_stddev_bound or {}
    at = "; ".join(
        f"{fmt(std)} at n={fmt(n)}" for n, std in zip(bound["n"], bound["stddev"], strict=True)
    )
    return f"at most {fmt(bound['stddev_times_n_for_large_n'])} / n for n rows ({at})"


def _cell(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars -> Python, so fmt formats them
        return value.item()
    return value.isoformat() if hasattr(value, "isoformat") else value


_STYLE = """
body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1em}td,th{border:1px solid #ccc;padding:3px 8px;
font-size:13px;text-align:left}th{background:#f0f0f0}img{max-width:100%;display:block;
margin:0.5em 0}.note{color:#555;font-size:13px}
"""


def build_report(release: str | Path, ledger: str | None, output: str | Path | None) -> Path:
    """Writes `index.html` (charts embedded) and the PNG charts; returns the page's path."""
    where = Location.of(release)
    manifest, datasets = load_release(release)
    if where.is_local:
        local = where.path
        target = Path(output) if output else local.parent / f"{local.name}_report"
        if target.resolve() == local.resolve() or local.resolve() in target.resolve().parents:
            raise UsageError(
                f"--output: {target} is inside the release; write the report beside it"
            )
    else:  # a release on a store: the report is written on local disk
        target = Path(output) if output else Path(f"{where.name}_report")
    target.mkdir(parents=True, exist_ok=True)
    scope, rows, policy = ledger_rows(ledger, manifest.run_id)
    budget_png = budget_chart(manifest, target / "budget_split.png")
    spend_png = spend_chart(scope, rows, policy, manifest.run_id, target / "ledger_spend.png")
    sections = []
    for name, query in manifest.queries.items():
        chart = histogram_chart(name, datasets[name], query, target / f"{name}.png")
        sections.append(_query_section(name, query, datasets[name], chart))
    job = [
        ["job", manifest.job],
        ["run_id", manifest.run_id],
        ["created_at", manifest.created_at],
        ["engine", manifest.engine],
        ["privacy unit", manifest.privacy_unit],
        ["epsilon (job)", manifest.epsilon],
        ["delta (job)", manifest.delta],
        ["noise", manifest.noise],
        ["data days", f"{manifest.input.start_date} to {manifest.input.end_date}"],
        ["released partitions (all queries)", manifest.released_partitions],
    ]
    ledger_part = (
        f"<h2>Ledger: scope {html.escape(scope)}</h2>"
        + _image(spend_png)
        + _table(
            ["run", "state", "data days", "epsilon", "delta"],
            [
                [r.run_id, r.state, f"{r.start_date} to {r.end_date}", r.epsilon, r.delta]
                for r in rows
            ],
        )
        if scope
        else '<p class="note">No ledger row for this run (released with --no-ledger).</p>'
    )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>DP release {html.escape(manifest.job)}</title><style>{_STYLE}</style>"
        "</head><body>"
        f"<h1>DP release: {html.escape(manifest.job)}</h1>"
        '<p class="note">Built from the release and the ledger only: every value here is '
        "released already or a public parameter. Intervals cover the value after "
        "contribution bounding and clipping.</p>"
        + _table(["", ""], job)
        + "<h2>Budget split</h2>"
        + _image(budget_png)
        + ledger_part
        + "".join(sections)
        + "</body></html>"
    )
    index = target / "index.html"
    index.write_text(page)
    return index
