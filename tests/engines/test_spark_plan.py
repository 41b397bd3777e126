"""How the Spark engine plans its work: the read schema taken from a Parquet footer, public
keys written as SQL literals, and the shape of the bounding plan (one shuffle of the rows, one
of the partition aggregates). Plans and values are checked; nothing here is timed."""

from __future__ import annotations

import datetime as dt
import re

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from dppipeline.core.tasks import read_schema, task_for
from dppipeline.engines.kernel.sampling import new_salt
from dppipeline.engines.spark import bound as spark_bound
from dppipeline.engines.spark import read as spark_read
from dppipeline.engines.spark.aggregate import bound_and_aggregate
from dppipeline.engines.spark.bound import keep_public, shuffled_by_unit, sql_literal
from dppipeline.engines.spark.read import (
    _spark_file_uri,
    footer_ddl,
    hadoop_path,
    read_validated,
    valid_rows,
)
from dppipeline.inputs.files import discover_partitions
from dppipeline.spec.model import build_spec

pytestmark = pytest.mark.usefixtures("spark")

NAMES = ["TRANSACTION_ID", "TX_DATETIME", "CUSTOMER_ID", "TERMINAL_ID", "TX_AMOUNT"]


def first_file(folder) -> str:
    return str(sorted(folder.glob("date=*/*.parquet"))[0])


def test_footer_schema_is_what_spark_infers(spark, small_inputs):
    """The DDL read from a file's footer gives the schema Spark's own inference gives
    (timestamps without a zone as timestamp_ntz)."""
    path = first_file(small_inputs["parquet"])
    inferred = spark.read.parquet(path).select(*NAMES).schema
    ddl = footer_ddl(NAMES, pq.read_schema(path))
    assert spark.read.schema(ddl).parquet(path).schema == inferred
    assert "`TX_DATETIME` timestamp_ntz" in ddl


def test_the_file_table_is_keyed_by_the_names_spark_gives_its_files(spark, tmp_path):
    """Each row's file and day come from a broadcast table keyed by `_metadata.file_path`;
    a key that misses falls back to decoding the name on every row (correct, but the slow
    path this table replaced). The predicted keys are exactly Spark's, odd names included."""
    names = ["plain.parquet", "a b.parquet", "p%20q.parquet", "c+d.parquet", "é[1].parquet"]
    folder = tmp_path / "date=2026-01-01 x"
    folder.mkdir()
    for name in names:
        pq.write_table(pa.table({"x": [1]}), folder / name)
    files = [folder / name for name in names]
    read = spark.read.parquet(*[hadoop_path(f) for f in files])
    seen = {r[0] for r in read.select("_metadata.file_path").collect()}
    assert seen == {_spark_file_uri(spark, f) for f in files}


@pytest.mark.parametrize(
    ("arrow_type", "expected"),
    [
        (pa.string(), "`TX_AMOUNT` string"),  # text values: validation parses them
        (pa.float32(), "`TX_AMOUNT` float"),
        (pa.uint32(), "`TX_AMOUNT` bigint"),
        (pa.timestamp("us", tz="UTC"), "`TX_AMOUNT` timestamp"),  # an instant
        (pa.timestamp("ms"), "`TX_AMOUNT` timestamp_ntz"),
        (pa.timestamp("ns"), "`TX_AMOUNT` bigint"),  # nanoseconds: read as their integer
    ],
)
def test_footer_schema_of_other_types(spark, tmp_path, arrow_type, expected):
    path = tmp_path / "one.parquet"
    pq.write_table(pa.table({"TX_AMOUNT": pa.array([None], arrow_type)}), path)
    ddl = footer_ddl(["TX_AMOUNT"], pq.read_schema(path))
    assert ddl == expected
    spark.conf.set("spark.sql.legacy.parquet.nanosAsLong", "true")  # as the engine does
    try:
        assert spark.read.schema(ddl).parquet(str(path)).count() == 1
    finally:
        spark.conf.unset("spark.sql.legacy.parquet.nanosAsLong")


@pytest.mark.parametrize("value", [0, -(2**63), 2**63 - 1, dt.date(2026, 2, 28)])
def test_sql_literal_reads_back_as_the_same_value(spark, value):
    literal = sql_literal(value)
    assert literal is not None
    assert spark.sql(f"SELECT {literal} AS v").first()["v"] == value


def test_sql_literal_refuses_other_types():
    """Text keys are never SQL text (Spark would substitute ${...} in them)."""
    assert sql_literal(True) is None
    assert sql_literal(1.5) is None
    assert sql_literal(dt.datetime(2026, 1, 1)) is None
    assert sql_literal("plain") is None


@pytest.mark.parametrize(
    "keys",
    [
        pd.DataFrame({"k": [1, 3, 5, 10**12]}),
        pd.DataFrame({"k": [dt.date(2026, 1, 2), dt.date(2026, 1, 4)]}),
    ],
)
def test_public_filter_as_sql_text_equals_the_semi_join(spark, monkeypatch, keys):
    values = keys["k"].tolist()
    others = [1_000, dt.date(2027, 1, 1), "other"]
    candidates = values + [o for o in others if type(o) is type(values[0])]
    rows = spark.createDataFrame(
        pd.DataFrame({"k": candidates * 2, "n": range(len(candidates) * 2)})
    )
    by_text = keep_public(rows, ["k"], keys)
    assert re.search(r"\bIN\b", by_text._jdf.queryExecution().analyzed().toString())
    monkeypatch.setattr(spark_bound, "INSET_MAX_KEYS", 0)  # the semi-join path
    by_join = keep_public(rows, ["k"], keys)
    assert "LeftSemi" in by_join._jdf.queryExecution().analyzed().toString()
    kept_text = sorted(r["n"] for r in by_text.collect())
    assert kept_text == sorted(r["n"] for r in by_join.collect())
    assert len(kept_text) == 2 * len(values)


def count_and_sum_spec(l0: int, linf_bounding: str | None = None):
    """Count and sum per terminal, L0 = `l0`, Linf = 2, values in [0, 10] (Linf bounding as
    given; unset: the default, scale)."""
    overrides = {"input.path": "unused", "output": "unused", "metrics": ["count", "sum"]}
    overrides |= {"bounds.linf_bounding": linf_bounding}  # None keeps the default
    overrides |= {"bounds.max_partitions_contributed": l0}
    overrides |= {"bounds.max_contributions_per_partition": 2}
    return build_spec({}, overrides | {"bounds.min_value": 0.0, "bounds.max_value": 10.0})


def test_one_query_samples_its_pairs_before_any_exchange(spark):
    """A one-query job's plan: Linf's bottom-k aggregate runs partially before its exchange
    (by pair), so no exchange carries more than Linf entries per pair and input task; then
    the pairs by privacy unit (L0 ranking) and the pair aggregates by key; the sampling
    secrets come as a broadcast one-row table."""
    spec = count_and_sum_spec(l0=2, linf_bounding="sample")  # about sampling's plan
    rows = spark.createDataFrame(
        pd.DataFrame(
            {
                "CUSTOMER_ID": [1, 1, 2],
                "TERMINAL_ID": [7, 8, 7],
                "TX_AMOUNT": [1.0] * 3,
                "_source_file": "f",
                "_row": [1, 2, 3],
            }
        )
    )
    task = task_for(spec.queries[0], spec.source_schema)
    aggregates = bound_and_aggregate(rows, task, "CUSTOMER_ID", new_salt())
    plan = aggregates._jdf.queryExecution().executedPlan().toString()
    exchanges = re.findall(r"Exchange hashpartitioning\(([\w#, ]+?), \d+\)", plan)
    exchanges = [re.sub(r"#\d+L?", "", e) for e in exchanges]
    # top of the plan first
    assert exchanges == ["TERMINAL_ID", "CUSTOMER_ID", "CUSTOMER_ID, TERMINAL_ID"], plan
    assert "partial_min_by" in plan and "Window" in plan  # Linf bottom-k, L0 ranking
    # The only other exchanges broadcast the one-row table of sampling secrets.
    assert len(re.findall(r"Exchange", plan)) == 3 + len(re.findall(r"BroadcastExchange", plan))
    assert aggregates.agg(F.sum("count")).first()[0] == 3


def test_queries_of_one_job_bound_the_rows_of_one_shuffle(spark):
    """A job of several queries shuffles its rows by privacy unit once (`shuffled_by_unit`,
    persisted); each query's bounding reads them where they lie: its only exchange carries its
    pair aggregates by key. Same aggregates as the one-query path (the same salt)."""
    spec = count_and_sum_spec(l0=1)
    rows = spark.createDataFrame(
        pd.DataFrame(
            {
                "CUSTOMER_ID": [1, 1, 1, 2, 2, 3],
                "TERMINAL_ID": [7, 8, 7, 7, 7, 8],
                "TX_AMOUNT": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
                "_source_file": "f",
                "_row": [1, 2, 3, 4, 5, 6],
            }
        )
    )
    salt = new_salt()
    shared = shuffled_by_unit(rows, "CUSTOMER_ID", salt).persist()
    try:
        for query in (spec.queries[0], spec.queries[0].model_copy(update={"partition_by": []})):
            task = task_for(query, spec.source_schema)
            alone = bound_and_aggregate(rows, task, "CUSTOMER_ID", salt).toPandas()
            aggregates = bound_and_aggregate(shared, task, "CUSTOMER_ID", salt, by_unit=True)
            together = aggregates.toPandas()
            keys = list(alone.columns[:1])
            pd.testing.assert_frame_equal(
                alone.sort_values(keys, ignore_index=True),
                together.sort_values(keys, ignore_index=True),
            )
            final = aggregates._jdf.queryExecution().executedPlan().toString()
            above_cache = final.split("InMemoryRelation")[0]
            exchanges = re.findall(r"Exchange hashpartitioning\((\w+)", above_cache)
            # by its key (a global total's key is a constant Spark folds)
            assert exchanges == [task.key_names[0] if task.key_names else "0"], final
    finally:
        shared.unpersist()


# Plan nodes that run Python (a UDF, pandas or Arrow batches in a Python worker).
PYTHON_NODES = ("BatchEvalPython", "ArrowEvalPython", "PythonUDF", "MapInPandas", "MapInArrow")


def test_the_scaled_default_plans_hash_aggregates_only(spark, small_inputs):
    """The one-query default (count and sum, Linf scaled) from the Parquet read to the
    partition aggregates: every aggregate a hash aggregate, the (unit, key) pairs aggregated
    partially before their first exchange (as a groupBy would), no bottom-k (`min_by`), no
    sort aggregate and no Python anywhere: the files, validation and bounding run in the JVM."""
    folder = small_inputs["parquet"]
    spec = build_spec(
        {},
        {
            "input.path": str(folder),
            "output": "unused",
            "metrics": ["count", "sum"],
            "bounds.max_partitions_contributed": 2,
            "bounds.max_contributions_per_partition": 2,
            "bounds.min_value": 0.0,
            "bounds.max_value": 10.0,
        },
    )
    task = task_for(spec.queries[0], spec.source_schema)
    assert task.scaled  # the default for count and sum
    days = discover_partitions(folder, "parquet")
    inputs = read_validated(spark, days, "parquet", read_schema(spec, [task]))
    rows = valid_rows(inputs.validated, read_schema(spec, [task]))
    aggregates = bound_and_aggregate(rows, task, spec.privacy_unit, new_salt())
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # the whole plan, not stage by stage
    try:
        plan = aggregates._jdf.queryExecution().executedPlan().toString()
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", "true")
    plain = re.sub(r"#\d+L?", "", plan)
    assert "HashAggregate" in plain
    for absent in ("SortAggregate", "ObjectHashAggregate", "min_by", *PYTHON_NODES):
        assert absent not in plain, plan
    # The rows' first exchange carries partial pair aggregates: a partial hash aggregate keyed
    # by (unit, key) right below it, not the rows themselves.
    pair_exchange = plain.index("Exchange hashpartitioning(CUSTOMER_ID, TERMINAL_ID")
    below = plain[pair_exchange:]
    assert re.search(
        r"HashAggregate\(keys=\[CUSTOMER_ID, TERMINAL_ID\], functions=\[partial_count", below
    ), plan
    assert below.count("Exchange") == 1 + below.count("BroadcastExchange"), plan
    assert aggregates.agg(F.sum("count")).first()[0] > 0


def test_rows_of_a_file_spark_names_unexpectedly_keep_their_file_and_day(
    spark, small_inputs, monkeypatch
):
    """Should Spark name a file otherwise than predicted, the lookup by its name misses and
    the row falls back to its decoded name: the same files and days, no row rejected."""
    folder = small_inputs["parquet"]
    bounds = {"bounds.min_value": 0.0, "bounds.max_value": 10.0}
    spec = build_spec({}, {"input.path": str(folder), "output": "unused", **bounds})
    schema = read_schema(spec, [task_for(spec.queries[0], spec.source_schema)])
    days = discover_partitions(folder, "parquet")

    def sources(validated):
        return sorted(
            (r["_source_file"], r["_row"], r["_bad"])
            for r in validated.select("_source_file", "_row", "_bad").collect()
        )

    expected = sources(read_validated(spark, days, "parquet", schema).validated)
    monkeypatch.setattr(spark_read, "_spark_file_uri", lambda _spark, path: f"file:/nowhere{path}")
    fallback = sources(read_validated(spark, days, "parquet", schema).validated)
    assert fallback == expected
    listed = {str(p) for day in days for p in day.files}
    assert {s for s, _, _ in fallback} == listed
    assert not any(bad for _, _, bad in fallback)
