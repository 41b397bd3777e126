"""The ledger composes a scope's releases by their privacy events (`core.events`): what each
release records, what a cap admits, checked with dp_accounting's own accountants independently
of the ledger's code, on SQLite and PostgreSQL.

The independent checks build dp_accounting `DpEvent`s from each planned mechanism's std and
sensitivities (PyDP's numbers, not the stored events) and compose them with `PLDAccountant`
at a finer grid than the ledger's: PLD estimates are pessimistic, so a sound ledger never
admits a set of releases whose independent epsilon exceeds the cap.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import sqlalchemy as sa
from dp_accounting import dp_event, pld
from pydp.algorithms.numerical_mechanisms import GaussianMechanism
from scipy.stats import norm
from support import REPO

from dppipeline.core.events import (
    PrivacyEvent,
    approx_dp,
    composed_epsilon,
    from_json,
    merged,
    release_events,
    to_json,
)
from dppipeline.core.extremes import EXTREME_METRICS, privacy_loss
from dppipeline.core.plan import NOT_ADDITIVE, TREE_HEIGHT, JobPlan, MechanismBudget
from dppipeline.ledger import BudgetExceededError, BudgetPolicy, Ledger, ReleaseKey
from dppipeline.ledger import tables as ledger_tables
from dppipeline.lifecycle.runner import make_plan
from dppipeline.spec.loader import load_raw
from dppipeline.spec.model import build_spec

NIGHTLY = REPO / "jobs" / "configs" / "terminal_stats.yaml"
BANK = REPO / "jobs" / "configs" / "bank_partner_release.yaml"
SCOPE = "card_tx/CUSTOMER_ID"
NIGHT_EPSILON, NIGHT_DELTA, CAP = 0.1, 1e-6, 2.5
STRATEGIES = ("truncated_geometric", "laplace_thresholding", "gaussian_thresholding")
# A job with every mechanism the tight pool holds: a percentile, max and min, and a private
# selection of each strategy (one with a pre-threshold). Planned only, never run.
EVERY = "every_mechanism"
EVERY_SPEC = {
    "name": EVERY,
    "privacy_unit": "CUSTOMER_ID",
    "value": "TX_AMOUNT",
    "budget": {"epsilon": 2.0, "delta": 1e-6},
    "bounds": {
        "max_partitions_contributed": 3,
        "max_contributions_per_partition": 2,
        "min_value": 0.0,
        "max_value": 100.0,
    },
    "input": {"path": "/nowhere", "format": "parquet"},
    "output": "/nowhere/out",
    "queries": [
        {
            "name": "geometric",
            "partition_by": ["TERMINAL_ID"],
            "metrics": ["count", "percentile(50)", "max"],
            "partition_selection": {"strategy": "truncated_geometric"},
        },
        {
            "name": "laplace",
            "partition_by": ["TERMINAL_ID", "day"],
            "metrics": ["min", "sum"],
            "partition_selection": {"strategy": "laplace_thresholding", "pre_threshold": 3},
        },
        {
            "name": "gaussian",
            "partition_by": ["month"],
            "metrics": ["count"],
            "partition_selection": {"strategy": "gaussian_thresholding"},
        },
    ],
}


def job_plan(job: Path | str, overrides: dict[str, object]) -> JobPlan:
    return make_plan(build_spec(EVERY_SPEC if job == EVERY else load_raw(job), overrides))


def nightly_plan(accounting: str = "basic", noise: str = "laplace") -> JobPlan:
    """The nightly example's job (examples/nightly_month.sh): epsilon 0.1 a night."""
    overrides = {
        "accounting": accounting,
        "noise": noise,
        "budget.epsilon": NIGHT_EPSILON,
        "budget.delta": NIGHT_DELTA,
        "count_noise": "continuous",  # discrete counts: tests/dp/statistical/test_discrete_noise.py
    }
    return make_plan(build_spec(load_raw(NIGHTLY), overrides))


class Noise(NamedTuple):
    """A noise mechanism as PyDP runs it: `event` from its noise and sensitivity; the
    ledger's record may be below it by `slack` (PyDP calibrates a pooled Gaussian from
    (epsilon, delta) and may add up to 1% more than the pool composed), within `tol` (what the
    derivation's floating point allows)."""

    event: dp_event.DpEvent
    tol: float = 1e-9
    slack: float = 0.0


class Independent(NamedTuple):
    noise: list[Noise]
    fixed: list[tuple[float, float]]  # (epsilon, delta) of everything else

    @property
    def additive(self) -> list[dp_event.DpEvent]:
        return [n.event for n in self.noise]


def independent_events(plan: JobPlan) -> Independent:
    """Every mechanism the job runs, from what it does, not from the plan's multipliers.
    Under basic composition the non-additive ones are their (epsilon, delta) shares. In the
    tight pool: a quantile tree by the noise PyDP adds for the (epsilon, delta) it is handed;
    max and min as L0 pure draws of the epsilon OpenDP's privacy map gives their Gumbel
    scale; a selection from its PyDP strategy's keep probabilities p(n) past its pre-threshold:
    truncated geometric as L0 pure draws of ln((p(2) - p(1)) / p(1)) (its recurrence p(n) =
    e^eps p(n - 1) + delta), thresholding as its noise (Laplace: p(2) / p(1) = e^(1 / b);
    Gaussian: 1 / sigma = its normal quantiles' step), each plus (0, the probability that a
    one-unit partition among L0 is released)."""
    noise: list[Noise] = []
    fixed: list[tuple[float, float]] = []
    pooled = plan.accounting != "basic"
    for m in [m for q in plan.queries for m in q.own_mechanisms()]:
        if m.name not in NOT_ADDITIVE:
            noise.append(Noise(_additive_event(m)))
        elif not pooled:
            fixed.append((m.epsilon, m.delta))
        elif m.name in EXTREME_METRICS:
            assert m.noise_scale is not None
            fixed += [(privacy_loss(m.noise_scale, round(m.linf_sensitivity)), 0.0)] * (
                m.l0_sensitivity
            )
        else:  # a quantile tree: L0 x its height partitions of Linf
            spec = m.build_spec()
            if m.kind == "laplace":
                noise.append(Noise(dp_event.LaplaceDpEvent(1 / spec.eps), tol=1e-12))
            else:
                l2 = math.sqrt(m.l0_sensitivity * TREE_HEIGHT) * m.linf_sensitivity
                sigma = GaussianMechanism(spec.eps, spec.delta, l2).std
                noise.append(Noise(dp_event.GaussianDpEvent(sigma / l2), slack=0.01))
    for group in plan.selections:
        s = group.mechanism
        if not pooled:
            fixed.append((s.epsilon, s.delta))
            continue
        strategy = s.build_selection(group.pre_threshold)
        first = group.pre_threshold or 1
        p1, p2 = strategy.probability_of_keep(first), strategy.probability_of_keep(first + 1)
        l0 = s.l0_sensitivity
        fixed.append((0.0, -math.expm1(l0 * math.log1p(-p1))))
        if s.kind == "truncated_geometric":
            fixed += [(math.log((p2 - p1) / p1), 0.0)] * l0
        elif s.kind == "laplace_thresholding":  # b in units, L1 = L0
            noise.append(Noise(dp_event.LaplaceDpEvent(1 / math.log(p2 / p1) / l0), tol=1e-6))
        else:  # L2 = sqrt(L0)
            sigma = 1 / (norm.isf(p1) - norm.isf(p2))
            noise.append(Noise(dp_event.GaussianDpEvent(sigma / math.sqrt(l0)), 1e-6, 0.01))
    return Independent(noise, fixed)


def _additive_event(m: MechanismBudget) -> dp_event.DpEvent:
    """A count, sum or privacy_id_count from the std of PyDP's mechanism."""
    std = float(m.build_additive().std)
    if m.kind == "gaussian":
        return dp_event.GaussianDpEvent(std / (math.sqrt(m.l0_sensitivity) * m.linf_sensitivity))
    return dp_event.LaplaceDpEvent(std / math.sqrt(2) / (m.l0_sensitivity * m.linf_sensitivity))


def independent_epsilon(plan: JobPlan, nights: int, delta: float) -> float:
    """Epsilon at `delta` of `nights` releases of `plan`: the additive mechanisms by
    dp_accounting's PLD accountant (grid 1e-4), the rest by sums (looser than the ledger,
    which composes them as PLDs too: still an upper bound on what it must admit)."""
    found = independent_events(plan)
    additive, fixed = found.additive, found.fixed
    fixed_eps = nights * math.fsum(e for e, _ in fixed)
    fixed_delta = nights * math.fsum(d for _, d in fixed)
    if not additive:
        return fixed_eps
    book = pld.PLDAccountant(value_discretization_interval=1e-4)
    book.compose(dp_event.SelfComposedDpEvent(dp_event.ComposedDpEvent(additive), nights))
    return float(book.get_epsilon(delta - fixed_delta)) + fixed_eps


def night_key(day: int, accounting: str = "basic") -> ReleaseKey:
    date = dt.date(2026, 1, 1) + dt.timedelta(days=day)
    return ReleaseKey(SCOPE, f"nightly-{accounting}", "input", date, date)


def release_nights(ledger: Ledger, plan: JobPlan, policy: BudgetPolicy, nights: int) -> int:
    """Reserves and commits one release a night until the cap refuses; the nights released."""
    eps, delta = plan.total_spent()
    events = release_events(plan)
    for night in range(nights):
        run_id = f"{plan.accounting}-{night}"
        try:
            ledger.reserve(
                night_key(night, plan.accounting), run_id=run_id, job="terminal_stats",
                epsilon=eps, delta=delta, output="/nowhere", policy=policy, events=events,
            )  # fmt: skip
        except BudgetExceededError:
            return night
        ledger.mark_reading(run_id)
        ledger.commit(run_id)
    return nights


# ------------------------------------------------------------------ what a release records


@pytest.mark.parametrize("job", [NIGHTLY, BANK, EVERY], ids=["nightly", "bank", "every"])
@pytest.mark.parametrize(
    ("accounting", "noise"),
    [("basic", "laplace"), ("basic", "gaussian"), ("pld", "gaussian"), ("pld", "laplace")],
)
def test_a_release_records_every_mechanism_it_runs(job, accounting, noise):
    """The events are the plan's mechanisms one for one, with no less privacy loss than PyDP
    and OpenDP's mechanisms have (`independent_events`): a mechanism left out, or recorded
    with more noise than it gets, fails here. The bank's job has a private selection (shared
    by two queries) and max; EVERY has a percentile, max, min and each selection strategy."""
    overrides = {"accounting": accounting, "noise": noise, "count_noise": "continuous"}
    plan = job_plan(job, overrides)
    found = independent_events(plan)
    events = release_events(plan)
    recorded = sorted(
        (e for e in events if e.kind != "approx_dp" for _ in range(e.count)),
        key=lambda e: (e.kind, e.noise_multiplier),
    )
    expected = sorted(found.noise, key=lambda n: (_kind(n.event), n.event.noise_multiplier))
    assert len(recorded) == len(expected) >= 2  # count and sum at least (mean: their ratio)
    for got, want in zip(recorded, expected, strict=True):
        assert got.kind == _kind(want.event)
        actual = want.event.noise_multiplier
        assert got.noise_multiplier <= actual * (1 + want.tol), (got, want)  # no more noise
        assert got.noise_multiplier >= actual / (1 + want.slack + want.tol), (got, want)
    approx = sorted(
        (e.epsilon, e.delta) for e in events if e.kind == "approx_dp" for _ in range(e.count)
    )
    fixed = sorted(found.fixed)
    assert len(approx) == len(fixed)
    for (eps, delta), (want_eps, want_delta) in zip(approx, fixed, strict=True):
        assert eps == pytest.approx(want_eps, rel=1e-6, abs=1e-15)
        assert delta == pytest.approx(want_delta, rel=1e-6, abs=1e-20)
        assert eps >= want_eps * (1 - 1e-9) and delta >= want_delta * (1 - 1e-6)
    mechanisms = {m.name for q in plan.queries for m in q.own_mechanisms()}
    if job == BANK:
        assert plan.selections and "max" in mechanisms
    if job == EVERY:
        assert {"percentile", "max", "min"} <= mechanisms
        assert {g.mechanism.kind for g in plan.selections} == set(STRATEGIES)


def _kind(event: dp_event.DpEvent) -> str:
    return "gaussian" if isinstance(event, dp_event.GaussianDpEvent) else "laplace"


@pytest.mark.parametrize("accounting", ["basic", "pld", "zcdp"])
def test_one_release_composes_to_at_most_its_own_budget(accounting):
    """The bank's 12-query job: its events composed by the ledger's code state no more than
    the job's (epsilon, delta), and at least its additive pool's independent composition."""
    overrides = {"accounting": accounting, "noise": "gaussian", "count_noise": "continuous"}
    plan = make_plan(build_spec(load_raw(BANK), overrides))
    events = release_events(plan)
    ledger_eps = composed_epsilon(events, plan.delta, plan.epsilon)
    assert ledger_eps is not None
    assert ledger_eps <= plan.epsilon * (1 + 1e-3)
    additive = independent_events(plan).additive
    book = pld.PLDAccountant(value_discretization_interval=1e-4)
    book.compose(dp_event.ComposedDpEvent(additive))
    assert book.get_epsilon(plan.delta) <= ledger_eps * (1 + 1e-3)  # nothing dropped


def test_events_round_trip_and_merge_identical_mechanisms():
    events = (
        PrivacyEvent("gaussian", noise_multiplier=2.5),
        PrivacyEvent("gaussian", noise_multiplier=2.5, count=3),
        approx_dp(0.1, 1e-8),
        PrivacyEvent("laplace", noise_multiplier=10.0),
    )
    back = from_json(to_json(events))
    assert {e.key(): e.count for e in back} == {
        ("gaussian", 2.5, None, None, None, None, None): 4,
        ("approx_dp", None, 0.1, 1e-8, None, None, None): 1,
        ("laplace", 10.0, None, None, None, None, None): 1,
    }
    for bad in ('{"format": 2, "events": []}', '{"format": 1, "events": [{"kind": "x"}]}'):
        with pytest.raises(ValueError):
            from_json(bad)
    with pytest.raises(ValueError):
        from_json(to_json([PrivacyEvent("gaussian", noise_multiplier=2.0)]).replace("2.0", "-2"))


# ------------------------------------------------------------------------ what a cap admits


def test_pure_dp_releases_stay_pure_without_a_delta_to_trade(ledger_url):
    """The nightly job with Laplace noise and public keys spends delta 0: under a cap on
    epsilon alone the scope's delta is 0, where composition is the sums: 25 nights of 0.1."""
    plan = nightly_plan("basic", "laplace")
    assert plan.total_spent()[1] == 0
    nights = release_nights(Ledger(ledger_url), plan, BudgetPolicy(cap_epsilon=CAP), 100)
    assert nights == round(CAP / NIGHT_EPSILON)


@pytest.mark.slow  # 45-300 s in a loaded test-fast run (load 7-8 on 2 cores)
@pytest.mark.parametrize(
    ("accounting", "noise", "cap_delta"),
    [("basic", "laplace", 1e-5), ("pld", "gaussian", None), ("pld", "gaussian", 1e-5)],
)
def test_an_all_time_cap_admits_more_nights_than_sums_and_never_too_many(
    tmp_path, accounting, noise, cap_delta
):
    """Cap epsilon 2.5 for all time: by sums 25 nights of 0.1 fit; composed at the scope's
    delta (the cap's, or without one what the sums spend: nights x 1e-6), as many as
    dp_accounting's own PLD accountant admits, within two nights. With Gaussian noise the
    sums of delta may pass the cap's delta: Gaussian noise has no fixed delta. (SQLite only:
    hundreds of nights; the same code runs on PostgreSQL in the tests below.)"""
    plan = nightly_plan(accounting, noise)
    policy = BudgetPolicy(cap_epsilon=CAP, cap_delta=cap_delta)
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    nights = release_nights(ledger, plan, policy, 2000)
    assert nights > 2 * round(CAP / NIGHT_EPSILON)

    def delta_at(n: int) -> float:
        return cap_delta if cap_delta is not None else n * plan.total_spent()[1]

    assert independent_epsilon(plan, nights, delta_at(nights)) <= CAP  # sound
    beyond = nights + 2  # and tight: two more nights would pass the cap
    assert independent_epsilon(plan, beyond, delta_at(beyond)) > CAP * (1 - 1e-3)


def test_a_rolling_window_composes_the_releases_it_holds(ledger_url):
    """The nightly example's cap, 2.5 per 30 days of data: by sums the 26th night of a window
    was refused; composed, every night of a month fits, and each window's releases compose
    (independently) to at most the cap."""
    plan = nightly_plan()
    policy = BudgetPolicy(cap_epsilon=CAP, cap_delta=1e-5, window_days=30)
    ledger = Ledger(ledger_url)
    assert release_nights(ledger, plan, policy, 60) == 60
    assert independent_epsilon(plan, 30, 1e-5) <= CAP
    assert ledger.spent(SCOPE, policy, dt.date(2026, 1, 1), dt.date(2026, 3, 1))[0] == (
        pytest.approx(30 * NIGHT_EPSILON)  # the sums, still reported
    )
    composed = ledger.composed(SCOPE, policy)
    assert composed.summed == pytest.approx((60 * NIGHT_EPSILON, 0.0))
    assert composed.composed is not None and composed.composed < composed.summed[0] / 2


def test_a_release_bigger_than_what_is_left_is_refused_with_the_composed_spend(ledger_url):
    plan = nightly_plan()
    ledger = Ledger(ledger_url)
    policy = BudgetPolicy(cap_epsilon=1.0, cap_delta=1e-5)
    nights = release_nights(ledger, plan, policy, 500)
    assert nights > 10
    with pytest.raises(BudgetExceededError) as refused:
        ledger.reserve(
            night_key(nights + 1), run_id="big", job="big", epsilon=0.9, delta=0.0,
            output="/nowhere", policy=policy,
        )  # fmt: skip
    message = str(refused.value)
    assert "epsilon 0.9 needed" in message and "left of 1" in message
    assert f"composed; {nights * NIGHT_EPSILON:g} by sums" in message


@pytest.mark.parametrize("caps", [(10.0, 2.5e-6), (None, 2.5e-6)], ids=["both", "delta-only"])
def test_a_delta_cap_holds_when_epsilon_has_room(ledger_url, caps):
    """Releases of (1, 1e-6) each (selection's delta: an (epsilon, delta) mechanism that
    composition cannot trade away) under a cap of delta 2.5e-6: the third is refused, naming
    delta, although epsilon is far from its cap (or uncapped); nothing is recorded for it."""
    cap_epsilon, cap_delta = caps
    ledger = Ledger(ledger_url)
    policy = BudgetPolicy(cap_epsilon=cap_epsilon, cap_delta=cap_delta)
    events = (approx_dp(1.0, 1e-6),)
    for night in range(2):
        ledger.reserve(
            night_key(night), run_id=f"n{night}", job="j", epsilon=1.0, delta=1e-6,
            output="/nowhere", policy=policy, events=events,
        )  # fmt: skip
    with pytest.raises(BudgetExceededError, match=r"delta 1e-06 needed, 5e-07 left of 2\.5e-06"):
        ledger.reserve(
            night_key(2), run_id="n2", job="j", epsilon=1.0, delta=1e-6,
            output="/nowhere", policy=policy, events=events,
        )  # fmt: skip
    assert [row.run_id for row in ledger.rows()] == ["n0", "n1"]


def test_releases_recorded_without_events_count_by_their_own_budget(ledger_url):
    """A release from before schema v3 (or with unreadable events) composes as one (epsilon,
    delta) mechanism: never less than its sums say for one release."""
    ledger = Ledger(ledger_url)
    policy = BudgetPolicy(cap_epsilon=2.0)
    for night in range(2):
        ledger.reserve(
            night_key(night), run_id=f"old-{night}", job="old", epsilon=1.0, delta=0.0,
            output="/nowhere", policy=policy,
        )  # fmt: skip
    table = ledger_tables.releases
    with ledger._engine.begin() as conn:
        conn.execute(table.update().where(table.c.run_id == "old-0").values(events=None))
        conn.execute(table.update().where(table.c.run_id == "old-1").values(events="{broken"))
    assert all(row.events is None for row in ledger.rows())
    with pytest.raises(BudgetExceededError, match="0 left of 2"):
        ledger.reserve(
            night_key(3), run_id="more", job="more", epsilon=0.01, delta=0.0,
            output="/nowhere", policy=policy,
        )  # fmt: skip


@pytest.mark.slow
def test_budget_show_prints_the_summed_and_the_composed_spend(ledger_url):
    plan = nightly_plan()
    ledger = Ledger(ledger_url)
    ledger.set_cap(SCOPE, BudgetPolicy(cap_epsilon=CAP, cap_delta=1e-5), changed_by="test")
    nights = release_nights(ledger, plan, BudgetPolicy(), 40)
    env = {k: v for k, v in os.environ.items() if k != "DPPIPELINE_DEBUG"}
    shown = subprocess.run(
        [sys.executable, "-m", "dppipeline", "budget", "show", "--ledger", ledger_url],
        capture_output=True, text=True, env=env, timeout=120, check=True,
    ).stdout  # fmt: skip
    line = next(row for row in shown.splitlines() if row.strip().startswith(SCOPE))
    fields = line.split()
    assert fields[1:3] == [str(nights), f"{nights * NIGHT_EPSILON:.4g}"]  # the sums: 4 > 2.5
    composed = float(fields[4])
    assert composed == pytest.approx(independent_epsilon(plan, nights, 1e-5), rel=0.01)
    assert composed < CAP and "OVER CAP" not in shown  # within the cap, composed
    left = float(line.split("epsilon left ")[1].split(",")[0])
    assert left == pytest.approx(CAP - composed, abs=1e-3)


def test_the_schema_upgrade_adds_events_and_keeps_old_rows(tmp_path):
    """A version-2 ledger (as dppipeline wrote it before events) upgrades in place; its rows
    read back without events."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        ledger_tables.migrate(conn, "test", ledger_tables.stamp(dt.datetime.now(dt.UTC)), 2)
        columns = {c["name"] for c in sa.inspect(conn).get_columns("releases")}
        assert "events" not in columns
        conn.execute(
            sa.text(
                "INSERT INTO releases (run_id, scope, job, spec_hash, input_fingerprint, "
                "start_date, end_date, release_key, epsilon, delta, state, output, "
                "reserved_at) VALUES ('v2', :scope, 'job', 'h', 'f', '2026-01-01', "
                "'2026-01-01', 'k', 1.5, 0, 'committed', '/old', '2026-01-01')"
            ),
            {"scope": SCOPE},
        )
    engine.dispose()
    ledger = Ledger(url)
    assert ledger.schema_version == ledger_tables.SCHEMA_VERSION  # through v3 and later
    (row,) = ledger.rows()
    assert row.events is None and row.epsilon == 1.5
    with pytest.raises(BudgetExceededError, match=r"0\.5 left of 2"):
        ledger.reserve(
            night_key(5), run_id="new", job="new", epsilon=1.0, delta=0.0, output="/x",
            policy=BudgetPolicy(cap_epsilon=2.0),
        )  # fmt: skip


# ------------------------------------------------- the caches change no bit of a composition

# Mixed lists: every kind, the same mechanism split over several events and counts, in an
# order `merged` changes. Their compositions share mechanisms, so cached PLDs are reused.
MIXED = [
    (PrivacyEvent("gaussian", noise_multiplier=3.0, count=4), approx_dp(0.1, 1e-8)),
    (
        PrivacyEvent("laplace", noise_multiplier=20.0),
        PrivacyEvent("gaussian", noise_multiplier=3.0),
        PrivacyEvent("discrete_laplace", noise_scale=40.0, l0=1, linf=2, count=3),
        PrivacyEvent("gaussian", noise_multiplier=3.0, count=7),
    ),
    (
        PrivacyEvent("discrete_gaussian", noise_scale=30.0, l0=2, linf=1),
        approx_dp(0.05, 0.0, count=6),
        PrivacyEvent("laplace", noise_multiplier=20.0, count=9),
        approx_dp(0.1, 1e-8, count=2),
    ),
    (PrivacyEvent("gaussian", noise_multiplier=51.3, count=1784),),
]


def reference_epsilon(events, delta: float, scale: float) -> float | None:
    """`composed_epsilon` as it was before its caches: a fresh PLD of each merged mechanism
    (the uncached builder), self-composed by its count, composed in merged order."""
    from dppipeline.core import events as core_events

    build = core_events._pld.__wrapped__
    interval = core_events.PLD_DISCRETIZATION * min(1.0, scale)
    total = None
    for event in merged(events):
        one = build(event, interval)
        one = one.self_compose(event.count) if event.count > 1 else one
        total = one if total is None else total.compose(one)
    epsilon = float(total.get_epsilon_for_delta(delta))
    return epsilon if math.isfinite(epsilon) else None


def test_cached_composition_is_bit_for_bit_the_uncached_one():
    """Each mixed list, composed twice in two orders (the second time from cached PLDs that
    earlier compositions used), states exactly the epsilon of a composition from fresh PLDs:
    the ledger's decisions cannot change by caching."""
    cases = [
        (events, delta, scale) for events in MIXED for delta, scale in ((1e-6, 2.5), (1e-5, 0.5))
    ]
    expected = [reference_epsilon(*case) for case in cases]
    assert all(e is not None for e in expected)
    for order in (cases, cases[::-1]):
        for case in order:
            assert composed_epsilon(*case) == expected[cases.index(case)]
    # one release's events split over several rows compose as one list
    both = (*MIXED[0], *MIXED[1])
    assert composed_epsilon(both, 1e-6, 2.5) == reference_epsilon(both, 1e-6, 2.5)


def test_a_scope_composes_every_charged_release_and_no_other(ledger_url):
    """The scope's composed spend is the uncached composition of the events of exactly its
    charged releases, after each change: a reservation, a commit, a failure (still charged),
    an abort (not charged). A release left out, or a spend remembered from before a change,
    fails here."""
    ledger = Ledger(ledger_url)
    policy = BudgetPolicy(cap_epsilon=CAP, cap_delta=1e-5)

    def expected() -> float | None:
        charged = [r for r in ledger.rows(SCOPE) if r.charged]
        return reference_epsilon([e for r in charged for e in r.events], 1e-5, CAP)

    steps = ["commit", "fail", "abort", "commit", "reserved"]
    for night, (events, step) in enumerate(zip(MIXED[:3] * 2, steps, strict=False)):
        run_id = f"n{night}"
        ledger.reserve(
            night_key(night), run_id=run_id, job="j", epsilon=0.2, delta=1e-8,
            output="/nowhere", policy=policy, events=events,
        )  # fmt: skip
        assert ledger.composed(SCOPE, policy).composed == expected()
        if step in ("commit", "fail"):
            ledger.mark_reading(run_id)
        if step != "reserved":
            getattr(ledger, step)(run_id)
        assert ledger.composed(SCOPE, policy).composed == expected()
    states = [r.state for r in ledger.rows(SCOPE)]
    assert states == ["committed", "failed", "aborted", "committed", "reserved"]
