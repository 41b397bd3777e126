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

from dppipeline.core.tasks import task_for
from dppipeline.engines.shared.sampling import new_salt
from dppipeline.engines.spark import bound as spark_bound
from dppipeline.engines.spark.aggregate import bound_and_aggregate
from dppipeline.engines.spark.bound import keep_public, sql_literal
from dppipeline.engines.spark.read import footer_ddl
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


def test_bounding_shuffles_rows_once_by_privacy_unit(spark):
    """The plan's exchanges: the rows by privacy unit (serving both Linf and L0 bounding, so
    the per-unit ranking needs no exchange of its own), then the pair aggregates by key; the
    sampling secrets come as a broadcast one-row table."""
    spec = build_spec(
        {},
        {
            "input.path": "unused",
            "output": "unused",
            "metrics": ["count", "sum"],
            "bounds.max_partitions_contributed": 2,
            "bounds.max_contributions_per_partition": 2,
            "bounds.min_value": 0.0,
            "bounds.max_value": 10.0,
        },
    )
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
    exchanges = re.findall(r"Exchange hashpartitioning\((\w+)#", plan)
    assert exchanges == ["TERMINAL_ID", "CUSTOMER_ID"], plan  # top of the plan first
    assert "min_by" in plan and "Window" in plan  # Linf bottom-k, L0 ranking
    # The only other exchanges broadcast the one-row table of sampling secrets.
    assert len(re.findall(r"Exchange", plan)) == 2 + len(re.findall(r"BroadcastExchange", plan))
    assert aggregates.agg(F.sum("count")).first()[0] == 3
