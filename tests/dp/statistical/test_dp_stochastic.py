"""A statistical test of the DP guarantee itself, in the spirit of Google's stochastic tester.

Two neighbouring inputs differ in one privacy unit, a customer who contributes far more than
the bounds allow (5 rows worth 150, clipped to 100, at each of 3 public terminals; L0 = 2,
Linf = 3). Each input is bounded once by the real engine code (every engine gives the same
exact aggregates; checked here), then released many times through `core.mechanisms` with PyDP's
noise, as in production. For events E of the outputs (the noisy counts, sums, or both, of
every partition where the two inputs differ, beyond a threshold, in either direction),
Clopper-Pearson intervals on P[M(D) in E] and P[M(D') in E] give a lower bound on the privacy
loss, ln(P_low / P'_high). It must stay below the epsilon the plan states (count, sum, and the
query's total for joint events); with every interval at level 1 - 1e-6 / (number of
intervals), a false failure has probability below 1e-6.

The test has power: at the threshold equal to the unit's shift the true loss is exactly the
stated epsilon, so an upper confidence bound must reach it (the noise is not larger than
stated), and two broken releases are caught: half the noise, and no contribution bounding.
"""

from __future__ import annotations

import dataclasses
import math
from itertools import product

import numpy as np
import pandas as pd
import polars as pl
import pytest
from scipy.stats import beta

from dppipeline.core.mechanisms import release_public
from dppipeline.core.tasks import plan_tasks
from dppipeline.engines.kernel.polars_tasks import aggregate_task
from dppipeline.engines.kernel.sampling import SamplingKeys, new_salt
from dppipeline.lifecycle.runner import make_plan
from dppipeline.spec.model import build_spec

DRAWS = 40_000
FAILURE_RATE = 1e-6
THRESHOLDS = (1.0, 1.5)  # in units of the unit's shift of each partition
TARGET = 99  # the customer in D and not in D'
SALT = new_salt(2026)
KEY = "TERMINAL_ID"


def job(epsilon: float = 1.0, l0: int = 2, linf: int = 3):
    spec = build_spec(
        {},
        {
            "input.path": "unused",
            "output": "unused",
            "metrics": ["count", "sum"],
            "budget.epsilon": epsilon,
            "bounds.max_partitions_contributed": l0,
            "bounds.max_contributions_per_partition": linf,
            "bounds.min_value": 0.0,
            "bounds.max_value": 100.0,
            "partition_selection.public_partitions": "1..3",
        },
    )
    plan = make_plan(spec)
    return spec, plan, plan_tasks(spec, plan, []).tasks[0]


def neighbours() -> tuple[pd.DataFrame, pd.DataFrame]:
    """(D, D'): 8 customers within the bounds (1-3 rows at 1-2 terminals), and in D only the
    target with 5 rows worth 150 at each of terminals 1..3, interleaved in the same file."""
    rng = np.random.default_rng(5)
    rows = []
    for customer in range(1, 9):
        for terminal in rng.choice([1, 2, 3], size=rng.integers(1, 3), replace=False):
            rows += [(customer, int(terminal), float(rng.uniform(0, 100)))] * int(
                rng.integers(1, 4)
            )
    rows += [(TARGET, terminal, 150.0) for terminal in (1, 2, 3) for _ in range(5)]
    order = rng.permutation(len(rows))
    frame = pd.DataFrame([rows[i] for i in order], columns=["CUSTOMER_ID", KEY, "TX_AMOUNT"])
    with_target = frame.assign(_source_file="day.parquet", _row=np.arange(1, len(frame) + 1))
    without = frame[frame["CUSTOMER_ID"] != TARGET]
    without = without.assign(_source_file="day.parquet", _row=np.arange(1, len(without) + 1))
    return with_target, without


def bound_local(rows: pd.DataFrame, task) -> pd.DataFrame:
    frame = pl.from_pandas(rows).with_columns(pl.col("_source_file").cast(pl.Enum(["day.parquet"])))
    exact = aggregate_task(frame, task, "CUSTOMER_ID", SamplingKeys.from_salt(SALT))
    return exact.sort_values(KEY, ignore_index=True)


def bound_spark(rows: pd.DataFrame, task, spark) -> pd.DataFrame:
    from dppipeline.engines.spark.aggregate import bound_and_aggregate, to_aggregates_frame

    frame = spark.createDataFrame(rows).repartition(3)
    exact = bound_and_aggregate(frame, task, "CUSTOMER_ID", SALT).toPandas()
    return to_aggregates_frame(exact, task).sort_values(KEY, ignore_index=True)


def bound_beam(rows: pd.DataFrame, task, folder) -> pd.DataFrame:
    """BoundContributions + AggregatePerPartition in a pipeline of four bundles; the result
    comes back through a file (the matcher runs on a pickled copy)."""
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that

    from dppipeline.engines.beam.bound import BoundContributions
    from dppipeline.engines.beam.shard_release import AggregatePerPartition

    target = folder / f"beam-{len(rows)}.parquet"

    def keep(parts):
        pd.concat([p for _, p in parts]).to_parquet(target)

    frame = pl.from_pandas(rows.drop(columns=["_source_file"]))
    elements = [("day.parquet", frame.slice(i, 10)) for i in range(0, frame.height, 10)]
    with TestPipeline() as pipeline:
        aggregates = (
            pipeline
            | beam.Create(elements, reshuffle=False)
            | BoundContributions(task, "CUSTOMER_ID", 2, 2, SALT)
            | AggregatePerPartition(task)
        )
        assert_that(aggregates, keep)
    return pd.read_parquet(target).sort_values(KEY, ignore_index=True)


@pytest.fixture(scope="module")
def bounded():
    """The local engine's exact aggregates of (D, D')."""
    _, _, task = job()
    d, d_prime = neighbours()
    return bound_local(d, task), bound_local(d_prime, task)


@pytest.mark.parametrize("engine", ["local", "spark", "beam"])
def test_every_engine_bounds_the_target_to_its_sensitivity(engine, bounded, request, tmp_path):
    """The aggregates differ in exactly L0 = 2 partitions, by Linf = 3 rows and 3 x 100 each
    (the target's clipped, bounded contribution), and every engine gives the same numbers."""
    _, _, task = job()
    d, d_prime = neighbours()
    if engine == "spark":
        spark = request.getfixturevalue("spark")
        got = bound_spark(d, task, spark), bound_spark(d_prime, task, spark)
    elif engine == "beam":
        got = bound_beam(d, task, tmp_path), bound_beam(d_prime, task, tmp_path)
    else:
        got = bounded
    columns = ["privacy_id_count", "count", "sum"]
    for mine, reference in zip(got, bounded, strict=True):
        assert mine[KEY].tolist() == reference[KEY].tolist()
        np.testing.assert_allclose(
            mine[columns].to_numpy(float), reference[columns].to_numpy(float)
        )
    with_target, without = (f.set_index(KEY).reindex([1, 2, 3], fill_value=0) for f in got)
    shift = with_target[columns] - without[columns]
    affected = shift[(shift != 0).any(axis=1)]
    assert len(affected) == 2
    assert affected["count"].tolist() == [3, 3] and affected["privacy_id_count"].tolist() == [1, 1]
    np.testing.assert_allclose(affected["sum"], [300.0, 300.0])


# ---------------------------------------------------------------------------------------------
# The stochastic part


def releases(exact: pd.DataFrame, plan, draws: int) -> pd.DataFrame:
    """`draws` independent releases of the 3 public partitions through core.mechanisms: the
    exact aggregates repeated under a draw index (each row gets its own PyDP noise)."""
    keys = pd.DataFrame(list(product(range(draws), [1, 2, 3])), columns=["draw", KEY])
    repeated = keys.merge(exact.astype({KEY: "int64"}), on=KEY, how="left")
    out = release_public(repeated, ["draw", KEY], plan, keys)
    return out.pivot(index="draw", columns=KEY, values=["count", "sum"])


def event_hits(out: pd.DataFrame, base: pd.Series, shift: pd.Series, metrics, t, upward):
    """Per draw: every affected partition's noisy value beyond base + t * shift (upward), or
    at most base + (1 - t) * shift (downward), for every metric in `metrics`."""
    hit = np.ones(len(out), dtype=bool)
    for metric in metrics:
        for partition in shift[metric].index[shift[metric] != 0]:
            value = out[(metric, partition)].to_numpy()
            low = base[metric][partition]
            step = shift[metric][partition]
            hit &= value >= low + t * step if upward else value <= low + (1 - t) * step
    return int(hit.sum())


def epsilon_bounds(k_num: int, k_den: int, n: int, alpha: float) -> tuple[float, float]:
    """(lower, upper) confidence bounds on ln(p_num / p_den) from k successes in n draws
    each, every Clopper-Pearson interval at level 1 - alpha."""
    num_low = beta.ppf(alpha / 2, k_num, n - k_num + 1) if k_num > 0 else 0.0
    num_high = beta.ppf(1 - alpha / 2, k_num + 1, n - k_num) if k_num < n else 1.0
    den_low = beta.ppf(alpha / 2, k_den, n - k_den + 1) if k_den > 0 else 0.0
    den_high = beta.ppf(1 - alpha / 2, k_den + 1, n - k_den) if k_den < n else 1.0
    lower = math.log(num_low / den_high) if num_low > 0 else -math.inf
    upper = math.log(num_high / den_low) if den_low > 0 else math.inf
    return lower, upper


def empirical_epsilon(plan, with_target, without, draws=DRAWS):
    """{event family: (largest lower bound, largest upper bound) on the privacy loss}."""
    a = with_target.set_index(KEY)[["count", "sum"]].reindex([1, 2, 3], fill_value=0)
    b = without.set_index(KEY)[["count", "sum"]].reindex([1, 2, 3], fill_value=0)
    out_a, out_b = releases(with_target, plan, draws), releases(without, plan, draws)
    shift = a - b
    families = {"count": ["count"], "sum": ["sum"], "count+sum": ["count", "sum"]}
    n_intervals = 2 * len(families) * len(THRESHOLDS) * 2 * 2
    alpha = FAILURE_RATE / n_intervals
    result = {}
    for name, metrics in families.items():
        lowers, uppers = [], []
        for t, upward in product(THRESHOLDS, (True, False)):
            k_a = event_hits(out_a, b, shift, metrics, t, upward)
            k_b = event_hits(out_b, b, shift, metrics, t, upward)
            num, den = (k_a, k_b) if upward else (k_b, k_a)  # the likelier way round
            low, high = epsilon_bounds(num, den, draws, alpha)
            lowers.append(low)
            uppers.append(high)
        result[name] = (max(lowers), max(uppers))
    return result


def stated(plan) -> dict[str, float]:
    count, total = plan.mechanism("count").epsilon, plan.mechanism("sum").epsilon
    return {"count": count, "sum": total, "count+sum": count + total}


@pytest.mark.slow
def test_released_count_and_sum_are_as_private_as_stated(bounded):
    """Lower bounds below the stated epsilons; upper bounds reach them (the loss is attained:
    the noise is not larger than stated and bounding kept the whole shift)."""
    _, job_plan, _ = job()
    plan = job_plan.queries[0].plan
    measured = empirical_epsilon(plan, *bounded)
    for family, epsilon in stated(plan).items():
        lower, upper = measured[family]
        assert lower <= epsilon, (family, lower, epsilon)
        assert upper >= epsilon, (family, upper, epsilon)


@pytest.mark.slow
def test_half_the_noise_is_caught(bounded):
    """The same release with each mechanism's epsilon doubled (half the noise) while the plan
    still states the original: the lower bound exceeds the stated epsilon."""
    _, job_plan, _ = job()
    plan = job_plan.queries[0].plan
    broken = dataclasses.replace(
        plan,
        mechanisms=tuple(
            dataclasses.replace(
                m,
                epsilon=2 * m.epsilon,
                noise_stddev=None,
                # discrete counts are drawn from their scale: halve it too
                noise_scale=None if m.noise_scale is None else m.noise_scale / 2,
            )
            for m in plan.mechanisms
        ),
    )
    measured = empirical_epsilon(broken, *bounded)
    assert all(measured[f][0] > eps for f, eps in stated(plan).items()), measured


@pytest.mark.slow
def test_missing_contribution_bounding_is_caught():
    """Aggregates bounded with L0 = 3, Linf = 100 (the target keeps all 15 rows) released with
    the noise planned for L0 = 2, Linf = 3: the lower bound exceeds the stated epsilon."""
    _, job_plan, _ = job()
    plan = job_plan.queries[0].plan
    _, _, loose = job(l0=3, linf=100)
    d, d_prime = neighbours()
    measured = empirical_epsilon(plan, bound_local(d, loose), bound_local(d_prime, loose))
    assert any(measured[f][0] > eps for f, eps in stated(plan).items()), measured
