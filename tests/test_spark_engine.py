"""The Spark engine on a real local SparkSession: bounding invariants on skew, uniform sampling,
the executor-side release, the noise it adds, and rejected rows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from conftest import check_count_noise_as_planned, release_small
from scipy.stats import norm

from dppipeline.engines.sampling import new_salt
from dppipeline.engines.spark import bound_and_aggregate
from dppipeline.errors import InputError
from dppipeline.queries import task_for
from dppipeline.spec import build_spec

pytestmark = pytest.mark.usefixtures("spark")


def spec_for(**overrides):
    base = {"input.path": "unused", "output": "unused", "metrics": ["count", "sum"]}
    base.update(overrides)
    base.setdefault("bounds.min_value", 0.0)
    base.setdefault("bounds.max_value", 1000.0)
    return build_spec({}, base)


def frame(spark, customers, terminals, values, partitions=4):
    """Valid rows as the reader gives them: typed columns and the row identity."""
    pdf = pd.DataFrame(
        {
            "CUSTOMER_ID": np.asarray(customers, dtype=np.int64),
            "TERMINAL_ID": np.asarray(terminals, dtype=np.int64),
            "TX_AMOUNT": np.asarray(values, dtype=np.float64),
            "_source_file": "memory",
            "_row": np.arange(len(customers), dtype=np.int64),
        }
    )
    return spark.createDataFrame(pdf).repartition(partitions)


def test_skewed_input_respects_bounds(spark):
    """One customer with 100,000 rows at one terminal, one at 500 terminals, 300 others."""
    rng = np.random.default_rng(2)
    heavy = (np.zeros(100_000), np.zeros(100_000))
    wide = (np.ones(500), np.arange(500))
    others = (rng.integers(2, 302, 3000), rng.integers(0, 40, 3000))
    customers = np.concatenate([heavy[0], wide[0], others[0]])
    terminals = np.concatenate([heavy[1], wide[1], others[1]])
    rows = frame(spark, customers, terminals, np.full(len(customers), 5.0))
    l0, linf = 4, 3
    spec = spec_for(
        **{"bounds.max_partitions_contributed": l0, "bounds.max_contributions_per_partition": linf}
    )
    task = task_for(spec.query_specs[0])  # no public keys: every key is aggregated
    agg = (
        bound_and_aggregate(rows, task, spec.privacy_unit, new_salt(3))
        .toPandas()
        .set_index("TERMINAL_ID")
    )
    assert (agg["count"] <= linf * agg["privacy_id_count"]).all()
    np.testing.assert_allclose(agg["sum"], 5.0 * agg["count"])
    pairs = pd.DataFrame({"c": customers, "t": terminals}).drop_duplicates()
    expected_pairs = pairs.groupby("c").size().clip(upper=l0).sum()
    assert agg["privacy_id_count"].sum() == expected_pairs
    counts = pd.DataFrame({"c": customers, "t": terminals}).value_counts()
    # Each kept pair keeps exactly min(rows, Linf): the heavy customer adds exactly Linf rows.
    assert agg.loc[0, "count"] <= counts.loc[pd.IndexSlice[:, 0]].clip(upper=linf).sum()
    assert agg["count"].sum() <= expected_pairs * linf


def test_linf_sampling_is_uniform(spark):
    """2,000 customers, each with rows worth 2^0..2^7 at its own terminal, Linf=3: the kept
    sum names the kept subset, so each row's inclusion frequency is observable; it must be 3/8
    (binomial tolerance, Bonferroni over 8 rows, failure rate 1e-6)."""
    n_customers, n_rows, linf = 2000, 8, 3
    customers = np.repeat(np.arange(n_customers), n_rows)
    values = np.tile(2.0 ** np.arange(n_rows), n_customers)
    rows = frame(spark, customers, customers, values)
    spec = spec_for(
        **{
            "bounds.max_contributions_per_partition": linf,
            "bounds.max_value": 1000.0,
        }
    )
    task = task_for(spec.query_specs[0])
    sums = (
        bound_and_aggregate(rows, task, spec.privacy_unit, new_salt())
        .toPandas()["sum"]
        .astype(int)
        .to_numpy()
    )
    assert len(sums) == n_customers
    kept = (sums[:, None] >> np.arange(n_rows)) & 1
    assert (kept.sum(axis=1) == linf).all()
    frequency = kept.mean(axis=0)
    p = linf / n_rows
    tolerance = float(norm.isf(1e-6 / n_rows / 2)) * math.sqrt(p * (1 - p) / n_customers)
    assert np.all(np.abs(frequency - p) <= tolerance), frequency


def release(small_inputs, tmp_path, fmt="parquet", **overrides):
    return release_small(small_inputs, tmp_path, "spark", fmt, **overrides)


def test_release_on_executors_equals_release_on_driver(small_inputs, tmp_path, monkeypatch):
    driver, manifest = release(small_inputs, tmp_path / "a", **{"budget.epsilon": 1e7})
    monkeypatch.setenv("DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS", "0")
    executors, _ = release(small_inputs, tmp_path / "b", **{"budget.epsilon": 1e7})
    assert driver["TERMINAL_ID"].tolist() == executors["TERMINAL_ID"].tolist() == list(range(60))
    assert list(executors.columns) == list(driver.columns)
    for metric in ("count", "sum", "privacy_id_count"):
        b = manifest["queries"]["terminal_stats"]["metrics"][metric]["noise_stddev"]
        b /= math.sqrt(2)
        tolerance = 2 * 2 * b * math.log(4 * 60 / 1e-6)
        assert (driver[metric] - executors[metric]).abs().max() <= tolerance


@pytest.mark.parametrize("where", ["driver", "executors"])
def test_noise_std_matches_manifest(small_inputs, tmp_path, monkeypatch, where):
    """The count's noise is as the manifest says, released on the driver or the executors."""
    if where == "executors":
        monkeypatch.setenv("DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS", "0")
    check_count_noise_as_planned(
        lambda name, **overrides: release(small_inputs, tmp_path / name, **overrides)
    )


def test_rejected_rows_are_quarantined_with_their_line(small_inputs, tmp_path):
    folder = tmp_path / "csv"
    folder.mkdir()
    source = sorted(small_inputs["csv"].glob("*.csv"))[0]
    lines = source.read_text().splitlines()
    fields = lines[5].split(",")
    fields[4] = "abc"
    lines[5] = ",".join(fields)  # line 6 of the file
    (folder / source.name).write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=rf"{source.name} line 6: TX_AMOUNT 'abc'|line 6"):
        release({"csv": folder}, tmp_path / "strict", fmt="csv")
    assert not (tmp_path / "strict" / "release").exists()
    _, manifest = release(
        {"csv": folder}, tmp_path / "lenient", fmt="csv", **{"input.max_rejected_fraction": 0.01}
    )
    quarantined = list((tmp_path / "lenient").glob("release_quarantine/*/rejected.parquet"))
    assert len(quarantined) == 1
    rejected = pd.read_parquet(quarantined[0])
    assert len(rejected) == 1 and rejected["TX_AMOUNT"].iloc[0] == "abc"
    assert "not a valid float64" in rejected["_reason"].iloc[0]

    def keys(value):
        if isinstance(value, dict):
            return [k for k, v in value.items() for k in (k, *keys(v))]
        return []

    published = [k for k in keys(manifest) if k != "max_rejected_fraction"]
    assert not [k for k in published if "reject" in k or "quarantine" in k or "rows" in k]
