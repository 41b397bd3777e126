"""Exact tier: the plan-time arithmetic a Laplace run does without importing pipeline-dp
(`planner.NaiveSplit`, `plan.LaplaceNoise`) equals pipeline-dp 0.3.1's own, bit for bit, over
a grid of budgets, weights, sensitivities and multipliers; their refusals too."""

from __future__ import annotations

import itertools
import math

import pipeline_dp
import pytest
from pipeline_dp import dp_computations
from pipeline_dp.aggregate_params import MechanismType

from dppipeline.core.plan import LaplaceNoise, MechanismBudget
from dppipeline.core.planner import NaiveSplit

TYPES = {
    "laplace": MechanismType.LAPLACE,
    "gaussian": MechanismType.GAUSSIAN,
    "truncated_geometric": MechanismType.TRUNCATED_GEOMETRIC,
    "laplace_thresholding": MechanismType.LAPLACE_THRESHOLDING,
    "gaussian_thresholding": MechanismType.GAUSSIAN_THRESHOLDING,
}
EPSILONS = (1e-6, 0.1, 1 / 3, 1.0, 7.7, 1e3)
DELTAS = (0.0, 1e-12, 1e-6, 0.3)
REQUESTS = (
    (("laplace", 1.0),),
    (("laplace", 0.5), ("laplace", 0.5), ("truncated_geometric", 0.5)),
    (("gaussian", 1 / 3), ("gaussian", 1 / 3), ("gaussian", 1 / 3), ("laplace", 0.1)),
    (("laplace", 0.7), ("gaussian_thresholding", 0.7), ("laplace", 2.9), ("laplace", 1e-3)),
    (("laplace_thresholding", 1.0), ("gaussian", 0.25), ("laplace", 0.0), ("gaussian", 3.0)),
)


def _split(make, request, requests):
    """The (eps, delta) of each request, or the refusal's message."""
    try:
        accountant = make()
        shares = [request(accountant, kind, weight, str(i)) for i, (kind, weight) in requests]
        accountant.compute_budgets()
    except ValueError as exc:
        return str(exc)
    return [(share.eps, share.delta) for share in shares]


@pytest.mark.parametrize("requests", REQUESTS)
def test_naive_split_is_pipeline_dps_split(requests):
    numbered = list(enumerate(requests))
    checked = 0
    for epsilon, delta in itertools.product(EPSILONS, DELTAS):
        ours = _split(
            lambda e=epsilon, d=delta: NaiveSplit(total_epsilon=e, total_delta=d),
            lambda a, kind, weight, name: a.request_budget(kind, weight=weight, name=name),
            numbered,
        )
        theirs = _split(
            lambda e=epsilon, d=delta: pipeline_dp.NaiveBudgetAccountant(
                total_epsilon=e, total_delta=d
            ),
            lambda a, kind, weight, name: a.request_budget(TYPES[kind], weight=weight, name=name),
            numbered,
        )
        assert ours == theirs, (epsilon, delta)
        checked += isinstance(ours, list)
    assert checked > 0  # the grid is not all refusals


@pytest.mark.parametrize(("epsilon", "delta"), [(0.0, 0.0), (-1.0, 1e-6), (1.0, -1e-9), (1.0, 1.0)])
def test_naive_split_refuses_what_pipeline_dp_refuses(epsilon, delta):
    with pytest.raises(ValueError) as ours:
        NaiveSplit(total_epsilon=epsilon, total_delta=delta)
    with pytest.raises(ValueError) as theirs:
        pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=delta)
    assert str(ours.value) == str(theirs.value)


def _pipeline_dp_laplace(budget: MechanismBudget) -> dp_computations.AdditiveMechanism:
    """What `MechanismBudget.build_additive` returned for Laplace before `LaplaceNoise`."""
    if budget.noise_multiplier is not None:
        return dp_computations.LaplaceMechanism.create_from_std_deviation(
            math.sqrt(2) * budget.noise_multiplier, budget.l1_sensitivity
        )
    sensitivities = (
        dp_computations.Sensitivities(l0=budget.l0_sensitivity, linf=budget.linf_sensitivity)
        if budget.l1 is None and budget.l2 is None
        else dp_computations.Sensitivities(l1=budget.l1_sensitivity, l2=budget.l2_sensitivity)
    )
    return dp_computations.create_additive_mechanism(budget.build_spec(), sensitivities)


def _laplace_budgets():
    for epsilon, l0, linf, explicit, multiplier in itertools.product(
        (1e-4, 0.05, 1 / 3, 1.0, 9.5, 700.0),
        (1, 3, 20, 1000),
        (0.5, 1.0, 10.0, 1234.5),
        (False, True),
        (None, 0.37, 2.0, 55.5),
    ):
        l1, l2 = (linf * 7, linf * math.sqrt(7)) if explicit else (None, None)
        yield MechanismBudget(
            "centred_sum", "laplace", epsilon, 0.0, l0, linf, None, multiplier, l1=l1, l2=l2
        )


def test_laplace_noise_is_the_mechanism_pipeline_dp_builds():
    """The same PyDP mechanism: same epsilon and sensitivity handed to PyDP, same std."""
    count = 0
    for budget in _laplace_budgets():
        ours, theirs = LaplaceNoise.of(budget), _pipeline_dp_laplace(budget)
        assert isinstance(theirs, dp_computations.LaplaceMechanism)
        pydp_ours, pydp_theirs = ours._mechanism, theirs._mechanism
        assert (pydp_ours.epsilon, pydp_ours.sensitivity) == (
            pydp_theirs.epsilon,
            pydp_theirs.sensitivity,
        ), budget
        assert ours.std == theirs.std, budget
        assert budget.build_additive().std == theirs.std
        count += 1
    assert count == 6 * 4 * 4 * 2 * 4


@pytest.mark.parametrize(
    ("l0", "linf", "l1", "l2"), [(0, 1.0, None, None), (2, 0.0, None, None), (2, 1.0, 0.0, 1.0)]
)
def test_laplace_noise_refuses_what_pipeline_dp_refuses(l0, linf, l1, l2):
    budget = MechanismBudget("sum", "laplace", 1.0, 0.0, l0, linf, None, l1=l1, l2=l2)
    with pytest.raises(ValueError):
        _pipeline_dp_laplace(budget)
    with pytest.raises(ValueError):
        LaplaceNoise.of(budget)
