"""Integer noise for integer outputs: OpenDP's discrete Laplace and discrete Gaussian samplers.

Counts and privacy_id_count are integers; released with integer noise they stay integers, as
Tumult Analytics and OpenDP release them. Both distributions live on the integers:

- discrete Laplace, scale t: P(x) proportional to exp(-|x| / t). On an integer query of L1
  sensitivity D it is (D / t)-DP, exactly like the continuous one (Canonne, Kamath, Steinke
  2020, "The Discrete Gaussian for Differential Privacy", section 2.3; Ghosh et al. 2009's
  geometric mechanism).
- discrete Gaussian, parameter sigma: P(x) proportional to exp(-x^2 / (2 sigma^2)). On an
  integer vector query of L2 sensitivity D2 it is (D2^2 / (2 sigma^2))-zCDP (CKS20, Theorem
  14); its variance is slightly below sigma^2.

The samplers are OpenDP's (exact, in Rust, no floating-point arithmetic on the noise: the
attack on naive floating-point Laplace noise, Mironov 2012, does not apply), from OpenDP 0.16:
0.14.1's drew some values too often and others too rarely (at scale 5, ln P(4)/P(3) = -0.05,
not -0.2), as tests/.../test_noise_distribution.py shows. OpenDP is imported when noise is drawn,
not when a plan is made (its core modules take 0.1-0.2 s to import on the development machine;
`opendp.prelude` twice that).
Variance and quantiles here are exact for `plan` and confidence intervals.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable

DISCRETE_KINDS = ("discrete_laplace", "discrete_gaussian")
# Summing the discrete Gaussian's mass term by term up to this sigma (at most ~80 sigma terms);
# above it the Poisson summation formula, whose correction terms are below 1e-300 there.
_DIRECT_SUM_SIGMA = 10.0
# Exact quantiles by summation up to this sigma; above it a sound (wider by at most one)
# bound from the normal tail (CKS20, Proposition 25).
_QUANTILE_SUM_SIGMA = 1e5
# OpenDP's exact samplers take 18-30 us a value (rational arithmetic); from this many values on,
# the array is drawn in one chunk per core, on threads (the FFI call releases the GIL):
# 200,000 counts took 1.5 s instead of 3.0 s on 2 cores (docs/explanation/benchmarks.md).
_VALUES_PER_THREAD = 20_000


@cache
def _sampler(kind: str, scale: float) -> Callable[[np.ndarray], list[int]]:
    """OpenDP's vector sampler: discrete Laplace (scale t) or discrete Gaussian (sigma) on
    64-bit integers."""
    # The modules themselves, not opendp.prelude (which also loads its numpy/sklearn extras).
    from opendp import domains, measurements, metrics, mod  # noqa: PLC0415 (lazy: see above)

    mod.enable_features("contrib")
    domain = domains.vector_domain(domains.atom_domain(T="i64"))
    make: Any
    if kind == "discrete_laplace":
        make = measurements.make_laplace(domain, metrics.l1_distance(T="i64"), scale)
    elif kind == "discrete_gaussian":
        make = measurements.make_gaussian(domain, metrics.l2_distance(T="i64"), scale)
    else:
        raise ValueError(f"no discrete sampler {kind!r}")
    sample: Callable[[np.ndarray], list[int]] = make
    return sample


def add_discrete_noise(kind: str, scale: float, exact: np.ndarray) -> np.ndarray:
    """`exact` (integers) plus independent discrete noise on each, as int64."""
    if len(exact) == 0:
        return np.zeros(0, dtype=np.int64)
    # An int64 array goes to Rust in bulk; a list would be checked element by element.
    values = np.ascontiguousarray(np.asarray(exact).astype(np.int64))
    sample = _sampler(kind, float(scale))
    threads = min(os.cpu_count() or 1, len(values) // _VALUES_PER_THREAD)
    if threads <= 1:
        return np.asarray(sample(values), dtype=np.int64)
    with ThreadPoolExecutor(threads, thread_name_prefix="discrete-noise") as pool:
        drawn = list(pool.map(sample, np.array_split(values, threads)))
    return np.concatenate([np.asarray(part, dtype=np.int64) for part in drawn])


def discrete_laplace_variance(scale: float) -> float:
    """2 p / (1 - p)^2, p = exp(-1 / t)."""
    p = math.exp(-1 / scale)
    return 2 * p / (-math.expm1(-1 / scale)) ** 2


def discrete_gaussian_variance(sigma: float) -> float:
    """Exact variance of the discrete Gaussian with parameter sigma."""
    if sigma < _DIRECT_SUM_SIGMA:
        x = np.arange(1, math.ceil(40 * sigma) + 2, dtype=np.float64)
        mass = np.exp(-(x**2) / (2 * sigma**2))
        return float(2 * np.sum(x**2 * mass) / (1 + 2 * np.sum(mass)))
    # Poisson summation: sum_x exp(-x^2/2s^2) = s sqrt(2 pi) sum_k exp(-2 pi^2 s^2 k^2), and
    # sum_x x^2 exp(-x^2/2s^2) = s sqrt(2 pi) sum_k (s^2 - 4 pi^2 s^4 k^2) exp(-2 pi^2 s^2 k^2).
    terms = [math.exp(-2 * math.pi**2 * sigma**2 * k * k) for k in (1, 2)]
    normaliser = 1 + 2 * sum(terms)
    second = sigma**2 * normaliser - 8 * math.pi**2 * sigma**4 * sum(
        k * k * t for k, t in zip((1, 2), terms, strict=True)
    )
    return second / normaliser


def discrete_variance(kind: str, scale: float) -> float:
    if kind == "discrete_laplace":
        return discrete_laplace_variance(scale)
    if kind == "discrete_gaussian":
        return discrete_gaussian_variance(scale)
    raise ValueError(f"not a discrete mechanism: {kind!r}")


def discrete_half_width(kind: str, scale: float, alpha: float) -> int:
    """The smallest integer w with P(|noise| > w) <= alpha (exact; for a discrete Gaussian of
    sigma above 1e5, a bound that is at most one too wide)."""
    if kind == "discrete_laplace":
        # P(|X| > w) = 2 p^(w+1) / (1 + p)
        p = math.exp(-1 / scale)
        if 2 * p / (1 + p) <= alpha:  # P(|X| > 0) (also p = 0: a scale below ~1/745)
            return 0
        w = math.log(alpha * (1 + p) / 2) / math.log(p) - 1
        return max(0, math.ceil(w - 1e-9))
    if kind != "discrete_gaussian":
        raise ValueError(f"not a discrete mechanism: {kind!r}")
    if scale > _QUANTILE_SUM_SIGMA:
        # CKS20 Proposition 25: P(X >= m) <= P(N(0, sigma^2) >= m - 1) for integers m >= 1,
        # so P(|X| > w) = 2 P(X >= w + 1) <= 2 P(N >= w) <= alpha at w = ceil(sigma z).
        return math.ceil(scale * NormalDist().inv_cdf(1 - alpha / 2))
    x = np.arange(0, math.ceil(40 * scale) + 2, dtype=np.float64)
    mass = np.exp(-(x**2) / (2 * scale**2))
    mass[1:] *= 2  # +x and -x
    tail = 1 - np.cumsum(mass) / np.sum(mass)  # tail[w] = P(|X| > w)
    return int(np.argmax(tail <= alpha))


# Largest noise scale accepted: the noise then stays far inside int64.
MAX_SCALE = 1e15


def zcdp_delta(rho: float, epsilon: float) -> float:
    """The delta at `epsilon` of a rho-zCDP mechanism: CKS20 Proposition 12 / Corollary 13,
    delta = inf over a > 1 of exp((a - 1)(a rho - epsilon)) / (a - 1) (1 - 1/a)^a. Every a
    gives a valid delta, so the minimum over a grid is sound (and within 1e-6 of the inf)."""
    if rho == 0:
        return 0.0
    a = 1 + np.geomspace(1e-8, 1e10, 4001)
    log_delta = (a - 1) * (a * rho - epsilon) - np.log(a - 1) + a * np.log1p(-1 / a)
    best = int(np.argmin(log_delta))
    fine = np.geomspace(a[max(best - 1, 0)] - 1, a[min(best + 1, len(a) - 1)] - 1, 2001) + 1
    log_fine = (fine - 1) * (fine * rho - epsilon) - np.log(fine - 1) + fine * np.log1p(-1 / fine)
    return float(min(1.0, math.exp(min(float(np.min(log_fine)), 0.0))))


def zcdp_epsilon(rho: float, delta: float) -> float:
    """The smallest epsilon (to 1e-9 relative) with zcdp_delta(rho, epsilon) <= delta."""
    low, high = 0.0, rho + 2 * math.sqrt(rho * math.log(1 / delta)) + 1.0
    while zcdp_delta(rho, high) > delta:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (low, mid) if zcdp_delta(rho, mid) <= delta else (mid, high)
        if high - low <= 1e-9 * high:
            break
    return high


def gaussian_sigma(epsilon: float, delta: float, l2_sensitivity: float) -> float:
    """The smallest discrete Gaussian sigma (to 1e-9 relative, from the safe side) whose zCDP,
    rho = L2^2 / (2 sigma^2) (CKS20 Theorem 14), gives (epsilon, delta)-DP."""

    def fits(sigma: float) -> bool:
        return zcdp_delta(l2_sensitivity**2 / (2 * sigma**2), epsilon) <= delta

    low = high = l2_sensitivity
    while not fits(high):
        low, high = high, high * 2
        if high > MAX_SCALE:
            return math.inf
    while fits(low):
        low /= 2
        if low < 1e-12:
            return high
    while high / low > 1 + 1e-9:
        mid = math.sqrt(low * high)
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high
