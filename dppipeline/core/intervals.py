"""Confidence intervals of released values, from the noise distribution alone.

The noise a mechanism adds depends only on public parameters (epsilon, delta, the bounds), so
publishing its distribution, and intervals derived from it, costs no privacy. An interval
covers the exact value *after* contribution bounding and clipping (what the mechanism noised),
not the raw total before bounding: bounds that drop rows bias the value below the interval.

- count, privacy_id_count, count_distinct(COLUMN), sum: value -/+ the exact (1 - alpha)
  quantile of |noise|; with discrete noise on counts an integer (`core.discrete`), so their
  intervals are integers.
- sum computed with mean (noisy centred sum + midpoint x noisy count): the exact quantile of
  the sum of the two independent noises (closed form for two Laplace variables, a normal for
  two Gaussians).
- mean: a sound, conservative interval: the count and the centred sum each get an interval at
  level 1 - alpha/2; every (count, centred sum) pair inside both gives a mean, and the interval
  spans them (union bound: coverage >= 1 - alpha). A count interval reaching below one row
  gives [min_value, max_value].

Mean and variance are ratios of noisy values, so their noise is not additive; for a partition
of n rows (after bounding) `mean_stddev_bound` and `variance_stddev_bound` give a conservative
bound on their standard deviation, valid for every dataset in the clipping range. With mid the
midpoint, r the half-range, a = mean - mid in [-r, r], D = max(1, n + Z_n) the noisy count,
d = n - D (|d| <= |Z_n|):

- mean: mid + (n a + Z_c) / D differs from the exact mean by (Z_c + a d) / D, whose square
  has expectation over Z_c of (s_c^2 + a^2 d^2) / D^2 <= (s_c^2 + r^2 d^2) / D^2. Clamping to
  [min, max] moves it no further from the exact mean, and by at most 2r: std^2 <= E_Zn[min(
  (s_c^2 + r^2 d^2) / D^2, 4 r^2)] (Jensen), computed by quadrature over the count's noise.
  For large n: sqrt(s_c^2 + r^2 s_n^2) / n (the delta method at the worst mean).
- variance: with q the mean of (x - mid)^2 in [a^2, r^2], the released value differs by
  W - e^2, e = (Z_c + a d) / D the mean's error and W = (Z_s - 2a Z_c + (q - r^2/2 - 2a^2)
  d) / D; E[(W - e^2)^2 | Z_n] is a polynomial in (a^2, q) (noise moments up to the fourth),
  maximised over the feasible region, capped at r^4 (both values lie in [0, r^2]) and
  averaged over Z_n. For large n: sqrt(s_s^2 + 4 r^2 s_c^2 + 9/4 r^4 s_n^2) / n.

These are maxima over datasets: data away from the bounds has less noise (the variance's
worst case has every value at one bound).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from dppipeline.core import discrete
from dppipeline.core.budget import BudgetPlan, MechanismBudget
from dppipeline.spec.model import distinct_column_of, metric_column

LEVEL = 0.95
INTERVAL_METRICS = ("count", "sum", "mean", "privacy_id_count")  # released with intervals


def has_interval(metric: str) -> bool:
    """Released with an interval (under confidence_intervals): INTERVAL_METRICS and every
    count_distinct(COLUMN), whose noise is additive like count's."""
    return metric in INTERVAL_METRICS or distinct_column_of(metric) is not None


def half_width(mechanism: MechanismBudget, alpha: float = 1 - LEVEL) -> float:
    """w with P(|noise| > w) = alpha for one additive mechanism (exact)."""
    std = mechanism.noise_stddev
    assert std is not None, f"{mechanism.name} adds no additive noise"
    if mechanism.discrete:
        assert mechanism.noise_scale is not None
        return float(
            discrete.discrete_half_width(mechanism.mechanism, mechanism.noise_scale, alpha)
        )
    if mechanism.kind == "laplace":
        return std / math.sqrt(2) * math.log(1 / alpha)  # P(|Lap(b)| > w) = exp(-w / b)
    return std * NormalDist().inv_cdf(1 - alpha / 2)


def sum_half_width(
    first: MechanismBudget, second: MechanismBudget, scale: float, alpha: float = 1 - LEVEL
) -> float:
    """w with P(|X + scale * Y| > w) = alpha, X and Y the two mechanisms' independent noises."""
    if scale == 0:
        return half_width(first, alpha)
    if second.discrete:
        return _mixed_sum_half_width(first, second, scale, alpha)
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


def _mixed_sum_half_width(
    first: MechanismBudget, second: MechanismBudget, scale: float, alpha: float
) -> float:
    """`sum_half_width` when Y (the count's noise) is discrete: P(|X + sY| > w) summed over
    Y's integers exactly; where Y's support is too wide for that, the union bound
    w_X(alpha/2) + |s| w_Y(alpha/2) (sound, a little wider)."""
    assert second.noise_scale is not None
    std_x, std_y = first.noise_stddev or 0.0, second.noise_stddev or 0.0
    reach = math.ceil(_GRID_WIDTH * std_y) + 1
    if reach > _GRID_POINTS or std_x == 0:
        return half_width(first, alpha / 2) + abs(scale) * half_width(second, alpha / 2)
    y = np.arange(-reach, reach + 1, dtype=np.float64)
    if second.kind == "laplace":
        mass = np.exp(-np.abs(y) / second.noise_scale)
    else:
        mass = np.exp(-(y**2) / (2 * second.noise_scale**2))
    mass /= np.sum(mass)
    shift = scale * y

    def tail(w: float) -> float:
        if first.kind == "laplace":
            b = std_x / math.sqrt(2)
            upper, lower = w - shift, -w - shift  # P(X > upper) + P(X < lower)
            p_up = np.where(
                upper >= 0, 0.5 * np.exp(-np.abs(upper) / b), 1 - 0.5 * np.exp(-np.abs(upper) / b)
            )
            p_low = np.where(
                lower <= 0, 0.5 * np.exp(-np.abs(lower) / b), 1 - 0.5 * np.exp(-np.abs(lower) / b)
            )
        else:
            from scipy.special import ndtr  # noqa: PLC0415 (0.2 s of start-up: Gaussian only)

            p_up = ndtr((shift - w) / std_x)
            p_low = ndtr((-w - shift) / std_x)
        return float(np.sum(mass * (p_up + p_low))) + 1e-17  # + Y's mass beyond 40 std

    low, high = 0.0, half_width(first, alpha / 2) + abs(scale) * half_width(second, alpha / 2)
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if tail(mid) > alpha else (low, mid)
    return high


def metric_half_width(plan: BudgetPlan, metric: str) -> float | None:
    """The constant half-width of a metric's interval; None when it varies per row (mean) or
    no interval is released (variance, percentiles)."""
    if metric == "sum" and plan.has("centred_sum"):
        return sum_half_width(
            plan.mechanism("centred_sum"), plan.mechanism("count"), plan.params.midpoint
        )
    if metric in ("count", "sum", "privacy_id_count") or distinct_column_of(metric) is not None:
        return half_width(plan.mechanism(metric_column(metric)))
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


# ---------------------------------------------------------------------------------------------
# Propagated noise of mean and variance (see the module docstring)

STD_BOUND_ROWS = (100, 1_000, 10_000)  # partition sizes `plan` and the manifest state it for
_GRID_POINTS, _GRID_WIDTH = 8001, 40.0  # count-noise quadrature: +/- 40 std (tail < 1e-24)


def _count_noise_quadrature(plan: BudgetPlan) -> tuple[np.ndarray, np.ndarray, float]:
    """(nodes z, weights, mass outside the nodes) for the count's noise distribution."""
    count = plan.mechanism("count")
    std = count.noise_stddev or 0.0
    if std == 0:
        return np.zeros(1), np.ones(1), 0.0
    if count.discrete and count.noise_scale is not None and _GRID_WIDTH * std <= _GRID_POINTS:
        # Integer noise: its exact mass on every integer within 40 std.
        k = np.arange(-math.ceil(_GRID_WIDTH * std), math.ceil(_GRID_WIDTH * std) + 1)
        if count.kind == "laplace":
            mass = np.exp(-np.abs(k) / count.noise_scale)
        else:
            mass = np.exp(-(k.astype(np.float64) ** 2) / (2 * count.noise_scale**2))
        # mass beyond 40 std: below 1e-17 of the total (Laplace) or far less (Gaussian)
        return k.astype(np.float64), mass / np.sum(mass), 1e-17
    z = np.linspace(-_GRID_WIDTH * std, _GRID_WIDTH * std, _GRID_POINTS)
    if count.kind == "laplace":
        b = std / math.sqrt(2)
        density = np.exp(-np.abs(z) / b) / (2 * b)
        outside = math.exp(-_GRID_WIDTH * std / b)
    else:
        density = np.exp(-0.5 * (z / std) ** 2) / (std * math.sqrt(2 * math.pi))
        outside = 2 * NormalDist().cdf(-_GRID_WIDTH)
    weights = density * (z[1] - z[0])
    weights[[0, -1]] /= 2  # trapezoid
    return z, weights, outside


def _noisy_count(rows: float, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(D, d): the denominator max(1, n + z) and n - D."""
    denominator = np.maximum(1.0, rows + z)
    return denominator, rows - denominator


def mean_stddev_bound(plan: BudgetPlan, rows: float) -> float:
    """An upper bound on the std of the released mean of a partition of `rows` rows."""
    r = plan.params.half_range
    s_c = plan.mechanism("centred_sum").noise_stddev or 0.0
    z, weights, outside = _count_noise_quadrature(plan)
    denominator, d = _noisy_count(rows, z)
    cap = 4 * r * r
    second = np.minimum((s_c**2 + r * r * d**2) / denominator**2, cap)
    return math.sqrt(float(np.sum(second * weights)) + outside * cap)


def variance_stddev_bound(plan: BudgetPlan, rows: float) -> float:
    """An upper bound on the std of the released variance of a partition of `rows` rows."""
    r2 = plan.params.half_range**2
    s_c = plan.mechanism("centred_sum").noise_stddev or 0.0
    s_s = plan.mechanism("centred_sum_of_squares").noise_stddev or 0.0
    fourth = (6.0 if plan.mechanism("centred_sum").kind == "laplace" else 3.0) * s_c**4
    z, weights, outside = _count_noise_quadrature(plan)
    denominator, d = (v[:, None] for v in _noisy_count(rows, z))
    u = np.linspace(0.0, r2, 101)[None, :]  # a^2
    worst = np.zeros(len(z))
    # E[(W - e^2)^2] is convex in q, so it peaks at q = a^2 or q = r^2 (s = q - r^2/2).
    for s in (u - r2 / 2, np.full_like(u, r2 / 2)):
        b = s - 2 * u
        w2 = (s_s**2 + 4 * u * s_c**2 + b**2 * d**2) / denominator**2
        we2 = (d * s_c**2 * (b - 4 * u) + b * u * d**3) / denominator**3
        e4 = (fourth + 6 * u * d**2 * s_c**2 + u**2 * d**4) / denominator**4
        worst = np.maximum(worst, np.max(w2 - 2 * we2 + e4, axis=1))
    cap = r2 * r2
    return math.sqrt(float(np.sum(np.minimum(worst, cap) * weights)) + outside * cap)


def ratio_stddev_bound(plan: BudgetPlan, metric: str, rows: float) -> float:
    """`mean_stddev_bound` or `variance_stddev_bound`."""
    if metric == "mean":
        return mean_stddev_bound(plan, rows)
    if metric == "variance":
        return variance_stddev_bound(plan, rows)
    raise ValueError(f"{metric} is not a ratio metric")


def ratio_stddev_times_rows(plan: BudgetPlan, metric: str) -> float:
    """S with std ~ S / n for large n (the bounds' limit): the delta method at the worst
    data."""
    r = plan.params.half_range
    s_n = plan.mechanism("count").noise_stddev or 0.0
    s_c = plan.mechanism("centred_sum").noise_stddev or 0.0
    if metric == "mean":
        return math.hypot(s_c, r * s_n)
    s_s = plan.mechanism("centred_sum_of_squares").noise_stddev or 0.0
    return math.sqrt(s_s**2 + 4 * r * r * s_c**2 + 2.25 * r**4 * s_n**2)
