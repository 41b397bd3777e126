"""Zero-row tasks have a defined, data-independent outcome on every engine.

Whether a run succeeds, and its schema and (under public keys) its rows, must not depend on
whether a filter happens to match a row: one customer could otherwise decide between a
release and a crash. Each query below matches no row (its filter, or its public keys have no
data); the job must release exactly what the spec and public keys say, with noise, and with the
same schema as when rows match. Beam also runs with more shards than the data fills (empty
unit and partition shards).
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dppipeline.core import extremes
from dppipeline.lifecycle.runner import make_plan, run_job
from dppipeline.spec.model import build_spec

ALL_METRICS = [
    "count", "sum", "mean", "variance", "percentile(50)", "max", "min", "privacy_id_count",
]  # fmt: skip
NOTHING = "TX_AMOUNT > 1000000"  # no row matches
QUERIES = [
    {"name": "total_of_nothing", "filter": NOTHING, "partition_by": [], "metrics": ALL_METRICS},
    {
        "name": "public_of_nothing",
        "filter": NOTHING,
        "partition_by": ["TERMINAL_ID"],
        "metrics": ALL_METRICS,
        "partition_selection": {"public_partitions": "1..3"},
    },
    {
        "name": "public_keys_without_rows",
        "partition_by": ["TERMINAL_ID", "month"],
        "metrics": ALL_METRICS,
        "partition_selection": {
            "public_partitions": {"TERMINAL_ID": [100, 101], "month": "input_range"}
        },
    },
    {
        "name": "private_of_nothing",
        "filter": NOTHING,
        "partition_by": ["TERMINAL_ID"],
        "metrics": ALL_METRICS,
    },
    {
        "name": "private_by_day_of_nothing",
        "filter": NOTHING,
        "partition_by": ["day"],
        "metrics": ["count", "privacy_id_count"],
    },
]
EXPECTED_ROWS = {
    "total_of_nothing": 1,
    "public_of_nothing": 3,
    "public_keys_without_rows": 4,  # 2 terminals x 2 months
    "private_of_nothing": 0,
    "private_by_day_of_nothing": 0,
}


@pytest.fixture(scope="module")
def tiny_input(tmp_path_factory):
    """12 transactions of 4 customers at terminals 1..3 over two days in two months."""
    root = tmp_path_factory.mktemp("zero") / "in"
    rng = np.random.default_rng(3)
    for day in (dt.date(2026, 1, 31), dt.date(2026, 2, 1)):
        n = 6
        table = pa.table(
            {
                "TRANSACTION_ID": pa.array(rng.integers(0, 10**6, n), pa.int64()),
                "TX_DATETIME": pa.array(
                    [dt.datetime.combine(day, dt.time(10, i)) for i in range(n)], pa.timestamp("us")
                ),
                "CUSTOMER_ID": pa.array(rng.integers(1, 5, n), pa.int64()),
                "TERMINAL_ID": pa.array(rng.integers(1, 4, n), pa.int64()),
                "TX_AMOUNT": pa.array(rng.uniform(1, 100, n)),
            }
        )
        folder = root / f"date={day.isoformat()}"
        folder.mkdir(parents=True)
        pq.write_table(table, folder / "part-0.parquet")
    return root


def job(root, out, queries=QUERIES):
    return build_spec(
        {
            "name": "zero_rows",
            "budget": {"epsilon": 1.0, "delta": 1e-6},
            "bounds": {
                "max_partitions_contributed": 2,
                "max_contributions_per_partition": 2,
                "min_value": 0.0,
                "max_value": 100.0,
            },
            "input": {"path": str(root)},
            "output": str(out),
            "queries": queries,
        }
    )


@pytest.fixture(params=["local", "spark", "beam", "beam-many-shards"])
def engine(request):
    if request.param == "spark":
        request.getfixturevalue("spark")
    if request.param == "beam-many-shards":
        from dppipeline.engines.beam.engine import BeamEngine

        return BeamEngine(unit_shards=16, partition_shards=16)
    return request.param


def test_queries_matching_no_row_release_what_the_spec_says(tiny_input, tmp_path, engine):
    spec = job(tiny_input, tmp_path / "release")
    result = run_job(spec, engine, echo=lambda _: None)
    plan = make_plan(spec)
    for query in QUERIES:
        name = query["name"]
        released = pd.read_parquet(result.output / name)
        assert len(released) == EXPECTED_ROWS[name], name
        assert result.manifest.queries[name].released_partitions == EXPECTED_ROWS[name]
        schema = pq.read_schema(next((result.output / name).glob("*.parquet")))
        expected_names = [f.name for f in _release_schema(spec, plan, name)]
        assert schema.names == expected_names, name
        if EXPECTED_ROWS[name]:
            # Noise on zero: drawn (not all exactly zero), and mean/variance within bounds.
            assert released["count"].abs().sum() > 0
            assert released["mean"].between(0.0, 100.0).all()
            assert released["variance"].between(0.0, 50.0**2).all()
            # max and min without rows: a uniform draw from the public grid (every score -m)
            grid = extremes.candidates(0.0, 100.0)
            assert released["max"].isin(grid).all() and released["min"].isin(grid).all()
    totals = pd.read_parquet(result.output / "public_keys_without_rows")
    assert sorted(zip(totals["TERMINAL_ID"], totals["month"], strict=True)) == [
        (100, "2026-01"),
        (100, "2026-02"),
        (101, "2026-01"),
        (101, "2026-02"),
    ]


def _release_schema(spec, plan, name):
    from dppipeline.core.mechanisms import release_arrow_schema
    from dppipeline.core.tasks import key_columns

    query = next(q for q in spec.queries if q.name == name)
    keys = [(k.name, k.arrow_type) for k in key_columns(query, spec.source_schema)]
    return release_arrow_schema(keys, plan.query(name).plan.params.metrics)
