"""Confidence intervals of released values, from the noise distribution alone.

The noise a mechanism adds depends only on public parameters (epsilon, delta, the bounds), so
publishing its distribution, and intervals derived from it, costs no privacy. An interval
covers the exact value *after* contribution bounding and clipping (what the mechanism noised),
not the raw total before bounding: bounds that drop rows bias the value below the interval.

- count, privacy_id_count, count_distinct(COLUMN), sum: value -/+ the exact (1 - alpha)
  quantile of |noise|; with discrete noise on counts an integer (`core.discrete`), so their
  intervals are integers.
- sum computed with mean (noisy centred sum + midpoint x noisy count): the certified
  quantile of the sum of the two independent noises (`core.noise_laws`: their distributions
  convolved, at most a fraction of a percent above the exact quantile, never below).
- mean: its error is exactly (Z_c - a Z_n) / D (D the noisy count, a the centred mean), so
  the released value -/+ w / D covers with probability exactly 1 - alpha when w is that
  combination's quantile at the true a; the released centred mean stands in for a (a
  plug-in, `mean_interval`; the coverage test checks it in every regime).
- variance: the same to first order, with the three noises (`variance_interval`); stddev the
  square roots of the variance's interval.
- A ratio whose noisy count is within twice the count noise's half-width of 0 may be mostly
  noise: its interval is the whole range.

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

import functools
import math
from statistics import NormalDist

import numpy as np

from dppipeline.core import discrete, noise_laws
from dppipeline.core.noise_laws import Combination, NoiseLaw
from dppipeline.core.plan import BudgetPlan, MechanismBudget
from dppipeline.spec.metrics import distinct_column_of, metric_column

LEVEL = 0.95
INTERVAL_METRICS = ("count", "sum", "mean", "variance", "stddev", "privacy_id_count")


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


def law_of(mechanism: MechanismBudget) -> NoiseLaw:
    """The noise distribution of one additive mechanism."""
    if mechanism.discrete:
        assert mechanism.noise_scale is not None
        return NoiseLaw(mechanism.kind, mechanism.noise_scale, discrete=True)
    std = mechanism.noise_stddev or 0.0
    return NoiseLaw(mechanism.kind, std / math.sqrt(2) if mechanism.kind == "laplace" else std)


def sum_half_width(
    first: MechanismBudget, second: MechanismBudget, scale: float, alpha: float = 1 - LEVEL
) -> float:
    """w with P(|X + scale * Y| > w) <= alpha, X and Y the two mechanisms' independent noises
    (certified, `core.noise_laws`: at most a fraction of a percent above the exact w)."""
    if scale == 0:
        return half_width(first, alpha)
    combination = Combination(law_of(first), count=law_of(second))
    return noise_laws.half_width(combination, 0.0, scale, alpha)


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


# Coefficients of the count's noise (and the centred sum's, for the variance) are tabulated at
# this many points from 0 to their largest value; a row reads the point above its own, which
# by Anderson's theorem gives a wider interval than its exact one (`core.noise_laws`).
_TABLE_POINTS = 33
_RATIO_RELIABLE = 2.0  # a ratio's interval needs noisy count > this x the count's half-width


def _table_index(value: np.ndarray, top: float, points: int = _TABLE_POINTS) -> np.ndarray:
    """The grid point at or above each |value| on linspace(0, top, points)."""
    if top <= 0:
        return np.zeros(len(value), dtype=np.int64)
    index = np.clip(np.ceil(np.abs(value) / top * (points - 1) - 1e-9), 0, points - 1)
    return np.asarray(index, dtype=np.int64)


def _reliable(plan: BudgetPlan, noisy_count: np.ndarray) -> np.ndarray:
    """Rows whose noisy count is far enough from its noise for a ratio's linear error (a
    count within twice its noise's 95% half-width of 0 may be mostly noise: the interval is
    then the whole range)."""
    w_n = half_width(plan.mechanism("count"))
    return noisy_count > max(1.0, _RATIO_RELIABLE * w_n)


def mean_interval(
    plan: BudgetPlan, noisy_count: np.ndarray, noisy_centred_sum: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row (low, high) of the mean's 95% interval.

    The released mean is mid + C / D (clamped), with C = n a + Z_c the noisy centred sum, D =
    n + Z_n the noisy count (n rows of centred mean a). Its error is (Z_c - a Z_n) / D: the
    interval is the released value -/+ w / D, w the certified 95% half-width of Z_c - a Z_n
    (the two noises' distributions convolved): exact at the true a; here at the released
    centred mean (a plug-in; the table's grid point above it); clipped to [min_value,
    max_value]. Where the noisy count is within twice its noise's half-width of 0 the ratio
    may be mostly noise: [min_value, max_value].
    """
    params = plan.params
    assert params.min_value is not None and params.max_value is not None
    r = params.half_range
    count = np.asarray(noisy_count, dtype=np.float64)
    denominator = np.maximum(1.0, count)
    centred = np.asarray(noisy_centred_sum, dtype=np.float64) / denominator
    widths = _mean_table(plan)
    w = widths[_table_index(np.clip(centred, -r, r), r)]
    centre = params.midpoint + centred
    reliable = _reliable(plan, count)
    low = np.where(reliable, centre - w / denominator, params.min_value)
    high = np.where(reliable, centre + w / denominator, params.max_value)
    return (
        np.clip(low, params.min_value, params.max_value),
        np.clip(high, params.min_value, params.max_value),
    )


def _mean_table(plan: BudgetPlan) -> np.ndarray:
    combination = Combination(
        law_of(plan.mechanism("centred_sum")), count=law_of(plan.mechanism("count"))
    )
    coefficients = np.linspace(0.0, plan.params.half_range, _TABLE_POINTS)
    return _cached_widths(combination, (0.0,), tuple(coefficients))


def variance_interval(
    plan: BudgetPlan,
    noisy_count: np.ndarray,
    noisy_centred_sum: np.ndarray,
    noisy_centred_squares: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per row (low, high) of the variance's 95% interval (stddev: their square roots).

    The released variance is V = S / D + r^2/2 - (C / D)^2 (clamped to [0, r^2]), S the noisy
    centred sum of squares. To first order its error is (Z_s - 2a Z_c + (a^2 - v + r^2/2) Z_n)
    / D, v the variance: the interval is V -/+ w / D, w the certified 95% half-width of that
    combination of the three noises at the released a and v (plug-ins), clipped to [0, r^2];
    the whole range where the noisy count is within twice its noise's half-width of 0.
    """
    r = plan.params.half_range
    r2 = r * r
    count = np.asarray(noisy_count, dtype=np.float64)
    denominator = np.maximum(1.0, count)
    centred = np.clip(np.asarray(noisy_centred_sum, dtype=np.float64) / denominator, -r, r)
    squares = np.asarray(noisy_centred_squares, dtype=np.float64)
    value = squares / denominator + r2 / 2 - (noisy_centred_sum / denominator) ** 2
    plug_in = np.clip(value, 0.0, r2)
    count_coefficient = centred**2 - plug_in + r2 / 2  # in [-r^2/2, 3r^2/2]
    a_top, c_top = 2 * r, 1.5 * r2
    widths = _variance_table(plan, a_top, c_top)
    i = _table_index(2 * centred, a_top, _VARIANCE_POINTS)
    j = _table_index(count_coefficient, c_top, _VARIANCE_POINTS)
    w = widths.reshape(_VARIANCE_POINTS, _VARIANCE_POINTS)[i, j]
    reliable = _reliable(plan, count)
    low = np.where(reliable, value - w / denominator, 0.0)
    high = np.where(reliable, value + w / denominator, r2)
    return np.clip(low, 0.0, r2), np.clip(high, 0.0, r2)


_VARIANCE_POINTS = 17


def _variance_table(plan: BudgetPlan, a_top: float, c_top: float) -> np.ndarray:
    combination = Combination(
        law_of(plan.mechanism("centred_sum_of_squares")),
        law_of(plan.mechanism("centred_sum")),
        law_of(plan.mechanism("count")),
    )
    a, c = np.meshgrid(
        np.linspace(0.0, a_top, _VARIANCE_POINTS),
        np.linspace(0.0, c_top, _VARIANCE_POINTS),
        indexing="ij",
    )
    return _cached_widths(combination, tuple(a.ravel()), tuple(c.ravel()))


@functools.lru_cache(maxsize=64)
def _cached_widths(
    combination: Combination, a: tuple[float, ...], c: tuple[float, ...]
) -> np.ndarray:
    """Certified 95% half-widths of a table of coefficient pairs (a release computes its
    table once per plan; batches on Spark's executors reuse it)."""
    widths, _ = noise_laws.certified_half_widths(
        combination, np.asarray(a), np.asarray(c), 1 - LEVEL, fine=len(c) <= 64
    )
    return widths


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
