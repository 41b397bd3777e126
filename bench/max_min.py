"""Accuracy of `max` against `percentile(100)` on generated data, at epsilon 1 (local engine).

`python -m bench.max_min [--seeds 3 4 5 6 7] [--releases 2]`: per seed, generates the data
of tests/dp/statistical/test_max_min.py's accuracy test (300,000 customers, 30 terminals, one
day, 150,000 transactions: no customer has more than 6 rows, so `max_contributions: 6` keeps
every row and
the truth of the bounded rows is the clipped input), releases `max` and `percentile(100)` at
epsilon 1 over bounds [0, 500] (each in its own release, with the whole epsilon) and counts the
terminals with
1,000+ kept rows whose released value lies in [p90, max] of their bounded rows.

`--default-data`: the same on `dppipeline generate`'s defaults (5,000 customers, 1,000
terminals, 30 days) at L0 = Linf = 10, where a terminal keeps about 750 rows, far fewer than
the 2m the plan asks for: every terminal is counted, whatever its rows.

NON-SENSITIVE data only: this prints true values.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl

from dppipeline.core import extremes
from dppipeline.lifecycle.runner import make_plan, run_job
from dppipeline.spec.model import build_spec
from dppipeline.synthetic.transactions import generate

METRICS = {"max": "max", "percentile(100)": "percentile_100"}


def _truth(data: Path, bounds: tuple[float, float], min_rows: int) -> pd.DataFrame:
    rows = pl.read_parquet(str(data / "**" / "*.parquet")).to_pandas()
    kept = rows.assign(TX_AMOUNT=rows.TX_AMOUNT.clip(*bounds)).groupby("TERMINAL_ID").TX_AMOUNT
    truth = pd.DataFrame({"rows": kept.size(), "p90": kept.quantile(0.9), "max": kept.max()})
    return truth[truth.rows >= min_rows]


def _release(
    data: Path, out: Path, metric: str, terminals: int, contributions: dict[str, int]
) -> tuple[pd.Series, int | None]:
    """The released column, and the margin m of `max` (None for percentile(100))."""
    spec = build_spec(
        {
            "budget": {"epsilon": 1.0, "delta": 1e-6},
            "metrics": [metric],
            "bounds": {**contributions, "min_value": 0.0, "max_value": 500.0},
            "partition_selection": {"public_partitions": f"0..{terminals - 1}"},
            "input": {"path": str(data)},
            "output": str(out),
        }
    )
    result = run_job(spec, "local", echo=lambda _: None)
    released = pd.read_parquet(result.output / "terminal_stats").set_index("TERMINAL_ID")
    if metric != "max":
        return released[METRICS[metric]], None
    scale = make_plan(spec).queries[0].plan.mechanism("max").noise_scale
    assert scale is not None
    return released["max"], extremes.margin(scale)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[3, 4, 5, 6, 7])
    parser.add_argument("--releases", type=int, default=2)
    parser.add_argument("--default-data", action="store_true")
    args = parser.parse_args()
    inside = {m: 0 for m in METRICS}
    released_values: dict[str, list[float]] = {m: [] for m in METRICS}
    counted, true_max, margins, rows = 0, [], set(), []
    with tempfile.TemporaryDirectory() as tmp:
        runs = (
            [("default", {}, {"max_partitions_contributed": 10,
                              "max_contributions_per_partition": 10}, 1000, 0)]
            if args.default_data
            else [
                (seed, {"customers": 300_000, "terminals": 30, "days": 1,
                        "tx_per_day": 150_000, "seed": seed},
                 {"max_contributions": 6}, 30, 1000)
                for seed in args.seeds
            ]
        )  # fmt: skip
        for name, population, contributions, terminals, min_rows in runs:
            data = generate(Path(tmp) / f"data_{name}", **population).output
            truth = _truth(data, (0.0, 500.0), min_rows)
            rows += truth.rows.tolist()
            for r in range(args.releases):
                counted += len(truth)
                true_max += truth["max"].tolist()
                for metric, column_name in METRICS.items():
                    out = Path(tmp) / f"out_{name}_{r}_{column_name}"
                    column, m = _release(data, out, metric, terminals, contributions)
                    margins.update([] if m is None else [m])
                    value = column.loc[truth.index]
                    inside[metric] += int(((value >= truth.p90) & (value <= truth["max"])).sum())
                    released_values[metric] += value.tolist()
    print(
        f"terminal releases counted: {counted} (kept rows per terminal {min(rows):,} to "
        f"{max(rows):,}; margin m = {sorted(margins)}); median true max {np.median(true_max):.1f}"
    )
    for metric in METRICS:
        median = np.median(released_values[metric])
        print(
            f"{metric:16} inside [p90, max]: {inside[metric]}/{counted} = "
            f"{inside[metric] / counted:.1%}; median released {median:.1f}"
        )


if __name__ == "__main__":
    main()
