"""Confidence intervals of released values, from the noise distribution alone.

The noise a mechanism adds depends only on public parameters (epsilon, delta, the bounds), so
publishing its distribution, and intervals derived from it, costs no privacy. An interval
covers the exact value *after* contribution bounding and clipping (what the mechanism noised),
not the raw total before bounding: bounds that drop rows bias the value below the interval.

- count, privacy_id_count, sum: value -/+ the exact (1 - alpha) quantile of |noise|.
- sum computed with mean (noisy centred sum + midpoint x noisy count): the exact quantile of
  the sum of the two independent noises (closed form for two Laplace variables, a normal for
  two Gaussians).
- mean: a sound, conservative interval: the count and the centred sum each get an interval at
  level 1 - alpha/2; every (count, centred sum) pair inside both gives a mean, and the interval
  spans them (union bound: coverage >= 1 - alpha). A count interval reaching below one row
  gives [min_value, max_value].
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from dppipeline.core.budget import BudgetPlan, MechanismBudget

LEVEL = 0.95
INTERVAL_METRICS = ("count", "sum", "mean", "privacy_id_count")  # released with intervals


def half_width(mechanism: MechanismBudget, alpha: float = 1 - LEVEL) -> float:
    """w with P(|noise| > w) = alpha for one additive mechanism (exact)."""
    std = mechanism.noise_stddev
    assert std is not None, f"{mechanism.name} adds no additive noise"
    if mechanism.kind == "laplace":
        return std / math.sqrt(2) * math.log(1 / alpha)  # P(|Lap(b)| > w) = exp(-w / b)
    return std * NormalDist().inv_cdf(1 - alpha / 2)


def sum_half_width(
    first: MechanismBudget, second: MechanismBudget, scale: float, alpha: float = 1 - LEVEL
) -> float:
    """w with P(|X + scale * Y| > w) = alpha, X and Y the two mechanisms' independent noises."""
    if scale == 0:
        return half_width(first, alpha)
    std_x, std_y = first.noise_stddev or 0.0, (second.noise_stddev or 0.0) * abs(scale)
    if first.kind != "laplace":
        return math.hypot(std_x, std_y) * NormalDist().inv_cdf(1 - alpha / 2)
    b1, b2 = std_x / math.sqrt(2), std_y / math.sqrt(2)

    def two_sided_tail(w: float) -> float:
        if math.isclose(b1, b2, rel_tol=1e-9):
            return math.exp(-w / b1) * (2 + w / b1) / 2
        return (b1 * b1 * math.exp(-w / b1) - b2 * b2 * math.exp(-w / b2)) / (b1 * b1 - b2 * b2)

    low, high = 0.0, (b1 + b2) * math.log(2 / alpha) * 2
    for _ in range(200):  # bisection on a decreasing tail: exact to float precision
        mid = (low + high) / 2
        low, high = (mid, high) if two_sided_tail(mid) > alpha else (low, mid)
    return high


def metric_half_width(plan: BudgetPlan, metric: str) -> float | None:
    """The constant half-width of a metric's interval; None when it varies per row (mean) or
    no interval is released (variance, percentiles)."""
    if metric == "sum" and plan.has("centred_sum"):
        return sum_half_width(
            plan.mechanism("centred_sum"), plan.mechanism("count"), plan.params.midpoint
        )
    if metric in ("count", "sum", "privacy_id_count"):
        return half_width(plan.mechanism(metric))
    return None


def mean_interval(
    plan: BudgetPlan, noisy_count: np.ndarray, noisy_centred_sum: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row (low, high) of the mean's interval (see the module docstring)."""
    params = plan.params
    alpha = 1 - LEVEL
    w_n = half_width(plan.mechanism("count"), alpha / 2)
    w_c = half_width(plan.mechanism("centred_sum"), alpha / 2)
    n_low, n_high = noisy_count - w_n, noisy_count + w_n
    c_low, c_high = noisy_centred_sum - w_c, noisy_centred_sum + w_c
    defined = n_low >= 1
    safe_low, safe_high = np.where(defined, n_low, 1.0), np.where(defined, n_high, 1.0)
    # c / n over the box is extreme at a corner: divide by the smallest n where that moves the
    # ratio outwards, by the largest where it moves it inwards.
    upper = np.where(c_high >= 0, c_high / safe_low, c_high / safe_high)
    lower = np.where(c_low >= 0, c_low / safe_high, c_low / safe_low)
    assert params.min_value is not None and params.max_value is not None
    low = np.where(defined, params.midpoint + lower, params.min_value)
    high = np.where(defined, params.midpoint + upper, params.max_value)
    return (
        np.clip(low, params.min_value, params.max_value),
        np.clip(high, params.min_value, params.max_value),
    )
