"""The engine-neutral release in the three tiers: exact, statistical, noise present."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from dppipeline.core.mechanisms import add_empty_public_partitions, release_partitions
from dppipeline.core.plan import AggregationParams
from dppipeline.core.planner import plan_budget

KEY = "TERMINAL_ID"
# Two-sided normal quantile for a per-test failure rate of 1e-6.
Z_1E6 = float(norm.isf(0.5e-6))


def make_plan(epsilon, delta=1e-6, **overrides):
    base = dict(
        metrics=("count", "sum", "mean", "privacy_id_count"),
        noise="laplace",
        max_partitions_contributed=2,
        max_contributions_per_partition=3,
        min_value=0.0,
        max_value=100.0,
        public_partitions=True,
    )
    base.update(overrides)
    return plan_budget(AggregationParams(**base), epsilon, delta)


def aggregates(rows):
    return pd.DataFrame(rows, columns=[KEY, "privacy_id_count", "count", "sum"])


def laplace_tolerance(plan, metric, values_checked: int, failure_rate: float = 1e-6) -> float:
    """|noise| bound holding for all checked values except with probability failure_rate."""
    std = plan.metric_noise_stddev(metric)
    b = std / math.sqrt(2)
    # Sum under mean mixes two Laplace noises: bound each part (union bound).
    return 2 * b * math.log(2 * values_checked / failure_rate) + 1e-9


# --- exact tier: huge epsilon, values equal the hand-computed ones -------------------------


def test_exact_tier_public_partitions():
    plan = make_plan(epsilon=1e7)
    agg = aggregates([(10, 2, 5, 300.0), (11, 1, 1, 40.0)])
    public = pd.DataFrame({KEY: [10, 11, 12]})
    out = release_partitions(add_empty_public_partitions(agg, [KEY], public), [KEY], plan)
    assert out[KEY].tolist() == [10, 11, 12]  # empty public partition 12 released
    assert list(out.columns) == [KEY, "count", "sum", "mean", "privacy_id_count"]
    tol = {m: laplace_tolerance(plan, m, 3) for m in ("count", "sum", "privacy_id_count")}
    np.testing.assert_allclose(out["count"], [5, 1, 0], atol=tol["count"])
    np.testing.assert_allclose(out["sum"], [300, 40, 0], atol=tol["sum"])
    np.testing.assert_allclose(out["privacy_id_count"], [2, 1, 0], atol=tol["privacy_id_count"])
    # mean = 60 and 40; the empty partition's mean is the midpoint (0/max(1, ~0) + 50).
    np.testing.assert_allclose(out["mean"], [60, 40, 50], atol=1e-3)


def test_exact_tier_non_public_keys_are_dropped():
    agg = aggregates([(1, 3, 3, 30.0), (99, 4, 4, 40.0)])
    aligned = add_empty_public_partitions(agg, [KEY], pd.DataFrame({KEY: [1, 2]}))
    assert aligned[KEY].tolist() == [1, 2]
    assert aligned["count"].tolist() == [3, 0]


def test_exact_tier_private_selection_keeps_large_drops_single_unit():
    plan = make_plan(epsilon=1e4, public_partitions=False)
    keys = list(range(200))
    # Even keys have 1 privacy unit, odd keys 50; a one-unit key is kept with p <= delta / L0.
    agg = aggregates([(k, 1 if k % 2 == 0 else 50, 3, 90.0) for k in keys])
    out = release_partitions(agg, [KEY], plan)
    assert out[KEY].tolist() == [k for k in keys if k % 2 == 1]


def test_mean_is_clamped_to_the_bounds():
    # A tiny count with a large centred sum would put the raw ratio far outside [0, 100].
    plan = make_plan(epsilon=0.05)
    agg = aggregates([(k, 1, 1, 100.0) for k in range(300)])
    out = release_partitions(agg, [KEY], plan)
    assert out["mean"].between(0.0, 100.0).all()
    assert (out["mean"] == 100.0).any() and (out["mean"] == 0.0).any()


def test_only_requested_metrics_in_release_order():
    plan = make_plan(epsilon=1.0, metrics=("privacy_id_count", "count"))
    out = release_partitions(aggregates([(1, 2, 2, 0.0)]), [KEY], plan)
    assert list(out.columns) == [KEY, "count", "privacy_id_count"]


# --- statistical tier: the noise is what the plan (and so the manifest) says ----------------


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
@pytest.mark.parametrize("metric", ["count", "sum", "privacy_id_count"])
def test_empirical_noise_std_matches_the_plan(noise, metric):
    """The variance of (released - exact) over n partitions matches the planned std.

    The sample variance s^2 of n iid draws has std sigma^2 sqrt((kurtosis - 1) / n); kurtosis
    is 6 for Laplace and 3 for Gaussian. Sum under mean is a sum of two independent noises
    (kurtosis between 3 and 6): using 6 is conservative. Failure rate 1e-6 (normal quantile).
    """
    n = 20000
    plan = make_plan(epsilon=1.0, noise=noise)
    exact = aggregates([(k, 7, 20, 1234.0) for k in range(n)])
    out = release_partitions(exact, [KEY], plan)
    truth = {"count": 20.0, "sum": 1234.0, "privacy_id_count": 7.0}[metric]
    noise_draws = out[metric].to_numpy() - truth
    sigma = first_principles_std(plan, metric)
    assert plan.metric_noise_stddev(metric) == pytest.approx(sigma, rel=1e-3)
    kurtosis = 6.0 if noise == "laplace" or metric == "sum" else 3.0
    tolerance = Z_1E6 * math.sqrt((kurtosis - 1) / n)
    ratio = np.var(noise_draws) / sigma**2
    assert abs(ratio - 1) <= tolerance, (ratio, tolerance)
    # The noise is centred: |mean| within the same failure rate.
    assert abs(noise_draws.mean()) <= Z_1E6 * sigma / math.sqrt(n)


def first_principles_std(plan, metric: str) -> float:
    """The noise std from the textbook formulas, independent of how the plan computed it:
    Laplace sqrt(2) * L0 * Linf / eps; Gaussian sigma from pipeline-dp's analytic formula with
    L2 = sqrt(L0) * Linf; sum under mean adds midpoint * count noise."""
    from pipeline_dp.dp_computations import compute_sigma

    p = plan.params
    l0, linf = p.max_partitions_contributed, p.max_contributions_per_partition
    linf_of = {
        "count": linf,
        "privacy_id_count": 1,
        "centred_sum": (p.max_value - p.min_value) / 2 * linf,
    }

    def std_of(name):
        m = plan.mechanism(name)
        if p.noise == "laplace":
            return math.sqrt(2) * l0 * linf_of[name] / m.epsilon
        return compute_sigma(m.epsilon, m.delta, math.sqrt(l0) * linf_of[name])

    if metric == "sum":
        return math.hypot(std_of("centred_sum"), p.midpoint * std_of("count"))
    return std_of(metric)


# --- noise present: a real mechanism ran -----------------------------------------------------


def test_noise_is_present_and_differs_between_runs():
    plan = make_plan(epsilon=1.0)
    exact = aggregates([(k, 5, 10, 500.0) for k in range(100)])
    first = release_partitions(exact, [KEY], plan)
    second = release_partitions(exact, [KEY], plan)
    for metric in ("count", "sum", "privacy_id_count"):
        assert (first[metric] != {"count": 10, "sum": 500, "privacy_id_count": 5}[metric]).all()
        assert not np.array_equal(first[metric], second[metric])
        assert first[metric].std() > 0


def test_pre_threshold_drops_partitions_below_it():
    """At a huge epsilon, keys with >= 2 units are kept unless below the pre-threshold."""
    plan = make_plan(epsilon=1e4, public_partitions=False, pre_threshold=40)
    agg = aggregates([(k, 30 if k < 50 else 60, 3, 90.0) for k in range(100)])
    out = release_partitions(agg, [KEY], plan)
    assert out[KEY].tolist() == list(range(50, 100))
