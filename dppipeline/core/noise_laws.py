"""Quantiles of sums of independent noises, certified: what the interval of a value made from
several noisy mechanisms (a sum under mean, a mean, a variance) must know.

A released value built from several mechanisms has noise `X1 + a X2 + c Y`: X1 and X2 the
continuous noises of sum-like mechanisms (one family: Laplace or Gaussian), Y the count's noise
(continuous, or discrete on the integers), a and c public or released coefficients. The tail

    T(w) = P(|X + c Y| > w) = E_Y[ g(w, c Y) ],   g(w, s) = P(|X + s| > w),  X = X1 + a X2,

is computed by conditioning on Y. X is symmetric and unimodal, so g(w, s) grows with |s|:
grouping Y's values into blocks of |y| in [lo, hi] and taking g at hi (at lo) bounds T(w) from
above (below). `half_widths` returns the smallest w whose upper bound is at most alpha, so
X + c Y lies in [-w, w] with probability at least 1 - alpha: sound whatever the block sizes;
the lower bound gives the exact w from below, and the gap between the two is the error of the
computation (`certified_half_widths` returns both; the tests hold the gap below 1e-3 of w).
Each integer is its own block while Y's support is small; beyond, blocks widen.

By Anderson's theorem the half-width grows with |a| and |c| (a symmetric unimodal noise added
with a larger weight makes |X| stochastically larger): a table of half-widths on a grid of
coefficients, read at the grid point above, stays conservative (`core.intervals`).

Closed forms: P(Lap(b) > t) = exp(-t/b)/2; for Lap(b1) + Lap(b2), (b1^2 exp(-t/b1) - b2^2
exp(-t/b2)) / (2 (b1^2 - b2^2)) (t >= 0); Gaussians add as one. Block masses: discrete Laplace
of scale t, P(Y = k) = (1 - p)/(1 + p) p^|k| with p = exp(-1/t); a discrete Gaussian's mass
summed, or for a sigma too wide to sum, bounded by the integrals of exp(-y^2 / 2 sigma^2) on
each side (its normaliser is at least sigma sqrt(2 pi), by Poisson summation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

_REACH = 40.0  # Y's support is cut at 40 stds; the mass beyond is bounded and counted in full
_FINE, _COARSE = 4_000, 600  # blocks per side of Y's support: one value, a table of values


@dataclass(frozen=True)
class NoiseLaw:
    """One mechanism's additive noise: `family` laplace or gaussian, continuous (`scale`: the
    Laplace b or the Gaussian sigma) or discrete (the discrete Laplace's t or the discrete
    Gaussian's sigma)."""

    family: str
    scale: float
    discrete: bool = False

    @property
    def std(self) -> float:
        if self.discrete:
            from dppipeline.core import discrete  # noqa: PLC0415 (numpy only)

            return math.sqrt(discrete.discrete_variance(f"discrete_{self.family}", self.scale))
        return self.scale * math.sqrt(2) if self.family == "laplace" else self.scale


# --------------------------------------------------------------------------- X: continuous


def _upper_tail(family: str, b1: float, b2: np.ndarray, t: np.ndarray) -> np.ndarray:
    """P(X > t), X = X1 + X2 with scales b1 and b2 (per row; 0: no second term)."""
    magnitude = np.abs(t)
    if family == "gaussian":
        from scipy.special import ndtr  # noqa: PLC0415 (0.2 s of start-up: Gaussian only)

        spread = np.hypot(b1, b2)
        tail = ndtr(-magnitude / np.where(spread > 0, spread, 1.0))
        tail = np.where(spread > 0, tail, np.where(magnitude > 0, 0.0, 0.5))
    else:
        big, small = np.maximum(b1, b2), np.minimum(b1, b2)
        safe = np.where(big > 0, big, 1.0)
        single = 0.5 * np.exp(-magnitude / safe)
        equal = np.exp(-magnitude / safe) * (2 + magnitude / safe) / 4
        gap = big * big - small * small
        mixed = (
            big * big * np.exp(-magnitude / safe)
            - small * small * np.exp(-magnitude / np.where(small > 0, small, 1.0))
        ) / (2 * np.where(gap > 0, gap, 1.0))
        close = small > big * (1 - 1e-6)
        tail = np.where(small == 0, single, np.where(close, equal, mixed))
        tail = np.where(big > 0, tail, np.where(magnitude > 0, 0.0, 0.5))
    return np.where(t >= 0, tail, 1.0 - tail)


# --------------------------------------------------------------------------- Y: the count


@dataclass(frozen=True)
class _Blocks:
    """|Y| grouped: each block's smallest and largest |y|, its mass from above and below,
    and the mass beyond the last block (at most)."""

    low: np.ndarray
    high: np.ndarray
    mass_up: np.ndarray
    mass_down: np.ndarray
    beyond: float


def _blocks(law: NoiseLaw, per_side: int) -> _Blocks:
    reach = _REACH * law.std
    if law.discrete:
        return _discrete_blocks(law, reach, per_side)
    # Blocks of equal mass (narrow where the mass is), the last one up to the reach.
    share = np.linspace(0.0, 1.0, per_side + 1)[:-1]  # P(|Y| <= edge)
    if law.family == "laplace":
        beyond = math.exp(-reach / law.scale)
        edges = np.append(-law.scale * np.log1p(-share), reach)
        cdf = -np.expm1(-edges / law.scale)
    else:
        from scipy.special import ndtr, ndtri  # noqa: PLC0415

        beyond = 2 * NormalDist().cdf(-_REACH)
        edges = np.append(law.scale * ndtri((1 + share) / 2), reach)
        cdf = 2 * ndtr(edges / law.scale) - 1
    mass = np.diff(cdf)
    return _Blocks(edges[:-1], edges[1:], mass, mass, beyond)


def _integer_edges(reach: float, per_side: int) -> tuple[np.ndarray, np.ndarray]:
    """Blocks [lo, hi] of non-negative integers: one by one up to `per_side`, then wider."""
    last = math.ceil(reach)
    if last <= per_side:
        k = np.arange(0, last + 1)
        return k, k
    exact = np.arange(0, per_side // 2)
    starts = np.unique(np.geomspace(per_side // 2, last + 1, per_side // 2 + 1).astype(np.int64))
    return np.concatenate([exact, starts[:-1]]), np.concatenate([exact, starts[1:] - 1])


def _discrete_blocks(law: NoiseLaw, reach: float, per_side: int) -> _Blocks:
    low, high = _integer_edges(reach, per_side)
    lo, hi = low.astype(np.float64), high.astype(np.float64)
    twice = np.where(lo > 0, 2.0, 1.0)  # +y and -y, except 0
    if law.family == "laplace":
        p = math.exp(-1 / law.scale)
        # the sum over k in [lo, hi] of (1-p)/(1+p) p^k is (p^lo - p^(hi+1)) / (1 + p)
        mass = twice * (np.power(p, lo) - np.power(p, hi + 1)) / (1 + p)
        beyond = 2 * p ** (hi[-1] + 1) / (1 + p)
        return _Blocks(lo, hi, mass, mass, float(beyond))
    sigma = law.scale
    if hi[-1] <= 2_000_000:  # sum the mass itself
        k = np.arange(0, high[-1] + 1, dtype=np.float64)
        terms = np.exp(-(k**2) / (2 * sigma**2))
        total = terms[0] + 2 * terms[1:].sum()
        cumulative = np.concatenate([[0.0], np.cumsum(terms)])
        mass = twice * (cumulative[high + 1] - cumulative[low]) / total
        return _Blocks(lo, hi, mass, mass, max(0.0, 1.0 - float(mass.sum())))
    from scipy.special import ndtr  # noqa: PLC0415

    # Too wide to sum: exp(-y^2/2s^2) decreases on y >= 0, so on [lo, hi] its sum lies between
    # the integral over [lo, hi + 1] and f(lo) + the integral over [lo, hi].
    root = sigma * math.sqrt(2 * math.pi)
    f_lo = np.exp(-(lo**2) / (2 * sigma**2))
    upper = twice * (f_lo + root * (ndtr(hi / sigma) - ndtr(lo / sigma))) / root
    lower = twice * (ndtr((hi + 1) / sigma) - ndtr(lo / sigma))
    lower /= 1 + 2 * math.exp(-2 * math.pi**2 * sigma**2)  # the normaliser's upper bound
    edge = hi[-1] + 1
    beyond = 2 * (math.exp(-(edge**2) / (2 * sigma**2)) / root + NormalDist().cdf(-edge / sigma))
    return _Blocks(lo, hi, upper, lower, beyond)


# --------------------------------------------------------------------------- the quantiles


@dataclass(frozen=True)
class Combination:
    """X1 + a X2 + c Y: `first` (X1's law), `second` (X2's, or None), `count` (Y's, or None)."""

    first: NoiseLaw
    second: NoiseLaw | None = None
    count: NoiseLaw | None = None


def certified_half_widths(
    combination: Combination,
    a: np.ndarray | float,
    c: np.ndarray | float,
    alpha: float,
    *,
    fine: bool = True,
    lower_bound: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """For each coefficient pair (a, c): (w with P(|X1 + a X2 + c Y| > w) <= alpha, a lower
    bound on the exact such w, or w itself unless `lower_bound`). `fine`: Y in finer blocks
    (one combination) or coarser ones (a table of them)."""
    a_values, c_values = np.broadcast_arrays(
        np.abs(np.asarray(a, dtype=np.float64)), np.abs(np.asarray(c, dtype=np.float64))
    )
    a_values, c_values = a_values.ravel(), c_values.ravel()
    first, second, count = combination.first, combination.second, combination.count
    b2 = a_values * (second.scale if second is not None else 0.0)
    if count is not None and not count.discrete and count.family == first.family:
        # A continuous count noise joins the closed form: a second Laplace term, or one more
        # Gaussian (three Laplace terms stay a block sum).
        if first.family == "gaussian":
            b2, count = np.hypot(b2, c_values * count.scale), None
        elif second is None:
            b2, count = c_values * count.scale, None
    spread = first.std + b2 * (math.sqrt(2) if first.family == "laplace" else 1.0)
    if count is None:
        c_values = np.zeros_like(c_values)
    if count is None or count.scale == 0:
        blocks = _Blocks(np.zeros(1), np.zeros(1), np.ones(1), np.ones(1), 0.0)
        reach = np.zeros_like(c_values)
    else:
        blocks = _blocks(count, _FINE if fine else _COARSE)
        reach = c_values * (blocks.high[-1] + 1)
    near = c_values[:, None] * blocks.low[None, :]
    far = c_values[:, None] * blocks.high[None, :]
    b2_column = b2[:, None]

    def tail(w: np.ndarray, side: int) -> np.ndarray:
        w_column, shift = w[:, None], far if side == 0 else near
        g = _upper_tail(first.family, first.scale, b2_column, w_column - shift) + (
            _upper_tail(first.family, first.scale, b2_column, w_column + shift)
        )
        if side == 0:
            return np.asarray(g @ blocks.mass_up + blocks.beyond)
        return np.asarray(g @ blocks.mass_down)

    top = reach + spread * (_REACH + math.log(2 / alpha)) + 1e-300
    results = []
    for side in (0, 1) if lower_bound else (0,):
        low, high = np.zeros_like(top), top.copy()
        for _ in range(48):  # bisection: 2^-48 of the bracket
            mid = (low + high) / 2
            above = tail(mid, side) > alpha
            low, high = np.where(above, mid, low), np.where(above, high, mid)
        results.append(high if side == 0 else low)
    width = results[0]
    return width, np.minimum(results[-1], width)


def half_width(combination: Combination, a: float, c: float, alpha: float) -> float:
    """The certified half-width of one combination (coverage at least 1 - alpha)."""
    return float(certified_half_widths(combination, a, c, alpha)[0][0])
