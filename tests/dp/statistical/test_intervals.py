"""Confidence intervals in the release: exact half-widths, and coverage on every engine.

Coverage tolerances: each check counts how many of n independent intervals cover the exact
(bounded, clipped) value; the count is Binomial(n, 0.95) for an exact interval, so the
observed share must lie within z * sqrt(0.95 * 0.05 / n) of 0.95, z the two-sided normal
quantile for failure rate 1e-6. The mean's interval is conservative: only its lower side is
checked.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import polars as pl
import pytest
from scipy import integrate, stats
from support.data import release_small, terminal_truth

from dppipeline.core.intervals import half_width, metric_half_width, sum_half_width
from dppipeline.core.plan import AggregationParams
from dppipeline.core.planner import plan_budget
from dppipeline.synthetic.transactions import generate

Z = float(stats.norm.isf(0.5e-6))  # failure rate 1e-6, two-sided
MIN_VALUE, MAX_VALUE = 0.0, 150.0


def plan(noise="laplace", epsilon=1.0, **overrides):
    base = {
        "metrics": ("count", "sum", "mean", "privacy_id_count"),
        "noise": noise,
        "max_partitions_contributed": 3,
        "max_contributions_per_partition": 2,
        "min_value": 20.0,
        "max_value": 200.0,
        "public_partitions": True,
        "confidence_intervals": True,
    }
    base.update(overrides)
    return plan_budget(AggregationParams(**base), epsilon, 1e-6)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_half_width_is_the_exact_noise_quantile(noise):
    p = plan(noise)
    for name in ("count", "privacy_id_count"):
        m = p.mechanism(name)
        dist = (
            stats.laplace(scale=m.noise_stddev / math.sqrt(2))
            if noise == "laplace"
            else stats.norm(scale=m.noise_stddev)
        )
        w = half_width(m)
        assert 2 * dist.sf(w) == pytest.approx(0.05, rel=1e-9)


@pytest.mark.parametrize("scales", [(1.0, 1.0), (1.0, 0.3), (5.0, 0.01), (0.2, 3.0)])
def test_sum_half_width_is_the_exact_quantile_of_two_laplace_noises(scales):
    """P(|X + Y| > w) by numerical integration over Y equals 0.05 (closed form checked)."""
    p = plan()
    centred, count = p.mechanism("centred_sum"), p.mechanism("count")
    b_x = centred.noise_stddev / math.sqrt(2)
    b_count = count.noise_stddev / math.sqrt(2)
    scale = scales[1] * b_x / b_count  # makes the second noise's scale scales[1] * b_x
    w = sum_half_width(centred, count, scale)
    x, y = stats.laplace(scale=b_x), stats.laplace(scale=b_count * scale)

    def tail_given(v):
        return y.pdf(v) * (x.sf(w - v) + x.cdf(-w - v))

    edge = 60 * (b_x + y.std())  # beyond it the integrand is below 1e-20
    tail, _ = integrate.quad(tail_given, -edge, edge, limit=800, points=[-w, 0, w])
    assert tail == pytest.approx(0.05, rel=1e-6)


def test_gaussian_sum_half_width_uses_the_combined_normal():
    p = plan("gaussian")
    centred, count = p.mechanism("centred_sum"), p.mechanism("count")
    w = sum_half_width(centred, count, 110.0)
    std = math.hypot(centred.noise_stddev, 110.0 * count.noise_stddev)
    assert w == pytest.approx(std * stats.norm.isf(0.025), rel=1e-12)


def test_sum_with_mean_interval_is_wider_than_either_part():
    p = plan()
    w = metric_half_width(p, "sum")
    assert w > half_width(p.mechanism("centred_sum"))
    assert w > p.params.midpoint * half_width(p.mechanism("count"))


# ---------------------------------------------------------------------------------------------
# Coverage


def truth(inputs, fmt="parquet") -> pd.DataFrame:
    pattern = "*/*.parquet" if fmt == "parquet" else "*.csv"
    rows = pl.read_parquet(sorted(inputs[fmt].glob(pattern)))
    return terminal_truth(rows, MIN_VALUE, MAX_VALUE).set_index("TERMINAL_ID")


def covered(released: pd.DataFrame, exact: pd.Series, metric: str) -> np.ndarray:
    value = exact.reindex(released["TERMINAL_ID"]).to_numpy()
    low, high = released[f"{metric}_ci_low"].to_numpy(), released[f"{metric}_ci_high"].to_numpy()
    return (low <= value) & (value <= high)


def exact_tolerance(n: int) -> float:
    return Z * math.sqrt(0.95 * 0.05 / n)


@pytest.fixture(params=["local", "spark", "beam"])
def engine(request):
    if request.param == "spark":
        request.getfixturevalue("spark")
    if request.param == "beam":
        from dppipeline.engines.beam.engine import BeamEngine

        return BeamEngine()
    return request.param


def test_intervals_cover_95_percent_on_every_engine(small_inputs, tmp_path, engine):
    """2,000 public terminals (50 with data, the rest empty: true value 0), epsilon 1, bounds
    loose enough that bounding keeps every row: count, sum and privacy_id_count intervals
    cover the truth 95% of the time."""
    keys = tmp_path / "terminals_0_1999.csv"  # release_small writes its own keys.csv
    keys.write_text("TERMINAL_ID\n" + "\n".join(map(str, range(2000))) + "\n")
    released, manifest = release_small(
        small_inputs,
        tmp_path,
        engine,
        **{
            "partition_selection.public_partitions": str(keys),
            "budget.epsilon": 1.0,
            "confidence_intervals": True,
            "count_noise": "continuous",  # exactly 95%; discrete: test_discrete_noise.py
        },
    )
    exact = truth(small_inputs).reindex(range(2000), fill_value=0.0)
    assert len(released) == 2000
    metrics = manifest["queries"]["terminal_stats"]["metrics"]
    for metric in ("count", "sum", "privacy_id_count"):
        share = covered(released, exact[metric], metric).mean()
        assert abs(share - 0.95) <= exact_tolerance(2000), (metric, share)
        assert metrics[metric]["confidence_interval"]["columns"] == [
            f"{metric}_ci_low",
            f"{metric}_ci_high",
        ]
    # The interval is value -/+ the manifest's half-width.
    width = metrics["count"]["ci95_half_width"]
    np.testing.assert_allclose(released["count_ci_high"] - released["count"], width)


@pytest.fixture(scope="module")
def many_terminals(tmp_path_factory):
    """500 terminals with data, so the mean's interval is checked on many partitions."""
    base = tmp_path_factory.mktemp("many")
    spec = {"customers": 3000, "terminals": 500, "days": 4, "tx_per_day": 6000, "seed": 5}
    return {"parquet": generate(base / "parquet", fmt="parquet", **spec).output}


def test_mean_interval_covers_at_least_95_percent(many_terminals, tmp_path):
    exact = truth(many_terminals)
    exact_mean = exact["sum"] / exact["count"]
    keys = tmp_path / "terminals_with_data.csv"
    keys.write_text("TERMINAL_ID\n" + "\n".join(map(str, exact.index)) + "\n")
    shares = []
    for run in range(4):
        released, _ = release_small(
            many_terminals,
            tmp_path / f"run{run}",
            "local",
            **{
                "partition_selection.public_partitions": str(keys),
                "budget.epsilon": 2.0,
                "confidence_intervals": True,
            },
        )
        shares.append(covered(released, exact_mean, "mean"))
        inside = (released["mean_ci_low"] <= released["mean"]) & (
            released["mean"] <= released["mean_ci_high"]
        )
        assert inside.all()  # the point estimate lies in its own interval
    hits = np.concatenate(shares)
    assert hits.mean() >= 0.95 - exact_tolerance(len(hits)), hits.mean()


def test_no_intervals_unless_asked(small_inputs, tmp_path):
    released, manifest = release_small(small_inputs, tmp_path, "local")
    assert not [c for c in released.columns if "_ci_" in c]
    metrics = manifest["queries"]["terminal_stats"]["metrics"]
    assert all("confidence_interval" not in m for m in metrics.values())


# ------------------------------------------------------------------ coverage, regime by regime

PARTITIONS = 4000
REGIMES = [
    # (noise, count_noise, L0 x Linf): count noise std below 200 (L0 Linf = 20) and above it
    # (L0 Linf = 200) at epsilon 1 over four mechanisms
    pytest.param("laplace", "discrete", 20, id="laplace-discrete-small-std"),
    pytest.param("laplace", "discrete", 200, id="laplace-discrete-large-std"),
    pytest.param("laplace", "continuous", 200, id="laplace-continuous-large-std"),
    pytest.param("gaussian", "discrete", 20, id="gaussian-discrete-small-std"),
    pytest.param("gaussian", "discrete", 200, id="gaussian-discrete-large-std"),
    pytest.param("gaussian", "continuous", 20, id="gaussian-continuous-small-std"),
]


def regime_plan(noise: str, count_noise: str, l0_linf: int):
    params = AggregationParams(
        metrics=("count", "sum", "mean", "variance", "stddev"),
        noise=noise,
        max_partitions_contributed=l0_linf // 10 if l0_linf >= 10 else 1,
        max_contributions_per_partition=10 if l0_linf >= 10 else l0_linf,
        min_value=0.0,
        max_value=200.0,
        public_partitions=True,
        confidence_intervals=True,
        count_noise=count_noise,
    )
    return plan_budget(params, 1.0, 1e-6)


def identical_partitions(rows: int, low_share: float = 0.25) -> tuple[pd.DataFrame, dict]:
    """PARTITIONS partitions of `rows` rows each, a quarter at 30 and the rest at 170: the
    exact aggregates and the exact metric values (the same for every partition)."""
    from dppipeline.core.mechanisms import CENTRED_SQUARES

    low = round(rows * low_share)
    values = np.array([30.0] * low + [170.0] * (rows - low))
    exact = pd.DataFrame(
        {
            "k": np.arange(PARTITIONS),
            "privacy_id_count": np.full(PARTITIONS, rows, dtype=np.int64),
            "count": np.full(PARTITIONS, rows, dtype=np.int64),
            "sum": np.full(PARTITIONS, values.sum()),
            CENTRED_SQUARES: np.full(PARTITIONS, ((values - 100.0) ** 2).sum()),
        }
    )
    truth = {
        "count": rows,
        "sum": values.sum(),
        "mean": values.mean(),
        "variance": values.var(),
        "stddev": values.std(),
    }
    return exact, truth


def central_95_range_upper_bound(values: np.ndarray) -> float:
    """An upper confidence bound on the width of the central 95% range (2.5% to 97.5%
    quantiles) of the distribution the values were drawn from: the 2.5% quantile is above
    the order statistic of rank binom.ppf(1e-6 / 2, n, 0.025) and the 97.5% quantile below
    that of rank binom.isf(1e-6 / 2, n, 0.975) (distribution-free), so the bound fails with
    probability at most 1e-6. The empirical range itself is an estimate: a check against it
    fails by chance whenever the mechanism's width sits near the allowance."""
    ordered = np.sort(values)
    n = len(ordered)
    low_rank = int(stats.binom.ppf(0.5e-6, n, 0.025))  # 1-based rank below the 2.5% quantile
    high_rank = int(stats.binom.isf(0.5e-6, n, 0.975)) + 1  # rank above the 97.5% quantile
    return float(ordered[min(high_rank, n) - 1] - ordered[max(low_rank, 1) - 1])


def coverage_tolerance(n: int) -> float:
    """Four standard errors of a 95% coverage share over n independent intervals."""
    return 4 * math.sqrt(0.95 * 0.05 / n)


@pytest.mark.parametrize(("noise", "count_noise", "l0_linf"), REGIMES)
@pytest.mark.parametrize("size", ["small", "large"])
def test_intervals_cover_95_percent_and_are_as_narrow_as_the_noise_allows(
    noise, count_noise, l0_linf, size
):
    """For PARTITIONS identical partitions (so every released value is an independent draw
    of the same mechanism): each metric's interval covers the exact value in 95% of them
    within 4 standard errors (or more, never less), and its median width is at most 10% above
    the width of the mechanism's central 95% range, bounded from the released values
    themselves (`central_95_range_upper_bound`, failure rate 1e-6). Small: 5 x the count's 95%
    noise half-width rows (ratios mostly noise); large: 40 x."""
    from dppipeline.core.mechanisms import noise_partitions

    plan = regime_plan(noise, count_noise, l0_linf)
    w_n = half_width(plan.mechanism("count"))
    rows = max(2, round((5 if size == "small" else 40) * w_n))
    exact, truth = identical_partitions(rows)
    released = noise_partitions(exact, ["k"], plan)
    tolerance = coverage_tolerance(PARTITIONS)
    for metric in ("count", "sum", "mean", "variance", "stddev"):
        low, high = released[f"{metric}_ci_low"], released[f"{metric}_ci_high"]
        covered = ((low <= truth[metric] + 1e-9) & (truth[metric] - 1e-9 <= high)).mean()
        assert covered >= 0.95 - tolerance, (metric, covered)
        values = released[metric].to_numpy(dtype=np.float64)
        monte_carlo = central_95_range_upper_bound(values)
        width = float(np.median(high - low))
        assert width <= 1.10 * monte_carlo, (metric, width, monte_carlo)
        if metric in ("count", "sum"):  # constant widths: also no narrower than the noise
            assert covered <= 0.95 + tolerance + (0.02 if count_noise == "discrete" else 0)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
@pytest.mark.parametrize("scale", [0.7, 3.0, 40.0, 300.0])
def test_integer_count_intervals_are_the_narrowest_that_cover_95_percent(noise, scale):
    """Discrete noise: the interval count -/+ w is integer, covers at least 95% (exactly,
    from the pmf) and w - 1 would not."""
    from dppipeline.core import discrete

    kind = f"discrete_{noise}"
    w = discrete.discrete_half_width(kind, scale, 0.05)
    x = np.arange(-math.ceil(80 * scale) - 10, math.ceil(80 * scale) + 11, dtype=np.float64)
    mass = np.exp(-np.abs(x) / scale) if noise == "laplace" else np.exp(-(x**2) / (2 * scale**2))
    mass /= mass.sum()

    def cover(width: int) -> float:
        return float(mass[np.abs(x) <= width].sum())

    assert cover(w) >= 0.95
    assert w == 0 or cover(w - 1) < 0.95


def test_released_integer_count_intervals_are_int64(small_inputs, tmp_path):
    released, manifest = release_small(
        small_inputs, tmp_path, "local", **{"confidence_intervals": True}
    )
    for column in ("count_ci_low", "count_ci_high", "privacy_id_count_ci_low"):
        assert released[column].dtype == np.int64, column
    entry = manifest["queries"]["terminal_stats"]["metrics"]["count"]["confidence_interval"]
    assert entry["level"] == "at least 0.95"


@pytest.mark.parametrize(("noise", "count_noise", "l0_linf"), REGIMES[:3])
def test_evaluates_expected_noise_is_the_median_of_the_released_noise(noise, count_noise, l0_linf):
    """`evaluate`'s "noise alone (expected)" figure (the median |noise| of count and sum) is
    the median |released - exact| of the same mechanism over PARTITIONS draws: within 4
    standard errors of a sample median (failure rate about 1e-4 per metric)."""
    from dppipeline.analysis.evaluate import noise_median_abs
    from dppipeline.core.mechanisms import noise_partitions

    plan = regime_plan(noise, count_noise, l0_linf)
    exact, truth = identical_partitions(500)
    released = noise_partitions(exact, ["k"], plan)
    for metric in ("count", "sum"):
        errors = np.abs(released[metric].to_numpy(dtype=np.float64) - truth[metric])
        expected = noise_median_abs(plan, metric, noise)
        # the sample median's rank is within 4 standard errors of half the sample
        share_below = float((errors <= expected).mean())
        assert abs(share_below - 0.5) <= 4 * math.sqrt(0.25 / PARTITIONS), (
            metric,
            share_below,
        )
