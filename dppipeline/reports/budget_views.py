"""`dppipeline budget show | history | plot | set-cap`: the ledger, for people and governance.

Everything shown is already in the ledger: budget spent by releases (public parameters), never
data. The chart is drawn with matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import socket
from pathlib import Path

from dppipeline.errors import UsageError
from dppipeline.ledger import CHARGED_STATES, BudgetPolicy, Ledger, LedgerRow, ScopeData
from dppipeline.ledger.caps import over_cap, spend_of, worst_spend, worst_window
from dppipeline.reports.charts import day_axis, pyplot
from dppipeline.spec.limits import MAX_SCOPE_CHARS

SPENDING = CHARGED_STATES  # what counts against a cap: reserved, reading, committed, failed


def _open(url: str) -> Ledger:
    return Ledger(url)


def set_cap(url: str, scope: str, policy: BudgetPolicy) -> str:
    """Stores a scope's cap (with a history row naming who changed it); one line saying so.
    The scope follows budget.scope's rule: no run could spend from a longer one."""
    if len(scope) > MAX_SCOPE_CHARS or not scope.isprintable():
        raise UsageError(
            f"scope: at most {MAX_SCOPE_CHARS} printable characters, got {len(scope):,} characters"
        )
    ledger = _open(url)
    try:
        change = ledger.set_cap(scope, policy, changed_by=f"budget set-cap by {_who()}")
        rows = [r for r in ledger.rows(scope) if r.charged]
    finally:
        ledger.close()
    line = (
        f"scope {scope!r}: {policy.describe()} (was: {change.previous}), recorded in ledger "
        f"{ledger.location}"
    )
    used = worst_spend(rows, policy)
    if over_cap(policy, used):
        line += f"; the scope is already OVER this cap ({used.describe()})"
    return line


def _data_line(data: ScopeData) -> str:
    """`2026-01-01..2026-01-30 (30 days, 30 files by content)`: the files recorded with the
    scope's charged releases; this data is refused in any other scope."""
    span = f"{data.first_day}..{data.last_day} " if data.first_day is not None else ""
    days = f"{data.days} days, " if data.days else ""
    return f"{span}({days}{data.files} files by content)"


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def show(url: str, scope: str | None, policy: BudgetPolicy | None) -> str:
    """Per scope: charged releases and their spend by sums and composed (at the cap's delta,
    or the delta the sums spend), its stored cap (or the --config one for a scope without a
    stored cap), what is left, a flag on any scope over its cap, and the data days its
    releases charged (by content: refused in any other scope)."""
    ledger = _open(url)
    try:
        scopes = [scope] if scope else ledger.scopes()
        if not scopes:
            return f"ledger {ledger.location}: no releases yet"
        stored = ledger.caps()
        data = ledger.scope_data()
        lines = [f"ledger {ledger.location} (schema v{ledger.schema_version})"]
        lines.append(
            f"  {'scope':32} {'releases':>8} {'epsilon':>10} {'delta':>10} {'composed':>10}"
            f" {'at delta':>10}  cap"
        )
        over = []
        for name in scopes:
            rows = [r for r in ledger.rows(name) if r.state in SPENDING]
            cap = stored[name].policy if name in stored else policy
            total = spend_of(rows, cap or BudgetPolicy())
            eps, delta = total.summed
            composed = "-" if total.composed is None else f"{total.composed:.4g}"
            text = "-"
            if cap is not None and cap.is_capped:
                text = cap.describe() + ("" if name in stored else " (--config; not stored)")
                today = max((r.end_date for r in rows), default=dt.date.today())
                latest = worst_window(rows, cap, today, today)  # what the next night meets
                if cap.cap_epsilon is not None:
                    text += f"; epsilon left {max(cap.cap_epsilon - latest.epsilon, 0):.4g}"
                if cap.cap_delta is not None:
                    text += f", delta left {max(cap.cap_delta - latest.summed[1], 0):g}"
                worst = worst_spend(rows, cap)
                if over_cap(cap, worst):
                    text += f"; OVER CAP ({worst.describe()} charged)"
                    over.append(name)
            failed = sum(r.state == "failed" for r in rows)
            if failed:
                text += f"; {failed} failed after reading (charged)"
            lines.append(
                f"  {name:32} {len(rows):>8} {eps:>10.4g} {delta:>10.3g} {composed:>10}"
                f" {total.delta:>10.3g}  {text}"
            )
        lines.append(
            "  epsilon, delta: basic composition (sums); composed: the releases' privacy "
            "events composed by privacy loss distributions, at that delta"
        )
        for name in scopes:
            if name in data:
                lines.append(f"  {name}: data charged {_data_line(data[name])}")
        if over:
            lines.append(f"OVER CAP: {', '.join(over)} (spent more than the cap now stored)")
        return "\n".join(lines)
    finally:
        ledger.close()


def history(url: str, scope: str | None) -> str:
    """Every reservation (with its state: committed, failed and reserved/reading are charged,
    aborted is not), then every cap change."""
    ledger = _open(url)
    try:
        rows = ledger.rows(scope)
        changes = ledger.cap_history(scope)
    finally:
        ledger.close()
    if not rows and not changes:
        return f"ledger {ledger.location}: no releases yet"
    lines = [
        f"{'id':>4} {'state':9} {'scope':28} {'job':16} {'data':23} {'epsilon':>8} "
        f"{'delta':>9} {'reserved at (UTC)':19} run / output / host"
    ]
    for r in rows:
        lines.append(
            f"{r.id:>4} {r.state:9} {r.scope[:28]:28} {r.job[:16]:16} "
            f"{r.start_date}..{r.end_date} {r.epsilon:>8.4g} {r.delta:>9.3g} "
            f"{r.reserved_at[:19]:19} {r.run_id} {r.output}"
            + (f" on {r.host_id or r.host}" if r.host_id or r.host else "")
            + (f" ({r.note})" if r.note else "")
        )
    if changes:
        lines += ["", "cap changes:"]
        for c in changes:
            lines.append(
                f"{c.id:>4} {c.changed_at[:19]:19} {c.scope[:28]:28} {c.policy.describe()} "
                f"(was: {c.previous}) by {c.changed_by}"
            )
    return "\n".join(lines)


def spend_curve(
    rows: list[LedgerRow], policy: BudgetPolicy
) -> tuple[list[dt.date], list[float], list[float]]:
    """(each release's last data day, epsilon by sums, epsilon as caps count it: the smaller of
    sums and composition) for all releases up to that day, or, with a rolling window, for the
    releases touching the window of `window_days` data days that ends there."""
    spending = sorted((r for r in rows if r.state in SPENDING), key=lambda r: (r.end_date, r.id))
    days = sorted({r.end_date for r in spending})
    sums, spent = [], []
    for day in days:
        inside = [r for r in spending if r.start_date <= day]
        if policy.window_days:
            start = day - dt.timedelta(days=policy.window_days - 1)
            inside = [r for r in inside if r.end_date >= start]
        total = spend_of(inside, policy)
        sums.append(total.summed[0])
        spent.append(min(total.summed[0], total.epsilon))
    return days, sums, spent


def plot(url: str, output: str | Path, scope: str | None, policy: BudgetPolicy | None) -> Path:
    plt = pyplot("budget plot")
    ledger = _open(url)
    scopes = [scope] if scope else ledger.scopes()
    stored = ledger.caps()
    if len(scopes) == 1 and scopes[0] in stored:
        policy = stored[scopes[0]].policy  # the governed cap wins over --config
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    plotted: list[dt.date] = []
    window = policy.window_days if policy is not None else None
    for name in scopes:
        days, sums, spent = spend_curve(ledger.rows(name), policy or BudgetPolicy())
        plotted += days
        if days:
            line = ax.step(days, spent, where="post", marker="o", markersize=3, label=name)
            if sums != spent:
                ax.step(
                    days, sums, where="post", linestyle=":", color=line[0].get_color(),
                    label=f"{name} by sums (basic composition)",
                )  # fmt: skip
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
        f"epsilon in the last {window} days of data" if window else "epsilon of all releases"
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
