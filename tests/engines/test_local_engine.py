"""The local engine end to end on a hand-written input: exact tier against hand-computed values,
plus a skewed input where bounding must hold."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import polars as pl
import pytest

from dppipeline.core.tasks import read_schema, task_for
from dppipeline.engines.kernel.sampling import new_salt
from dppipeline.engines.local.engine import compute_aggregates
from dppipeline.inputs.files import discover_partitions
from dppipeline.lifecycle.runner import run_job
from dppipeline.spec.model import build_spec

HEADER = "TRANSACTION_ID,TX_DATETIME,CUSTOMER_ID,TERMINAL_ID,TX_AMOUNT"
# customer 1: three $10 rows at terminal 1       -> Linf=2 keeps 2: count 2, sum 20
# customer 2: one $500 row at terminal 1         -> clipped to 100
# customer 3: one -$5 row at terminal 2          -> clipped to 0
# customer 4: one $50 row at terminals 2 and 3   -> L0=1 keeps exactly one of them
ROWS = [
    (1, "2026-01-01 10:00:00", 1, 1, 10.0),
    (2, "2026-01-01 11:00:00", 1, 1, 10.0),
    (3, "2026-01-02 12:00:00", 1, 1, 10.0),
    (4, "2026-01-02 09:00:00", 2, 1, 500.0),
    (5, "2026-01-01 09:30:00", 3, 2, -5.0),
    (6, "2026-01-01 08:00:00", 4, 2, 50.0),
    (7, "2026-01-02 08:00:00", 4, 3, 50.0),
]


@pytest.fixture
def hand_input(tmp_path):
    folder = tmp_path / "tx"
    folder.mkdir()
    for day in ("2026-01-01", "2026-01-02"):
        lines = [HEADER] + [",".join(map(str, r)) for r in ROWS if r[1].startswith(day)]
        (folder / f"{day}.csv").write_text("\n".join(lines) + "\n")
    keys = tmp_path / "keys.csv"
    keys.write_text("TERMINAL_ID\n1\n2\n3\n4\n")
    return folder, keys


def spec_for(folder, out, keys, **extra):
    overrides = {
        "input.path": str(folder),
        "input.format": "csv",
        "output": str(out),
        "metrics": ["count", "sum", "mean", "privacy_id_count"],
        "budget.epsilon": 1e7,
        "bounds.max_partitions_contributed": 1,
        "bounds.max_contributions_per_partition": 2,
        "bounds.min_value": 0.0,
        "bounds.max_value": 100.0,
        "partition_selection.public_partitions": str(keys) if keys else None,
    }
    overrides.update(extra)
    return build_spec({}, overrides)


def aggregate(spec, days, public_keys, quarantine, seed):
    """The local engine's exact bounded aggregates of the spec's one query, with the given
    public keys (None: all keys), and its reject counts."""
    task = dataclasses.replace(
        task_for(spec.queries[0], spec.source_schema), public_keys=public_keys
    )
    result = compute_aggregates(
        [task],
        days,
        schema=read_schema(spec, [task]),
        fmt=spec.input.format,
        unit=spec.privacy_unit,
        max_rejected_fraction=spec.input.max_rejected_fraction,
        quarantine=quarantine,
        salt=new_salt(seed),
    )
    assert list(result.aggregates) == [spec.name]
    return result.aggregates[spec.name], result.rejects


def test_exact_aggregates_match_hand_computation(hand_input, tmp_path):
    folder, keys = hand_input
    spec = spec_for(folder, tmp_path / "rel", keys)
    for seed in range(10):  # whichever rows are sampled, the hand-computed values hold
        aggregates, rejects = aggregate(
            spec,
            discover_partitions(folder, "csv"),
            pd.DataFrame({"TERMINAL_ID": [1, 2, 3, 4]}),
            tmp_path / "q",
            seed=seed,
        )
        agg = aggregates.set_index("TERMINAL_ID")
        assert agg.loc[1, "count"] == 3 and agg.loc[1, "sum"] == 120.0
        assert agg.loc[1, "privacy_id_count"] == 2
        # customer 4 lands in exactly one of terminals 2 and 3
        count_2_3 = agg["count"].reindex([2, 3], fill_value=0).sum()
        assert count_2_3 == 2  # customer 3's row plus one of customer 4's
        assert agg["sum"].reindex([2, 3], fill_value=0).sum() == 50.0
        assert agg["privacy_id_count"].sum() == 4  # each customer in exactly one terminal
        assert rejects.rows_read == 7 and rejects.rows_rejected == 0


def test_release_matches_hand_computation(hand_input, tmp_path):
    folder, keys = hand_input
    result = run_job(spec_for(folder, tmp_path / "rel", keys), "local", echo=lambda _: None)
    released = pd.read_parquet(result.output / "terminal_stats").set_index("TERMINAL_ID")
    assert released.index.tolist() == [1, 2, 3, 4]
    # noise at epsilon 1e7: Laplace b <= 1e-4 for every metric here
    assert released.loc[1, "count"] == pytest.approx(3, abs=1e-2)
    assert released.loc[1, "sum"] == pytest.approx(120, abs=1e-2)
    assert released.loc[1, "mean"] == pytest.approx(40, abs=1e-2)
    assert released.loc[1, "privacy_id_count"] == pytest.approx(2, abs=1e-2)
    assert released.loc[4, "count"] == pytest.approx(0, abs=1e-2)
    assert released.loc[4, "mean"] == pytest.approx(50, abs=1e-2)  # empty: the midpoint
    assert released.loc[[2, 3], "count"].sum() == pytest.approx(2, abs=1e-2)
    schema = pl.read_parquet_schema(result.output / "terminal_stats" / "part-00000.parquet")
    assert (
        schema["TERMINAL_ID"] == pl.Int64 and schema["count"] == pl.Int64
    )  # discrete count noise (the default)


def test_skewed_input_respects_bounds(tmp_path):
    """One customer with 5,000 rows over 100 terminals among 200 ordinary customers."""
    rng = np.random.default_rng(5)
    n_heavy, n_light = 5000, 600
    customers = np.r_[np.zeros(n_heavy, dtype=np.int64), rng.integers(1, 201, n_light)]
    terminals = np.r_[rng.integers(0, 100, n_heavy), rng.integers(0, 100, n_light)]
    n = n_heavy + n_light
    frame = pl.DataFrame(
        {
            "TRANSACTION_ID": np.arange(n, dtype=np.int64),
            "TX_DATETIME": pl.Series([pd.Timestamp("2026-01-01 12:00")] * n).cast(
                pl.Datetime("us")
            ),
            "CUSTOMER_ID": customers,
            "TERMINAL_ID": terminals,
            "TX_AMOUNT": rng.uniform(0, 100, n),
        }
    )
    folder = tmp_path / "tx" / "date=2026-01-01"
    folder.mkdir(parents=True)
    frame.write_parquet(folder / "part-0.parquet")
    l0, linf = 3, 2
    spec = build_spec(
        {},
        {
            "input.path": str(tmp_path / "tx"),
            "output": str(tmp_path / "rel"),
            "metrics": ["count", "privacy_id_count"],
            "budget.epsilon": 1e7,
            "bounds.max_partitions_contributed": l0,
            "bounds.max_contributions_per_partition": linf,
        },
    )
    agg, _ = aggregate(
        spec, discover_partitions(tmp_path / "tx", "parquet"), None, tmp_path / "q", seed=1
    )
    # Every partition: count <= Linf * privacy_id_count. Overall: each customer adds at most
    # L0 * Linf rows and L0 partitions, and exactly min(partitions, L0) of them.
    assert (agg["count"] <= linf * agg["privacy_id_count"]).all()
    light = pl.DataFrame({"c": customers[n_heavy:], "t": terminals[n_heavy:]})
    expected_pairs = sum(min(n_t, l0) for n_t in light.group_by("c").n_unique()["t"]) + l0
    assert agg["privacy_id_count"].sum() == expected_pairs
    assert agg["count"].sum() <= expected_pairs * linf
    assert math.isclose(agg["privacy_id_count"].sum(), expected_pairs)


@pytest.mark.parametrize("bounds", ["l0_linf", "max_contributions", "scaled"])
def test_reading_in_batches_keeps_exactly_the_rows_one_pass_keeps(
    small_inputs, tmp_path, monkeypatch, bounds
):
    """The engine reads a few files at a time, keeps of each batch only the rows bounding may
    keep and thins what it holds now and then; with one file per batch and thinning at every
    batch it must keep exactly the rows (and so aggregates, kept values included) of a run
    that holds every row at once. Bounds that bind (Linf = 2, L0 = 3; or K = 5; or scaled
    Linf = 2, L0 = 3, where each batch keeps one partial per pair: rows, sum, squares)."""
    import dppipeline.engines.local.engine as local
    from dppipeline.engines.kernel.polars_read import read_validated
    from dppipeline.engines.kernel.polars_tasks import aggregate_task
    from dppipeline.engines.kernel.sampling import SamplingKeys

    metrics = ["count", "sum", "privacy_id_count", "percentile(50)"]
    fields: dict = {"bounds.max_contributions": 5}
    if bounds != "max_contributions":
        fields = {
            "bounds.max_partitions_contributed": 3,
            "bounds.max_contributions_per_partition": 2,
        }
    if bounds == "scaled":
        fields["bounds.linf_bounding"] = "scale"
        metrics = ["count", "sum", "privacy_id_count", "variance"]
    spec = build_spec(
        {},
        {
            "input.path": str(small_inputs["parquet"]),
            "output": str(tmp_path / "out"),
            "metrics": metrics,
            "bounds.min_value": 0.0,
            "bounds.max_value": 150.0,
            **fields,
        },
    )
    task = task_for(spec.queries[0], spec.source_schema)
    days = discover_partitions(small_inputs["parquet"], "parquet")

    def aggregates() -> pd.DataFrame:
        result = compute_aggregates(
            [task], days, schema=read_schema(spec, [task]), fmt="parquet", unit="CUSTOMER_ID",
            max_rejected_fraction=0.0, quarantine=tmp_path / "q", salt=new_salt(3),
        )  # fmt: skip
        return sorted_values(result.aggregates[spec.name])

    # every row in memory, bounded in one pass (no pre_bound)
    rows = read_validated(days, "parquet", read_schema(spec, [task])).rows
    whole = aggregate_task(rows, task, "CUSTOMER_ID", SamplingKeys.from_salt(new_salt(3)))
    whole = sorted_values(whole)
    assert len(days) > 1 and 0 < whole["count"].sum() < len(rows)  # the bounds bind
    for batch_files, compact_rows in ((10**6, 10**9), (1, 0), (3, 500)):
        monkeypatch.setattr(local, "BATCH_FILES", batch_files)
        monkeypatch.setattr(local, "COMPACT_ROWS", compact_rows)
        # Partial sums add up in another order than one pass: the last bits may differ.
        pd.testing.assert_frame_equal(aggregates(), whole, check_dtype=False, rtol=1e-12)


def sorted_values(frame: pd.DataFrame) -> pd.DataFrame:
    """Aggregates by terminal, each partition's kept values (percentiles) in order."""
    frame = frame.sort_values("TERMINAL_ID", ignore_index=True)
    if "values" in frame.columns:
        frame["values"] = [sorted(v) for v in frame["values"]]
    return frame


def test_queries_share_pair_partials_only_where_their_rows_and_values_agree(small_inputs, tmp_path):
    """Scaled queries on the same rows and pairs read one query's pair partials: each query's
    exact aggregates in the job equal those of the query run on its own. `narrow` clips at
    another bound (binding: its sums differ), so it must compute its own pairs; `customers`
    reads no value and `wide_l0` bounds pairs with another L0, so both read `wide`'s."""
    from dppipeline.core.tasks import plan_tasks
    from dppipeline.engines.kernel.polars_tasks import TaskBounder
    from dppipeline.engines.kernel.sampling import SamplingKeys
    from dppipeline.lifecycle.runner import make_plan

    public = {"public_partitions": "0..1000"}
    wide = {"min_value": 0.0, "max_value": 150.0}
    queries = [
        {"name": "wide", "metrics": ["count", "sum", "variance"], "bounds": wide},
        {"name": "narrow", "metrics": ["count", "sum"], "bounds": {**wide, "max_value": 20.0}},
        {"name": "customers", "metrics": ["privacy_id_count"]},
        {
            "name": "wide_l0",
            "metrics": ["count", "sum"],
            "bounds": {**wide, "max_partitions_contributed": 2},
        },
    ]
    for query in queries:
        query.update(partition_by=["TERMINAL_ID"], partition_selection=public)
    spec = build_spec(
        {
            "name": "shared",
            "privacy_unit": "CUSTOMER_ID",
            "value": "TX_AMOUNT",
            "input": {"path": str(small_inputs["parquet"])},
            "output": str(tmp_path / "out"),
            "budget": {"epsilon": 1.0, "delta": 1e-6},
            "bounds": {"max_partitions_contributed": 3, "max_contributions_per_partition": 2},
            "queries": queries,
        }
    )
    days = discover_partitions(small_inputs["parquet"], "parquet")
    tasks = plan_tasks(spec, make_plan(spec), days).tasks
    assert all(t.scaled for t in tasks)

    def aggregates(chosen) -> dict[str, pd.DataFrame]:
        result = compute_aggregates(
            chosen, days, schema=read_schema(spec, chosen), fmt="parquet", unit="CUSTOMER_ID",
            max_rejected_fraction=0.0, quarantine=tmp_path / "q", salt=new_salt(3),
        )  # fmt: skip
        return {name: sorted_values(frame) for name, frame in result.aggregates.items()}

    together = aggregates(tasks)
    assert together["narrow"]["sum"].sum() < together["wide"]["sum"].sum()  # the clip binds
    for task in tasks:
        alone = aggregates([task])[task.name]
        pd.testing.assert_frame_equal(together[task.name], alone, check_dtype=False, rtol=1e-12)
    # and the job did share (the pairs above came from `wide`'s query)
    bounder = TaskBounder(tasks, "CUSTOMER_ID", SamplingKeys.from_salt(new_salt(3)), compact_rows=0)
    assert bounder.source == {"customers": "wide", "wide_l0": "wide"}
