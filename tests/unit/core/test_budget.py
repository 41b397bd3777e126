"""The budget split and noise scales, checked against hand-computed values and pipeline-dp."""

from __future__ import annotations

import math

import pipeline_dp
import pytest
from pipeline_dp import budget_accounting, dp_computations
from pipeline_dp.aggregate_params import MechanismType

from dppipeline.core.plan import AggregationParams, privacy_units_needed
from dppipeline.core.planner import plan_budget
from dppipeline.errors import UsageError


def params(**overrides) -> AggregationParams:
    base = dict(
        metrics=("count", "sum", "mean"),
        noise="laplace",
        max_partitions_contributed=20,
        max_contributions_per_partition=10,
        min_value=0.0,
        max_value=200.0,
        public_partitions=True,
    )
    base.update(overrides)
    return AggregationParams(**base)


def test_count_sum_mean_public_laplace_matches_hand_computed_scales():
    plan = plan_budget(params(), epsilon=1.0, delta=1e-6)
    assert [m.name for m in plan.mechanisms] == ["count", "centred_sum"]
    count, centred = plan.mechanism("count"), plan.mechanism("centred_sum")
    assert count.epsilon == pytest.approx(0.5) and centred.epsilon == pytest.approx(0.5)
    # Laplace b = L0 * Linf_metric / eps; std = sqrt(2) b.
    assert count.noise_stddev == pytest.approx(math.sqrt(2) * 20 * 10 / 0.5)
    assert centred.noise_stddev == pytest.approx(math.sqrt(2) * 20 * (100 * 10) / 0.5)
    # sum under mean = centred sum + midpoint * count: two independent noises.
    expected_sum = math.hypot(centred.noise_stddev, 100 * count.noise_stddev)
    assert plan.metric_noise_stddev("sum") == pytest.approx(expected_sum)
    assert plan.metric_noise_stddev("mean") is None


def test_private_selection_takes_a_share_and_all_delta_under_laplace():
    plan = plan_budget(
        params(metrics=("count", "sum", "mean", "privacy_id_count"), public_partitions=False),
        epsilon=1.0,
        delta=1e-6,
    )
    names = [m.name for m in plan.mechanisms]
    assert names == ["count", "centred_sum", "privacy_id_count", "partition_selection"]
    for m in plan.mechanisms:
        assert m.epsilon == pytest.approx(0.25)
    assert plan.selection is not None and plan.selection.delta == pytest.approx(1e-6)
    assert plan.mechanism("count").delta == 0
    assert plan.mechanism("privacy_id_count").noise_stddev == pytest.approx(
        math.sqrt(2) * 20 / 0.25
    )


@pytest.mark.parametrize(
    ("metrics", "noise", "public", "epsilon", "delta"),
    [
        (("count",), "laplace", True, 1.0, 0.0),
        (("sum",), "gaussian", True, 2.0, 1e-5),
        (("count", "sum", "mean", "privacy_id_count"), "gaussian", False, 0.7, 1e-6),
        (("mean",), "laplace", False, 3.0, 1e-8),
    ],
)
def test_split_sums_to_the_total(metrics, noise, public, epsilon, delta):
    plan = plan_budget(
        params(metrics=metrics, noise=noise, public_partitions=public), epsilon, delta
    )
    spent_eps, spent_delta = plan.total_spent()
    assert spent_eps == pytest.approx(epsilon, rel=1e-12)
    uses_delta = noise == "gaussian" or not public
    assert spent_delta == pytest.approx(delta if uses_delta else 0.0, rel=1e-12, abs=0)


def test_sum_without_mean_uses_max_abs_sensitivity():
    plan = plan_budget(
        params(metrics=("sum",), min_value=-50.0, max_value=20.0), epsilon=1.0, delta=0.0
    )
    assert plan.mechanism("sum").linf_sensitivity == 50.0 * 10
    assert plan.metric_noise_stddev("sum") == pytest.approx(math.sqrt(2) * 20 * 500 / 1.0)


def test_gaussian_std_equals_pipeline_dp_mechanism():
    plan = plan_budget(params(noise="gaussian"), epsilon=1.0, delta=1e-6)
    spec = budget_accounting.MechanismSpec(MechanismType.GAUSSIAN)
    spec.set_eps_delta(0.5, 0.5e-6)
    expected = dp_computations.create_additive_mechanism(
        spec, dp_computations.Sensitivities(l0=20, linf=10)
    ).std
    assert plan.mechanism("count").noise_stddev == pytest.approx(expected)
    # sigma = L2 * c(eps, delta) with L2 = sqrt(L0) * Linf: grows with sqrt(L0), not L0.
    plan4 = plan_budget(
        params(noise="gaussian", max_partitions_contributed=80), epsilon=1.0, delta=1e-6
    )
    ratio = plan4.mechanism("count").noise_stddev / plan.mechanism("count").noise_stddev
    assert ratio == pytest.approx(2.0, rel=1e-6)


def test_split_equals_pipeline_dp_engine_split():
    """The same metrics through pipeline-dp's own DPEngine request the same shares."""
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=1.0, total_delta=1e-6)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    aggregate_params = pipeline_dp.AggregateParams(
        noise_kind=pipeline_dp.NoiseKind.LAPLACE,
        metrics=[
            pipeline_dp.Metrics.COUNT,
            pipeline_dp.Metrics.SUM,
            pipeline_dp.Metrics.MEAN,
            pipeline_dp.Metrics.PRIVACY_ID_COUNT,
        ],
        max_partitions_contributed=20,
        max_contributions_per_partition=10,
        min_value=0.0,
        max_value=200.0,
    )
    extractors = pipeline_dp.DataExtractors(
        privacy_id_extractor=lambda r: r[0],
        partition_extractor=lambda r: r[1],
        value_extractor=lambda r: r[2],
    )
    engine.aggregate([(1, 1, 1.0)], aggregate_params, extractors)
    accountant.compute_budgets()
    theirs = sorted((s.eps, s.delta or 0.0) for s in accountant.mechanism_specs)
    plan = plan_budget(
        params(metrics=("count", "sum", "mean", "privacy_id_count"), public_partitions=False),
        epsilon=1.0,
        delta=1e-6,
    )
    ours = sorted((m.epsilon, m.delta) for m in plan.mechanisms)
    assert len(ours) == len(theirs) == 4
    for (our_eps, our_delta), (their_eps, their_delta) in zip(ours, theirs, strict=True):
        assert our_eps == pytest.approx(their_eps) and our_delta == pytest.approx(their_delta)


def test_privacy_units_needed_is_where_release_probability_crosses():
    plan = plan_budget(params(public_partitions=False), epsilon=1.0, delta=1e-6)
    n50 = privacy_units_needed(plan, 0.5)
    n95 = privacy_units_needed(plan, 0.95)
    assert n50 is not None and n95 is not None and 1 < n50 <= n95
    strategy = plan.selection.build_selection(None)
    assert strategy.probability_of_keep(n50) >= 0.5 > strategy.probability_of_keep(n50 - 1)
    assert strategy.probability_of_keep(n95) >= 0.95 > strategy.probability_of_keep(n95 - 1)
    assert privacy_units_needed(plan_budget(params(), 1.0, 1e-6), 0.5) is None


def test_unsound_gaussian_thresholding_is_refused():
    with pytest.raises(UsageError, match=r"partition_selection\.strategy"):
        plan_budget(
            params(
                metrics=("count",),
                public_partitions=False,
                selection_strategy="gaussian_thresholding",
            ),
            epsilon=5000.0,
            delta=1e-6,
        )
