"""`max` and `min`: the exponential mechanism over a public grid (`core.extremes`).

Three tiers, as for every DP metric here:

1. Exact: at a huge epsilon (margin m = 1, Gumbel noise far below one row) every engine
   releases the largest grid candidate at or below the true maximum of the bounded rows (the
   smallest at or above the true minimum), against a pandas truth on a hand-made input.
2. Statistical: the issue's accuracy claim on generated data at epsilon 1. The mechanism's
   output distribution is known exactly (P(c) proportional to exp(score(c) / scale)), so each
   terminal's probability of landing in [p90, max] is computed, and the test's failure rate is
   the Poisson-binomial tail of "fewer than 80% of terminals inside", asserted below 1e-6.
   The draws themselves are checked against that distribution by a chi-square test (failure
   rate 1e-6), which a wrong noise scale fails.
3. Noise present: two releases at epsilon 1 differ; the manifest states the mechanism.
"""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2
from support.data import with_ids_and_times, write_daily_parquet

from dppipeline.core import extremes
from dppipeline.core.events import release_events
from dppipeline.core.plan import AggregationParams
from dppipeline.core.planner import plan_budget
from dppipeline.lifecycle.runner import make_plan, run_job
from dppipeline.spec.model import build_spec
from dppipeline.synthetic.transactions import generate

FAILURE_RATE = 1e-6
START = dt.datetime(2026, 3, 2)
LOW, HIGH = 0.0, 1023.0  # with 1,024 candidates: the grid is the integers 0..1023


def independent_rows_beyond(values: np.ndarray, grid: np.ndarray, metric: str) -> np.ndarray:
    """Rows at or above (max) / at or below (min) each candidate, by brute force."""
    values = np.asarray(values, dtype=np.float64)
    if metric == "max":
        return np.array([(values >= c).sum() for c in grid])
    return np.array([(values <= c).sum() for c in grid])


def documented_margin(scale: float) -> int:
    """m = the smallest integer above scale (ln 1024 + ln 1/0.05) (docs/explanation/max_min.md)."""
    return math.floor(scale * (math.log(1024) + math.log(20))) + 1


def exact_distribution(values: np.ndarray, grid: np.ndarray, metric: str, scale: float):
    """P(candidate) of the exponential mechanism: exp(-|rows beyond - m| / scale), normed,
    with the documented margin m (computed here, not by the code under test)."""
    m = documented_margin(scale)
    score = -np.abs(independent_rows_beyond(values, grid, metric) - m) / scale
    p = np.exp(score - score.max())
    return p / p.sum()


# --- the mechanism's pieces -------------------------------------------------------------------


def test_grid_margin_and_scale_are_the_documented_ones():
    grid = extremes.candidates(-5.0, 250.0)
    assert len(grid) == extremes.GRID_SIZE == 1024
    assert grid[0] == -5.0 and grid[-1] == 250.0
    assert np.allclose(np.diff(grid), 255.0 / 1023)
    assert extremes.gumbel_scale(l0=3, linf=4, epsilon=0.5) == pytest.approx(48.0)
    # m: the smallest integer above scale (ln G + ln 1/beta); 1 at a huge epsilon.
    for scale in (1e-9, 0.05, 1.0, 12.0, 400.0):
        t = scale * (math.log(1024) + math.log(1 / 0.05))
        m = extremes.margin(scale)
        assert m - 1 <= t < m
        # The promise: P(chosen score <= best - m) <= G exp(-m / scale) <= beta.
        assert 1024 * math.exp(-m / scale) <= extremes.BETA
    assert extremes.margin(1e-9) == 1
    assert extremes.margin(12.0) == 120


@pytest.mark.parametrize("l0,linf", [(1, 1), (3, 2), (10, 10)])
def test_opendp_privacy_map_gives_the_planned_epsilon_per_partition(l0, linf):
    """OpenDP's own map of the planned draw: a unit changing each score by Linf costs
    epsilon / L0 in one partition, so L0 partitions cost the mechanism's epsilon."""
    params = AggregationParams(
        metrics=("max", "min"),
        noise="laplace",
        max_partitions_contributed=l0,
        max_contributions_per_partition=linf,
        min_value=LOW,
        max_value=HIGH,
        public_partitions=True,
    )
    plan = plan_budget(params, 1.0, 1e-6)
    for metric in ("max", "min"):
        mechanism = plan.mechanism(metric)
        assert mechanism.kind == "exponential" and mechanism.delta == 0
        assert mechanism.epsilon == pytest.approx(0.5)
        assert mechanism.noise_scale == pytest.approx(2 * l0 * linf / 0.5)
        loss = extremes.privacy_loss(mechanism.noise_scale, linf)
        assert l0 * loss == pytest.approx(mechanism.epsilon, rel=1e-9)
        assert l0 * loss <= mechanism.epsilon * (1 + 1e-9)
    assert plan.total_spent() == pytest.approx((1.0, 0.0))


def test_max_contributions_calibrate_for_one_partition_of_k_rows():
    """Under max_contributions K: (L0, Linf) = (1, K), as the quantile trees (a unit's k_i
    rows in partition i cost e k_i / K there, at most e in all)."""
    params = AggregationParams(
        metrics=("max",),
        noise="gaussian",
        max_partitions_contributed=6,
        max_contributions_per_partition=6,
        max_contributions=6,
        min_value=LOW,
        max_value=HIGH,
        public_partitions=True,
    )
    mechanism = plan_budget(params, 1.0, 1e-6).mechanism("max")
    assert (mechanism.l0_sensitivity, mechanism.linf_sensitivity) == (1, 6.0)
    assert mechanism.noise_scale == pytest.approx(12.0)
    assert mechanism.delta == 0  # pure DP: no delta spent, Gaussian noise or not


@pytest.mark.parametrize("accounting", ["pld", "zcdp"])
def test_tight_accounting_pools_max_and_min(accounting):
    """Under pld / zcdp, max and min join the tight pool: their plan epsilon is an attributed
    share (a third each), and the ledger records each of their L0 = 1 draws as a pure
    (e, 0) event, e what OpenDP's privacy map gives for the Gumbel scale they run with."""
    spec = build_spec(
        {
            "budget": {"epsilon": 1.0, "delta": 1e-6},
            "accounting": accounting,
            "noise": "gaussian",
            "metrics": ["count", "max", "min"],
            "bounds": {
                "min_value": LOW,
                "max_value": HIGH,
                "max_partitions_contributed": 1,
                "max_contributions_per_partition": 1,
            },
            "partition_selection": {"public_partitions": "1..5"},
        }
    )
    plan = make_plan(spec)
    own = plan.queries[0].plan
    recorded = [e for e in release_events(plan) if e.kind == "approx_dp" for _ in range(e.count)]
    expected = []
    for metric in ("max", "min"):
        m = own.mechanism(metric)
        assert m.pooled and m.epsilon == pytest.approx(1 / 3)
        e = extremes.privacy_loss(m.noise_scale, round(m.linf_sensitivity))
        expected += [e] * m.l0_sensitivity
    assert all(e.delta == 0 for e in recorded)
    assert sorted(e.epsilon for e in recorded) == pytest.approx(sorted(expected), rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    base=st.lists(st.floats(LOW, HIGH, allow_nan=False), max_size=40),
    added=st.lists(st.floats(LOW, HIGH, allow_nan=False), min_size=1, max_size=4),
    m=st.integers(1, 30),
    metric=st.sampled_from(["max", "min"]),
)
def test_one_unit_moves_every_score_by_at_most_its_rows(base, added, m, metric):
    """Sensitivity: a unit's k <= Linf rows change every candidate's score by at most k (in
    both directions: some scores rise, others fall, hence 2 Linf / e)."""
    grid = extremes.candidates(LOW, HIGH)
    before = extremes.scores(np.array(base), grid, metric, m)
    after = extremes.scores(np.array(base + added), grid, metric, m)
    assert np.max(np.abs(after - before)) <= len(added)
    truth = -np.abs(independent_rows_beyond(np.array(base), grid, metric) - m)
    assert np.array_equal(before, truth)


def chi_square_p_value(draws: np.ndarray, p: np.ndarray) -> float:
    """Chi-square goodness of fit of candidate indices to p, candidates merged into bins of
    expected count >= 5 (in grid order)."""
    n = len(draws)
    observed = np.bincount(draws, minlength=len(p))
    bins_o, bins_e, o, e = [], [], 0.0, 0.0
    for count, prob in zip(observed, p, strict=True):
        o, e = o + count, e + n * prob
        if e >= 5:
            bins_o.append(o)
            bins_e.append(e)
            o, e = 0.0, 0.0
    if bins_e:
        bins_o[-1] += o
        bins_e[-1] += e
    stat = sum((a - b) ** 2 / b for a, b in zip(bins_o, bins_e, strict=True))
    return float(chi2.sf(stat, len(bins_e) - 1))


@pytest.mark.slow
@pytest.mark.parametrize("metric", ["max", "min"])
def test_draws_follow_the_exponential_mechanism(metric):
    """1,500 draws of one partition (and of an empty one, whose scores are all -m: uniform)
    against the exact distribution; failure rate 1e-6 each."""
    rng = np.random.default_rng(5)
    values = np.round(rng.uniform(100, 900, 200), 2)
    grid = extremes.candidates(LOW, HIGH)
    scale = 4.0
    for kept in (values, np.zeros(0)):
        out = extremes.release_extremes([kept] * 1500, metric, LOW, HIGH, scale)
        indices = np.rint(out).astype(int)  # the grid is the integers
        assert np.array_equal(grid[indices], out)
        p = exact_distribution(kept, grid, metric, scale)
        assert chi_square_p_value(indices, p) > FAILURE_RATE


# --- 1. exact on every engine --------------------------------------------------------------------


@pytest.fixture(scope="module")
def hand_made(tmp_path_factory) -> tuple[object, pd.DataFrame]:
    """Terminals 1..4, 40 customers, amounts in [20, 300] plus, per terminal, a top and a
    bottom pair around one grid point (so that exactly one candidate has one row beyond it);
    terminal 3's maximum and terminal 4's minimum sit on grid points. Terminal 4's top row
    (2,000) is clipped to 1,023."""
    rng = np.random.default_rng(17)
    frames = []
    for terminal in (1, 2, 3, 4):
        n = 150
        amounts = np.round(rng.uniform(20, 300, n), 2)
        top = 400.0 + 37 * terminal
        amounts[:4] = [top + 0.3, top - 0.3, 4.7 + terminal, 5.3 + terminal]
        if terminal == 3:  # a maximum on a grid point: rows at or above it count it
            amounts[:2] = [511.0, 510.4]
        if terminal == 4:  # a minimum on a grid point; a maximum clipped to the bound
            amounts[:4] = [2000.0, 1022.5, 9.0, 9.6]
        frames.append(
            pd.DataFrame(
                {
                    "CUSTOMER_ID": rng.integers(1, 41, n).astype(np.int64),
                    "TERMINAL_ID": np.full(n, terminal, dtype=np.int64),
                    "TX_AMOUNT": amounts,
                }
            )
        )
    rows = with_ids_and_times(pd.concat(frames, ignore_index=True), rng, START, days=3)
    root = write_daily_parquet(rows, tmp_path_factory.mktemp("max_min") / "in")
    return root, rows


def hand_made_spec(root, out, epsilon: float, **bounds) -> object:
    return build_spec(
        {
            "name": "extremes",
            "budget": {"epsilon": epsilon, "delta": 1e-6},
            "bounds": {
                "max_partitions_contributed": 1000,
                "max_contributions_per_partition": 1000,
                "min_value": LOW,
                "max_value": HIGH,
                **bounds,
            },
            "input": {"path": str(root)},
            "output": str(out),
            "queries": [
                {
                    "name": "by_terminal",
                    "partition_by": ["TERMINAL_ID"],
                    "metrics": ["count", "max", "min"],
                    "partition_selection": {"public_partitions": "1..5"},  # 5: no rows
                },
                {"name": "total", "partition_by": [], "metrics": ["max", "min"]},
            ],
        }
    )


def test_exact_at_huge_epsilon_on_every_engine(hand_made, tmp_path, engine):
    root, rows = hand_made
    spec = hand_made_spec(root, tmp_path / "release", 1e12)
    result = run_job(spec, engine, echo=lambda _: None, seed=1)
    manifest = result.manifest.model_dump(mode="json", exclude_unset=True)
    grid = extremes.candidates(LOW, HIGH)
    bounded = rows.assign(TX_AMOUNT=rows.TX_AMOUNT.clip(LOW, HIGH))
    truth = bounded.groupby("TERMINAL_ID").TX_AMOUNT.agg(["max", "min"])
    for metric in ("max", "min"):
        entry = manifest["queries"]["by_terminal"]["metrics"][metric]
        assert entry["exponential_mechanism"]["margin_m"] == 1
    # the design of the input: exactly one candidate has exactly one row beyond it
    for _, values in bounded.groupby("TERMINAL_ID").TX_AMOUNT:
        for metric in ("max", "min"):
            assert (independent_rows_beyond(values.to_numpy(), grid, metric) == 1).sum() == 1

    out = pd.read_parquet(result.output / "by_terminal").sort_values("TERMINAL_ID")
    assert list(out.columns) == ["TERMINAL_ID", "count", "max", "min"]
    assert out.TERMINAL_ID.tolist() == [1, 2, 3, 4, 5]
    expected_max = [grid[grid <= t].max() for t in truth["max"]]
    expected_min = [grid[grid >= t].min() for t in truth["min"]]
    assert out["max"].iloc[:4].tolist() == expected_max
    assert out["min"].iloc[:4].tolist() == expected_min
    assert expected_max == [437.0, 474.0, 511.0, 1023.0]
    assert expected_min == [6.0, 7.0, 8.0, 9.0]
    # terminal 5 has no row: every score is -m, a uniform draw from the grid
    for metric in ("max", "min"):
        assert out[metric].iloc[4] in grid
    total = pd.read_parquet(result.output / "total")
    assert total["max"].tolist() == [HIGH] and total["min"].tolist() == [6.0]
    schema = pq.read_schema(next((result.output / "by_terminal").glob("*.parquet")))
    assert schema.field("max").type == pa.float64() and schema.field("min").type == pa.float64()


# --- 3. noise present --------------------------------------------------------------------------


def test_noise_present_and_mechanism_in_manifest(hand_made, tmp_path):
    """Two releases at epsilon 1 (L0 = Linf = 1, each of the query's three mechanisms at
    epsilon 1/6: Gumbel scale 12 rows, m = 120, spread over many candidates) differ."""
    root, _ = hand_made
    bounds = {"max_partitions_contributed": 1, "max_contributions_per_partition": 1}
    releases = []
    for run in range(2):
        spec = hand_made_spec(root, tmp_path / f"release{run}", 1.0, **bounds)
        result = run_job(spec, "local", echo=lambda _: None, seed=run)
        releases.append(pd.read_parquet(result.output / "by_terminal").sort_values("TERMINAL_ID"))
        manifest = result.manifest.model_dump(mode="json", exclude_unset=True)
    a, b = releases
    assert not (np.array_equal(a["max"], b["max"]) and np.array_equal(a["min"], b["min"]))
    query = manifest["queries"]["by_terminal"]
    split = query["budget_split"]["max"]
    assert split["mechanism"] == "exponential" and split["delta"] == 0
    assert split["noise_scale"] == pytest.approx(2 * 1 * 1 / split["epsilon"])
    mechanism = query["metrics"]["max"]["exponential_mechanism"]
    assert mechanism["candidates"] == 1024 and mechanism["beta"] == 0.05
    assert mechanism["margin_m"] == documented_margin(split["noise_scale"])
    assert "make_noisy_max" in mechanism["implementation"]
    assert query["metrics"]["max"]["noise_stddev"] is None


# --- 2. statistical: the accuracy claim ------------------------------------------------

# 300,000 customers on 30 terminals for one day: most customers reach one terminal, and no
# customer has more than 6 rows, so max_contributions 6 keeps every row (asserted) and the
# truth of the bounded rows is the clipped input.
GENERATED = {"customers": 300_000, "terminals": 30, "days": 1, "tx_per_day": 150_000, "seed": 3}
K = 6
BOUNDS = (0.0, 500.0)


def poisson_binomial_below(p: np.ndarray, k: int) -> float:
    """P(fewer than k successes) of independent trials with success probabilities p."""
    dist = np.zeros(len(p) + 1)
    dist[0] = 1.0
    for q in p:
        dist[1:] = dist[1:] * (1 - q) + dist[:-1] * q
        dist[0] *= 1 - q
    return float(dist[:k].sum())


def test_max_lands_in_the_upper_tail_at_epsilon_one(tmp_path):
    """For at least 80% of terminals with 1,000+ kept rows, the released max lies in [p90,
    max] of the bounded rows; the test's failure rate, computed exactly from the data, is
    asserted below 1e-6."""
    data = generate(tmp_path / "in", **GENERATED).output
    rows = pl.read_parquet(str(data / "**" / "*.parquet")).to_pandas()
    assert rows.groupby("CUSTOMER_ID").size().max() <= K  # bounding keeps every row
    spec = build_spec(
        {
            "budget": {"epsilon": 1.0, "delta": 1e-6},
            "metrics": ["max"],
            "bounds": {"max_contributions": K, "min_value": BOUNDS[0], "max_value": BOUNDS[1]},
            "partition_selection": {"public_partitions": f"0..{GENERATED['terminals'] - 1}"},
            "input": {"path": str(data)},
            "output": str(tmp_path / "release"),
        }
    )
    result = run_job(spec, "local", echo=lambda _: None, seed=4)
    released = pd.read_parquet(result.output / "terminal_stats").set_index("TERMINAL_ID")["max"]
    scale = make_plan(spec).queries[0].plan.mechanism("max").noise_scale
    assert scale == pytest.approx(2 * K)

    grid = extremes.candidates(*BOUNDS)
    inside, probabilities = [], []
    for terminal, values in rows.groupby("TERMINAL_ID").TX_AMOUNT:
        kept = values.clip(*BOUNDS).to_numpy()
        if len(kept) < 1000:
            continue
        low, high = np.quantile(kept, 0.9), kept.max()
        in_tail = (grid >= low) & (grid <= high)
        probabilities.append(exact_distribution(kept, grid, "max", scale)[in_tail].sum())
        inside.append(low <= released[terminal] <= high)
    terminals = len(inside)
    needed = math.ceil(0.8 * terminals)
    assert terminals >= 25
    assert poisson_binomial_below(np.array(probabilities), needed) < FAILURE_RATE
    assert sum(inside) >= needed, f"{sum(inside)} of {terminals} terminals in [p90, max]"
