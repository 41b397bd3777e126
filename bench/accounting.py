"""Noise of the bank's 10-query job under each accounting, at the same (epsilon, delta); and
how many nightly releases the ledger admits under one cap, by sums and composed.

`python -m bench.accounting [--epsilon 4] [--delta 1e-6]`: plans
jobs/configs/bank_partner_release.yaml (no data is read) under basic composition with Laplace
noise (the default), basic with Gaussian, zcdp and pld with Gaussian, and prints the median
noise std of the released counts, sums and means (a mean's worst-case std at a partition of
1,000 rows) and its ratio to the default's: once per query, and once per released value over
a month of input (January 2026: every public key released, a query's count counted once per
key it releases). Then the nightly
job (jobs/configs/terminal_stats.yaml at epsilon 0.1, delta 1e-6 a night) released night
after night into a real ledger (a temporary SQLite file, no data read) under a cap of epsilon
2.5 and delta 2.5e-5 (what 25 nights spend by sums) for all time, until the ledger refuses:
the nights basic composition allows against the nights the ledger admits by composing the
releases' privacy events.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from dppipeline.core.events import release_events
from dppipeline.core.intervals import ratio_stddev_bound
from dppipeline.core.tasks import key_columns, public_key_set
from dppipeline.ledger import BudgetExceededError, BudgetPolicy, Ledger, ReleaseKey
from dppipeline.lifecycle.public_keys import read_key_files
from dppipeline.lifecycle.runner import make_plan
from dppipeline.spec.loader import load_raw
from dppipeline.spec.model import build_spec

CONFIGS = Path(__file__).resolve().parents[1] / "jobs" / "configs"
JOB = CONFIGS / "bank_partner_release.yaml"
NIGHTLY = CONFIGS / "terminal_stats.yaml"
NIGHT_EPSILON, NIGHT_DELTA, CAP_EPSILON = 0.1, 1e-6, 2.5
SETTINGS = [("basic", "laplace"), ("basic", "gaussian"), ("zcdp", "gaussian"), ("pld", "gaussian")]
METRICS = ("count", "sum", "mean")
HEADER = ("count", "sum", "mean", "count x", "sum x", "mean x", "plan s")
MEAN_ROWS = 1_000  # the partition size at which a mean's (worst-case) std is compared
MONTH = [dt.date(2026, 1, 1) + dt.timedelta(days=d) for d in range(31)]


def median_stds(
    accounting: str, noise: str, epsilon: float, delta: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Median noise std per metric: (over queries, over the values a month's release holds)."""
    overrides = {"accounting": accounting, "noise": noise}
    overrides |= {"budget.epsilon": epsilon, "budget.delta": delta}
    spec = build_spec(load_raw(JOB), overrides)
    plan = make_plan(spec)
    key_files = read_key_files(spec)
    per_query: dict[str, list[float]] = {m: [] for m in METRICS}
    per_value: dict[str, list[float]] = {m: [] for m in METRICS}
    for query, planned in zip(spec.queries, plan.queries, strict=True):
        keys = key_columns(query, spec.source_schema)
        # a private selection's values are counted as if it released every key it could
        released = len(public_key_set(query, keys, MONTH, key_files)) if query.is_public else 1
        for metric in METRICS:
            if metric not in planned.plan.params.metrics:
                continue
            std = (
                ratio_stddev_bound(planned.plan, metric, MEAN_ROWS)
                if metric == "mean"
                else planned.plan.metric_noise_stddev(metric) or 0.0
            )
            per_query[metric].append(std)
            per_value[metric].extend([std] * released)
    by_query = {m: statistics.median(v) for m, v in per_query.items()}
    return by_query, {m: statistics.median(v) for m, v in per_value.items()}


def nights_that_fit(accounting: str, noise: str) -> tuple[int, int]:
    """(nights by sums, nights the ledger admits) of the nightly job under one cap."""
    overrides = {"accounting": accounting, "noise": noise}
    overrides |= {"budget.epsilon": NIGHT_EPSILON, "budget.delta": NIGHT_DELTA}
    plan = make_plan(build_spec(load_raw(NIGHTLY), overrides))
    by_sums = int(CAP_EPSILON / NIGHT_EPSILON + 1e-9)
    policy = BudgetPolicy(cap_epsilon=CAP_EPSILON, cap_delta=by_sums * NIGHT_DELTA)
    epsilon, delta = plan.total_spent()
    events = release_events(plan)
    with tempfile.TemporaryDirectory() as folder, Ledger(f"sqlite:///{folder}/l.sqlite") as book:
        for night in range(100_000):
            day = dt.date(2026, 1, 1) + dt.timedelta(days=night)
            key = ReleaseKey("bench/CUSTOMER_ID", accounting, "input", day, day)
            try:
                book.reserve(
                    key, run_id=f"n{night}", job="nightly", epsilon=epsilon, delta=delta,
                    output="/nowhere", policy=policy, events=events,
                )  # fmt: skip
            except BudgetExceededError:
                return by_sums, night
            book.mark_reading(f"n{night}")
            book.commit(f"n{night}")
    raise RuntimeError("no cap reached")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.accounting", description=__doc__)
    parser.add_argument("--epsilon", type=float, default=4.0)
    parser.add_argument("--delta", type=float, default=1e-6)
    args = parser.parse_args(argv)
    rows = []
    for accounting, noise in SETTINGS:
        start = time.perf_counter()
        stds = median_stds(accounting, noise, args.epsilon, args.delta)
        rows.append((f"{accounting} + {noise}", stds, time.perf_counter() - start))
    for view, title in enumerate(("per query", "per released value, a month of input")):
        print(
            f"{JOB.name} at epsilon={args.epsilon:g}, delta={args.delta:g}: median noise std "
            f"{title} (mean: worst case at {MEAN_ROWS:,} rows)"
        )
        header = zip(HEADER, (10, 12, 8, 8, 8, 8, 7), strict=True)
        print(f"{'accounting + noise':20} " + " ".join(f"{h:>{w}}" for h, w in header))
        base = rows[0][1][view]
        for label, stds, seconds in rows:
            std = stds[view]
            print(
                f"{label:20} {std['count']:>10,.1f} {std['sum']:>12,.0f} {std['mean']:>8.3f} "
                + " ".join(f"{base[m] / std[m]:>7.2f}x" for m in METRICS)
                + f" {seconds:>7.2f}"
            )
        print()
    print(
        f"{NIGHTLY.name} nightly at epsilon {NIGHT_EPSILON:g}, delta {NIGHT_DELTA:g}, cap "
        f"epsilon {CAP_EPSILON:g}, delta {25 * NIGHT_DELTA:g} for all time: nights that fit"
    )
    print(f"{'accounting + noise':20} {'by sums':>8} {'ledger':>8} {'seconds':>8}")
    for accounting, noise in (("basic", "laplace"), ("pld", "gaussian"), ("zcdp", "gaussian")):
        start = time.perf_counter()
        by_sums, admitted = nights_that_fit(accounting, noise)
        seconds = time.perf_counter() - start
        print(f"{accounting + ' + ' + noise:20} {by_sums:>8} {admitted:>8} {seconds:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
