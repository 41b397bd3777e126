"""The one-pass bounding (`unit_partitions`) on inputs the first tests do not
cover (text keys, every time bucket, numeric buckets, nulls in filter columns, keys absent
from the public list, a unit with many rows, many small shuffle partitions), the pass keeps
exactly what each query's own Spark bounding keeps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F
from test_spark_one_pass import by_keys

from dppipeline.core.tasks import public_key_set, task_for
from dppipeline.engines.kernel.sampling import new_salt
from dppipeline.engines.spark.aggregate import bound_and_aggregate, to_aggregates_frame
from dppipeline.engines.spark.bound import shuffled_by_unit
from dppipeline.engines.spark.unit_partitions import bound_in_one_pass
from dppipeline.spec.model import build_spec

pytestmark = pytest.mark.usefixtures("spark")

SCHEMA = [
    {"name": "U", "type": "string", "nullable": False},
    {"name": "AT", "type": "timestamp[us]", "nullable": False, "role": "event_time"},
    {"name": "CITY", "type": "string", "nullable": False},
    {"name": "SHOP", "type": "int64", "nullable": False},
    {"name": "CHANNEL", "type": "string", "nullable": True},
    {"name": "SCORE", "type": "float64", "nullable": True},
    {"name": "AMOUNT", "type": "float64", "nullable": False},
]
QUERIES = [
    {  # text keys, one listed key absent from the data, one present key unlisted
        "name": "per_city",
        "filter": "SCORE > 0.5",
        "partition_by": ["CITY"],
        "metrics": ["count", "sum", "privacy_id_count"],
        "partition_selection": {"public_partitions": ["Zürich", "Genève", "Nowhere", "O'Hare"]},
    },
    {
        "name": "per_week_city",
        "filter": "CHANNEL != 'web'",
        "partition_by": ["week", "CITY"],
        "metrics": ["count", "sum"],
    },
    {"name": "per_hour", "partition_by": ["hour"], "metrics": ["count"]},
    {"name": "per_year_month", "partition_by": ["year", "month"], "metrics": ["count"]},
    {"name": "per_day_shop", "partition_by": ["day", "SHOP"], "metrics": ["sum", "variance"]},
    {
        "name": "per_amount_bucket",
        "partition_by": [{"bucket": "AMOUNT", "edges": [0, 50, 100, 150]}],
        "metrics": ["count", "sum"],
    },
    {  # a filter that matches only the many-row unit: most partitions have no row
        "name": "rare",
        "filter": "SHOP = 99",
        "partition_by": [],
        "metrics": ["count", "sum", "percentile(50)", "min"],
    },
    {
        "name": "per_shop_k4",
        "filter": "CHANNEL = 'web' OR SCORE < 0.2",
        "partition_by": ["SHOP"],
        "metrics": ["count", "max"],
        "bounds": {"max_contributions": 4},
        # shops 4, 5 unlisted: their rows must not use up a unit's K; shop 7 has no row
        "partition_selection": {"public_partitions": [1, 2, 3, 7]},
    },
    {
        "name": "per_city_scaled",
        "partition_by": ["CITY"],
        "metrics": ["count", "sum", "variance"],
        "bounds": {"linf_bounding": "scale"},
    },
]
CITIES = ["Zürich", "Genève", "O'Hare", "a b", "${x}", "Zürich "]


def rows_frame(seed: int = 11) -> pd.DataFrame:
    """80 units with 1 to 30 rows each, and unit `many` with 3,000 rows (all at shop 99);
    nulls in CHANNEL and SCORE; times spread over 3 years."""
    rng = np.random.default_rng(seed)
    per_unit = rng.integers(1, 31, size=80)
    units = np.repeat([f"u{i}" for i in range(80)], per_unit).tolist() + ["many"] * 3000
    n = len(units)
    start = np.datetime64("2024-12-20T00:00:00")
    channel = rng.choice(np.array(["web", "shop", None], dtype=object), size=n)
    score = rng.uniform(0, 1, size=n)
    score[rng.uniform(size=n) < 0.2] = np.nan
    shop = rng.integers(1, 6, size=n)
    shop[-3000:] = 99
    return pd.DataFrame(
        {
            "U": units,
            "AT": start + rng.integers(0, 3 * 365 * 86400, size=n).astype("timedelta64[s]"),
            "CITY": rng.choice(CITIES, size=n),
            "SHOP": shop,
            "CHANNEL": channel,
            "SCORE": pd.array(np.where(np.isnan(score), None, score), dtype="Float64"),
            "AMOUNT": np.round(rng.uniform(-20, 220, size=n), 2),
            "_source_file": rng.choice(["a", "b"], size=n),
            "_row": np.arange(n),
        }
    )


def spec_of(queries):
    bounds = {
        "max_partitions_contributed": 2,
        "max_contributions_per_partition": 2,
        "min_value": 0.0,
        "max_value": 200.0,
    }
    raw = {
        "name": "audit",
        "privacy_unit": "U",
        "input": {"schema": SCHEMA},
        "bounds": bounds,
        "queries": queries,
    }
    return build_spec(raw, {"input.path": "unused", "output": "unused", "value": "AMOUNT"})


def with_public_keys(query, task):
    """The task as `plan_tasks` makes it: a public query's listed keys dropped before bounding
    (`task_for` alone leaves them out)."""
    if not query.is_public or not task.keys:
        return task
    return replace(task, public_keys=public_key_set(query, task.keys, []))


@pytest.mark.parametrize(("partitions", "coalesce"), [(1, "true"), (7, "false")])
def test_one_pass_equals_each_query_alone_on_tricky_inputs(spark, partitions, coalesce):
    """One shuffle partition (every unit in one worker), and 7 that AQE may not merge (units
    spread over several workers, some partitions with no row of a query)."""
    spec = spec_of(QUERIES)
    tasks = [with_public_keys(q, task_for(q, spec.source_schema)) for q in spec.queries]
    assert {t.name for t in tasks if t.public_keys is not None} >= {"per_city", "per_shop_k4"}
    frame = rows_frame()
    salt = new_salt(21)
    settings = {
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.adaptive.coalescePartitions.enabled": coalesce,
    }
    previous = {key: spark.conf.get(key) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        rows = spark.createDataFrame(frame).repartition(4)
        shared = shuffled_by_unit(rows, "U", salt).persist()
        used = shared.select(F.spark_partition_id()).distinct().count()
        assert used == min(partitions, 7)
        together = bound_in_one_pass(shared, tasks, "U", salt)
        for task in tasks:
            alone = bound_and_aggregate(shared, task, "U", salt, by_unit=True)
            expected = to_aggregates_frame(alone.toPandas(), task)
            got = together[task.name]
            assert len(got) == len(expected), task.name
            pd.testing.assert_frame_equal(
                by_keys(got, task), by_keys(expected, task), rtol=1e-9, obj=task.name
            )
        shared.unpersist()
    finally:
        for key, value in previous.items():
            spark.conf.set(key, value)


def test_a_failing_worker_fails_the_run_in_one_line(tmp_path):
    """`dppipeline run` of a two-query Spark job whose one-pass workers fail (a worker of
    200 MB, set through spark-defaults.conf, cannot load numpy: as a worker out of memory
    would): exit 70 with one line, no output, the ledger's release `failed`, and no
    traceback on stderr."""
    import os
    import sqlite3
    import subprocess
    import sys

    import yaml
    from support.data import write_daily_parquet
    from test_spark_one_pass import rows_frame as bank_rows

    frame = bank_rows(seed=6).drop(columns=["_source_file", "_row"])
    frame["TX_DATETIME"] = frame["TX_DATETIME"].astype("datetime64[us]")
    spec = {
        "name": "two",
        "privacy_unit": "CUSTOMER_ID",
        "value": "TX_AMOUNT",
        "budget": {"epsilon": 1.0},
        "bounds": {
            "max_partitions_contributed": 2,
            "max_contributions_per_partition": 2,
            "min_value": 0,
            "max_value": 200,
        },
        "queries": [
            {
                "name": "a",
                "partition_by": ["TERMINAL_ID"],
                "metrics": ["count"],
                "partition_selection": {"public_partitions": "1..6"},
            },
            {"name": "b", "partition_by": [], "metrics": ["sum"]},
        ],
        "input": {"path": str(write_daily_parquet(frame, tmp_path / "in"))},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("spark.executor.pyspark.memory 200m\n")
    env = {k: v for k, v in os.environ.items() if k != "DPPIPELINE_DEBUG"}
    env["SPARK_CONF_DIR"] = str(conf)
    ledger, output = tmp_path / "ledger.sqlite", tmp_path / "out"
    argv = ["run", "--config", tmp_path / "spec.yaml", "--engine", "spark", "--output", output]
    result = subprocess.run(
        [sys.executable, "-m", "dppipeline", *map(str, argv), "--ledger", f"sqlite:///{ledger}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 70, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("dppipeline")]
    assert len(lines) == 1 and "PYTHON_EXCEPTION" in lines[0], result.stderr[-3000:]
    assert not output.exists()
    with sqlite3.connect(ledger) as db:
        assert [row[0] for row in db.execute("SELECT state FROM releases")] == ["failed"]
    # Spark's task-failure logs and PySpark's toPandas warning would print the worker's
    # Python traceback, and any value its message quotes.
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


def test_a_recomputed_partition_keeps_the_same_rows(spark):
    """What a retried or recomputed task sees: the same units' rows in another order, from
    other input partitions. The one pass keeps the same rows (equal counts, units, kept
    values); its float sums may differ in the last bits (summation order), never more."""
    spec = spec_of(QUERIES)
    tasks = [with_public_keys(q, task_for(q, spec.source_schema)) for q in spec.queries]
    frame, salt = rows_frame(), new_salt(5)
    key = "spark.sql.adaptive.coalescePartitions.enabled"
    previous = spark.conf.get(key)
    spark.conf.set(key, "false")
    try:
        runs = []
        for seed, parts in ((0, 3), (1, 5)):
            shuffled = frame.sample(frac=1, random_state=seed).reset_index(drop=True)
            rows = spark.createDataFrame(shuffled).repartition(parts)
            runs.append(bound_in_one_pass(shuffled_by_unit(rows, "U", salt), tasks, "U", salt))
    finally:
        spark.conf.set(key, previous)
    for task in tasks:
        first, second = (by_keys(run[task.name], task) for run in runs)
        exact = [c for c in first.columns if c not in ("sum", "centred_squares")]
        pd.testing.assert_frame_equal(first[exact], second[exact], check_exact=True, obj=task.name)
        pd.testing.assert_frame_equal(first, second, rtol=1e-12, obj=task.name)
