"""The metric grammar: the metric names a query may ask for and what each one needs.

`count`, ..., `privacy_id_count`, the parametrised `percentile(P)` (0 <= P <= 100) and
`count_distinct(COLUMN)`; `parse_metric` gives a name its canonical form, the rest read a
canonical name (its release column, its P or COLUMN, whether it needs value bounds).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from dppipeline.errors import SpecError, excerpt
from dppipeline.spec.limits import MAX_NAME_CHARS

METRICS = ("count", "sum", "mean", "variance", "stddev", "max", "min", "privacy_id_count")
# Metrics computed from the variance mechanisms (stddev is its square root: no extra budget).
VARIANCE_METRICS = ("variance", "stddev")
# percentile(p), 0 <= p <= 100, is the parametrised metric (PyDP clamps its rank to 99.5%:
# `max` and `min`, an exponential mechanism near the extreme rank, are the DP extremes).
_PERCENTILE = re.compile(r"^percentile\(\s*(\d+(?:\.\d+)?)\s*\)$")
# count_distinct(COLUMN): distinct non-null values of an input column among the kept rows.
_COUNT_DISTINCT = re.compile(r"^count_distinct\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)$")
# How the parametrised metrics are written (error messages, `--metrics` help).
PARAMETRISED_METRICS = ("percentile(P)", "count_distinct(COLUMN)")


def parse_metric(name: Any, where: str = "metrics") -> str:
    """A metric name in canonical form: `count`, ..., `percentile(P)` with 0 <= P <= 100, or
    `count_distinct(COLUMN)` (the column is checked against the input schema later)."""
    if isinstance(name, str):
        text = name.strip()
        if text in METRICS:
            return text
        match = _PERCENTILE.match(text)
        if match:
            p = float(match.group(1))
            if not 0 <= p <= 100:
                raise SpecError(where, f"percentile must be in [0, 100], got {match.group(1)}")
            return f"percentile({p:g})"
        match = _COUNT_DISTINCT.match(text)
        if match:
            if len(match.group(1)) > MAX_NAME_CHARS:
                raise SpecError(
                    where, f"count_distinct: the column name exceeds {MAX_NAME_CHARS} characters"
                )
            return f"count_distinct({match.group(1)})"
    raise SpecError(
        where,
        f"must be one of {', '.join(METRICS)}, percentile(P) with 0 <= P <= 100 or "
        f"count_distinct(COLUMN); got {excerpt(name)}",
    )


def percentile_of(metric: str) -> float | None:
    """P of a canonical `percentile(P)` metric; None for any other metric."""
    match = _PERCENTILE.match(metric)
    return float(match.group(1)) if match else None


def distinct_column_of(metric: str) -> str | None:
    """COLUMN of a canonical `count_distinct(COLUMN)` metric; None for any other metric."""
    match = _COUNT_DISTINCT.match(metric)
    return match.group(1) if match else None


def distinct_columns(metrics: Sequence[str]) -> tuple[str, ...]:
    """The columns of a query's count_distinct metrics, in the spec's order."""
    return tuple(c for m in metrics if (c := distinct_column_of(m)) is not None)


def metric_column(metric: str) -> str:
    """The release column of a metric: its name, `percentile_P` (`.` as `_`) or
    `count_distinct_COLUMN`."""
    column = distinct_column_of(metric)
    if column is not None:
        return f"count_distinct_{column}"
    p = percentile_of(metric)
    return metric if p is None else f"percentile_{p:g}".replace(".", "_")


def needs_kept_rows(metric: str) -> bool:
    """Metrics computed from the kept rows themselves, not from a pair's count and sums."""
    return (
        metric in ("max", "min")
        or percentile_of(metric) is not None
        or distinct_column_of(metric) is not None
    )


def needs_value_bounds(metrics: tuple[str, ...]) -> bool:
    """Whether the metrics read the value column, clipped to [min_value, max_value]."""
    return any(
        m in ("sum", "mean", "max", "min", *VARIANCE_METRICS) or percentile_of(m) is not None
        for m in metrics
    )
