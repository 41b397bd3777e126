"""`stddev` (issue 20): the square root of the released variance, post-processing of the same
mechanisms, so no extra budget. Exact at a huge epsilon on every engine against pandas; with
noise present it is exactly sqrt(variance) of the same release and within [0, r]."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support.data import release_small
from support.engines import engine_named

from dppipeline.lifecycle.runner import make_plan
from dppipeline.spec.model import build_spec


@pytest.mark.parametrize("engine", ["local", "spark", "beam"])
def test_stddev_is_exact_at_a_huge_epsilon(small_inputs, tmp_path, engine, request):
    released, manifest = release_small(
        small_inputs, tmp_path, engine_named(engine, request),
        metrics=["count", "stddev"], **{"budget.epsilon": 1e12},
    )  # fmt: skip
    # At epsilon 1e9 a one-row terminal's variance noise had std up to about 0.25 (centred
    # squares 0.06, plus 2 r x the centred sum's 0.0016): atol 0.5 failed once in a full run.
    rows = pd.read_parquet(small_inputs["parquet"])
    truth = rows.assign(v=rows["TX_AMOUNT"].clip(0, 150)).groupby("TERMINAL_ID")["v"].std(ddof=0)
    with_data = released[released["count"] > 0].set_index("TERMINAL_ID")
    # The square root magnifies the variance's tiny noise near 0 (a one-row terminal): compare
    # variances absolutely, and the stddev itself where the variance is not near 0.
    expected = truth.loc[with_data.index]
    np.testing.assert_allclose(with_data["stddev"] ** 2, expected**2, atol=0.5)
    wide = expected > 5
    assert wide.sum() > 30
    np.testing.assert_allclose(with_data["stddev"][wide], expected[wide], rtol=1e-3)
    assert list(released.columns) == ["TERMINAL_ID", "count", "stddev"]
    entry = manifest["queries"]["terminal_stats"]["metrics"]["stddev"]
    assert entry["noise_stddev"] is None  # not additive noise


def test_stddev_costs_nothing_beyond_the_variance_and_is_its_square_root(small_inputs, tmp_path):
    def spec(metrics):
        return build_spec({}, {"metrics": metrics, "bounds.min_value": 0.0,
                               "bounds.max_value": 150.0, "budget.epsilon": 1.0,
                               "bounds.max_partitions_contributed": 1,
                               "bounds.max_contributions_per_partition": 1})  # fmt: skip

    with_stddev = make_plan(spec(["count", "variance", "stddev"])).queries[0].plan
    alone = make_plan(spec(["count", "variance"])).queries[0].plan
    assert with_stddev.mechanisms == alone.mechanisms  # the same split: no extra budget
    only = make_plan(spec(["stddev"])).queries[0].plan
    assert {m.name for m in only.mechanisms} >= {"count", "centred_sum", "centred_sum_of_squares"}

    released, _ = release_small(
        small_inputs, tmp_path, "local", metrics=["variance", "stddev"], **{"budget.epsilon": 1.0}
    )
    np.testing.assert_array_equal(released["stddev"], np.sqrt(released["variance"]))
    assert released["stddev"].between(0, 75).all()  # r = (150 - 0) / 2
    rows = pd.read_parquet(small_inputs["parquet"])
    truth = rows.assign(v=rows["TX_AMOUNT"].clip(0, 150)).groupby("TERMINAL_ID")["v"].std(ddof=0)
    exact = truth.reindex(released["TERMINAL_ID"]).fillna(0).to_numpy()
    assert np.abs(released["stddev"].to_numpy() - exact).max() > 1  # noise present
