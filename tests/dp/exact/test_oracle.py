"""Exact tier against the oracle: PipelineDP's own DPEngine + LocalBackend on the same rows.

At a huge epsilon and with bounds loose enough that nothing is sampled or scaled away, both must
give the exact bounded aggregates; the tolerance is the union bound of both releases' noise.
"""

from __future__ import annotations

import math

import pandas as pd
import pipeline_dp
import polars as pl
import pytest
from support.data import terminal_truth

from dppipeline.lifecycle.runner import run_job
from dppipeline.spec.model import build_spec
from dppipeline.synthetic.transactions import generate

METRICS = ("count", "sum", "mean", "privacy_id_count")
MIN_VALUE, MAX_VALUE = 0.0, 150.0  # some amounts exceed 150: clipping is exercised


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("oracle")
    for fmt in ("parquet", "csv"):
        generate(root / fmt, fmt=fmt, customers=300, terminals=40, days=4, tx_per_day=1500, seed=3)
    rows = pl.read_parquet(root / "parquet" / "*" / "*.parquet")
    pairs = rows.group_by("CUSTOMER_ID", "TERMINAL_ID").len()
    loose_l0 = int(pairs.group_by("CUSTOMER_ID").len()["len"].max())
    loose_linf = int(pairs["len"].max())
    return root, rows, loose_l0, loose_linf


def oracle_release(rows: pl.DataFrame, l0, linf, epsilon, delta, public):
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=delta)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    params = pipeline_dp.AggregateParams(
        noise_kind=pipeline_dp.NoiseKind.LAPLACE,
        metrics=[getattr(pipeline_dp.Metrics, m.upper()) for m in METRICS],
        max_partitions_contributed=l0,
        max_contributions_per_partition=linf,
        min_value=MIN_VALUE,
        max_value=MAX_VALUE,
    )
    extractors = pipeline_dp.DataExtractors(
        privacy_id_extractor=lambda r: r[0],
        partition_extractor=lambda r: r[1],
        value_extractor=lambda r: r[2],
    )
    data = rows.select("CUSTOMER_ID", "TERMINAL_ID", "TX_AMOUNT").rows()
    result = engine.aggregate(data, params, extractors, public_partitions=public)
    accountant.compute_budgets()
    out = pd.DataFrame(
        [{"TERMINAL_ID": k, **{m: getattr(v, m) for m in METRICS}} for k, v in result]
    )
    return out.sort_values("TERMINAL_ID", ignore_index=True)


def our_release(root, fmt, out, l0, linf, epsilon, delta, public_file, engine="local"):
    overrides = {
        "input.path": str(root / fmt),
        "input.format": fmt,
        "output": str(out),
        "metrics": list(METRICS),
        "budget.epsilon": epsilon,
        "budget.delta": delta,
        "bounds.max_partitions_contributed": l0,
        "bounds.max_contributions_per_partition": linf,
        "bounds.min_value": MIN_VALUE,
        "bounds.max_value": MAX_VALUE,
        "partition_selection.public_partitions": public_file,
    }
    result = run_job(build_spec({}, overrides), engine, echo=lambda _: None)
    released = pd.read_parquet(result.output / "terminal_stats")
    manifest = result.manifest.model_dump(mode="json", exclude_unset=True)  # as written
    return released.sort_values("TERMINAL_ID", ignore_index=True), manifest


def tolerances(manifest, n_values: int, failure_rate: float = 1e-6) -> dict[str, float]:
    """Bound on |ours - oracle| for all values: each side's Laplace noise (two Laplace parts
    for sum), union-bounded over values, metrics and both releases."""
    cells = n_values * 4 * 2 * 2
    out = {}
    metrics = manifest["queries"]["terminal_stats"]["metrics"]  # the job's one query
    split = manifest["queries"]["terminal_stats"]["budget_split"]
    for metric in ("count", "sum", "privacy_id_count"):
        # discrete Laplace counts: the oracle's continuous b is our scale t, and our tail at
        # integers is at most twice a continuous one's (2 p^k / (1 + p) vs p^k, p = e^(-1/t))
        scale = split.get(metric, {}).get("noise_scale")
        b = scale if scale is not None else metrics[metric]["noise_stddev"] / math.sqrt(2)
        out[metric] = 2 * 2 * b * math.log(cells / failure_rate)
    return out


def compare(ours, theirs, manifest):
    # Our query scales its pairs (the default for these metrics), PipelineDP samples rows:
    # with Linf at least every pair's rows both keep every row (min(1, Linf / c) = 1).
    assert manifest["queries"]["terminal_stats"]["bounds"]["linf_bounding"] == "scale"
    assert ours["TERMINAL_ID"].tolist() == theirs["TERMINAL_ID"].tolist()
    tol = tolerances(manifest, len(ours))
    for metric in ("count", "sum", "privacy_id_count"):
        diff = (ours[metric] - theirs[metric]).abs().max()
        assert diff <= tol[metric], (metric, diff, tol[metric])
    # mean error <= (centred-sum noise + |mean - mid| * count noise) / count, per side.
    count = theirs["count"].clip(lower=1)
    mean_tol = 2 * (tol["sum"] + MAX_VALUE * tol["count"]) / count + 1e-9
    assert ((ours["mean"] - theirs["mean"]).abs() <= mean_tol).all()


def truth(rows: pl.DataFrame) -> pd.DataFrame:
    return terminal_truth(rows, MIN_VALUE, MAX_VALUE)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_public_partitions_equal_oracle_and_truth(dataset, tmp_path, fmt, engine):
    root, rows, l0, linf = dataset
    public = list(range(45))  # 40 terminals with data, 5 listed ones without
    key_file = tmp_path / "keys.csv"
    key_file.write_text("TERMINAL_ID\n" + "\n".join(map(str, public)) + "\n")
    epsilon = 1e6
    ours, manifest = our_release(
        root, fmt, tmp_path / "rel", l0, linf, epsilon, 1e-6, key_file, engine
    )
    assert manifest["engine"] == engine
    theirs = oracle_release(rows, l0, linf, epsilon, 1e-6, public)
    assert ours["TERMINAL_ID"].tolist() == public
    compare(ours, theirs, manifest)
    exact = truth(rows).set_index("TERMINAL_ID").reindex(public, fill_value=0.0)
    tol = tolerances(manifest, len(public))
    for metric in ("count", "sum", "privacy_id_count"):
        assert (ours[metric].to_numpy() - exact[metric].to_numpy()).max() <= tol[metric]


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_private_selection_equals_oracle(dataset, tmp_path, fmt, engine):
    root, rows, l0, linf = dataset
    epsilon = 1e4  # huge, yet inside PyDP's numerically sound range for selection
    ours, manifest = our_release(root, fmt, tmp_path / "rel", l0, linf, epsilon, 1e-6, None, engine)
    theirs = oracle_release(rows, l0, linf, epsilon, 1e-6, None)
    # Keys released by both: every terminal with at least 2 customers (one-customer terminals
    # are released with probability <= delta / L0 each).
    exact = truth(rows)
    expected_keys = exact.loc[exact["privacy_id_count"] >= 2, "TERMINAL_ID"].tolist()
    assert ours["TERMINAL_ID"].tolist() == expected_keys
    compare(ours, theirs, manifest)
