"""The default Linf bounding: each query scales its pairs unless a metric needs the kept rows or
`max_contributions` bounds a unit's total rows (docs/explanation/bounding.md).

Exact tier, a whole run on every engine at epsilon 1e12 (noise below 1e-6): one customer has
six rows worth 1, 2, 4, ..., 32 at terminal 1 and Linf is 2. Scaled, the pair adds
63 x 2 / 6 = 21 to the sum, which no two of its rows add (their sums are at least 1 away): a
query that samples releases one of those pair sums, a query that scales releases 21.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from support.data import quiet, write_daily_parquet
from support.engines import engine_named

from dppipeline.lifecycle.runner import run_job
from dppipeline.spec.model import build_spec

LINF = 2
HEAVY = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]  # customer 1's rows at terminal 1
LIGHT = [(2, 1, 10.0), (2, 2, 30.0), (3, 1, 50.0), (3, 3, 70.0), (4, 2, 90.0)]
TOLERANCE = 1e-3  # far above the noise at epsilon 1e12, far below 1 (the gap to any sample)
QUERIES = [
    {"name": "totals", "metrics": ["count", "sum", "mean"]},
    {"name": "with_max", "metrics": ["count", "sum", "max"]},
    {"name": "unit_rows", "metrics": ["count", "sum"], "bounds": {"max_contributions": LINF}},
]
CHOSEN = {"totals": "scale", "with_max": "sample", "unit_rows": "sample"}


def transactions() -> pd.DataFrame:
    rows = [(1, 1, v) for v in HEAVY] + LIGHT
    frame = pd.DataFrame(rows, columns=["CUSTOMER_ID", "TERMINAL_ID", "TX_AMOUNT"])
    frame.insert(0, "TRANSACTION_ID", np.arange(len(frame), dtype=np.int64))
    hours = pd.to_timedelta(np.arange(len(frame)), "h")
    frame.insert(1, "TX_DATETIME", (pd.Timestamp("2026-03-02") + hours).astype("datetime64[us]"))
    return frame


def light_sum(terminal: int) -> float:
    return sum(v for _, t, v in LIGHT if t == terminal)


def test_the_scaled_value_is_no_samples_sum():
    """The test's premise: 21 is at least 1 from every sum of Linf of the heavy rows."""
    scaled = sum(HEAVY) * min(1.0, LINF / len(HEAVY))
    samples = [sum(pair) for pair in itertools.combinations(HEAVY, LINF)]
    assert scaled == 21.0 and min(abs(s - scaled) for s in samples) >= 1.0


@pytest.mark.parametrize("engine", ["local", "spark", "beam"])
def test_every_engine_scales_by_default_and_samples_where_rows_are_needed(
    engine, request, tmp_path
):
    """No linf_bounding anywhere in the spec. `totals` (count, sum, mean) scales: terminal 1's
    sum is exactly the others' rows plus 21. `with_max` (max needs kept rows) and `unit_rows`
    (max_contributions) sample: terminal 1's sum is the others' plus a sum of two heavy rows,
    never the scaled value. The manifest names each query's choice."""
    root = write_daily_parquet(transactions(), tmp_path / "in")
    raw = {
        "name": "linf_default",
        "bounds": {
            "max_partitions_contributed": 3,
            "max_contributions_per_partition": LINF,
            "min_value": 0.0,
            "max_value": 100.0,
        },
        "partition_selection": {"public_partitions": "1..3"},
        "queries": [{**q, "partition_selection": {"public_partitions": "1..3"}} for q in QUERIES],
    }
    overrides = {"input.path": str(root), "output": str(tmp_path / "out"), "budget.epsilon": 1e12}
    spec = build_spec(raw, overrides)
    assert {q.name: q.bounds.linf_bounding for q in spec.queries} == CHOSEN
    result = run_job(spec, engine_named(engine, request), seed=3, echo=quiet)
    manifest = result.manifest.model_dump(mode="json", exclude_unset=True)
    chosen = {name: q["bounds"]["linf_bounding"] for name, q in manifest["queries"].items()}
    assert chosen == CHOSEN

    scaled = light_sum(1) + sum(HEAVY) * LINF / len(HEAVY)
    sampled = [light_sum(1) + sum(p) for p in itertools.combinations(HEAVY, LINF)]
    for name, choice in CHOSEN.items():
        released = pd.read_parquet(result.output / name).set_index("TERMINAL_ID")
        # other terminals: every pair has one row, scaled or sampled alike
        for terminal in (2, 3):
            assert abs(released.loc[terminal, "sum"] - light_sum(terminal)) <= TOLERANCE, name
        assert abs(released.loc[1, "count"] - (LINF + 2)) <= TOLERANCE, name
        total = float(released.loc[1, "sum"])
        if choice == "scale":
            assert abs(total - scaled) <= TOLERANCE, (name, total)
        else:
            assert min(abs(total - s) for s in sampled) <= TOLERANCE, (name, total)
            assert abs(total - scaled) >= 1.0 - TOLERANCE, (name, total)


@pytest.mark.parametrize(
    ("metrics", "says"), [("count,sum", "(scaled pairs)"), ("count,max", "(sampled rows)")]
)
def test_plan_says_which_bounding_a_query_uses(metrics, says, capsys):
    from dppipeline.cli.main import main

    code = main(
        ["plan", "--metrics", metrics, "--min-value", "0", "--max-value", "10",
         "--max-partitions-contributed", "1", "--max-contributions-per-partition", "2",
         "--public-partitions", "1..5"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert f"Linf (max_contributions_per_partition)=2 {says}" in out
