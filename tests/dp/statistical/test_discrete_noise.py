"""Integer counts (`count_noise: discrete`): OpenDP's discrete Laplace and Gaussian on count and
privacy_id_count, in the three tiers, with their accounting checked independently.

- Exact tier: at a huge epsilon every engine releases the exact integer counts, as int64.
- Statistical tier: the mean of squared released noise over n draws is within
  Z * sqrt(Var(X^2) / n) of the plan's exact variance, Z the two-sided normal quantile for a
  failure rate of 1e-6; E[X^2] and E[X^4] are computed here by summing the distribution's mass
  (not with the code under test).
- Noise present: at epsilon 1 the counts differ from the truth and between runs.
- Accounting: the (epsilon, delta) of the discrete mechanisms composed by dp_accounting and
  OpenDP's own privacy maps, from each mechanism's scale and sensitivities (not from the plan's
  multipliers or the ledger's events).
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pandas as pd
import polars as pl
import pyarrow.parquet as pq
import pytest
from dp_accounting import dp_event, rdp
from dp_accounting.pld import privacy_loss_distribution as pld
from scipy.stats import norm
from support.data import release_small, terminal_truth
from test_accounting import BANK, independent_others

from dppipeline.core import discrete
from dppipeline.core.events import composed_epsilon, release_events
from dppipeline.core.extremes import privacy_loss
from dppipeline.core.intervals import half_width
from dppipeline.core.mechanisms import noise_partitions
from dppipeline.core.plan import NOT_ADDITIVE, AggregationParams, JobPlan
from dppipeline.core.planner import plan_budget
from dppipeline.lifecycle.runner import make_plan
from dppipeline.reports.check_release import check_release
from dppipeline.spec.loader import load_raw
from dppipeline.spec.model import build_spec

Z = float(norm.isf(0.5e-6))  # two-sided, failure rate 1e-6


def pmf(kind: str, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """The distribution's support (|x| <= 60 scales + 20) and mass, by brute force."""
    x = np.arange(-math.ceil(60 * scale) - 20, math.ceil(60 * scale) + 21, dtype=np.float64)
    mass = (
        np.exp(-np.abs(x) / scale)
        if kind == "discrete_laplace"
        else np.exp(-(x**2) / (2 * scale**2))
    )
    return x, mass / mass.sum()


def count_plan(noise: str, epsilon: float, delta: float = 1e-6, accounting: str = "basic", **kw):
    params = AggregationParams(
        metrics=kw.pop("metrics", ("count", "privacy_id_count")),
        noise=noise,
        max_partitions_contributed=kw.pop("l0", 1),
        max_contributions_per_partition=kw.pop("linf", 1),
        min_value=0.0,
        max_value=100.0,
        public_partitions=True,
        count_noise="discrete",
        **kw,
    )
    return plan_budget(params, epsilon, delta, accounting)


def zeros(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "k": np.arange(n),
            "privacy_id_count": np.zeros(n, dtype=np.int64),
            "count": np.zeros(n, dtype=np.int64),
            "sum": np.zeros(n),
        }
    )


# ---------------------------------------------------------------------- exact tier, engines


@pytest.fixture(params=["local", "spark", "beam"])
def engine(request):
    if request.param == "spark":
        request.getfixturevalue("spark")
    if request.param == "beam":
        from dppipeline.engines.beam.engine import BeamEngine

        return BeamEngine()
    return request.param


def test_exact_integer_counts_on_every_engine(small_inputs, tmp_path, engine):
    """Epsilon 1e7: discrete Laplace of scale 1e-7 x L1 is 0 except with probability
    2 e^(-1/t) (below 1e-300 here), so every count equals the truth exactly, as int64 in
    the Parquet file; the manifest names the mechanism; check-release accepts the schema."""
    released, manifest = release_small(
        small_inputs, tmp_path, engine, **{"budget.epsilon": 1e7, "confidence_intervals": True}
    )
    split = manifest["queries"]["terminal_stats"]["budget_split"]
    assert manifest["count_noise"] == "discrete"
    for name in ("count", "privacy_id_count"):
        assert split[name]["mechanism"] == "discrete_laplace"
        t = split[name]["noise_scale"]
        assert 2 * math.exp(-1 / t) < 1e-12  # P(any noise) over 60 partitions: negligible
    assert split["centred_sum"]["mechanism"] == "laplace"  # sums stay continuous
    rows = pl.read_parquet(sorted(small_inputs["parquet"].glob("*/*.parquet")))
    truth = terminal_truth(rows, 0.0, 150.0).set_index("TERMINAL_ID")
    truth = truth.reindex(range(60), fill_value=0)
    for name in ("count", "privacy_id_count"):
        assert released[name].dtype == np.int64
        np.testing.assert_array_equal(released[name].to_numpy(), truth[name].to_numpy())
        # integer intervals of half-width 0 around the exact value
        np.testing.assert_array_equal(released[f"{name}_ci_low"], truth[name].to_numpy())
    folder = tmp_path / "release" / "terminal_stats"
    schema = pq.read_schema(next(folder.glob("*.parquet")))
    assert str(schema.field("count").type) == "int64"
    assert str(schema.field("privacy_id_count").type) == "int64"
    assert str(schema.field("sum").type) == "double"
    assert "valid release" in check_release(tmp_path / "release", None)


def test_exact_tier_with_discrete_gaussian(small_inputs, tmp_path):
    """Gaussian noise, epsilon 1e9 on counts alone: discrete Gaussian counts, exact (sigma
    small enough that P(noise != 0) over 60 partitions is below 1e-9)."""
    released, manifest = release_small(
        small_inputs,
        tmp_path,
        "local",
        **{"budget.epsilon": 1e9, "noise": "gaussian", "metrics": ["count", "privacy_id_count"]},
    )
    rows = pl.read_parquet(sorted(small_inputs["parquet"].glob("*/*.parquet")))
    truth = terminal_truth(rows, 0.0, 150.0).set_index("TERMINAL_ID").reindex(range(60))
    for name in ("count", "privacy_id_count"):
        split = manifest["queries"]["terminal_stats"]["budget_split"][name]
        assert split["mechanism"] == "discrete_gaussian"
        x, mass = pmf("discrete_gaussian", split["noise_scale"])
        assert 60 * mass[x != 0].sum() < 1e-9
        np.testing.assert_array_equal(released[name].to_numpy(), truth[name].fillna(0))


@pytest.mark.parametrize("accounting", ["pld", "zcdp"])
def test_tight_accounting_at_a_huge_epsilon_plans_discrete_laplace(accounting):
    """Where PLD cannot grid the epsilon and RDP is loose, pure Laplace pools are proved by
    basic composition of their pure epsilons: the plan exists and its noise is small."""
    plan = count_plan("laplace", 1e7, accounting=accounting, metrics=("count", "sum"))
    assert plan.mechanism("count").noise_stddev < 1e-3


def test_a_scale_past_int64_reach_is_refused_at_plan_time():
    """Noise of scale above 1e15 could leave int64 (L0 = Linf = 2^31 - 1 at a tiny epsilon):
    refused before any data is read, naming budget.epsilon; 1e15 itself is sampled."""
    from dppipeline.errors import SpecError

    with pytest.raises(SpecError) as info:
        count_plan("laplace", 2.0**-40, l0=2**31 - 1, linf=2**31 - 1)
    assert info.value.field == "budget.epsilon" and "discrete noise scale" in info.value.rule
    drawn = discrete.add_discrete_noise("discrete_laplace", discrete.MAX_SCALE, np.zeros(50))
    assert drawn.dtype == np.int64 and np.abs(drawn).max() > 1e12


# ------------------------------------------------------------------ noise present, sampler


def test_noise_present_and_integer(small_inputs, tmp_path):
    first, _ = release_small(small_inputs, tmp_path / "a", "local", **{"metrics": ["count"]})
    second, _ = release_small(small_inputs, tmp_path / "b", "local", **{"metrics": ["count"]})
    exact, _ = release_small(
        small_inputs, tmp_path / "c", "local", **{"metrics": ["count"], "budget.epsilon": 1e7}
    )
    assert first["count"].dtype == np.int64
    assert (first["count"] != exact["count"]).sum() > 30  # std ~ 7,000: all differ but ~1
    assert (first["count"] != second["count"]).sum() > 30


def test_continuous_count_noise_still_available(small_inputs, tmp_path):
    released, manifest = release_small(
        small_inputs, tmp_path, "local", **{"metrics": ["count"], "count_noise": "continuous"}
    )
    assert released["count"].dtype == np.float64
    assert manifest["queries"]["terminal_stats"]["budget_split"]["count"]["mechanism"] == (
        "laplace"
    )


def test_the_noise_comes_from_opendp_not_numpy(monkeypatch):
    """The sampler is OpenDP's measurement, whose own privacy map states the plan's epsilon;
    numpy's generators are not called."""
    import opendp.prelude as dp

    plan = count_plan("laplace", 0.5, l0=3, linf=2)
    count = plan.mechanism("count")
    sampler = discrete._sampler("discrete_laplace", count.noise_scale)
    assert isinstance(sampler, dp.Measurement)
    assert sampler.map(int(count.l1_sensitivity)) == pytest.approx(count.epsilon, rel=1e-12)

    def refuse(*_, **__):
        raise AssertionError("numpy randomness used for released noise")

    monkeypatch.setattr(np.random, "default_rng", refuse)
    monkeypatch.setattr(np.random, "laplace", refuse)
    monkeypatch.setattr(np.random, "normal", refuse)
    out = noise_partitions(zeros(2000), ["k"], plan)
    assert out["count"].dtype == np.int64 and out["count"].std() > 1


def test_a_large_array_is_drawn_on_threads_in_order(monkeypatch):
    """Past `_VALUES_PER_THREAD` values the array is drawn in chunks on threads: every chunk
    gets noise, and each value's noise lands on that value (scale 3: |noise| > 200 has
    probability below 1e-28 a draw)."""
    monkeypatch.setattr(discrete, "_VALUES_PER_THREAD", 1_000)
    monkeypatch.setattr(discrete.os, "cpu_count", lambda: 4)
    threads: set[str] = set()
    sample = discrete._sampler("discrete_laplace", 3.0)

    def watched(values):
        threads.add(threading.current_thread().name)
        return sample(values)

    monkeypatch.setattr(discrete, "_sampler", lambda kind, scale: watched)
    exact = np.arange(10_000, dtype=np.int64) * 1_000_000
    noise = discrete.add_discrete_noise("discrete_laplace", 3.0, exact) - exact
    assert len(threads) > 1 and all(name.startswith("discrete-noise") for name in threads)
    assert np.abs(noise).max() < 200
    for chunk in np.array_split(noise, 4):
        assert np.count_nonzero(chunk) > 0.5 * len(chunk)  # P(0) = 0.17 at scale 3


# -------------------------------------------------------------------- statistical tier


@pytest.mark.slow
@pytest.mark.parametrize(
    ("noise", "epsilon", "delta"),
    [("laplace", 1.0, 0.0), ("laplace", 0.3, 0.0), ("gaussian", 2.0, 1e-3), ("gaussian", 6.0, 0.1)],
)
def test_released_noise_has_the_planned_exact_variance(noise, epsilon, delta):
    """100,000 draws on empty partitions. At these scales the discrete variance differs from
    the continuous one by 2-40% (Laplace scale 1: 1.84 against 2): continuous noise rounded,
    or a scale off by a factor, fails."""
    plan = count_plan(noise, epsilon, delta, metrics=("count",))
    count = plan.mechanism("count")
    x, mass = pmf(count.mechanism, count.noise_scale)
    second, fourth = float(np.sum(mass * x**2)), float(np.sum(mass * x**4))
    assert count.noise_stddev**2 == pytest.approx(second, rel=1e-9)  # the plan is exact
    n = 100_000
    noise_values = noise_partitions(zeros(n), ["k"], plan)["count"].to_numpy()
    assert noise_values.dtype == np.int64
    tolerance = Z * math.sqrt((fourth - second**2) / n)
    assert abs(np.mean(noise_values.astype(float) ** 2) - second) <= tolerance


def test_exact_variance_and_quantiles_against_brute_force():
    for kind in discrete.DISCRETE_KINDS:
        for scale in (0.2, 0.7, 1.0, 3.0, 9.9, 10.1, 40.0):
            x, mass = pmf(kind, scale)
            assert discrete.discrete_variance(kind, scale) == pytest.approx(
                float(np.sum(mass * x**2)), rel=1e-9
            )
            for alpha in (0.05, 0.025, 1e-3):
                w = discrete.discrete_half_width(kind, scale, alpha)
                assert mass[np.abs(x) > w].sum() <= alpha * (1 + 1e-9)
                assert w == 0 or mass[np.abs(x) > w - 1].sum() > alpha


def test_interval_coverage_is_the_exact_discrete_coverage():
    """The count's interval is an integer half-width; over 50,000 partitions the share it
    covers equals the exact 1 - P(|X| > w) (>= 95%) within the binomial tolerance."""
    plan = count_plan("laplace", 0.5, metrics=("count",), confidence_intervals=True)
    count = plan.mechanism("count")
    w = half_width(count)
    assert w == int(w)
    x, mass = pmf(count.mechanism, count.noise_scale)
    expected = float(mass[np.abs(x) <= w].sum())
    assert expected >= 0.95
    n = 50_000
    out = noise_partitions(zeros(n), ["k"], plan)
    covered = ((out["count_ci_low"] <= 0) & (out["count_ci_high"] >= 0)).mean()
    assert abs(covered - expected) <= Z * math.sqrt(expected * (1 - expected) / n)


# ---------------------------------------------------------------------------- accounting


def test_basic_discrete_gaussian_meets_its_share_by_opendp_and_dp_accounting():
    """Basic composition: each discrete Gaussian's zCDP, as OpenDP's own map states it for the
    sampler drawn, converts with dp_accounting's RDP accountant to at most its (epsilon,
    delta) share, and not much less (the calibration is tight to the conversion)."""
    plan = count_plan("gaussian", 1.0, 1e-6, l0=4, linf=3)
    for m in (plan.mechanism("count"), plan.mechanism("privacy_id_count")):
        sampler = discrete._sampler("discrete_gaussian", m.noise_scale)
        # OpenDP's map takes the integer L2 distance bound; check with L2^2 = L0 Linf^2
        rho = (
            sampler.map(math.ceil(m.l2_sensitivity))
            * (m.l2_sensitivity / math.ceil(m.l2_sensitivity)) ** 2
        )
        assert rho == pytest.approx(m.l2_sensitivity**2 / (2 * m.noise_scale**2), rel=1e-9)
        book = rdp.RdpAccountant()
        book.compose(dp_event.ZCDpEvent(rho))
        eps = book.get_epsilon(m.delta)
        assert eps <= m.epsilon * (1 + 1e-3)
        assert eps >= m.epsilon * 0.97


def bank(accounting: str, noise: str) -> JobPlan:
    overrides = {"accounting": accounting, "noise": noise, "budget.epsilon": 4.0}
    return make_plan(build_spec(load_raw(BANK), overrides))


def independent_pool_pld(
    plan: JobPlan, skip: int | None = None, others: bool = True
) -> pld.PrivacyLossDistribution:
    """The pool composed from each mechanism's scale and sensitivities with dp_accounting's
    PLDs at a fine grid: discrete Laplace of integer L1 sensitivity; discrete Gaussian as L0
    one-dimensional ones of sensitivity Linf; continuous ones by std / sensitivity; the pool's
    other mechanisms (max, selections: `test_accounting.independent_others`) composed too.
    `skip`: the index of an additive mechanism left out; `others`: False, additive only."""
    total = None
    for one in independent_others(plan)[0] if others else []:
        total = one if total is None else total.compose(one)
    for i, m in enumerate(plan.additive_mechanisms()):
        if i == skip:
            continue
        l0, linf = m.l0_sensitivity, m.linf_sensitivity
        grid = 1e-4
        if m.mechanism == "discrete_laplace":
            one = pld.from_discrete_laplace_mechanism(
                1 / m.noise_scale, sensitivity=round(l0 * linf), value_discretization_interval=grid
            )
        elif m.mechanism == "discrete_gaussian":
            one = pld.from_discrete_gaussian_mechanism(
                m.noise_scale, sensitivity=round(linf), value_discretization_interval=grid
            ).self_compose(l0)
        elif m.kind == "gaussian":
            one = pld.from_gaussian_mechanism(
                m.noise_stddev / (math.sqrt(l0) * linf), value_discretization_interval=grid
            )
        else:
            one = pld.from_laplace_mechanism(
                m.noise_stddev / math.sqrt(2) / (l0 * linf), value_discretization_interval=grid
            )
        total = one if total is None else total.compose(one)
    return total


@pytest.mark.slow
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_the_discrete_pool_meets_the_job_budget_independently(noise):
    """The bank's 12 queries under pld with discrete counts: the pool composed independently
    meets its share, within 2% of it (tight), and leaving out one discrete mechanism would
    have met it with room to spare (each counts)."""
    plan = bank("pld", noise)
    pool = plan.additive_mechanisms()
    discrete_ones = [i for i, m in enumerate(pool) if m.discrete]
    assert len(discrete_ones) >= 6 and len(discrete_ones) < len(pool)
    pool_delta = plan.delta - independent_others(plan)[1]  # the thresholds' delta
    eps = independent_pool_pld(plan).get_epsilon_for_delta(pool_delta)
    assert eps <= plan.epsilon * (1 + 1e-6)
    assert eps >= plan.epsilon * 0.98
    without = independent_pool_pld(plan, skip=discrete_ones[0]).get_epsilon_for_delta(pool_delta)
    assert without < eps * 0.999


def independent_other_rdp(plan: JobPlan) -> tuple[list[dp_event.DpEvent], float]:
    """(zCDP events of the bank pool's other mechanisms, the selections' threshold delta): max
    as L0 e-bounded-range draws, e^2 / 8-zCDP each (Cesar and Rogers 2021), e from OpenDP's
    privacy map of its Gumbel scale; a truncated geometric selection as L0 pure e-DP draws,
    e^2 / 2-zCDP each (Bun and Steinke 2016), e its PyDP strategy's epsilon / L0, plus the
    probability that a one-unit partition among L0 is released."""
    events: list[dp_event.DpEvent] = []
    for m in (m for q in plan.queries for m in q.own_mechanisms() if m.name in NOT_ADDITIVE):
        assert m.name in ("max", "min"), m.name  # the bank job's others
        e = privacy_loss(m.noise_scale, round(m.linf_sensitivity))
        events.append(dp_event.ZCDpEvent(m.l0_sensitivity * e**2 / 8))
    threshold_delta = 0.0
    for group in plan.selections:
        s = group.mechanism
        assert s.kind == "truncated_geometric", s.kind
        strategy = s.build_selection(group.pre_threshold)
        e = strategy.epsilon / s.l0_sensitivity
        events.append(dp_event.ZCDpEvent(s.l0_sensitivity * e**2 / 2))
        p_one = strategy.probability_of_keep(1)
        threshold_delta += -math.expm1(s.l0_sensitivity * math.log1p(-p_one))
    return events, threshold_delta


def test_zcdp_pool_with_discrete_gaussians_by_opendp_maps():
    """zcdp accounting, Gaussian noise: each discrete Gaussian's rho from OpenDP's map, every
    continuous Gaussian's from its std, composed as zCDP by dp_accounting: within the pool."""
    plan = bank("zcdp", "gaussian")
    events, threshold_delta = independent_other_rdp(plan)
    for m in plan.additive_mechanisms():
        if m.discrete:
            sampler = discrete._sampler("discrete_gaussian", m.noise_scale)
            l2 = m.l2_sensitivity
            rho = sampler.map(math.ceil(l2)) * (l2 / math.ceil(l2)) ** 2
            events.append(dp_event.ZCDpEvent(rho))
        else:
            events.append(dp_event.GaussianDpEvent(m.noise_stddev / m.l2_sensitivity))
    book = rdp.RdpAccountant()
    book.compose(dp_event.ComposedDpEvent(events))
    assert book.get_epsilon(plan.delta - threshold_delta) <= plan.epsilon * (1 + 1e-3)


@pytest.mark.slow
@pytest.mark.parametrize(("accounting", "noise"), [("basic", "laplace"), ("pld", "gaussian")])
def test_the_ledger_composes_discrete_releases_like_dp_accounting(accounting, noise):
    """Ten nights of the bank job: the ledger's events (discrete kinds with their scale and
    sensitivity) compose to what dp_accounting gives from the mechanisms themselves."""
    plan = bank(accounting, noise)
    events = release_events(plan)
    kinds = {e.kind for e in events}
    assert f"discrete_{noise}" in kinds
    nights = 10
    many = [type(e)(**{**e.__dict__, "count": e.count * nights}) for e in events]
    ledger = composed_epsilon(many, nights * plan.delta, nights * plan.epsilon)
    assert ledger is not None
    pooled = accounting != "basic"  # else: the others by their (epsilon, delta) shares
    independent = independent_pool_pld(plan, others=pooled).self_compose(nights)
    fixed = [g.mechanism for g in plan.selections]
    fixed += [m for q in plan.queries for m in q.own_mechanisms() if m.name in NOT_ADDITIVE]
    for m in [] if pooled else fixed:
        independent = independent.compose(
            pld.from_privacy_parameters(
                pld.common.DifferentialPrivacyParameters(m.epsilon, m.delta),
                value_discretization_interval=1e-4,
            ).self_compose(nights)
        )
    thresholds = nights * independent_others(plan)[1] if pooled else 0.0
    truth = independent.get_epsilon_for_delta(nights * plan.delta - thresholds)
    assert truth <= ledger * (1 + 1e-3)  # sound: nothing dropped or under-counted
    assert ledger <= truth * 1.05  # and tight
