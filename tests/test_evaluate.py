"""`dppipeline evaluate`: refuses sensitive use, and measures error against epsilon correctly."""

from __future__ import annotations

import datetime as dt
import math

import pandas as pd
import pytest
from scipy import stats

from dppipeline.cli import main
from dppipeline.runner import make_plan
from dppipeline.spec import build_spec
from dppipeline.synth import generate

Z = float(stats.norm.isf(0.5e-6))  # failure rate 1e-6, two-sided
EPSILONS = (0.1, 1.0, 10.0)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    base = tmp_path_factory.mktemp("evaluate")
    data = generate(
        base / "in", fmt="parquet", customers=300, terminals=30, days=5, tx_per_day=600,
        seed=3, start_date=dt.date(2026, 1, 1),
    ).output  # fmt: skip
    keys = base / "keys.csv"
    keys.write_text("TERMINAL_ID\n" + "\n".join(map(str, range(30))) + "\n")
    return data, keys


def flags(data, keys, out, *extra):
    return [
        "evaluate", "--input", str(data), "--output", str(out), "--metrics", "count,sum",
        "--max-partitions-contributed", "30", "--max-contributions-per-partition", "100",
        "--min-value", "0", "--max-value", "100000", "--public-partitions", str(keys),
        "--epsilons", ",".join(map(str, EPSILONS)), "--repeats", "2", *extra,
    ]  # fmt: skip


def test_refuses_without_the_not_sensitive_flag(synthetic, tmp_path, capsys):
    data, keys = synthetic
    assert main(flags(data, keys, tmp_path / "out")) == 2
    assert "--data-is-not-sensitive" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_error_is_the_noise_when_bounds_drop_nothing(synthetic, tmp_path):
    """Loose bounds keep every row, so the count's error is Laplace noise alone: its median
    |error| over 60 values (30 partitions x 2 runs) is within the sample median's tolerance
    of b ln 2 (|Lap(b)| is exponential: the sample median's sd is about b / sqrt(n)),
    failure rate 1e-6 per epsilon; and it falls as epsilon grows."""
    data, keys = synthetic
    out = tmp_path / "out"
    assert main(flags(data, keys, out, "--data-is-not-sensitive")) == 0
    table = pd.read_csv(out / "evaluation.csv")
    bias = table[table["stat"] == "bias|count:median_abs_error"]["value"]
    assert bias.iloc[0] == 0  # nothing dropped, nothing clipped
    medians = []
    for epsilon in EPSILONS:
        spec = build_spec(
            {},
            {
                "input.path": str(data), "output": "x", "metrics": ["count", "sum"],
                "bounds.max_partitions_contributed": 30,
                "bounds.max_contributions_per_partition": 100,
                "bounds.min_value": 0.0, "bounds.max_value": 100000.0,
                "partition_selection.public_partitions": str(keys), "budget.epsilon": epsilon,
            },
        )  # fmt: skip
        b = make_plan(spec).queries[0].plan.metric_noise_stddev("count") / math.sqrt(2)
        rows = table[(table["epsilon"] == epsilon) & (table["stat"] == "count:mean_abs_error")]
        assert len(rows) == 2
        # pooled median |error| of the runs: recompute from the released files
        errors = []
        for run in (1, 2):
            released = pd.read_parquet(
                out / "runs" / f"epsilon_{epsilon:g}_run_{run}" / "release" / "terminal_stats"
            )
            truth = (
                pd.read_parquet(data).groupby("TERMINAL_ID").size().reindex(range(30), fill_value=0)
            )
            errors += list((released.set_index("TERMINAL_ID")["count"] - truth).abs())
        median = float(pd.Series(errors).median())
        n = len(errors)
        assert abs(median - b * math.log(2)) <= Z * b / math.sqrt(n), (epsilon, median, b)
        medians.append(median)
    assert medians[0] > medians[1] > medians[2]
    for name in ("evaluation.json", "index.html", "terminal_stats_error.png"):
        assert (out / name).is_file()
    png = (out / "terminal_stats_error.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_private_selection_share_released_grows_with_epsilon(synthetic, tmp_path):
    data, _ = synthetic
    out = tmp_path / "out"
    argv = [
        "evaluate", "--input", str(data), "--output", str(out), "--metrics", "count",
        "--max-partitions-contributed", "3", "--max-contributions-per-partition", "5",
        "--epsilons", "0.05,1,20", "--repeats", "2", "--data-is-not-sensitive",
    ]  # fmt: skip
    assert main(argv) == 0
    table = pd.read_csv(out / "evaluation.csv")
    share = (
        table[table["stat"] == "true_partitions_released_share"].groupby("epsilon")["value"].mean()
    )
    assert share.between(0, 1).all()
    # At epsilon 0.05 a terminal needs hundreds of customers after bounding (none has);
    # at 20, a handful: the share must grow.
    assert share.loc[0.05] < share.loc[20.0]
    released = table[table["stat"] == "partitions_released"]["value"]
    assert (released <= 30).all()  # no key outside the data's 30 terminals
