"""A Spark job of several queries bounds its queries in one pass over the rows
shuffled by unit (`unit_partitions`): it must keep exactly the rows each query's own Spark
bounding keeps (the same salt), with bounds that bind, for every kind of key, filter and
bounding option; and the code it runs beside the data imports no noise library."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from support.data import write_daily_parquet

from dppipeline.core.tasks import task_for
from dppipeline.engines.kernel.sampling import new_salt
from dppipeline.engines.spark.aggregate import bound_and_aggregate, to_aggregates_frame
from dppipeline.engines.spark.bound import shuffled_by_unit
from dppipeline.engines.spark.unit_partitions import bound_in_one_pass, bounds_in_one_pass
from dppipeline.lifecycle.runner import run_job
from dppipeline.spec.model import build_spec

pytestmark = pytest.mark.usefixtures("spark")

TIGHT = {"max_partitions_contributed": 2, "max_contributions_per_partition": 2}
QUERIES = [
    {
        "name": "per_terminal",
        "partition_by": ["TERMINAL_ID"],
        "metrics": ["count", "sum", "mean", "privacy_id_count"],
        "partition_selection": {"public_partitions": "1..5"},
    },
    {
        "name": "per_terminal_day",
        "filter": "TERMINAL_ID != 3",
        "partition_by": ["TERMINAL_ID", "day"],
        "metrics": ["sum"],
    },
    {"name": "per_month", "partition_by": ["month"], "metrics": ["count", "variance"]},
    {
        "name": "overall",
        "partition_by": [],
        "metrics": ["count", "sum", "variance"],
        "bounds": {"max_contributions_per_partition": 5},
    },
    {"name": "small", "filter": "TX_AMOUNT < 50", "partition_by": [], "metrics": ["count"]},
    {
        "name": "per_terminal_k3",
        "partition_by": ["TERMINAL_ID"],
        "metrics": ["count", "sum"],
        "bounds": {"max_contributions": 3},
        "partition_selection": {"public_partitions": "1..6"},
    },
    {
        "name": "per_terminal_scaled",
        "partition_by": ["TERMINAL_ID"],
        "metrics": ["count", "sum", "variance"],
        "bounds": {"linf_bounding": "scale"},
        "partition_selection": {"public_partitions": "1..6"},
    },
    {
        "name": "largest_and_median",
        "partition_by": ["TERMINAL_ID"],
        "metrics": ["max", "percentile(50)"],
        "partition_selection": {"public_partitions": "1..6"},
    },
]


def rows_frame(seed: int = 5) -> pd.DataFrame:
    """60 customers with 1 to 40 transactions each over 6 terminals and 70 days: most of them
    exceed L0 = 2 and Linf = 2; amounts beyond the bounds' 200."""
    rng = np.random.default_rng(seed)
    per_customer = rng.integers(1, 41, size=60)
    n = int(per_customer.sum())
    start = np.datetime64("2026-01-01T00:00:00")
    return pd.DataFrame(
        {
            "TRANSACTION_ID": np.arange(n),
            "TX_DATETIME": start + rng.integers(0, 70 * 86400, size=n).astype("timedelta64[s]"),
            "CUSTOMER_ID": np.repeat(np.arange(1, 61), per_customer),
            "TERMINAL_ID": rng.integers(1, 7, size=n),
            "TX_AMOUNT": np.round(rng.uniform(0, 300, size=n), 2),
            "_source_file": rng.choice(["a", "b", "c"], size=n),
            "_row": np.arange(n),
        }
    )


def spec_of(queries, **overrides):
    bounds = {**TIGHT, "min_value": 0.0, "max_value": 200.0}
    raw = {"name": "one_pass", "bounds": bounds, "queries": queries}
    return build_spec(raw, {"input.path": "unused", "output": "unused", **overrides})


def by_keys(frame: pd.DataFrame, task) -> pd.DataFrame:
    """Columns in one order, aggregates as floats, each partition's kept values sorted (their
    order is whatever the exchange gave), rows by key."""
    keys = task.key_names
    frame = frame[[*keys, *sorted(c for c in frame.columns if c not in keys)]].copy()
    frame = frame.astype({c: "float64" for c in frame.columns if c not in [*keys, "values"]})
    if "values" in frame:
        frame["values"] = [sorted(v) for v in frame["values"]]
    return frame.sort_values(keys, ignore_index=True) if keys else frame


def test_one_pass_keeps_what_each_query_keeps_alone(spark):
    spec = spec_of(QUERIES)
    tasks = [task_for(q, spec.source_schema) for q in spec.queries]
    assert all(bounds_in_one_pass(t) for t in tasks)
    frame = rows_frame()
    salt = new_salt(7)
    rows = spark.createDataFrame(frame).repartition(3)  # rows of a unit in several input parts
    shared = shuffled_by_unit(rows, "CUSTOMER_ID", salt).persist()
    try:
        together = bound_in_one_pass(shared, tasks, "CUSTOMER_ID", salt)
        for task in tasks:
            alone = bound_and_aggregate(shared, task, "CUSTOMER_ID", salt, by_unit=True)
            expected = to_aggregates_frame(alone.toPandas(), task)
            assert sorted(together[task.name].columns) == sorted(expected.columns), task.name
            pd.testing.assert_frame_equal(
                by_keys(together[task.name], task), by_keys(expected, task), rtol=1e-9
            )
            # the bounds bind: fewer rows than the task's filter matches
            assert together[task.name]["count"].sum() < len(frame), task.name
    finally:
        shared.unpersist()


def test_one_pass_of_a_filter_no_row_matches(spark):
    """A query with no row anywhere gives no partition (as alone), beside one with rows."""
    queries = [QUERIES[0], {**QUERIES[4], "filter": "TX_AMOUNT < 0"}]
    spec = spec_of(queries)
    tasks = [task_for(q, spec.source_schema) for q in spec.queries]
    salt = new_salt(8)
    shared = shuffled_by_unit(spark.createDataFrame(rows_frame()), "CUSTOMER_ID", salt)
    together = bound_in_one_pass(shared, tasks, "CUSTOMER_ID", salt)
    assert len(together["small"]) == 0 and list(together["small"].columns) == [
        "privacy_id_count",
        "count",
        "sum",
    ]
    assert together["per_terminal"]["count"].sum() > 0


def test_workers_import_no_noise_library():
    """What the Python workers import to bound rows: no pipeline-dp (with Beam, 1.3 s and a
    warning on stderr per worker), no scipy, no ledger."""
    program = (
        "import sys, dppipeline.engines.spark.unit_partitions\n"
        "print(sorted(m for m in ('pipeline_dp', 'apache_beam', 'scipy', 'sqlalchemy', 'pydp')"
        " if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]" and done.stderr == ""


def test_a_job_of_several_queries_releases_what_the_local_engine_releases(tmp_path):
    """Through `run_job`, bounds binding, epsilon 1e12 (noise below 1e-9): the Spark job
    (one pass for most queries, the per-query path for count_distinct) releases
    what the local engine releases from the same files with the same seed."""
    frame = rows_frame(seed=6).drop(columns=["_source_file", "_row"])
    frame["TX_DATETIME"] = frame["TX_DATETIME"].astype("datetime64[us]")
    root = write_daily_parquet(frame, tmp_path / "in")
    distinct = {"name": "terminals", "partition_by": [], "metrics": ["count_distinct(TERMINAL_ID)"]}
    queries = [*QUERIES, distinct]
    lines: list[str] = []
    released = {}
    for engine in ("local", "spark"):
        spec = spec_of(
            queries,
            **{"input.path": str(root), "output": str(tmp_path / engine), "budget.epsilon": 1e12},
        )
        result = run_job(spec, engine, seed=3, echo=lines.append)
        released[engine] = {q["name"]: pd.read_parquet(result.output / q["name"]) for q in queries}
    assert any("8 queries: bounding contributions in one pass" in line for line in lines), [
        line for line in lines if "[spark]" in line
    ]
    for query in queries:
        local, spark = released["local"][query["name"]], released["spark"][query["name"]]
        keys = query["partition_by"]
        if keys:
            local, spark = (f.sort_values(keys, ignore_index=True) for f in (local, spark))
        # max: the exponential mechanism draws among grid points of equal score, even at
        # this epsilon (the kept values themselves are compared above)
        spark, local = (f.drop(columns=["max"], errors="ignore") for f in (spark, local))
        pd.testing.assert_frame_equal(spark, local, rtol=1e-6, check_dtype=False)


def test_a_job_of_several_queries_succeeds_whatever_its_partitions_number(tmp_path, monkeypatch):
    """Whether a run succeeds must not depend on how many partitions the data fill: a job
    of several queries releases on the driver even beyond
    $DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS (it failed there, naming the query, before),
    the same rows as under the default limit; its progress lines say nothing of it."""
    frame = rows_frame(seed=6).drop(columns=["_source_file", "_row"])
    frame["TX_DATETIME"] = frame["TX_DATETIME"].astype("datetime64[us]")
    root = write_daily_parquet(frame, tmp_path / "in")
    released, lines = {}, {}
    for limit in ("5", "1000000"):
        monkeypatch.setenv("DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS", limit)
        out = tmp_path / f"out_{limit}"
        spec = spec_of(
            QUERIES[:2],
            **{"input.path": str(root), "output": str(out), "budget.epsilon": 1e12},
        )
        lines[limit] = []
        result = run_job(spec, "spark", seed=3, echo=lines[limit].append)
        released[limit] = pd.read_parquet(result.output / "per_terminal_day")
    keys = ["TERMINAL_ID", "day"]
    assert len(released["5"]) > 5
    pd.testing.assert_frame_equal(
        released["5"].sort_values(keys, ignore_index=True),
        released["1000000"].sort_values(keys, ignore_index=True),
        rtol=1e-6,
    )

    def steps(echoed: list[str]) -> list[str]:
        """The engine's lines without their timings (and the output folder's name)."""
        return [
            re.sub(r"^\[spark\]\s+[\d.]+s ", "[spark] ", line)
            for line in echoed
            if line.startswith("[spark]") and "written to" not in line
        ]

    assert any("releasing" in line for line in steps(lines["5"]))
    assert steps(lines["5"]) == steps(lines["1000000"])
