"""Noise of the bank's 12-query job under each accounting, at the same (epsilon, delta).

`python -m bench.accounting [--epsilon 4] [--delta 1e-6]`: plans
jobs/configs/bank_partner_release.yaml (no data is read) under basic composition with Laplace
noise (the default), basic with Gaussian, zcdp and pld with Gaussian, and prints the median
noise std of the released counts and sums and its ratio to the default's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from dppipeline.orchestration.runner import make_plan
from dppipeline.spec.model import build_spec, load_raw

JOB = Path(__file__).resolve().parents[1] / "jobs" / "configs" / "bank_partner_release.yaml"
SETTINGS = [("basic", "laplace"), ("basic", "gaussian"), ("zcdp", "gaussian"), ("pld", "gaussian")]


def median_stds(accounting: str, noise: str, epsilon: float, delta: float) -> dict[str, float]:
    overrides = {"accounting": accounting, "noise": noise}
    overrides |= {"budget.epsilon": epsilon, "budget.delta": delta}
    plan = make_plan(build_spec(load_raw(JOB), overrides))
    stds: dict[str, list[float]] = {"count": [], "sum": []}
    for query in plan.queries:
        for metric, values in stds.items():
            if metric in query.plan.params.metrics:
                values.append(query.plan.metric_noise_stddev(metric) or 0.0)
    return {metric: statistics.median(values) for metric, values in stds.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.accounting", description=__doc__)
    parser.add_argument("--epsilon", type=float, default=4.0)
    parser.add_argument("--delta", type=float, default=1e-6)
    args = parser.parse_args(argv)
    print(f"{JOB.name} at epsilon={args.epsilon:g}, delta={args.delta:g}: median noise std")
    header = ("count", "sum", "count x", "sum x", "plan s")
    widths = (10, 12, 8, 8, 7)
    print(
        f"{'accounting + noise':20} "
        + " ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True))
    )
    base: dict[str, float] = {}
    for accounting, noise in SETTINGS:
        start = time.perf_counter()
        stds = median_stds(accounting, noise, args.epsilon, args.delta)
        seconds = time.perf_counter() - start
        base = base or stds
        print(
            f"{accounting + ' + ' + noise:20} {stds['count']:>10,.1f} {stds['sum']:>12,.0f} "
            f"{base['count'] / stds['count']:>7.2f}x {base['sum'] / stds['sum']:>7.2f}x "
            f"{seconds:>7.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
