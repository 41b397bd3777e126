"""Caps: how much a scope may spend, for all time or per rolling window of data days.

Composition is basic (sums of epsilon and delta), the accounting pipeline-dp's naive accountant
uses within a run. Every charged release counts: `reserved`, `reading`, `committed` and
`failed` (a run that read data and failed still spent its budget).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from dppipeline.errors import DPPipelineError

CAP_TOLERANCE = 1e-9  # relative: float sums of shares (0.1 + 0.2) must fit a cap of 0.3
CHARGED_STATES = ("reserved", "reading", "committed", "failed")


class BudgetExceededError(DPPipelineError):
    """The ledger refuses the spend (cap exhausted, or a spec that would change the scope's
    cap); nothing was read or spent (exit code 3: do not retry)."""

    exit_code = 3


@dataclass(frozen=True)
class BudgetPolicy:
    """A cap on a scope's total spend, for all time or per rolling window of data days."""

    cap_epsilon: float | None = None
    cap_delta: float | None = None
    window_days: int | None = None

    @property
    def is_capped(self) -> bool:
        return self.cap_epsilon is not None or self.cap_delta is not None

    @property
    def is_given(self) -> bool:
        """Does a job spec state any of the three fields?"""
        return self.is_capped or self.window_days is not None

    def describe(self) -> str:
        caps = []
        if self.cap_epsilon is not None:
            caps.append(f"epsilon {self.cap_epsilon:g}")
        if self.cap_delta is not None:
            caps.append(f"delta {self.cap_delta:g}")
        if not caps:
            return "no cap"
        span = f" per {self.window_days} days of data" if self.window_days else " for all time"
        return "cap " + ", ".join(caps) + span


class Spend(Protocol):
    """What a cap counts of a ledger row."""

    epsilon: float
    delta: float
    start_date: dt.date
    end_date: dt.date


def governed_policy(scope: str, stored: BudgetPolicy | None, requested: BudgetPolicy) -> bool:
    """Checks a job spec's cap fields against the scope's stored cap. Returns True when the
    spec's cap should be stored (the scope has none yet); raises BudgetExceededError when the
    spec states a field that differs from the stored cap: only `budget set-cap` changes it."""
    if not requested.is_given:
        return False
    if stored is None or not stored.is_capped:
        return requested.is_capped
    differences = [
        f"{name} {_show(mine)} (stored: {_show(theirs)})"
        for name, mine, theirs in (
            ("cap_epsilon", requested.cap_epsilon, stored.cap_epsilon),
            ("cap_delta", requested.cap_delta, stored.cap_delta),
            ("window_days", requested.window_days, stored.window_days),
        )
        if mine is not None and mine != theirs
    ]
    if requested.window_days is None and requested.is_capped and stored.window_days is not None:
        differences.append(f"window_days unset (stored: {stored.window_days})")
    if differences:
        raise BudgetExceededError(
            f"scope {scope!r} has a stored {stored.describe()}; the job spec says "
            + ", ".join(differences)
            + ": a job spec cannot change a scope's cap (use `dppipeline budget set-cap`, or "
            "remove the cap fields from the spec)"
        )
    return False


def _show(value: float | int | None) -> str:
    return "none" if value is None else f"{value:g}"


def check_cap(
    scope: str, policy: BudgetPolicy, used: tuple[float, float], eps: float, delta: float
) -> None:
    """Raises BudgetExceededError, naming what is needed and what is left, when spending
    (eps, delta) on top of `used` would pass a cap."""
    used_eps, used_delta = used
    problems = []
    if policy.cap_epsilon is not None and used_eps + eps > policy.cap_epsilon * (1 + CAP_TOLERANCE):
        left = max(policy.cap_epsilon - used_eps, 0.0)
        problems.append(f"epsilon {eps:g} needed, {left:g} left of {policy.cap_epsilon:g}")
    if policy.cap_delta is not None and used_delta + delta > policy.cap_delta * (1 + CAP_TOLERANCE):
        left = max(policy.cap_delta - used_delta, 0.0)
        problems.append(f"delta {delta:g} needed, {left:g} left of {policy.cap_delta:g}")
    if problems:
        span = f" in a {policy.window_days}-day window" if policy.window_days else ""
        raise BudgetExceededError(
            f"privacy budget of scope {scope!r} exhausted{span}: " + "; ".join(problems)
        )


def window_spend(
    rows: Iterable[Spend], policy: BudgetPolicy, start: dt.date, end: dt.date
) -> tuple[float, float]:
    """All-time sums, or the largest sums over every window of `window_days` data days that
    overlaps [start, end] (each release counts in every window its date range touches)."""
    rows = list(rows)
    if not policy.window_days:
        return sum(r.epsilon for r in rows), sum(r.delta for r in rows)
    n = policy.window_days
    worst = (0.0, 0.0)
    first = start - dt.timedelta(days=n - 1)
    for offset in range((end - first).days + 1):
        lo = first + dt.timedelta(days=offset)
        hi = lo + dt.timedelta(days=n - 1)
        inside = [r for r in rows if r.start_date <= hi and r.end_date >= lo]
        sums = (sum(r.epsilon for r in inside), sum(r.delta for r in inside))
        worst = (max(worst[0], sums[0]), max(worst[1], sums[1]))
    return worst


def worst_spend(rows: Iterable[Spend], policy: BudgetPolicy) -> tuple[float, float]:
    """The fullest window over all of a scope's releases (all-time sums without a window):
    what `budget show` compares with the cap."""
    rows = list(rows)
    if not rows:
        return 0.0, 0.0
    start = min(r.start_date for r in rows)
    end = max(r.end_date for r in rows)
    return window_spend(rows, policy, start, end)


def over_cap(policy: BudgetPolicy, used: tuple[float, float]) -> bool:
    eps, delta = used
    return (policy.cap_epsilon is not None and eps > policy.cap_epsilon * (1 + CAP_TOLERANCE)) or (
        policy.cap_delta is not None and delta > policy.cap_delta * (1 + CAP_TOLERANCE)
    )
