"""`dppipeline tune`: recommends the known bounds of data built with them, spends its budget
through the ledger, and its histograms carry the noise the mechanism claims."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from scipy import stats
from support.data import write_daily_parquet

from dppipeline.analysis.tune import BIN_EDGES, bin_index, contribution_histograms, noisy, tune
from dppipeline.cli.main import main
from dppipeline.core.plan import MechanismBudget
from dppipeline.ledger import Ledger
from dppipeline.spec.model import build_spec

CUSTOMERS, TERMINALS_EACH, ROWS_EACH, MAX_AMOUNT = 3000, 6, 4, 120.0
# A job states L0 and Linf, even one `tune` replaces (its candidates set them): 1, as before.
PAIR = ["--max-partitions-contributed", "1", "--max-contributions-per-partition", "1"]


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    """Every customer at exactly 6 of 100 terminals with exactly 4 rows each, amounts
    uniform in [0, 120], over 4 days."""
    rng = np.random.default_rng(11)
    terminals = np.array([rng.choice(100, TERMINALS_EACH, replace=False) for _ in range(CUSTOMERS)])
    customer = np.repeat(np.arange(CUSTOMERS), TERMINALS_EACH * ROWS_EACH)
    terminal = np.repeat(terminals.ravel(), ROWS_EACH)
    n = len(customer)
    start = dt.datetime(2026, 3, 2)
    rows = pd.DataFrame(
        {
            "TRANSACTION_ID": np.arange(n),
            "TX_DATETIME": (
                start + pd.to_timedelta(rng.integers(0, 4 * 86400, n), unit="s")
            ).astype("datetime64[us]"),
            "CUSTOMER_ID": customer,
            "TERMINAL_ID": terminal,
            "TX_AMOUNT": rng.uniform(0, MAX_AMOUNT, n),
        }
    )
    root = write_daily_parquet(rows, tmp_path_factory.mktemp("tune") / "in")
    keys = root.parent / "keys.csv"
    keys.write_text("TERMINAL_ID\n" + "\n".join(map(str, range(100))) + "\n")
    return root, keys


def job(root, keys, **overrides):
    base = {
        "input.path": str(root), "output": "unused", "metrics": ["count", "sum"],
        "bounds.max_partitions_contributed": 1, "bounds.max_contributions_per_partition": 1,
        "bounds.min_value": 0.0, "bounds.max_value": 1.0, "budget.epsilon": 1.0,
        "partition_selection.public_partitions": str(keys),
    }  # fmt: skip
    base.update(overrides)
    return build_spec({}, base)


def test_recommends_the_bounds_the_data_was_built_with(known, tmp_path):
    """With 3,000 units and tune epsilon 1 (1/3 per statistic, noise b = 3 per bin), the
    exact optimum (6, 4) wins by a wide margin: one fewer partition drops 1/6 of the rows
    (bias 120 per terminal), one more adds a third to the count's noise (std 68 -> 90)."""
    root, keys = known
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    result, path = tune(
        job(root, keys), query_name=None, epsilon=1.0, partitions=None, ledger=ledger,
        output=tmp_path / "tune.json", progress=lambda _: None,
    )  # fmt: skip
    assert (result.best.l0, result.best.linf) == (TERMINALS_EACH, ROWS_EACH)
    assert result.best.kept_share == pytest.approx(1.0, abs=0.02)
    # Clipping bounds on a ten-per-decade grid: 99.5% of uniform [0, 120] lies in (100, 120].
    assert (result.min_value, result.max_value) == (0.0, 120.0)
    assert path.is_file() and '"max_contributions_per_partition": 4' in path.read_text()
    rows = Ledger(ledger).rows()
    assert [(r.job, r.state, r.epsilon) for r in rows] == [
        ("tune:terminal_stats", "committed", 1.0)
    ]


def test_tune_needs_no_contribution_bounds_in_the_job(known, tmp_path):
    """A release refuses a job without L0 and Linf; tune, which recommends them, takes it
    and recommends the same bounds as with placeholder ones."""
    root, keys = known
    unbounded = job(root, keys).to_dict()
    del unbounded["bounds"]["max_partitions_contributed"]
    del unbounded["bounds"]["max_contributions_per_partition"]
    del unbounded["queries"]
    spec = build_spec(unbounded)
    result, _ = tune(
        spec, query_name=None, epsilon=1.0, partitions=None, ledger=None,
        output=tmp_path / "tune.json", progress=lambda _: None,
    )  # fmt: skip
    assert (result.best.l0, result.best.linf) == (TERMINALS_EACH, ROWS_EACH)


def test_histogram_noise_is_present_and_as_claimed(known):
    """Released minus exact over 2,000 draws of the 22-bin histogram: the variance matches
    2 b^2 within the sampling tolerance of a Laplace variance (kurtosis 6), failure rate 1e-6;
    two draws differ."""
    root, _ = known
    import polars as pl

    frame = pl.read_parquet(sorted(root.glob("*/*.parquet"))).rename({"TX_AMOUNT": "_value"})
    h1, _ = contribution_histograms(frame, "CUSTOMER_ID", ["TERMINAL_ID"])
    assert h1[BIN_EDGES.index(TERMINALS_EACH)] == CUSTOMERS and h1.sum() == CUSTOMERS
    from pipeline_dp import budget_accounting
    from pipeline_dp.aggregate_params import MechanismType

    spec = budget_accounting.MechanismSpec(MechanismType.LAPLACE)
    spec.set_eps_delta(0.5, 0.0)
    mechanism = MechanismBudget("h", "laplace", 0.5, 0.0, 1, 1.0, None)
    b = 1 / 0.5
    # Bins far from zero, so clamping at zero never applies.
    exact = np.full(len(BIN_EDGES), 1000.0)
    draws = np.array([noisy(mechanism, exact) for _ in range(2000)]) - exact
    n = draws.size
    ratio = draws.var() / (2 * b * b)
    assert abs(ratio - 1) <= float(stats.norm.isf(0.5e-6)) * math.sqrt(5 / n), ratio
    assert not np.array_equal(draws[0], draws[1])


def test_a_capped_scope_refuses_and_spends_nothing(known, tmp_path, capsys):
    root, keys = known
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    config = tmp_path / "job.yaml"
    config.write_text("budget: {epsilon: 1.0, cap_epsilon: 0.05}\n")
    argv = [
        "tune", "--config", str(config), "--input", str(root), "--public-partitions",
        str(keys), "--metrics", "count", "--tune-epsilon", "0.1", "--ledger", ledger,
        "--tune-output", str(tmp_path / "t.json"), *PAIR,
    ]  # fmt: skip
    assert main(argv) == 3
    assert not (tmp_path / "t.json").exists()
    assert [r.state for r in Ledger(ledger).rows()] == []


def test_cli_prints_the_table_and_yaml_and_rejects_unknown_query(known, tmp_path, capsys):
    root, keys = known
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    base = ["tune", "--input", str(root), "--public-partitions", str(keys),
            "--metrics", "count", "--ledger", ledger, *PAIR]  # fmt: skip
    assert main([*base, "--tune-output", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "<- recommended" in out and "max_partitions_contributed: 6" in out
    assert main([*base, "--query", "nope"]) == 2
    assert "--query: no query 'nope'" in capsys.readouterr().err


def test_a_stored_cap_holds_tune_too(known, tmp_path, capsys):
    """A scope's stored cap applies to `tune` like to `run`: a tune whose spec says nothing
    of caps is refused (exit 3) when the stored cap is spent, and a spec stating another cap
    is refused too; nothing is read or recorded."""
    from dppipeline.ledger import BudgetPolicy

    root, keys = known
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    Ledger(ledger).set_cap(f"{root.name}/CUSTOMER_ID", BudgetPolicy(cap_epsilon=0.05), "test")
    argv = [
        "tune", "--input", str(root), "--public-partitions", str(keys), "--metrics", "count",
        "--tune-epsilon", "0.1", "--ledger", ledger, "--tune-output", str(tmp_path / "t.json"),
        *PAIR,
    ]  # fmt: skip
    assert main(argv) == 3
    assert "0.05 left of 0.05" in capsys.readouterr().err
    config = tmp_path / "job.yaml"
    config.write_text("budget: {epsilon: 1.0, cap_epsilon: 1.0}\n")
    assert main([*argv, "--config", str(config)]) == 3
    assert "budget set-cap" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()
    assert Ledger(ledger).rows() == []


def test_histograms_count_only_the_rows_the_run_bounds(known, tmp_path):
    """Public keys 0..9 (no filter): the run drops the other terminals before bounding, so
    tune's partitions-per-unit histogram counts each customer's listed terminals only. At a
    huge tune epsilon it equals that exact histogram (it used to count all 100 terminals)."""
    root, _ = known
    listed = tmp_path / "keys10.csv"
    listed.write_text("TERMINAL_ID\n" + "\n".join(map(str, range(10))) + "\n")
    result, _ = tune(
        job(root, listed), query_name=None, epsilon=1e6, partitions=None, ledger=None,
        output=tmp_path / "t.json", progress=lambda _: None,
    )  # fmt: skip
    rows = pq.read_table(root).to_pandas()
    rows = rows[rows["TERMINAL_ID"] < 10]
    per_customer = rows.groupby("CUSTOMER_ID")["TERMINAL_ID"].nunique().to_numpy()
    exact = np.bincount(bin_index(per_customer), minlength=len(BIN_EDGES))
    assert exact.sum() < CUSTOMERS  # some customers have no listed terminal
    assert np.allclose(result.partitions_per_unit, exact, atol=0.01)


def test_noise_that_hides_the_data_gives_no_recommendation(known, tmp_path, capsys):
    """A filter keeping 3 of 100 terminals at a small tune epsilon: the histograms are mostly
    noise. tune says so with the epsilon it would need and recommends nothing, but does not
    fail (exit 0): the data was read, so the spend stays charged, and a failure would be an
    output that depends on the data. It writes no file unless asked."""
    root, keys = known
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    config = tmp_path / "jobs" / "small.yaml"
    config.parent.mkdir()
    config.write_text(
        "metrics: [count]\n"
        "bounds: {max_partitions_contributed: 1, max_contributions_per_partition: 1}\n"
        'queries: [{name: few, filter: "TERMINAL_ID < 3", '
        f"partition_selection: {{public_partitions: {keys}}}}}]\n"
    )
    argv = ["tune", "--config", str(config), "--input", str(root),
            "--tune-epsilon", "0.003", "--ledger", ledger]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    line = out.strip().splitlines()[-1]
    assert "the noise hides part of query few's data at tune epsilon 0.003 (about" in line
    assert "no contribution bounds recommended;" in line and "value bounds" not in line
    assert "bounds:" not in out and "<- recommended" not in out
    needed = float(line.split("--tune-epsilon ")[1].split()[0])
    assert needed > 0.003
    assert not list(config.parent.glob("*.json")) and not list(tmp_path.glob("*.json"))
    assert [(r.state, r.epsilon) for r in Ledger(ledger).rows()] == [("committed", 0.003)]
    # Following the epsilon it names (from a hidden signal it can only say "at least"), a few
    # reruns recommend; with --tune-output the result lands exactly there.
    target = tmp_path / "out" / "tuned.json"
    argv += ["--tune-output", str(target)]
    for _ in range(4):
        argv[argv.index("--tune-epsilon") + 1] = f"{needed:g}"
        assert main(argv) == 0
        out = capsys.readouterr().out
        if "<- recommended" in out:
            break
        last = out.strip().splitlines()[-1]
        previous, needed = needed, float(last.split("--tune-epsilon ")[1].split()[0])
        assert needed > previous
    else:
        pytest.fail("no recommendation at the epsilons tune named")
    assert '"max_partitions_contributed"' in target.read_text()
    assert not list(config.parent.glob("*.json"))


@pytest.mark.slow
def test_tune_scores_candidates_under_the_jobs_tight_accounting(known, tmp_path):
    """A pld job: each candidate's count noise comes from a tight plan (RDP for speed), less
    than basic composition gives for the same bounds."""
    root, keys = known
    tight = job(root, keys, accounting="pld", noise="gaussian")
    basic = job(root, keys, noise="gaussian")
    results = [
        tune(spec, query_name=None, epsilon=1.0, partitions=None, ledger=None,
             output=tmp_path / f"{i}.json", progress=lambda _: None)[0]
        for i, spec in enumerate((tight, basic))
    ]  # fmt: skip
    noise = [{(c.l0, c.linf): c.noise_std for c in r.candidates} for r in results]
    assert noise[0].keys() == noise[1].keys()
    assert all(noise[0][k] < noise[1][k] for k in noise[0])


def test_a_zeroed_pair_histogram_is_no_signal():
    """Enough units, but every pair-size bin below its noise level (their mass spread thin):
    the rows-kept estimate would read 100%; tune says the noise hides it and names more
    epsilon, never less."""
    from dppipeline.analysis.tune import _hidden_by_noise

    bins = len(BIN_EDGES)
    h1 = [0.0] * bins
    h1[2] = 5000.0
    hidden, needed = _hidden_by_noise(eps=1.0, eps_units=1 / 3, h1=h1, h2=[0.0] * bins, values=None)
    assert hidden == ["every bin of rows per (unit, partition) pair below its noise level"]
    assert needed is not None and needed >= 2.0
    assert _hidden_by_noise(eps=1.0, eps_units=1 / 3, h1=h1, h2=h1, values=None) == ([], None)
