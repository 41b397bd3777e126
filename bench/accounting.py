"""Noise of the bank's 12-query job under each accounting, at the same (epsilon, delta); and
how many nightly releases fit under one cap if the ledger composed them tightly.

`python -m bench.accounting [--epsilon 4] [--delta 1e-6]`: plans
jobs/configs/bank_partner_release.yaml (no data is read) under basic composition with Laplace
noise (the default), basic with Gaussian, zcdp and pld with Gaussian, and prints the median
noise std of the released counts and sums and its ratio to the default's. Then the nightly
example (examples/nightly_month.sh: jobs/configs/terminal_stats.yaml at epsilon 0.1, delta
1e-6 a night, cap epsilon 2.5): nights that fit by sums (what the ledger does today) against
the nights whose composition by privacy loss distributions stays within (2.5, the delta the
sums would spend), for each night's plan.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from dppipeline.core.accounting import composed_epsilon
from dppipeline.core.budget import JobPlan
from dppipeline.orchestration.runner import make_plan
from dppipeline.spec.model import build_spec, load_raw

CONFIGS = Path(__file__).resolve().parents[1] / "jobs" / "configs"
JOB = CONFIGS / "bank_partner_release.yaml"
NIGHTLY = CONFIGS / "terminal_stats.yaml"
NIGHT_EPSILON, NIGHT_DELTA, CAP_EPSILON = 0.1, 1e-6, 2.5
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


def night_events(plan: JobPlan) -> list[tuple[str, float]]:
    """(kind, noise multiplier) of every noise mechanism of one night's release, from its std
    and sensitivity (basic plans have no multiplier of their own)."""
    events = []
    for m in plan.additive_mechanisms():
        assert m.noise_stddev is not None and not plan.selections
        if m.kind == "gaussian":
            events.append(("gaussian", m.noise_stddev / m.l2_sensitivity))
        else:
            events.append(("laplace", m.noise_stddev / math.sqrt(2) / m.l1_sensitivity))
    return events


def nights_that_fit(accounting: str, noise: str) -> tuple[int, int]:
    """(nights by sums, nights by PLD composition) of the nightly job under one cap."""
    overrides = {"accounting": accounting, "noise": noise}
    overrides |= {"budget.epsilon": NIGHT_EPSILON, "budget.delta": NIGHT_DELTA}
    plan = make_plan(build_spec(load_raw(NIGHTLY), overrides))
    by_sums = int(CAP_EPSILON / NIGHT_EPSILON + 1e-9)
    delta = by_sums * NIGHT_DELTA  # the delta the sums spend for as many nights
    night = night_events(plan)
    nights = by_sums
    while composed_epsilon("pld", night * (nights + 1), delta, CAP_EPSILON) <= CAP_EPSILON:
        nights += 1
    return by_sums, nights


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
    print(
        f"\n{NIGHTLY.name} nightly at epsilon {NIGHT_EPSILON:g}, delta {NIGHT_DELTA:g}, cap "
        f"epsilon {CAP_EPSILON:g}: nights that fit"
    )
    print(f"{'accounting + noise':20} {'by sums':>8} {'by PLD':>8}")
    for accounting, noise in (("basic", "laplace"), ("pld", "gaussian")):
        by_sums, by_pld = nights_that_fit(accounting, noise)
        print(f"{accounting + ' + ' + noise:20} {by_sums:>8} {by_pld:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
