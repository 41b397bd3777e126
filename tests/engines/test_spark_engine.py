"""The Spark engine on a real local SparkSession: bounding invariants on skew, uniform sampling,
the executor-side release, the noise it adds, and rejected rows."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pytest
from pyspark.sql import functions as F
from scipy.stats import norm
from support import SUPPORT
from support.data import check_count_noise_as_planned, release_small

from dppipeline.core.tasks import task_for
from dppipeline.engines.kernel.polars_tasks import aggregate_task
from dppipeline.engines.kernel.sampling import SamplingKeys, new_salt
from dppipeline.engines.spark.aggregate import bound_and_aggregate
from dppipeline.engines.spark.bound import bounded_pairs
from dppipeline.errors import InputError
from dppipeline.spec.model import build_spec

pytestmark = pytest.mark.usefixtures("spark")


def spec_for(**overrides):
    base = {"input.path": "unused", "output": "unused", "metrics": ["count", "sum"]}
    base.update(overrides)
    base.setdefault("bounds.min_value", 0.0)
    base.setdefault("bounds.max_value", 1000.0)
    base.setdefault("bounds.max_partitions_contributed", 1)  # L0 = Linf = 1 unless given
    base.setdefault("bounds.max_contributions_per_partition", 1)
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
    task = task_for(spec.queries[0], spec.source_schema)  # no public keys: every key is aggregated
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
            "bounds.linf_bounding": "sample",  # about sampling: scaling keeps no subset
        }
    )
    task = task_for(spec.queries[0], spec.source_schema)
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
    with pytest.raises(InputError, match=rf"{source.name} line 6: TX_AMOUNT is not a valid"):
        release({"csv": folder}, tmp_path / "strict", fmt="csv")
    assert not (tmp_path / "strict" / "release").exists()
    quarantine = Path(os.environ["DPPIPELINE_STATE_DIR"]) / "quarantine"
    shutil.rmtree(quarantine)
    _, manifest = release(
        {"csv": folder}, tmp_path / "lenient", fmt="csv", **{"input.max_rejected_fraction": 0.01}
    )
    quarantined = list(quarantine.glob("*/rejected.parquet"))
    assert len(quarantined) == 1
    rejected = pd.read_parquet(quarantined[0])
    assert len(rejected) == 1 and rejected["TX_AMOUNT"].iloc[0] == "abc"
    assert rejected["_row"].iloc[0] == 6  # Spark knows the line too
    assert "not a valid float64" in rejected["_reason"].iloc[0]

    def keys(value):
        if isinstance(value, dict):
            return [k for k, v in value.items() for k in (k, *keys(v))]
        return []

    published = [k for k in keys(manifest) if k != "max_rejected_fraction"]
    assert not [k for k in published if "reject" in k or "quarantine" in k or "rows" in k]


# ---------------------------------------------------------------------------------------------
# What a Spark run prints

RUN_CLI = "import sys; from dppipeline.cli.main import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.parametrize("verbose", [False, True], ids=["default", "verbose"])
def test_a_spark_run_prints_no_console_progress_bar(small_inputs, tmp_path, verbose):
    """Spark's console progress bar (`[Stage 3:=====>  (41 + 2) / 200]`) prints task counts
    that follow the data (adaptive execution sizes tasks at run time): a `dppipeline run` in
    its own process, the JVM's output captured with it, shows progress only as its own
    `[spark]` lines, at -v too. The release runs on the executors, so stages last long
    enough (Python workers importing PyDP) for a bar to show if it were on."""
    argv = [
        "run", "--engine", "spark", "--input", small_inputs["parquet"],
        "--output", tmp_path / "release", "--no-ledger", "--metrics", "count,sum",
        "--min-value", "0", "--max-value", "150", "--max-partitions-contributed", "3",
        "--max-contributions-per-partition", "3",
        "--public-partitions", "0..59", *(["-v"] if verbose else []),
    ]  # fmt: skip
    env = {**os.environ, "DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS": "0"}
    env.pop("DPPIPELINE_DEBUG", None)
    done = subprocess.run(
        [sys.executable, "-c", RUN_CLI, *map(str, argv)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "[Stage" not in done.stderr and "\r" not in done.stderr, done.stderr
    spark_lines = [line for line in done.stderr.splitlines() if "[spark]" in line]
    assert any("releasing (partition selection and noise)" in line for line in spark_lines)


# ---------------------------------------------------------------------------------------------
# Sampling that survives recomputation


def skewed_rows(seed: int = 17) -> pd.DataFrame:
    """The forced-retry program's input: 300 customers, 1-8 terminals each, 1-6 rows per pair,
    integer amounts (sums exact in any order), identities over three files."""
    from support.spark_forced_retry import skewed_rows as rows

    return rows()


def test_priorities_are_sparks_own_xxhash64(spark):
    """Spark computes the Linf priority in the JVM (xxhash64); the numpy implementation the
    local and Beam engines use gives the same longs."""
    from dppipeline.engines.kernel.sampling import row_priorities
    from dppipeline.engines.spark.bound import LINF_SECRET, sampling_secrets, with_secret

    rows = skewed_rows().head(500)
    salt = new_salt()
    frame = with_secret(spark.createDataFrame(rows), sampling_secrets(spark, salt), LINF_SECRET)
    spark_priority = (
        frame.select("_row", "_source_file", F.xxhash64(LINF_SECRET, "_source_file", "_row"))
        .toPandas()
        .set_index(["_source_file", "_row"])
        .iloc[:, 0]
    )
    codes, files = pd.factorize(rows["_source_file"])
    mine = pd.Series(
        row_priorities(SamplingKeys.from_salt(salt), list(files), codes, rows["_row"].to_numpy()),
        index=pd.MultiIndex.from_frame(rows[["_source_file", "_row"]]),
    )
    assert spark_priority.sort_index().tolist() == mine.sort_index().tolist()
    # The secrets are data, not literals: no plan of a whole bounding shows them.
    spec = spec_for(**{"bounds.max_partitions_contributed": 2})
    pairs = bounded_pairs(
        spark.createDataFrame(rows),
        task_for(spec.queries[0], spec.source_schema),
        spec.privacy_unit,
        salt,
    )
    pairs.collect()
    execution = pairs._jdf.queryExecution()
    plans = execution.toString() + execution.executedPlan().toString()
    keys = SamplingKeys.from_salt(salt)
    assert "xxhash64" in plans
    assert str(keys.linf) not in plans and str(keys.l0) not in plans


def test_same_salt_keeps_the_same_rows_whatever_the_partitioning(spark):
    """What a retry or a recomputed stage may change is how rows are split and ordered: with
    the same salt, other input partitionings and shuffle widths keep the same pairs with the
    same sums, and the local engine keeps the same ones too; another salt keeps others."""
    rows = skewed_rows()
    spec = spec_for(
        **{"bounds.max_partitions_contributed": 3, "bounds.max_contributions_per_partition": 2}
    )
    task = task_for(spec.queries[0], spec.source_schema)
    salt = new_salt()

    def bounded(partitions: int, shuffle: int, salt: bytes) -> pd.DataFrame:
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle))
        try:
            shuffled = rows.sample(frac=1.0, random_state=partitions)
            frame = spark.createDataFrame(shuffled).repartition(partitions)
            out = bounded_pairs(frame, task, spec.privacy_unit, salt).toPandas()
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", "4")
        return out.sort_values(["CUSTOMER_ID", "TERMINAL_ID"], ignore_index=True)

    first = bounded(2, 3, salt)
    pd.testing.assert_frame_equal(bounded(5, 7, salt), first)
    assert not bounded(2, 3, new_salt()).equals(first)
    local = aggregate_task(
        pl.from_pandas(rows), task, spec.privacy_unit, SamplingKeys.from_salt(salt)
    )
    spark_totals = first.groupby("TERMINAL_ID")[["count", "sum"]].sum()
    local_totals = local.set_index("TERMINAL_ID")[["count", "sum"]]
    pd.testing.assert_frame_equal(spark_totals, local_totals, check_dtype=False)


def test_a_task_retried_mid_bounding_keeps_the_same_rows(tmp_path):
    """In its own Spark (local[2,4]: failed tasks are retried), a UDF on the bounded pairs fails
    the first attempt of the bounding stage's first task: the retry recomputes its Linf and L0
    sampling. The aggregates equal a failure-free run with the same salt, and every unit keeps
    at most L0 partitions and Linf rows in each (exactly min(partitions, L0))."""
    import json
    import subprocess
    import sys

    output = tmp_path / "result.json"
    script = SUPPORT / "spark_forced_retry.py"
    run = subprocess.run(
        [sys.executable, str(script), str(output), str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=script.parent,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert list(tmp_path.glob("stage*-attempt0-failed")), "no task failed: nothing was retried"
    result = json.loads(output.read_text())
    assert result["retried"] == result["clean"]
    l0, linf = result["bounds"]
    pairs = pd.DataFrame(result["retried_pairs"])
    given = pd.DataFrame(result["input"]).drop_duplicates()
    assert (pairs["count"] <= linf).all()
    per_unit = pairs.groupby("CUSTOMER_ID").size()
    expected = given.groupby("CUSTOMER_ID").size().clip(upper=l0)
    pd.testing.assert_series_equal(per_unit, expected, check_names=False)


def test_l0_sampling_is_uniform(spark):
    """3,000 customers, each with one row at each of the same 6 terminals, L0=2: each terminal
    keeps each customer with probability 1/3 (binomial, Bonferroni over 6, rate 1e-6)."""
    n_customers, n_terminals, l0 = 3000, 6, 2
    customers = np.repeat(np.arange(n_customers), n_terminals)
    terminals = np.tile(np.arange(n_terminals), n_customers)
    rows = frame(spark, customers, terminals, np.ones(len(customers)))
    spec = spec_for(**{"bounds.max_partitions_contributed": l0})
    task = task_for(spec.queries[0], spec.source_schema)
    agg = bound_and_aggregate(rows, task, spec.privacy_unit, new_salt()).toPandas()
    frequency = agg.sort_values("TERMINAL_ID")["privacy_id_count"].to_numpy() / n_customers
    p = l0 / n_terminals
    tolerance = float(norm.isf(1e-6 / n_terminals / 2)) * math.sqrt(p * (1 - p) / n_customers)
    assert np.all(np.abs(frequency - p) <= tolerance), frequency
    assert agg["privacy_id_count"].sum() == n_customers * l0
