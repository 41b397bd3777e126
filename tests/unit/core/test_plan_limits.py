"""Numbers PyDP cannot handle are refused when the plan is made, naming the spec field.

Each case was a traceback (or a silent privacy failure) before: a C++ `Bad StatusOr access`,
a numpy TypeError, PyDP's Gaussian returning sigma 2.2e-308 (no noise at all) at a large
epsilon, a ValueError while writing the manifest. The plan checks every mechanism it builds.
"""

from __future__ import annotations

import math

import pytest
from scipy.stats import norm

from dppipeline.core.plan import AggregationParams, gaussian_delta, privacy_units_needed
from dppipeline.core.planner import plan_budget
from dppipeline.errors import SpecError, UsageError
from dppipeline.lifecycle.runner import make_plan
from dppipeline.spec.model import build_spec


def spec(**overrides):
    base = {
        "bounds.min_value": 0.0,
        "bounds.max_value": 100.0,
        "bounds.max_partitions_contributed": 1,
        "bounds.max_contributions_per_partition": 1,
    }
    return build_spec({}, {**base, **overrides})


def params(**changes) -> AggregationParams:
    base = {
        "metrics": ("count", "sum", "mean"),
        "noise": "laplace",
        "max_partitions_contributed": 1,
        "max_contributions_per_partition": 1,
        "min_value": 0.0,
        "max_value": 100.0,
        "public_partitions": True,
    }
    return AggregationParams(**{**base, **changes})


def refused(**overrides) -> SpecError:
    with pytest.raises(SpecError) as info:
        make_plan(spec(**overrides))
    assert "\n" not in str(info.value)
    assert "StatusOr" not in str(info.value)
    return info.value


def test_an_epsilon_share_below_pydps_minimum_names_budget_epsilon():
    """1e-15 passes the field's own rule (>= 2^-50) but is split three ways."""
    error = refused(**{"budget.epsilon": 1e-15})
    assert error.field == "budget.epsilon"
    assert "the count mechanism an epsilon of 3.33e-16" in error.rule
    assert "2^-50" in error.rule


def test_a_tiny_query_weight_names_the_weight_too():
    raw = {
        "bounds": {
            "min_value": 0.0,
            "max_value": 100.0,
            "max_partitions_contributed": 1,
            "max_contributions_per_partition": 1,
        },
        "budget": {"epsilon": 1.0},
        "queries": [
            {"name": "big", "partition_selection": {"public_partitions": "1..5"}},
            {
                "name": "tiny",
                "budget_weight": 1e-20,
                "partition_selection": {"public_partitions": "1..5"},
            },
        ],
    }
    with pytest.raises(SpecError) as info:
        make_plan(build_spec(raw))
    assert info.value.field == "budget.epsilon"
    assert "of query tiny" in info.value.rule
    assert "queries.tiny.budget_weight" in info.value.rule


@pytest.mark.parametrize("epsilon", [710.0, 3000.0, 1e7])
def test_gaussian_noise_past_pydps_range_is_refused(epsilon):
    """Above ln(DBL_MAX) ~ 709.78 per mechanism PyDP's Gaussian sigma is 2.2e-308: no noise,
    while the manifest would claim (epsilon, delta)-DP. Public keys: only the noise counts."""
    error = refused(
        **{
            "noise": "gaussian",
            "count_noise": "continuous",  # PyDP's limit (OpenDP's discrete Gaussian has none)
            "metrics": ["count"],
            "budget.epsilon": epsilon,
            "partition_selection.public_partitions": "1..5",
        }
    )
    assert error.field == "budget.epsilon"
    assert "use laplace noise" in error.rule


def test_gaussian_noise_just_below_the_edge_is_sound():
    plan = make_plan(
        spec(
            noise="gaussian",
            metrics=["count"],
            count_noise="continuous",  # PyDP's edge
            **{"budget.epsilon": 700.0, "partition_selection.public_partitions": "1..5"},
        )
    )
    mechanism = plan.queries[0].plan.mechanism("count")
    assert gaussian_delta(mechanism.noise_stddev, mechanism.epsilon, 1.0) <= mechanism.delta


@pytest.mark.parametrize(
    ("sigma", "epsilon", "l2"), [(4.2265625, 1.0, 1.0), (0.5, 3.0, 1.0), (300.0, 0.02, 7.0)]
)
def test_gaussian_delta_is_the_analytic_formula(sigma, epsilon, l2):
    """Balle and Wang (2018), Theorem 8, computed the plain way where it does not overflow."""
    a, b = l2 / (2 * sigma), epsilon * sigma / l2
    expected = norm.cdf(a - b) - math.exp(epsilon) * norm.cdf(-a - b)
    assert gaussian_delta(sigma, epsilon, l2) == pytest.approx(expected, rel=1e-9)


def test_percentiles_limit_l0_to_what_the_quantile_tree_can_multiply():
    error = refused(
        metrics=["percentile(50)"],
        **{
            "bounds.max_partitions_contributed": 600_000_000,
            "partition_selection.public_partitions": "1..5",
        },
    )
    assert error.field == "bounds.max_partitions_contributed"
    assert "536,870,911" in error.rule
    # at the limit the plan is made (and PyDP's quantile tree accepts it)
    make_plan(
        spec(
            metrics=["percentile(50)"],
            **{
                "bounds.max_partitions_contributed": 536_870_911,
                "partition_selection.public_partitions": "1..5",
            },
        )
    )


def test_a_selection_that_could_never_release_is_refused():
    """At epsilon 1e-10 and delta 1e-30 a partition needs more than 2^40 units: the plan (and
    the manifest, which states the units needed) raised a ValueError after the data was read.
    At delta 1e-6 about 950,000 units suffice: planned."""
    make_plan(spec(**{"budget.epsilon": 1e-10}))
    error = refused(**{"budget.epsilon": 1e-10, "budget.delta": 1e-30})
    assert error.field == "budget.epsilon"
    assert "2^40" in error.rule


def test_truncated_geometric_at_a_huge_epsilon_is_sound_and_needs_two_units():
    """PyDP says NaN for the probability of keeping a one-unit partition above epsilon 709.78
    (and never keeps one); the units needed are 2, not the 1 a NaN comparison gave."""
    plan = plan_budget(params(public_partitions=False), epsilon=1e4, delta=1e-6)
    selection = plan.selection
    assert selection is not None
    assert math.isnan(selection.build_selection(None).probability_of_keep(1))
    assert privacy_units_needed(plan, 0.5) == 2
    assert privacy_units_needed(plan, 0.95) == 2


def test_laplace_thresholding_past_its_range_is_refused():
    with pytest.raises(UsageError, match="releases a partition of one privacy unit"):
        make_plan(
            spec(
                **{"budget.epsilon": 1e300, "partition_selection.strategy": "laplace_thresholding"}
            )
        )


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_the_widest_spec_the_limits_allow_plans_finite_noise(noise):
    """Bounds +-1e15, L0 and Linf at 2^31 - 1, variance: every std finite and positive.
    Gaussian noise: PyDP caps sigma near 3e27, which at epsilon 2^-40 honours a delta of
    1e-20 but not 1e-30 (refused at plan time, before any data is read)."""
    widest = {
        "bounds.min_value": -1e15,
        "bounds.max_value": 1e15,
        "bounds.max_partitions_contributed": 2**31 - 1,
        "bounds.max_contributions_per_partition": 2**31 - 1,
        "budget.epsilon": 2.0**-40,
        "budget.delta": 1e-100 if noise == "laplace" else 1e-20,
        "partition_selection.public_partitions": "1..5",
        "count_noise": "continuous",  # PyDP's limits; discrete: test_discrete_noise.py
    }
    metrics = ["count", "sum", "mean", "variance", "privacy_id_count"]
    plan = make_plan(spec(noise=noise, metrics=metrics, **widest))
    if noise == "gaussian":
        error = refused(noise=noise, metrics=metrics, **{**widest, "budget.delta": 1e-30})
        assert error.field == "budget.epsilon" and "only gives delta" in error.rule
    for mechanism in plan.queries[0].plan.mechanisms:
        assert math.isfinite(mechanism.noise_stddev) and mechanism.noise_stddev > 0
        noisy = mechanism.build_additive().add_noise(0.0)
        assert math.isfinite(noisy)
