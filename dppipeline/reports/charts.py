"""Shared chart plumbing for `budget plot`, `report` and `evaluate`: matplotlib on the Agg
backend (charts go to files; no display needed), imported only when a chart is drawn."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from dppipeline.errors import UsageError


def pyplot(command: str) -> Any:
    """matplotlib.pyplot on Agg, or a one-line usage error naming the command."""
    try:
        import matplotlib  # noqa: PLC0415
    except ImportError:
        raise UsageError(f"{command} needs matplotlib: pip install 'dppipeline[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def day_axis(ax: Any, days: Sequence[dt.date]) -> None:
    """Whole days on the x axis, at most about eight labels; a single day is shown between
    its neighbours (a zero-width range would ask the locator for thousands of ticks)."""
    import matplotlib.dates as mdates  # noqa: PLC0415

    ax.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d"))
    span = (max(days) - min(days)).days if days else 0
    if days and span == 0:
        ax.set_xlim(days[0] - dt.timedelta(days=1), days[0] + dt.timedelta(days=1))
    ax.xaxis.set_major_locator(mdates.DayLocator(interval=max(1, span // 8)))
