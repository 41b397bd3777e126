"""The law of every noise sampler the planner can choose, tested against the exact distribution.

Samplers, each through the code path releases use:
- OpenDP's discrete Laplace (scale t, P(x) ~ exp(-|x| / t)) and discrete Gaussian (sigma,
  P(x) ~ exp(-x^2 / (2 sigma^2))) through `core.discrete.add_discrete_noise`, at scales
  3, 5, 10, 200 (the default job's count noise), 1e4 and the non-round 5.3, 17.7, 333.3;
- PyDP's continuous Laplace and Gaussian as `core.mechanisms.noise_partitions` adds them
  (`MechanismBudget.build_additive().add_noise`), under basic and tight (pld) accounting.

The exact law is computed here by summing the mass (discrete) or from scipy's CDF of the scale
derived from epsilon and the sensitivity (continuous), never with the code under test. Each
check gives an exact or asymptotic p-value; a test fails when any p-value is below
FAILURE_RATE / (its number of checks) (Bonferroni): a correct sampler fails a test with
probability at most 1e-6.

Discrete checks (N_DRAWS = 100,000 draws, 1.5-2.5 s of CPU):
- chi-square of the residues x mod m, m in 2, 3, 5, 7, 10, against the summed mass;
- chi-square of the values in ~50 bins of about equal exact mass;
- each value of |x| expected at least MIN_VALUE_COUNT times, by an exact binomial test (at
  scales up to ~50; a sampler's error can sit on single values);
- log-ratios ln P(B) / P(A) of neighbouring windows of |x|, w = max(1, ceil(0.03 scale)) wide
  (single values at scales up to 33), four near zero and four around one scale out: -w / t
  for Laplace, -(2k + 1) / (2 sigma^2) per single step for the Gaussian; the p-value is the
  exact binomial one of the count in B given the count in A and B;
- the residues |x| mod t, t the sampler's period (`sampler_period`: a Laplace scale that is
  an integer, floor(sigma) + 1 for the Gaussian) when t <= 1,000, by a chi-square and each
  one by an exact binomial test: an error in one of CKS20's Bernoulli(exp(-r / t)) draws
  (OpenDP 0.14.1's) sits on one residue.

Power against OpenDP 0.14.1, whose Bernoulli(exp(-r / t)) draws are wrong for some r / t of
small reduced denominator (3/5, 4/5, 2/3, ...). Measured on 1 million of its draws, split into
ten disjoint sets of 100,000 run through these checks:
- Laplace scale 5: ln P(4)/P(3) = -0.024 (exact -0.200), |x| = 4 mod 5 at z +16 per 100,000
  draws: 10 of 10 sets fail (also at scales 3 and 10: 10 of 10);
- Gaussian sigma 5: ln P(4)/P(3) = +0.031 (exact -0.140), |x| = 4 at z +18 per 100,000:
  10 of 10 fail (sigma 5.3 and 17.7 fail too); smaller defects at sigma 10 (9 of 10 fail)
  and sigma 3 (4 of 10);
- scale 200: |x| = 160 mod 200 is 13% too likely (Laplace, 1/280 of the mass; z ~0.0085
  sqrt(draws)) and |x| = 134 18% (Gaussian, z ~0.0125 sqrt(draws)): 100,000 draws see them
  at 2.7 and 4 sigma, below the ~6 sigma threshold (0 of 15 Laplace sets fail). The slow
  `test_default_count_noise_scale_in_depth` draws 1.2 million (Laplace, ~9.3 sigma) and
  500,000 (Gaussian, ~8.8 sigma): each caught with probability above 0.99. No test finds a
  defect of that size within a few seconds of drawing (15-25 us of CPU a draw): even one
  told which residue to test needs ~700,000 Laplace draws.

Continuous checks (100,000 draws): Kolmogorov-Smirnov against the CDF; chi-square of values
in 50 bins of equal exact mass; chi-square of the fractional parts x - floor(x) in 10 bins
against the mass summed from the CDF (noise rounded to a grid shows there at any scale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest
from scipy import optimize, stats

from dppipeline.core.discrete import add_discrete_noise
from dppipeline.core.mechanisms import noise_partitions
from dppipeline.core.plan import AggregationParams, BudgetPlan
from dppipeline.core.planner import plan_budget

FAILURE_RATE = 1e-6  # per test, split over its checks (Bonferroni)
N_DRAWS = 100_000
# Scale 200 (the default job's count noise) in depth: the draws that see one residue 13%
# (Laplace) or one value 18% (Gaussian) off with probability ~0.99 (module docstring).
DEPTH_DRAWS = {"discrete_laplace": 1_200_000, "discrete_gaussian": 500_000}
RESIDUE_MODULI = (2, 3, 5, 7, 10)
SCALES = (3.0, 5.0, 10.0, 200.0, 1e4, 5.3, 17.7, 333.3)
MAX_PERIOD = 1000  # |x| mod t checked for sampler periods up to this (`sampler_period`)
BINS = 50
MIN_VALUE_COUNT = 500  # each |x| expected at least this often is checked on its own


@dataclass
class Checks:
    """p-values of one test's checks; `verify` fails on any below FAILURE_RATE / count."""

    rows: list[tuple[str, float, str]] = field(default_factory=list)

    def add(self, label: str, p_value: float, detail: str) -> None:
        self.rows.append((label, float(p_value), detail))

    def chi_square(self, label: str, observed: np.ndarray, expected: np.ndarray) -> None:
        """Pearson's chi-square; every expected count is at least 5 (asserted)."""
        assert expected.min() >= 5, (label, expected.min())
        assert abs(observed.sum() - expected.sum()) <= 1e-6 * expected.sum(), label
        stat = float(np.sum((observed - expected) ** 2 / expected))
        df = len(expected) - 1
        self.add(label, stats.chi2.sf(stat, df), f"chi2 {stat:.1f} on {df} df")

    def binomial(self, label: str, k: int, n: int, p: float, detail: str = "") -> None:
        """Two-sided exact binomial test of k successes in n at probability p."""
        tail = min(stats.binom.cdf(k, n, p), stats.binom.sf(k - 1, n, p))
        z = (k - n * p) / math.sqrt(n * p * (1 - p))
        self.add(label, min(1.0, 2 * tail), detail or f"{k} of {n} (z {z:+.1f})")

    def verify(self) -> None:
        cut = FAILURE_RATE / len(self.rows)
        failed = [f"{label}: p={p:.2e} {detail}" for label, p, detail in self.rows if p < cut]
        assert not failed, f"{len(failed)} of {len(self.rows)} checks below {cut:.1e}:\n" + (
            "\n".join(failed)
        )


# --------------------------------------------------------------------------- discrete


def exact_pmf(kind: str, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Support (int64, |x| up to 40 t or 12 sigma, past which the mass is below 1e-17) and
    mass, normalised by summation."""
    reach = math.ceil((40 if kind == "discrete_laplace" else 12) * scale) + 20
    x = np.arange(-reach, reach + 1, dtype=np.int64)
    xf = x.astype(np.float64)
    log_mass = -np.abs(xf) / scale if kind == "discrete_laplace" else -(xf**2) / (2 * scale**2)
    mass = np.exp(log_mass)
    return x, mass / mass.sum()


def equal_mass_bins(mass: np.ndarray, bins: int = BINS) -> np.ndarray:
    """A bin label per support point: consecutive points grouped by the exact CDF to their
    left, ~`bins` groups of about equal mass (one point alone when its mass is larger)."""
    left = np.cumsum(mass) - mass
    labels = np.minimum((left * bins).astype(np.int64), bins - 1)
    return np.unique(labels, return_inverse=True)[1]


def window_steps(scale: float) -> tuple[int, list[int]]:
    """Window width w and window starts: four near zero, four around one scale out."""
    w = max(1, math.ceil(0.03 * scale))
    out = round(scale)
    starts = {0, w, 2 * w, 3 * w} | {max(0, out + i * w) for i in (-2, -1, 0, 1)}
    return w, sorted(starts)


def sampler_period(kind: str, scale: float) -> int | None:
    """The period t of CKS20's samplers (OpenDP's), when at most MAX_PERIOD: discrete
    Laplace of scale t (as the rational t / 1) draws |x| = U + t V, U on {0..t-1} accepted
    with probability exp(-U / t); the discrete Gaussian draws Y from discrete Laplace of scale
    t = floor(sigma) + 1 and keeps it with probability exp(-(|Y| - sigma^2 / t)^2 / 2 sigma^2).
    An error in one of those Bernoulli draws sits on one residue of |x| mod t (and, for the
    Gaussian, on one value)."""
    if kind == "discrete_laplace":
        t = int(scale) if float(scale).is_integer() else None
    else:
        t = math.floor(scale) + 1
    return t if t is not None and t <= MAX_PERIOD else None


def discrete_checks(kind: str, scale: float, noise: np.ndarray) -> Checks:
    """All the discrete checks of `noise` against the exact law (module docstring)."""
    n = len(noise)
    x, mass = exact_pmf(kind, scale)
    reach = int(x[-1])
    checks = Checks()
    inside = int(np.sum(np.abs(noise) <= reach))
    # the mass outside is below 1e-15: a draw there is a defect
    checks.add("support", 1.0 if inside == n else 0.0, f"{n - inside} draws beyond {reach}")
    noise = np.clip(noise, -reach, reach)

    for m in RESIDUE_MODULI:
        observed = np.bincount(noise % m, minlength=m)
        expected = n * np.bincount(x % m, weights=mass, minlength=m)
        checks.chi_square(f"x mod {m}", observed, expected)

    labels = equal_mass_bins(mass)
    observed = np.bincount(labels[noise + reach], minlength=labels.max() + 1)
    checks.chi_square(
        f"{labels.max() + 1} equal-mass bins", observed, n * np.bincount(labels, mass)
    )

    folded_mass = np.bincount(np.abs(x), weights=mass)
    folded = np.bincount(np.abs(noise), minlength=len(folded_mass))
    for k in np.flatnonzero(n * folded_mass >= MIN_VALUE_COUNT):
        checks.binomial(f"|x| = {k}", int(folded[k]), n, float(folded_mass[k]))
    w, starts = window_steps(scale)
    for a in starts:
        count_a, count_b = int(folded[a : a + w].sum()), int(folded[a + w : a + 2 * w].sum())
        p_a, p_b = folded_mass[a : a + w].sum(), folded_mass[a + w : a + 2 * w].sum()
        expected_ratio = math.log(p_b / p_a)
        if w == 1 and a > 0:  # the closed form, as a check on the mass summed above
            closed = -1 / scale if kind == "discrete_laplace" else -(2 * a + 1) / (2 * scale**2)
            assert expected_ratio == pytest.approx(closed, rel=1e-9, abs=1e-12)
        se = math.sqrt(1 / (n * p_a) + 1 / (n * p_b))
        observed_ratio = math.log(count_b / count_a) if count_a and count_b else math.nan
        checks.binomial(
            f"ln P(|x| in [{a + w},{a + 2 * w}))/P(|x| in [{a},{a + w}))",
            count_b,
            count_a + count_b,
            p_b / (p_a + p_b),
            f"{observed_ratio:+.4f} (exact {expected_ratio:+.4f}, se {se:.4f})",
        )

    t = sampler_period(kind, scale)
    if t is not None:
        observed = np.bincount(np.abs(noise) % t, minlength=t)
        probability = np.bincount(np.abs(x) % t, weights=mass, minlength=t)
        checks.chi_square(f"|x| mod {t}", observed, n * probability)
        for r in range(t):
            checks.binomial(f"|x| = {r} mod {t}", int(observed[r]), n, float(probability[r]))
    return checks


def draw_discrete(kind: str, scale: float, n: int) -> np.ndarray:
    """n noise values through add_discrete_noise, added to varied integers and taken back off
    (releases add the noise to the exact counts)."""
    exact = (np.arange(n, dtype=np.int64) % 1009) * 1_000 - 400_000
    released = add_discrete_noise(kind, scale, exact)
    assert released.dtype == np.int64 and len(released) == n
    noise: np.ndarray = released - exact
    return noise


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["discrete_laplace", "discrete_gaussian"])
@pytest.mark.parametrize("scale", SCALES)
def test_discrete_noise_has_the_exact_law(kind, scale):
    """N_DRAWS draws: residues, binned values and log-ratios against the summed mass."""
    discrete_checks(kind, scale, draw_discrete(kind, scale, N_DRAWS)).verify()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["discrete_laplace", "discrete_gaussian"])
def test_default_count_noise_scale_in_depth(kind):
    """The default job's count noise scale, 200, at DEPTH_DRAWS draws: the same checks, with
    the power to see OpenDP 0.14.1's defects there (one residue or value off by 13-18%)."""
    discrete_checks(kind, 200.0, draw_discrete(kind, 200.0, DEPTH_DRAWS[kind])).verify()


# ------------------------------------------------------------------------- continuous


def count_plan(noise: str, epsilon: float, delta: float, accounting: str) -> BudgetPlan:
    """One count per partition with PyDP's continuous noise; L0 = 2, Linf = 3."""
    params = AggregationParams(
        metrics=("count",),
        noise=noise,
        max_partitions_contributed=2,
        max_contributions_per_partition=3,
        min_value=0.0,
        max_value=1.0,
        public_partitions=True,
        count_noise="continuous",
    )
    return plan_budget(params, epsilon, delta, accounting)


def analytic_gaussian_sigma(epsilon: float, delta: float, l2: float) -> float:
    """Balle and Wang 2018, Theorem 8: the sigma at which the Gaussian mechanism's delta at
    epsilon, Phi(D/2s - e s/D) - e^e Phi(-D/2s - e s/D), equals `delta`."""

    def excess(sigma: float) -> float:
        a, b = l2 / (2 * sigma), epsilon * sigma / l2
        return float(stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b)) - delta

    return float(optimize.brentq(excess, 1e-6 * l2, 1e6 * l2, xtol=1e-12, rtol=1e-12))


def expected_law(plan: BudgetPlan, accounting: str) -> stats.rv_continuous:
    """The count's noise law from its epsilon (or the pool's multiplier) and sensitivity."""
    m = plan.mechanism("count")
    if m.kind == "laplace":
        scale = (m.noise_multiplier or 1 / m.epsilon) * m.l1_sensitivity
        law = stats.laplace(scale=scale)
    elif accounting == "basic":
        law = stats.norm(scale=analytic_gaussian_sigma(m.epsilon, m.delta, m.l2_sensitivity))
    else:
        law = stats.norm(scale=m.noise_multiplier * m.l2_sensitivity)
    assert m.noise_stddev == pytest.approx(law.std(), rel=1e-3)  # the plan agrees
    return law


def fractional_mass(law: stats.rv_continuous, bins: int = 10) -> np.ndarray:
    """P(x - floor(x) in [j/bins, (j+1)/bins)), summing the CDF's increments over integers
    out to 40 standard deviations."""
    reach = math.ceil(40 * law.std()) + 1
    grid = np.arange(-reach, reach)[:, None] + np.arange(bins + 1)[None, :] / bins
    return np.diff(law.cdf(grid), axis=1).sum(axis=0)


@pytest.mark.parametrize(
    ("noise", "epsilon", "delta", "accounting"),
    [
        ("laplace", 6.0, 0.0, "basic"),  # scale 1
        ("laplace", 0.03, 0.0, "basic"),  # scale 200
        ("laplace", 1.0, 1e-6, "pld"),
        ("gaussian", 1.0, 1e-6, "basic"),
        ("gaussian", 0.02, 1e-6, "basic"),
        ("gaussian", 1.0, 1e-6, "pld"),
    ],
)
def test_continuous_noise_has_the_exact_law(noise, epsilon, delta, accounting):
    """N_DRAWS counts of zero released by noise_partitions: KS, equal-mass bins and
    fractional parts against the law derived from epsilon and the sensitivity."""
    plan = count_plan(noise, epsilon, delta, accounting)
    law = expected_law(plan, accounting)
    n = N_DRAWS
    zeros = pd.DataFrame({"k": np.arange(n), "privacy_id_count": 0, "count": 0, "sum": 0.0})
    values = noise_partitions(zeros, ["k"], plan)["count"].to_numpy()
    assert values.dtype == np.float64
    checks = Checks()
    ks = stats.kstest(values, law.cdf)
    checks.add("Kolmogorov-Smirnov", ks.pvalue, f"D {ks.statistic:.4f}")
    edges = law.ppf(np.arange(1, BINS) / BINS)
    observed = np.bincount(np.searchsorted(edges, values), minlength=BINS)
    checks.chi_square(f"{BINS} equal-mass bins", observed, np.full(BINS, n / BINS))
    frac = values - np.floor(values)
    observed = np.bincount(np.minimum((frac * 10).astype(np.int64), 9), minlength=10)
    expected = fractional_mass(law)
    checks.chi_square("fractional parts", observed, n * expected / expected.sum())
    checks.verify()
