"""`dppipeline budget show | history | plot`: what the ledger says, for people.

Everything shown is already in the ledger: budget spent by releases (public parameters), never
data. The chart is drawn with matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from dppipeline.charts import day_axis, pyplot
from dppipeline.ledger import BudgetPolicy, Ledger, LedgerRow

SPENDING = ("reserved", "committed")


def _open(url: str) -> Ledger:
    return Ledger(url)


def show(url: str, scope: str | None, policy: BudgetPolicy | None) -> str:
    ledger = _open(url)
    scopes = [scope] if scope else ledger.scopes()
    if not scopes:
        return f"ledger {ledger.path}: no releases yet"
    lines = [f"ledger {ledger.path} (schema v{ledger.schema_version})"]
    header = f"  {'scope':40} {'releases':>8} {'epsilon':>10} {'delta':>10}  cap"
    lines.append(header)
    for name in scopes:
        rows = [r for r in ledger.rows(name) if r.state in SPENDING]
        eps, delta = sum(r.epsilon for r in rows), sum(r.delta for r in rows)
        cap = "-"
        if policy is not None:
            today = max((r.end_date for r in rows), default=dt.date.today())
            used_eps, used_delta = ledger.spent(name, policy, today, today)
            cap = policy.describe()
            if policy.cap_epsilon is not None:
                cap += f"; epsilon left {max(policy.cap_epsilon - used_eps, 0):g}"
            if policy.cap_delta is not None:
                cap += f", delta left {max(policy.cap_delta - used_delta, 0):g}"
        lines.append(f"  {name:40} {len(rows):>8} {eps:>10.4g} {delta:>10.3g}  {cap}")
    return "\n".join(lines)


def history(url: str, scope: str | None) -> str:
    ledger = _open(url)
    rows = ledger.rows(scope)
    if not rows:
        return f"ledger {ledger.path}: no releases yet"
    lines = [
        f"{'id':>4} {'state':9} {'scope':28} {'job':16} {'data':23} {'epsilon':>8} "
        f"{'delta':>9} {'reserved at':25} run / output"
    ]
    for r in rows:
        lines.append(
            f"{r.id:>4} {r.state:9} {r.scope[:28]:28} {r.job[:16]:16} "
            f"{r.start_date}..{r.end_date} {r.epsilon:>8.4g} {r.delta:>9.3g} "
            f"{r.reserved_at:25} {r.run_id} {r.output}" + (f" ({r.note})" if r.note else "")
        )
    return "\n".join(lines)


def cumulative(rows: list[LedgerRow]) -> tuple[list[dt.date], list[float]]:
    """Cumulative epsilon of the spending releases, ordered by their last data day."""
    spending = sorted((r for r in rows if r.state in SPENDING), key=lambda r: (r.end_date, r.id))
    days, totals, total = [], [], 0.0
    for r in spending:
        total += r.epsilon
        days.append(r.end_date)
        totals.append(total)
    return days, totals


def windowed(rows: list[LedgerRow], window_days: int) -> tuple[list[dt.date], list[float]]:
    """Epsilon spent by releases touching the window of `window_days` data days that ends on
    each release's last day: what a rolling-window cap limits."""
    spending = [r for r in rows if r.state in SPENDING]
    days = sorted({r.end_date for r in spending})
    totals = []
    for day in days:
        start = day - dt.timedelta(days=window_days - 1)
        totals.append(
            sum(r.epsilon for r in spending if r.start_date <= day and r.end_date >= start)
        )
    return days, totals


def plot(url: str, output: str | Path, scope: str | None, policy: BudgetPolicy | None) -> Path:
    plt = pyplot("budget plot")
    ledger = _open(url)
    scopes = [scope] if scope else ledger.scopes()
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    plotted: list[dt.date] = []
    window = policy.window_days if policy is not None else None
    for name in scopes:
        rows = ledger.rows(name)
        days, totals = windowed(rows, window) if window else cumulative(rows)
        plotted += days
        if days:
            ax.step(days, totals, where="post", marker="o", markersize=3, label=name)
    if policy is not None and policy.cap_epsilon is not None and not policy.window_days:
        ax.axhline(policy.cap_epsilon, color="crimson", linestyle="--", label="epsilon cap")
    elif policy is not None and policy.cap_epsilon is not None:
        ax.axhline(
            policy.cap_epsilon,
            color="crimson",
            linestyle="--",
            label=f"epsilon cap per {policy.window_days} days",
        )
    day_axis(ax, plotted)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("last data day of the release")
    ax.set_ylabel(
        f"epsilon in the last {window} days of data"
        if window
        else "cumulative epsilon (basic composition)"
    )
    ax.set_title("Privacy budget spent" + (f": {scope}" if scope else ""))
    ax.grid(alpha=0.3)
    if scopes:
        ax.legend(loc="upper left", fontsize=8)
    fig.autofmt_xdate()
    fig.tight_layout()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output)
    plt.close(fig)
    return output
