"""Tight accounting (`accounting: pld | zcdp`): the composed guarantee, checked with dp_accounting
independently of the code that split the budget; the noise the plan states, in the three tiers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pytest
from conftest import release_small, terminal_truth
from dp_accounting import dp_event, pld, rdp
from scipy.stats import norm

from dppipeline.core.accounting import smallest_multiplier
from dppipeline.core.budget import NOT_ADDITIVE, AggregationParams, JobPlan, plan_budget
from dppipeline.core.release import release_partitions
from dppipeline.orchestration.runner import make_plan
from dppipeline.spec.model import build_spec, load_raw

REPO = Path(__file__).resolve().parents[1]
BANK = REPO / "jobs" / "configs" / "bank_partner_release.yaml"
Z_1E6 = float(norm.isf(0.5e-6))  # two-sided normal quantile, failure rate 1e-6


def bank_plan(accounting: str, noise: str = "gaussian") -> JobPlan:
    # continuous counts: the independent check below composes continuous mechanisms
    # (discrete ones: tests/test_discrete_noise.py)
    overrides = {
        "accounting": accounting,
        "noise": noise,
        "budget.epsilon": 4.0,
        "count_noise": "continuous",
    }
    return make_plan(build_spec(load_raw(BANK), overrides))


def independent_epsilon(accounting: str, plan: JobPlan, pool_delta: float) -> float:
    """The pool's epsilon at `pool_delta`, composed here from each mechanism's std and
    sensitivities (not from the plan's multipliers), with dp_accounting's own defaults."""
    events = []
    for m in plan.additive_mechanisms():
        l0, linf = m.l0_sensitivity, m.linf_sensitivity
        assert m.noise_stddev is not None
        if m.kind == "gaussian":
            events.append(dp_event.GaussianDpEvent(m.noise_stddev / (math.sqrt(l0) * linf)))
        else:
            events.append(dp_event.LaplaceDpEvent(m.noise_stddev / math.sqrt(2) / (l0 * linf)))
    book = pld.PLDAccountant() if accounting == "pld" else rdp.RdpAccountant()
    book.compose(dp_event.ComposedDpEvent(events))
    return float(book.get_epsilon(pool_delta))


def fixed_shares(plan: JobPlan) -> tuple[float, float]:
    """(epsilon, delta) of the mechanisms kept out of the pool: selections and percentiles."""
    fixed = [g.mechanism for g in plan.selections]
    fixed += [m for q in plan.queries for m in q.own_mechanisms() if m.name in NOT_ADDITIVE]
    return math.fsum(m.epsilon for m in fixed), math.fsum(m.delta for m in fixed)


@pytest.mark.parametrize("noise", ["gaussian", "laplace"])
@pytest.mark.parametrize("accounting", ["pld", "zcdp"])
def test_the_composed_guarantee_meets_the_job_budget(accounting, noise):
    plan = bank_plan(accounting, noise)
    pool = plan.additive_mechanisms()
    expected = sum(1 for q in plan.queries for m in q.plan.mechanisms if m.name not in NOT_ADDITIVE)
    assert len(pool) == expected > 12  # every noise mechanism of the 12 queries
    assert all(m.noise_multiplier is not None for m in pool)
    fixed_eps, fixed_delta = fixed_shares(plan)
    pool_eps = independent_epsilon(accounting, plan, plan.delta - fixed_delta)
    # basic composition of the pool with the selections and percentiles
    assert pool_eps + fixed_eps <= plan.epsilon * (1 + 1e-6), (pool_eps, fixed_eps)
    # ... and not loose: the search stops within its precision of the budget
    assert pool_eps + fixed_eps >= plan.epsilon * 0.99
    assert plan.total_spent() == pytest.approx((4.0, 1e-6))  # what the ledger charges


def test_the_check_fails_when_a_mechanism_is_left_out():
    """A split that forgot one mechanism (a multiplier for one fewer) breaks the budget when
    all the mechanisms the job runs are composed: the check above would catch it."""
    plan = bank_plan("pld")
    pool = plan.additive_mechanisms()
    fixed_eps, fixed_delta = fixed_shares(plan)
    target = (plan.epsilon - fixed_eps, plan.delta - fixed_delta)
    weights = [plan.noise_multiplier / m.noise_multiplier for m in pool]
    short = smallest_multiplier("pld", [("gaussian", w) for w in weights[1:]], *target)
    assert short < plan.noise_multiplier
    events = [dp_event.GaussianDpEvent(short / w) for w in weights]
    book = pld.PLDAccountant()
    book.compose(dp_event.ComposedDpEvent(events))
    assert book.get_epsilon(target[1]) > target[0]


def test_tight_accounting_lowers_the_noise_of_the_bank_job():
    """The bank's 12 queries at (4, 1e-6): median noise std of released counts and sums under
    basic + Laplace (today's default) against zcdp and pld with Gaussian noise."""

    def medians(plan: JobPlan) -> dict[str, float]:
        stds: dict[str, list[float]] = {"count": [], "sum": []}
        for q in plan.queries:
            for metric, values in stds.items():
                if metric in q.plan.params.metrics:
                    values.append(q.plan.metric_noise_stddev(metric))
        return {metric: float(np.median(v)) for metric, v in stds.items()}

    basic = medians(bank_plan("basic", "laplace"))
    for accounting in ("zcdp", "pld"):
        tight = medians(bank_plan(accounting))
        assert tight["count"] < basic["count"] / 2, (accounting, tight, basic)
        assert tight["sum"] < basic["sum"] / 3, (accounting, tight, basic)
    assert medians(bank_plan("pld"))["count"] <= medians(bank_plan("zcdp"))["count"]


def plan_for(accounting: str, noise: str, epsilon: float = 1.0):
    params = AggregationParams(
        metrics=("count", "sum", "mean", "privacy_id_count"),
        noise=noise,
        max_partitions_contributed=4,
        max_contributions_per_partition=3,
        min_value=0.0,
        max_value=100.0,
        public_partitions=True,
    )
    return plan_budget(params, epsilon, 1e-6, accounting)


@pytest.mark.parametrize("noise", ["gaussian", "laplace"])
@pytest.mark.parametrize("accounting", ["pld", "zcdp"])
@pytest.mark.parametrize("metric", ["count", "sum", "privacy_id_count"])
def test_statistical_tier_the_noise_is_the_planned_one(accounting, noise, metric):
    """Variance of (released - exact) over n partitions against the planned std, whose value
    is recomputed from first principles (multiplier x sensitivity); tolerance from the sample
    variance's std, sigma^2 sqrt((kurtosis - 1) / n), failure rate 1e-6."""
    n = 20000
    plan = plan_for(accounting, noise)
    exact = pd.DataFrame(
        [(k, 7, 20, 1234.0) for k in range(n)],
        columns=["TERMINAL_ID", "privacy_id_count", "count", "sum"],
    )
    out = release_partitions(exact, ["TERMINAL_ID"], plan)
    truth = {"count": 20.0, "sum": 1234.0, "privacy_id_count": 7.0}[metric]
    draws = out[metric].to_numpy() - truth

    def std_of(name: str) -> float:
        m = plan.mechanism(name)
        assert m.noise_multiplier is not None
        if noise == "gaussian":
            return m.noise_multiplier * math.sqrt(m.l0_sensitivity) * m.linf_sensitivity
        return math.sqrt(2) * m.noise_multiplier * m.l0_sensitivity * m.linf_sensitivity

    sigma = (
        math.hypot(std_of("centred_sum"), plan.params.midpoint * std_of("count"))
        if metric == "sum"
        else std_of(metric)
    )
    assert plan.metric_noise_stddev(metric) == pytest.approx(sigma, rel=1e-9)
    kurtosis = 3.0 if noise == "gaussian" and metric != "sum" else 6.0
    ratio = float(np.var(draws)) / sigma**2
    assert abs(ratio - 1) <= Z_1E6 * math.sqrt((kurtosis - 1) / n), ratio
    assert abs(draws.mean()) <= Z_1E6 * sigma / math.sqrt(n)


@pytest.mark.parametrize(
    ("accounting", "engine"),
    [("pld", "local"), ("zcdp", "local"), ("pld", "spark"), ("zcdp", "beam")],
)
def test_exact_tier_and_noise_present(small_inputs, tmp_path, accounting, engine, request):
    """At a huge epsilon the release equals the truth on every engine (the plan travels to
    Spark's and Beam's workers); at epsilon 1 it differs from it and between runs; the
    manifest names the accounting and the multiplier."""
    if engine == "spark":
        request.getfixturevalue("spark")
    # continuous counts: the tolerance is a normal tail (discrete: tests/test_discrete_noise.py)
    tight = {"accounting": accounting, "noise": "gaussian", "count_noise": "continuous"}
    exact, manifest = release_small(
        small_inputs, tmp_path / "exact", engine, **tight, **{"budget.epsilon": 1e7}
    )
    rows = pl.read_parquet(sorted(small_inputs["parquet"].glob("*/*.parquet")))
    truth = terminal_truth(rows, 0.0, 150.0)
    merged = exact.merge(truth, on="TERMINAL_ID", suffixes=("", "_true"))
    metrics = manifest["queries"]["terminal_stats"]["metrics"]
    for metric in ("count", "sum"):
        # all values within Z(1e-6, union over both metrics and every terminal) stds
        z = float(norm.isf(0.5e-6 / (2 * len(merged))))
        std = metrics[metric]["noise_stddev"]
        assert std < (1.0 if metric == "count" else 100.0), (metric, std)  # near noise-free
        assert np.all(np.abs(merged[metric] - merged[f"{metric}_true"]) <= z * std), metric
    assert manifest["accountant"].startswith(accounting)
    assert manifest["noise_multiplier"] > 0
    first, _ = release_small(small_inputs, tmp_path / "a", engine, **tight)
    second, _ = release_small(small_inputs, tmp_path / "b", engine, **tight)
    assert not np.allclose(first["count"], second["count"])
    assert not np.allclose(first["count"], exact["count"])


@pytest.mark.parametrize("epsilon", [0.0003, 0.01, 1.0, 100.0])
def test_tight_accounting_never_adds_noise_over_basic(epsilon):
    """The auditor's case: at small epsilon dp_accounting's default Rényi orders floor epsilon
    near 0.006, and the search returned 100x the noise of basic composition. Every noise
    mechanism of the bank job, at every epsilon, gets less noise than under basic."""
    overrides = {"noise": "gaussian", "budget.epsilon": epsilon}
    basic = make_plan(build_spec(load_raw(BANK), {**overrides, "accounting": "basic"}))
    for accounting in ("zcdp", "pld"):
        tight = make_plan(build_spec(load_raw(BANK), {**overrides, "accounting": accounting}))
        assert tight.certified_by == accounting
        for q in tight.queries:
            for m in q.own_mechanisms():
                if m.name not in NOT_ADDITIVE:
                    was = basic.query(q.name).plan.mechanism(m.name).noise_stddev
                    assert m.noise_stddev < was, (accounting, q.name, m.name)
