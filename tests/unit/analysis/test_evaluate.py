"""`dppipeline evaluate`: refuses unless told the data is not sensitive; its error figures are
the noise the plan promises when bounds drop nothing; private selection's share behaves.

Statistical checks use exact distributions (order statistics of |Laplace|, the Poisson-binomial
count of released partitions), each with a stated failure rate.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import struct

import numpy as np
import pandas as pd
import polars as pl
import pytest
import yaml
from scipy import stats

from dppipeline.analysis.evaluate import read_rows, selection_stats, true_values
from dppipeline.cli.main import main
from dppipeline.core.tasks import job_task
from dppipeline.lifecycle.runner import input_days, make_plan
from dppipeline.spec.model import build_spec
from dppipeline.synthetic.transactions import generate

ALPHA = 1e-6  # failure rate of each statistical check (two-sided)
PUBLIC_EPSILONS = (0.1, 1.0, 10.0)
PRIVATE_EPSILONS = (3.0, 10.0, 40.0)  # expected share released: about 0.02, 0.45, 0.91
REPEATS = 2
TERMINALS = 30
PUBLIC_KEYS = 100  # terminals 0..99 are public: 30 with rows, 70 listed but quiet
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """The brief's small input, plus the truth a test needs to check figures against."""
    base = tmp_path_factory.mktemp("evaluate")
    data = generate(
        base / "in", fmt="parquet", customers=300, terminals=TERMINALS, days=5, tx_per_day=600,
        seed=3, start_date=dt.date(2026, 1, 1),
    ).output  # fmt: skip
    rows = pl.read_parquet(f"{data}/**/*.parquet")
    assert sorted(rows["TERMINAL_ID"].unique()) == list(range(TERMINALS))
    return base, data, rows


def public_spec(data) -> dict:
    """count + sum per terminal, public terminals 0..99 (a quiet terminal's true count and
    sum are 0), bounds that drop and clip nothing (each customer has at most 3 terminals and
    a few dozen rows; amounts are below 300)."""
    return {
        "name": "terminal_stats",
        "metrics": ["count", "sum"],
        "count_noise": "continuous",  # the checks below are continuous Laplace's medians
        "budget": {"epsilon": 1.0, "delta": 1e-6},
        "bounds": {
            "max_partitions_contributed": TERMINALS,
            "max_contributions_per_partition": 100,
            "min_value": 0.0,
            "max_value": 1000.0,
        },
        "partition_selection": {"public_partitions": f"0..{PUBLIC_KEYS - 1}"},
        "input": {"path": str(data), "format": "parquet"},
    }


def private_spec(data) -> dict:
    """count per terminal under private selection. L0 = 3 is every customer's largest number
    of terminals, so bounding keeps each terminal's customers exactly: the selection's input
    is known and each partition is kept independently with a known probability."""
    return {
        "name": "terminal_counts",
        "metrics": ["count"],
        "budget": {"epsilon": 1.0, "delta": 1e-6},
        "bounds": {"max_partitions_contributed": 3, "max_contributions_per_partition": 5},
        "input": {"path": str(data), "format": "parquet"},
    }


def write_config(path, spec: dict):
    path.write_text(yaml.safe_dump(spec))
    return path


def evaluate_argv(config, out, epsilons, *extra) -> list[str]:
    eps = ",".join(f"{e:g}" for e in epsilons)
    return [
        "evaluate", "--config", str(config), "--output", str(out), "--epsilons", eps,
        "--repeats", str(REPEATS), "--engine", "local", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def public_run(synthetic):
    """One evaluation of the public job, with a ledger configured that it must not touch."""
    base, data, _ = synthetic
    config = write_config(base / "public.yaml", public_spec(data))
    out = base / "public_out"
    ledger = base / "state" / "ledger.sqlite"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPPIPELINE_LEDGER", f"sqlite:///{ledger}")
        argv = evaluate_argv(config, out, PUBLIC_EPSILONS, "--data-is-not-sensitive")
        assert main(argv) == 0
    assert not ledger.exists() and not (base / "state").exists()
    return out, pd.read_csv(out / "evaluation.csv")


def test_refuses_without_the_not_sensitive_flag(synthetic, tmp_path, capsys):
    _, data, _ = synthetic
    config = write_config(tmp_path / "job.yaml", public_spec(data))
    out = tmp_path / "out" / "nested"
    assert main(evaluate_argv(config, out, PUBLIC_EPSILONS)) == 2
    err = capsys.readouterr().err.strip()
    assert "--data-is-not-sensitive" in err and "TRUE values" in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing written, not even the folder


def test_refuses_to_write_into_a_release(synthetic, tmp_path, capsys):
    _, data, _ = synthetic
    config = write_config(tmp_path / "job.yaml", public_spec(data))
    (tmp_path / "release").mkdir()
    (tmp_path / "release" / "manifest.json").write_text("{}")
    argv = evaluate_argv(config, tmp_path / "release", (1.0,), "--data-is-not-sensitive")
    assert main(argv) == 2
    assert "holds a release" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "release").iterdir()) == ["manifest.json"]


def test_files_and_rows(public_run):
    out, table = public_run
    assert list(table.columns) == ["query", "metric", "epsilon", "repeat", "stat", "value"]
    assert set(table["query"]) == {"terminal_stats"}
    errors = ("median_abs_error", "mean_abs_error", "median_rel_error")
    expected = (
        {(m, None, None, f"bounding_{s}") for m in ("count", "sum") for s in errors}
        | {(m, e, None, "noise_median_abs") for m in ("count", "sum") for e in PUBLIC_EPSILONS}
        | {
            (m, e, r, s)
            for m in ("count", "sum")
            for e in PUBLIC_EPSILONS
            for r in range(1, REPEATS + 1)
            for s in errors
        }
    )
    found = [
        (m, None if pd.isna(e) else e, None if pd.isna(r) else int(r), s)
        for m, e, r, s in table[["metric", "epsilon", "repeat", "stat"]].itertuples(index=False)
    ]
    assert len(found) == len(set(found)) == len(expected)
    assert set(found) == expected
    assert table["value"].notna().all() and (table["value"] >= 0).all()
    # Loose bounds: bounding alone changes nothing, so all of the error is noise.
    # (Only float rounding is left: the sums are added in another order.)
    assert (table[table["stat"].str.startswith("bounding_")]["value"] < 1e-6).all()

    document = json.loads((out / "evaluation.json").read_text())
    assert document["epsilons"] == list(PUBLIC_EPSILONS) and document["repeats"] == REPEATS
    assert len(document["rows"]) == len(table)
    page = (out / "index.html").read_text()
    assert "src='terminal_stats_error.png'" in page and "http" not in page
    assert "TRUE values" in page
    for epsilon in PUBLIC_EPSILONS:
        for repeat in range(1, REPEATS + 1):
            release = out / "runs" / f"epsilon_{epsilon:g}_run_{repeat}" / "release"
            assert (release / "terminal_stats").is_dir()


def test_chart_is_a_real_png(public_run):
    out, _ = public_run
    png = (out / "terminal_stats_error.png").read_bytes()
    assert png[:8] == PNG_SIGNATURE and png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 800 and height >= 300
    # Two panels with lines, bands, labels and legends; a blank canvas of this size is ~5 KB.
    assert len(png) > 30_000


def laplace_median_interval(b: float, n: int, alpha: float) -> tuple[float, float]:
    """Exact interval holding the sample median of n iid |Laplace(b)| (exponential, mean b)
    with probability >= 1 - alpha. For even n the median lies between the order statistics
    X(n/2) and X(n/2+1); U(k) of n uniforms is Beta(k, n - k + 1)."""
    k = n // 2 if n % 2 == 0 else (n + 1) // 2
    low_q = stats.beta.ppf(alpha / 2, k, n - k + 1)
    high_q = stats.beta.isf(alpha / 2, n + 1 - k, k)
    return -b * math.log1p(-low_q), -b * math.log1p(-high_q)


def decrease_failure_rate(n: int, ratio: float, repeats: int) -> float:
    """Bound on P(the average over `repeats` runs of the median of n |Lap(b / ratio)| is not
    below the same for |Lap(b)|). In units of b the runs' medians are Z'_j / ratio and Z_j,
    each Z the median of n Exp(1); failure needs some Z'_j >= c or some Z_j <= c / ratio, for
    any c (here ln 2 sqrt(ratio)), and the order statistics X(k), X(k+1) around the median
    give each tail exactly (Beta distributions)."""
    k = n // 2
    c = math.log(2) * math.sqrt(ratio)
    above = stats.beta.sf(-math.expm1(-c), k + 1, n - k)  # Z' > c needs X(k+1) > c
    below = stats.beta.cdf(-math.expm1(-c / ratio), k, n - k + 1)  # Z < c/r needs X(k) < c/r
    return repeats * (above + below)


def test_error_is_the_laplace_noise_when_bounds_drop_nothing(synthetic, public_run):
    """Per run, count's and sum's median |error| over the 100 public terminals lies in the
    exact interval of the sample median of 100 |Lap(b)| values, b = noise_stddev / sqrt(2)
    from `make_plan`; failure rate <= 1e-6 per check, 12 checks: <= 1.2e-5. And the median
    over repeats falls as epsilon grows tenfold (failure rate computed below, < 1e-9 per
    pair)."""
    _, data, _ = synthetic
    _, table = public_run
    runs = table[table["repeat"].notna()]
    for metric in ("count", "sum"):
        medians = []
        for epsilon in PUBLIC_EPSILONS:
            spec = build_spec({**public_spec(data), "budget": {"epsilon": epsilon, "delta": 1e-6}})
            sd = make_plan(spec).queries[0].plan.metric_noise_stddev(metric)
            b = sd / math.sqrt(2)
            noise = table[(table["stat"] == "noise_median_abs") & (table["metric"] == metric)]
            assert noise[noise["epsilon"] == epsilon]["value"].item() == pytest.approx(
                b * math.log(2), rel=1e-9
            )
            low, high = laplace_median_interval(b, PUBLIC_KEYS, ALPHA)
            rows = runs[
                (runs["metric"] == metric)
                & (runs["epsilon"] == epsilon)
                & (runs["stat"] == "median_abs_error")
            ]["value"]
            assert len(rows) == REPEATS
            for value in rows:
                assert low <= value <= high, (metric, epsilon, value, low, high, b)
            medians.append(rows.median())
        for i in range(len(PUBLIC_EPSILONS) - 1):
            ratio = PUBLIC_EPSILONS[i + 1] / PUBLIC_EPSILONS[i]  # b falls by this factor
            assert decrease_failure_rate(PUBLIC_KEYS, ratio, REPEATS) < 1e-9
            assert medians[i + 1] < medians[i], (metric, medians)


def poisson_binomial_interval(p: np.ndarray, alpha: float) -> tuple[int, int]:
    """Exact central interval of the number of successes of independent Bernoulli(p_i)."""
    pmf = np.array([1.0])
    for pi in p:
        pmf = np.convolve(pmf, [1 - pi, pi])
    cdf = np.cumsum(pmf)
    low = int(np.searchsorted(cdf, alpha / 2, side="right"))
    high = int(np.searchsorted(cdf, 1 - alpha / 2, side="left"))
    return low, min(high, len(p))


def test_private_selection_share(synthetic, tmp_path):
    """Share of true terminals released, per epsilon over both repeats: in [0, 1]; within the
    exact interval of its Poisson-binomial distribution (each terminal kept with the
    mechanism's probability_of_keep of its customer count; failure rate <= 1e-6 per epsilon,
    3e-6 for the test); non-decreasing up to the tolerance those intervals allow; and no
    released terminal outside the data."""
    _, data, rows = synthetic
    per_customer = rows.group_by("CUSTOMER_ID").agg(pl.col("TERMINAL_ID").n_unique())
    assert per_customer["TERMINAL_ID"].max() <= 3  # L0 = 3 keeps every customer whole
    customers = (
        rows.group_by("TERMINAL_ID").agg(pl.col("CUSTOMER_ID").n_unique()).sort("TERMINAL_ID")
    )["CUSTOMER_ID"].to_numpy()
    config = write_config(tmp_path / "private.yaml", private_spec(data))
    out = tmp_path / "out"
    assert main(evaluate_argv(config, out, PRIVATE_EPSILONS, "--data-is-not-sensitive")) == 0
    table = pd.read_csv(out / "evaluation.csv")
    selection = table[table["metric"] == "partition_selection"]
    share = selection[selection["stat"] == "true_partitions_released_share"]
    assert len(share) == len(PRIVATE_EPSILONS) * REPEATS
    assert share["value"].between(0, 1).all()
    assert (selection[selection["stat"] == "released_not_in_truth"]["value"] == 0).all()
    assert (selection[selection["stat"] == "true_partitions"]["value"] == TERMINALS).all()

    expected, observed, bounds = [], [], []
    trials = TERMINALS * REPEATS
    for epsilon in PRIVATE_EPSILONS:
        spec = build_spec({**private_spec(data), "budget": {"epsilon": epsilon, "delta": 1e-6}})
        group = make_plan(spec).selections[0]
        strategy = group.mechanism.build_selection(group.pre_threshold)
        p = np.array([strategy.probability_of_keep(int(n)) for n in customers])
        low, high = poisson_binomial_interval(np.tile(p, REPEATS), ALPHA)
        released = round(share[share["epsilon"] == epsilon]["value"].sum() * TERMINALS)
        assert low <= released <= high, (epsilon, released, low, high)
        expected.append(p.mean())
        observed.append(released / trials)
        bounds.append((low / trials, high / trials))
    assert expected == sorted(expected)  # the mechanism keeps more as epsilon grows
    for i in range(len(observed) - 1):
        tolerance = max(0.0, bounds[i][1] - bounds[i + 1][0])
        assert observed[i + 1] >= observed[i] - tolerance, (observed, tolerance)
    assert observed[0] < observed[-1]  # intervals at 3 and 40 are far apart

    # The released keys themselves: every one is a terminal with rows.
    for epsilon in PRIVATE_EPSILONS:
        for repeat in range(1, REPEATS + 1):
            release = out / "runs" / f"epsilon_{epsilon:g}_run_{repeat}" / "release"
            keys = pd.read_parquet(release / "terminal_counts")["TERMINAL_ID"]
            assert set(keys) <= set(range(TERMINALS))
    png = (out / "terminal_counts_error.png").read_bytes()
    assert png[:8] == PNG_SIGNATURE and len(png) > 30_000


def test_selection_stats_counts_keys_outside_the_truth():
    truth = pd.DataFrame({"TERMINAL_ID": [1, 2, 3, 4]})
    released = pd.DataFrame({"TERMINAL_ID": [2, 3, 99]})
    found = selection_stats(released, truth, ["TERMINAL_ID"])
    assert found["true_partitions_released_share"] == 0.5
    assert found["released_not_in_truth"] == 1
    assert found["partitions_released"] == 3


def test_bad_epsilons_are_a_usage_error(synthetic, tmp_path, capsys):
    _, data, _ = synthetic
    config = write_config(tmp_path / "job.yaml", public_spec(data))
    argv = evaluate_argv(config, tmp_path / "out", (1.0,), "--data-is-not-sensitive")
    argv[argv.index("--epsilons") + 1] = "1,zero"
    assert main(argv) == 2
    assert "--epsilons" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_truth_is_the_group_by_of_the_rows_the_filter_keeps(synthetic):
    """Exact: evaluate's true values (read through `engines.in_process`) are a plain group-by
    of the input rows its query's filter keeps, per terminal: count, sum and distinct
    customers, computed here from the Parquet files by Polars alone."""
    _, data, rows = synthetic
    spec = build_spec({**public_spec(data), "filter": "TX_AMOUNT >= 50"})
    query = spec.queries[0]
    truth = true_values(
        read_rows(spec, input_days(spec)), job_task(spec, query), query, spec.privacy_unit
    ).sort_values("TERMINAL_ID")
    kept = rows.filter(pl.col("TX_AMOUNT") >= 50)
    assert 0 < kept.height < rows.height  # the filter drops some rows and keeps some
    expected = (
        kept.group_by("TERMINAL_ID")
        .agg(
            pl.len().alias("count"),
            pl.col("TX_AMOUNT").sum().alias("sum"),
            pl.col("CUSTOMER_ID").n_unique().alias("privacy_id_count"),
        )
        .sort("TERMINAL_ID")
        .to_pandas()
    )
    assert truth["TERMINAL_ID"].tolist() == expected["TERMINAL_ID"].tolist()
    assert truth["count"].tolist() == expected["count"].astype(float).tolist()
    assert truth["privacy_id_count"].tolist() == expected["privacy_id_count"].astype(float).tolist()
    np.testing.assert_allclose(truth["sum"], expected["sum"], rtol=1e-12)
