"""`max` and `min`: an exponential mechanism over a public grid, per partition.

PyDP's quantile tree clamps ranks to [0.5%, 99.5%] and, on skewed data, answered about the
upper bound for `percentile(100)`. Here each partition picks one of `GRID_SIZE` public
candidates spanning [min_value, max_value] by OpenDP's report-noisy-max with Gumbel noise
(`make_noisy_max`: the exponential mechanism, exact sampling in Rust; never numpy or random).

Score of candidate c for `max`: -|#{kept values >= c} - m|; for `min`: -|#{kept values <= c}
- m|. The margin m is public (`margin`): with probability at least 1 - `BETA` the chosen
candidate's score is within m - 1 of the best one, so when some candidate has exactly m kept
rows at or above it, the answer has between 1 and 2m - 1 kept rows at or above it: it lies
between the (n - 2m + 2)-th order statistic and the true maximum. docs/explanation/max_min.md has
the sensitivity and accounting argument and the measured accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import numpy as np

EXTREME_METRICS = ("max", "min")
EXPONENTIAL = "exponential"  # the mechanism's kind in plans, manifests and the ledger
GRID_SIZE = 1024  # public candidates per partition, evenly spaced, both bounds included
BETA = 0.05  # the margin's failure probability per partition


def candidates(min_value: float, max_value: float) -> np.ndarray:
    """The public grid: GRID_SIZE evenly spaced values from min_value to max_value."""
    return np.linspace(min_value, max_value, GRID_SIZE)


def gumbel_scale(l0: int, linf: float, epsilon: float) -> float:
    """Noise scale in rows: 2 Linf / e with e = epsilon / L0 per partition. The scores are not
    monotonic (one unit can raise some and lower others), hence 2 x the sensitivity."""
    return 2 * linf * l0 / epsilon


def margin(scale: float) -> int:
    """m: the smallest integer above scale x (ln G + ln 1/beta), public. Then
    P(best score - chosen score >= m) <= G exp(-m / scale) < beta, so with probability at
    least 1 - beta the chosen score is within m - 1 of the best; m = 1 at a huge epsilon."""
    return math.floor(scale * (math.log(GRID_SIZE) + math.log(1 / BETA))) + 1


def scores(kept: np.ndarray, grid: np.ndarray, metric: str, m: int) -> np.ndarray:
    """-|rows at or beyond each candidate - m| (at or above for max, at or below for min)."""
    ordered = np.sort(np.asarray(kept, dtype=np.float64))
    if metric == "max":
        beyond = len(ordered) - np.searchsorted(ordered, grid, side="left")
    elif metric == "min":
        beyond = np.searchsorted(ordered, grid, side="right")
    else:
        raise ValueError(f"not an extreme metric: {metric!r}")
    result: np.ndarray = -np.abs(beyond.astype(np.int64) - m)
    return result


@cache
def _noisy_max(scale: float) -> Callable[[np.ndarray], int]:
    """OpenDP's report-noisy-max (Gumbel noise of `scale` on integer scores). It takes the
    scores as one int64 numpy array, which OpenDP hands to Rust in bulk (a Python list is
    checked element by element: 4x the cost of a whole draw)."""
    # The modules themselves, not opendp.prelude (as in core.discrete).
    from opendp import domains, measurements, measures, metrics, mod  # noqa: PLC0415 (lazy)

    mod.enable_features("contrib")
    make: Any = measurements.make_noisy_max(
        domains.vector_domain(domains.atom_domain(T="i64")),
        metrics.linf_distance(T="i64", monotonic=False),
        measures.max_divergence(),
        scale=scale,
    )
    select: Callable[[np.ndarray], int] = make
    return select


def privacy_loss(scale: float, linf: int) -> float:
    """OpenDP's own privacy map: the epsilon of one partition's draw when one unit changes
    every score by at most `linf` (2 linf / scale)."""
    make: Any = _noisy_max(scale)
    return float(make.map(linf))


def release_extremes(
    values: Sequence[np.ndarray],
    metric: str,
    min_value: float,
    max_value: float,
    scale: float,
) -> np.ndarray:
    """One candidate per partition, drawn independently; a partition without kept values
    (an empty public partition) has every score -m: a uniform draw from the grid."""
    grid = candidates(min_value, max_value)
    m = margin(scale)
    select = _noisy_max(scale)
    out = np.empty(len(values), dtype=np.float64)
    for row, kept in enumerate(values):
        out[row] = grid[select(np.ascontiguousarray(scores(kept, grid, metric, m), np.int64))]
    return out
