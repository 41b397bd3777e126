"""Caps: how much a scope may spend, for all time or per rolling window of data days.

A set of releases spends two valid guarantees: their sums (basic composition) and the
composition of their privacy events by privacy loss distributions (`core.events`) at the
scope's delta: the cap's delta, or, for a cap on epsilon alone, the delta the sums spend. A
release fits when either guarantee of the scope with it stays within the cap, so composition
only ever admits more, never claims less than the sums. Every charged release counts:
`reserved`, `reading`, `committed` and `failed` (a run that read data and failed still spent
its budget).
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from dppipeline.core.events import PrivacyEvent, approx_dp, composed_epsilon, merged
from dppipeline.errors import BudgetExceededError

CAP_TOLERANCE = 1e-9  # relative: float sums of shares (0.1 + 0.2) must fit a cap of 0.3
CHARGED_STATES = ("reserved", "reading", "committed", "failed")


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
    events: tuple[PrivacyEvent, ...] | None  # None: a release recorded before events


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


@dataclass(frozen=True)
class ScopeSpend:
    """What a set of releases spends: by sums, and composed at `delta`, the scope's delta."""

    releases: int
    summed: tuple[float, float]
    delta: float
    composed: float | None  # epsilon at `delta` by composition; None if not computed

    @property
    def epsilon(self) -> float:
        """The smaller epsilon of the two guarantees that hold at `delta` (inf: neither)."""
        by_sums = self.summed[0] if self.summed[1] <= self.delta * (1 + CAP_TOLERANCE) else math.inf
        return min(by_sums, math.inf if self.composed is None else self.composed)

    @property
    def composition_helps(self) -> bool:
        """Does composition state a visibly smaller epsilon than the sums (by 0.1%)?"""
        return self.composed is not None and self.composed < self.summed[0] * (1 - 1e-3)

    def describe(self) -> str:
        """`epsilon 2 at delta 2e-05 (composed; 3 by sums)`, or the sums alone."""
        eps, delta = self.summed
        if not self.composition_helps:
            return f"epsilon {eps:g}, delta {delta:g} (by sums)"
        return f"epsilon {self.composed:.4g} at delta {self.delta:g} (composed; {eps:g} by sums)"


def spend_of(
    rows: Iterable[Spend], policy: BudgetPolicy, *, compose: bool = True, scale: float | None = None
) -> ScopeSpend:
    """The spend of `rows` under `policy` (which fixes the delta composition is stated at);
    `compose=False` skips the composition (when the sums already fit)."""
    rows = list(rows)
    summed = (math.fsum(r.epsilon for r in rows), math.fsum(r.delta for r in rows))
    delta = policy.cap_delta if policy.cap_delta is not None else summed[1]
    composed = None
    if compose and rows:
        scale = scale or policy.cap_epsilon or summed[0]
        composed = _composed(merged(e for r in rows for e in events_of(r)), delta, scale)
    return ScopeSpend(len(rows), summed, delta, composed)


def events_of(row: Spend) -> tuple[PrivacyEvent, ...]:
    """A release's events; one (epsilon, delta) event for a release recorded without them."""
    return row.events if row.events is not None else (approx_dp(row.epsilon, row.delta),)


@functools.lru_cache(maxsize=256)
def _composed(events: tuple[PrivacyEvent, ...], delta: float, scale: float) -> float | None:
    """Cached: the windows of a nightly scope hold the same events night after night."""
    return composed_epsilon(events, delta, scale)


def fits(policy: BudgetPolicy, spend: ScopeSpend) -> bool:
    """Does one of the spend's guarantees stay within the cap? A cap on delta alone is held
    by the sums: composition trades delta for epsilon, which such a cap does not bound."""
    if policy.cap_epsilon is None:
        return policy.cap_delta is None or spend.summed[1] <= policy.cap_delta * (1 + CAP_TOLERANCE)
    return spend.epsilon <= policy.cap_epsilon * (1 + CAP_TOLERANCE)


def left_of(policy: BudgetPolicy, spend: ScopeSpend) -> tuple[float, float]:
    """What the cap still allows after `spend`: (epsilon, delta), never below 0; inf for
    what the policy does not cap."""
    epsilon = math.inf if policy.cap_epsilon is None else policy.cap_epsilon - spend.epsilon
    delta = math.inf if policy.cap_delta is None else policy.cap_delta - spend.summed[1]
    return max(epsilon, 0.0), max(delta, 0.0)


def check_cap(
    scope: str,
    policy: BudgetPolicy,
    rows: Sequence[Spend],
    new: Spend,
) -> None:
    """Raises BudgetExceededError, naming what is needed and what is left, when adding
    release `new` would take any window it touches past the cap."""
    if not policy.is_capped:
        return
    for window in _windows(rows, policy, new.start_date, new.end_date):
        with_new = spend_of([*window, new], policy, compose=False)
        if not fits(policy, with_new):
            with_new = spend_of([*window, new], policy)
        if fits(policy, with_new):
            continue
        used = spend_of(window, policy)
        left_epsilon, left_delta = left_of(policy, used)
        problems = []
        if policy.cap_epsilon is not None and not with_new.epsilon <= policy.cap_epsilon * (
            1 + CAP_TOLERANCE
        ):
            problems.append(
                f"epsilon {new.epsilon:g} needed, {left_epsilon:.4g} left of {policy.cap_epsilon:g}"
            )
        if policy.cap_delta is not None and with_new.summed[1] > policy.cap_delta * (
            1 + CAP_TOLERANCE
        ):
            problems.append(
                f"delta {new.delta:g} needed, {left_delta:g} left of {policy.cap_delta:g}"
            )
        span = f" in a {policy.window_days}-day window" if policy.window_days else ""
        helps = policy.cap_epsilon is not None and used.composition_helps
        spent = f" (spent: {used.describe()})" if helps else ""
        raise BudgetExceededError(
            f"privacy budget of scope {scope!r} exhausted{span}: " + "; ".join(problems) + spent,
            remaining_epsilon=left_epsilon,
            remaining_delta=left_delta,
        )


def _windows(
    rows: Iterable[Spend], policy: BudgetPolicy, start: dt.date, end: dt.date
) -> list[list[Spend]]:
    """The releases of every window of `window_days` data days that overlaps [start, end]
    (each release counts in every window its date range touches); all of them without a
    window. Windows holding the same releases are listed once."""
    rows = list(rows)
    if not policy.window_days:
        return [rows]
    n = policy.window_days
    seen: dict[tuple[int, ...], list[Spend]] = {}
    first = start - dt.timedelta(days=n - 1)
    for offset in range((end - first).days + 1):
        lo = first + dt.timedelta(days=offset)
        hi = lo + dt.timedelta(days=n - 1)
        inside = [i for i, r in enumerate(rows) if r.start_date <= hi and r.end_date >= lo]
        seen.setdefault(tuple(inside), [rows[i] for i in inside])
    return list(seen.values())


def window_spend(
    rows: Iterable[Spend], policy: BudgetPolicy, start: dt.date, end: dt.date
) -> tuple[float, float]:
    """By sums: the all-time sums, or the largest sums over every window of `window_days`
    data days that overlaps [start, end]."""
    worst = (0.0, 0.0)
    for window in _windows(rows, policy, start, end):
        eps, delta = spend_of(window, policy, compose=False).summed
        worst = (max(worst[0], eps), max(worst[1], delta))
    return worst


def worst_window(
    rows: Iterable[Spend], policy: BudgetPolicy, start: dt.date, end: dt.date
) -> ScopeSpend:
    """The fullest window touching [start, end] (everything without a window), by its
    smaller guarantee."""
    spends = [spend_of(w, policy) for w in _windows(rows, policy, start, end)]
    return max(spends, key=lambda s: (s.epsilon, s.summed))


def worst_spend(rows: Iterable[Spend], policy: BudgetPolicy) -> ScopeSpend:
    """The fullest window over all of a scope's releases: what `budget show` compares with
    the cap."""
    rows = list(rows)
    if not rows:
        return spend_of([], policy)
    return worst_window(
        rows, policy, min(r.start_date for r in rows), max(r.end_date for r in rows)
    )


def over_cap(policy: BudgetPolicy, spend: ScopeSpend) -> bool:
    return policy.is_capped and not fits(policy, spend)
