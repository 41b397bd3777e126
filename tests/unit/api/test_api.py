"""The Python API (issue 22): DataFrames and PCollections in, the CLI's release out.

Each engine's entry (a pandas frame on the local engine, a Spark DataFrame in the caller's
session, a PCollection in the caller's TestPipeline) releases what `run_job` releases on
the same rows written to Parquet, at a huge epsilon (tier 1: noise far below the tolerance,
bounds loose enough to keep every row), and charges the ledger the same. The book's Tumult
session runs through `Session`; bad input fails with the CLI's InputError.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support import REPO as ROOT
from support import SUPPORT

import dppipeline
from dppipeline.ledger import Ledger
from dppipeline.lifecycle.runner import run_job
from dppipeline.spec.model import build_spec

SCOPE = "parquet/CUSTOMER_ID"  # what `run_job` calls the scope of `small_inputs["parquet"]`
JOB = {
    "metrics": ["count", "sum", "privacy_id_count"],
    "noise": "laplace",
    "budget": {"epsilon": 1e12, "delta": 1e-6},
    "bounds": {
        "max_partitions_contributed": 50,  # no customer reaches either bound: every row kept
        "max_contributions_per_partition": 100,
        "min_value": 0.0,
        "max_value": 150.0,
    },
    "partition_selection": {"public_partitions": "0..59"},  # 50 terminals with data, 10 empty
}
# Both releases carry Laplace noise; the largest std is the sum's, sqrt(2) L0 Linf max_value /
# (epsilon / 3) = 3.2e-6. 20 std: P(|X| > 20 std) = exp(-20 sqrt(2)) < 1e-12 per value.
ATOL = 20 * 2 * math.sqrt(2) * 50 * 100 * 150.0 / (1e12 / 3)  # two releases: twice the std


def rows_of(folder: Path) -> pd.DataFrame:
    """The generated transactions as a caller holds them (no folder column)."""
    return pd.read_parquet(folder).drop(columns=["date"])


def ledger_row(path: Path) -> dict:
    """The one release a ledger holds, as the comparison sees it."""
    with Ledger(path) as book:
        (row,) = book.rows()
    return {
        "scope": row.scope,
        "spec_hash": row.spec_hash,
        "epsilon": row.epsilon,
        "delta": row.delta,
        "state": row.state,
    }


def sorted_release(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values("TERMINAL_ID", ignore_index=True)


def assert_same_release(got: pd.DataFrame, cli: pd.DataFrame) -> None:
    got = sorted_release(got)
    assert list(got.columns) == list(cli.columns)
    assert got["TERMINAL_ID"].tolist() == cli["TERMINAL_ID"].tolist() == list(range(60))
    for column in ("count", "sum", "privacy_id_count"):
        np.testing.assert_allclose(got[column], cli[column], atol=ATOL, err_msg=column)


@pytest.fixture(scope="module")
def cli_release(small_inputs, tmp_path_factory):
    """`run_job` on the generated Parquet folder: (released rows, its ledger row)."""
    out = tmp_path_factory.mktemp("cli")
    spec = build_spec(JOB, {"input.path": str(small_inputs["parquet"]), "output": str(out / "r")})
    result = run_job(spec, "local", echo=lambda _: None, ledger=out / "ledger.sqlite", seed=1)
    released = sorted_release(pd.read_parquet(Path(result.output) / "terminal_stats"))
    return released, ledger_row(out / "ledger.sqlite")


@pytest.mark.slow
def test_import_is_cheap_and_names_resolve_on_use():
    """`import dppipeline` loads no data or DP library; the public names import on use."""
    heavy = ["polars", "pandas", "pyarrow", "pyspark", "apache_beam", "pipeline_dp", "pydantic"]
    code = (
        "import sys, dppipeline\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
        "print(sorted(m for m in sys.modules if m.startswith('dppipeline.')))\n"
        "print(dppipeline.release.__module__, dppipeline.BudgetExceeded.__name__)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout.splitlines()
    assert out[0] == "[]"
    assert out[1] == "['dppipeline.version']"
    assert out[2] == "dppipeline.api.frame_release BudgetExceededError"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = dppipeline.nope


@pytest.mark.slow
def test_a_notebook_sees_no_beam_warning_and_keeps_its_logging():
    """A fresh interpreter with no logging configured: using the API prints nothing on
    stderr (Beam's GCP warning, imported through pipeline-dp, is dropped) and leaves the
    root logger without handlers."""
    code = (
        "import logging, dppipeline\n"
        "dppipeline.plan(dppipeline.load_job({'metrics': ['count'], "
        "'bounds': {'max_partitions_contributed': 1, 'max_contributions_per_partition': 1}, "
        "'partition_selection': {'public_partitions': '1..3'}}))\n"
        "print(len(logging.getLogger().handlers), len(logging.getLogger().filters))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "0"]
    assert done.stderr == ""


def test_plan_is_typed_and_reads_no_data():
    plan = dppipeline.plan(dppipeline.load_job(JOB, budget__epsilon=3.0, count_noise="continuous"))
    assert plan.queries == ("terminal_stats",)
    assert plan.epsilon == pytest.approx(3.0) and plan.delta == 0.0  # public keys: no delta
    count = next(m for m in plan.query("terminal_stats") if m.mechanism == "count")
    assert count.kind == "laplace" and count.epsilon == pytest.approx(1.0)
    assert plan.noise_std("terminal_stats", "count") == pytest.approx(
        math.sqrt(2) * 50 * 100 / 1.0  # Laplace b = L0 * Linf / epsilon share
    )


def test_load_job_takes_yaml_text_a_file_a_dict_and_overrides(tmp_path):
    text = (
        "name: t\nmetrics: [count]\nbudget: {epsilon: 2.0, delta: 1.0e-6}\n"
        "bounds: {max_partitions_contributed: 1, max_contributions_per_partition: 1}\n"
    )
    (tmp_path / "t.yaml").write_text(text)
    for source in (text, tmp_path / "t.yaml", str(tmp_path / "t.yaml")):
        assert dppipeline.load_job(source).budget.epsilon == 2.0
    one = {"max_partitions_contributed": 1, "max_contributions_per_partition": 1}
    job = dppipeline.load_job(
        {"name": "t", "metrics": ["count"], "bounds": one}, budget__epsilon=0.5
    )
    assert job.budget.epsilon == 0.5 and dppipeline.load_job(job) is job
    with pytest.raises(dppipeline.SpecError, match=r"budget.epsilon: must be > 0"):
        dppipeline.load_job({"budget": {"epsilon": -1}, "bounds": one})
    # overrides of a shorthand Job reach its query; its hash is the written-out spec's
    yaml = ROOT / "jobs" / "configs" / "terminal_stats.yaml"
    overridden = dppipeline.load_job(dppipeline.load_job(yaml), bounds__max_value=100.0)
    assert overridden.queries[0].bounds.max_value == 100.0
    assert overridden.spec_hash() == dppipeline.load_job(yaml, bounds__max_value=100.0).spec_hash()


def test_a_pandas_frame_releases_what_the_cli_releases(small_inputs, cli_release, tmp_path):
    cli, cli_ledger = cli_release
    frame = rows_of(small_inputs["parquet"])
    ledger = tmp_path / "ledger.sqlite"
    release = dppipeline.release(JOB, frame, ledger=ledger, scope=SCOPE, seed=1, echo=print)
    got = release.datasets["terminal_stats"]
    assert isinstance(got, pd.DataFrame)
    assert_same_release(got, cli)
    assert ledger_row(ledger) == cli_ledger  # same scope, spec hash, spend; committed
    assert release.manifest.queries["terminal_stats"].released_partitions == 60
    assert "terminal_stats: 60 rows released" in repr(release)
    assert "count_ci_low" not in repr(release) and "<table" in release._repr_html_()


def test_a_polars_frame_comes_back_as_polars(small_inputs, cli_release):
    import polars as pl

    frame = pl.from_pandas(rows_of(small_inputs["parquet"]))
    release = dppipeline.release(JOB, frame, ledger=False, seed=1, echo=lambda _: None)
    got = release.datasets["terminal_stats"]
    assert isinstance(got, pl.DataFrame)
    assert_same_release(got.to_pandas(), cli_release[0])


def test_a_spark_frame_releases_in_the_callers_session(spark, small_inputs, cli_release, tmp_path):
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    context = spark.sparkContext
    frame = spark.read.parquet(str(small_inputs["parquet"])).drop("date")
    ledger = tmp_path / "ledger.sqlite"
    release = dppipeline.release(JOB, frame, ledger=ledger, scope=SCOPE, seed=1, echo=print)
    got = release.datasets["terminal_stats"]
    assert got.sparkSession is spark  # a Spark DataFrame in the caller's session
    assert SparkSession.getActiveSession() is spark
    assert SparkContext._active_spark_context is context  # no second context was started
    assert_same_release(got.toPandas(), cli_release[0])
    assert ledger_row(ledger) == cli_release[1]

    with pytest.raises(dppipeline.InputError, match="DataFrame: missing column TX_AMOUNT"):
        dppipeline.release(JOB, frame.drop("TX_AMOUNT"), ledger=False, echo=lambda _: None)
    # the Spark engine's rules (engines/spark/rules.py) reject a non-finite amount
    from pyspark.sql import functions as F

    bad = frame.withColumn(
        "TX_AMOUNT",
        F.when(F.col("TRANSACTION_ID") == 5, F.lit(float("inf"))).otherwise(F.col("TX_AMOUNT")),
    )
    job = {**JOB, "input": {"max_rejected_fraction": 0.01}}
    dppipeline.release(job, bad, ledger=False, quarantine=tmp_path / "q", echo=lambda _: None)
    (kept,) = (tmp_path / "q").glob("*/rejected.parquet")
    rejected = pd.read_parquet(kept)
    assert rejected["TX_AMOUNT"].tolist() == ["Infinity"]
    assert rejected["_reason"].tolist() == ["TX_AMOUNT is not finite"]


@pytest.mark.slow
def test_a_pcollection_releases_in_the_callers_pipeline(small_inputs, cli_release, tmp_path):
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that

    from dppipeline.beam import ReleaseTransform

    cli, cli_ledger = cli_release
    frame = rows_of(small_inputs["parquet"])
    records = [
        {**row, "TX_DATETIME": row["TX_DATETIME"].to_pydatetime()}
        for row in frame.to_dict("records")
    ]
    ledger = tmp_path / "ledger.sqlite"

    def same_as_cli(rows: list[dict]) -> None:
        assert_same_release(pd.DataFrame(rows)[list(cli.columns)], cli)

    with TestPipeline() as pipeline:
        transform = ReleaseTransform(JOB, ledger=ledger, scope=SCOPE, seed=1, echo=print)
        released = pipeline | beam.Create(records) | "Release" >> transform
        # charged when applied, before the pipeline runs (see dppipeline.api.beam_transform)
        assert ledger_row(ledger) == cli_ledger
        assert transform.manifest is not None
        assert_that(released["terminal_stats"], same_as_cli)


@pytest.mark.slow
def test_a_pcollection_with_too_many_bad_rows_fails_its_pipeline(tmp_path):
    """Rows breaking the contract are kept in the quarantine; above max_rejected_fraction the
    released rows never leave the transform: the pipeline fails with the InputError."""
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline

    from dppipeline.beam import ReleaseTransform

    rows = [{"CUSTOMER_ID": c, "TERMINAL_ID": c % 3, "TX_AMOUNT": 10.0} for c in range(20)]
    rows[4] = {**rows[4], "TX_AMOUNT": math.nan}
    job = {**JOB, "partition_selection": {"public_partitions": "0..2"}}
    failed = pytest.raises(Exception, match=r"rejected 1 of 20 rows .* TX_AMOUNT is not finite")
    with failed, TestPipeline() as pipeline:
        released = (
            pipeline
            | beam.Create(rows)
            | ReleaseTransform(job, ledger=False, quarantine=tmp_path / "q", echo=lambda _: None)
        )
        _ = released["terminal_stats"] | beam.Map(print)
    (kept,) = (tmp_path / "q").glob("*/rejected-*.parquet")
    rejected = pd.read_parquet(kept)  # the row, named by its batch and place in it
    assert rejected["CUSTOMER_ID"].tolist() == ["4"]
    assert rejected["_reason"].tolist() == ["TX_AMOUNT is not finite"]


def book_frame(tmp_path: Path) -> pd.DataFrame:
    """The book's one-file CSV (`generate --table book_transactions --single-file`) as the
    notebook reads it."""
    from dppipeline.synthetic.transactions import generate

    summary = generate(
        tmp_path / "book", fmt="csv", customers=200, terminals=50, days=5, tx_per_day=300,
        seed=3, table="book_transactions", single_file=True,
    )  # fmt: skip
    return pd.read_csv(summary.files[0], parse_dates=["TX_DATETIME"])


def test_the_books_tumult_session(tmp_path):
    """Budget 3.5: the total count, the counts under 25 and 25-50 at epsilon 1 each; over 50
    at 1 is refused with 0.5 left (nothing spent); rerun at what is left, nothing remains."""
    rows = book_frame(tmp_path)
    ledger = tmp_path / "ledger.sqlite"
    linf = int(rows.groupby("CUSTOMER_ID").size().max())  # every row kept: the truth is a count
    session = dppipeline.Session(rows, ledger=ledger, scope="book/CUSTOMER_ID", cap=3.5)

    def count(where: str | None, name: str) -> dict:
        return dppipeline.query(
            metrics=["count"], filter=where, max_contributions_per_partition=linf, name=name
        )

    amount = rows["TX_AMOUNT"]
    asked = [
        (count(None, "total"), len(rows)),
        (count("TX_AMOUNT < 25", "under_25"), int((amount < 25).sum())),
        (count("TX_AMOUNT >= 25 and TX_AMOUNT < 50", "from_25_to_50"),
         int(amount.between(25, 50, "left").sum())),
    ]  # fmt: skip
    for job, truth in asked:
        release = session.release(job, epsilon=1)
        check_count(release, truth)
    assert session.remaining() == dppipeline.Budget(pytest.approx(0.5), 0.0)

    over_50 = count("TX_AMOUNT >= 50", "over_50")
    with pytest.raises(dppipeline.BudgetExceeded, match=r"epsilon 1 needed, 0.5 left of 3.5") as e:
        session.release(over_50, epsilon=1)
    assert e.value.remaining_epsilon == pytest.approx(0.5) and e.value.remaining_delta == 0.0
    with Ledger(ledger) as book:
        assert [r.state for r in book.rows()] == ["committed"] * 3  # the refusal spent nothing

    release = session.release(over_50, epsilon=session.remaining().epsilon)
    check_count(release, int((amount >= 50).sum()))
    assert release.manifest.epsilon == pytest.approx(0.5)
    assert session.remaining() == dppipeline.Budget(0.0, 0.0)
    with Ledger(ledger) as book:
        assert [r.epsilon for r in book.rows()] == pytest.approx([1, 1, 1, 0.5])


def check_count(release: dppipeline.Release[pd.DataFrame], truth: int) -> None:
    """|noisy - true| <= b ln(2 / 1e-9): fails with probability below 1e-9 under (discrete)
    Laplace noise of scale b (the manifest's std / sqrt(2))."""
    (query,) = release.manifest.queries
    std = release.manifest.queries[query].metrics["count"].noise_stddev
    assert std is not None and std > 0
    (got,) = release.datasets[query]["count"]
    assert abs(got - truth) <= std / math.sqrt(2) * math.log(2 / 1e-9)


def test_bad_rows_are_kept_aside_or_fail_the_release(small_inputs, tmp_path):
    """Rows breaking the contract are counted and kept in the quarantine, as a file run's;
    above max_rejected_fraction the release fails naming the row, column and rule, and
    returns nothing."""
    frame = rows_of(small_inputs["parquet"])
    frame.loc[[3, 7], "TX_AMOUNT"] = math.inf
    quarantine = tmp_path / "quarantine"
    lines: list[str] = []
    job = {**JOB, "input": {"max_rejected_fraction": 0.01}}
    release = dppipeline.release(job, frame, ledger=False, quarantine=quarantine, echo=lines.append)
    assert f"read {len(frame):,} rows; rejected 2" in "\n".join(lines)
    (kept,) = quarantine.glob("*/rejected.parquet")
    rejected = pd.read_parquet(kept)
    assert rejected["_row"].tolist() == [4, 8]  # 1-based positions in the frame
    assert set(rejected["_reason"]) == {"TX_AMOUNT is not finite"}
    assert release.manifest.queries["terminal_stats"].released_partitions == 60

    ledger = tmp_path / "ledger.sqlite"
    with pytest.raises(dppipeline.InputError) as failed:
        dppipeline.release(JOB, frame, ledger=ledger, scope="s", echo=lambda _: None)
    assert "rejected 2 of" in str(failed.value)
    assert "first: DataFrame row 4: TX_AMOUNT is not finite" in str(failed.value)
    with Ledger(ledger) as book:
        assert [r.state for r in book.rows()] == ["failed"]  # rows were read: charged


def test_a_ledger_needs_a_scope_and_a_named_dataset_is_one_release(small_inputs, tmp_path):
    frame = rows_of(small_inputs["parquet"])
    ledger = tmp_path / "ledger.sqlite"
    with pytest.raises(dppipeline.UsageError, match="scope: required with a ledger"):
        dppipeline.release(JOB, frame, ledger=ledger, echo=lambda _: None)
    dppipeline.release(JOB, frame, ledger=ledger, scope="s", echo=lambda _: None)
    dppipeline.release(JOB, frame, ledger=ledger, scope="s", echo=lambda _: None)
    named = {"ledger": ledger, "scope": "s", "dataset_id": "tx-2026-01", "echo": lambda _: None}
    dppipeline.release(JOB, frame, **named)
    with pytest.raises(dppipeline.OutputError, match="already committed for this dataset_id"):
        dppipeline.release(JOB, frame, **named)
    dppipeline.release(JOB, frame, new_release=True, **named)
    with Ledger(ledger) as book:
        assert len(book.rows()) == 4  # unnamed data: a new release each time; named: once


def test_in_memory_rows_are_filtered_by_the_stated_period(tmp_path):
    """No daily partitions: the spec's period keeps rows by their time column (as layout
    `files` does), and `input_range` keys need that period, refused in one line without it."""
    rows = pd.DataFrame({
        "CUSTOMER_ID": [1, 2, 3],
        "TERMINAL_ID": [1, 2, 1],
        "TX_DATETIME": pd.to_datetime(["2026-01-01 10:00", "2026-01-02 23:59", "2026-01-03 00:00"]),
    })  # fmt: skip
    keys = {"TERMINAL_ID": "1..2", "day": "input_range"}
    job = {
        "queries": [{"name": "daily", "partition_by": ["TERMINAL_ID", "day"], "metrics": ["count"],
                     "partition_selection": {"public_partitions": keys}},
                    {"name": "total", "partition_by": [], "metrics": ["count"]}],
        "budget": {"epsilon": 1e12, "delta": 0.0},
        "bounds": {"max_partitions_contributed": 2, "max_contributions_per_partition": 1},
    }  # fmt: skip
    with pytest.raises(dppipeline.UsageError, match=r"public_partitions.day: input_range needs"):
        dppipeline.release(job, rows, ledger=False, echo=lambda _: None)
    period = {"start_date": "2026-01-01", "end_date": "2026-01-02"}
    release = dppipeline.release({**job, "input": period}, rows, ledger=False, echo=lambda _: None)
    assert release["total"]["count"].tolist() == [2]  # the row of 2026-01-03 is outside
    counts = {(t, d.isoformat()): c for t, d, c in release["daily"].itertuples(index=False)}
    assert counts == {
        (1, "2026-01-01"): 1,
        (1, "2026-01-02"): 0,
        (2, "2026-01-01"): 0,
        (2, "2026-01-02"): 1,
    }  # fmt: skip


@pytest.mark.slow
def test_the_api_program_type_checks_strictly(tmp_path):
    """mypy --strict on a program that uses only the public API passes; the same program
    with a type error fails (the check can fail)."""
    program = SUPPORT / "api_program.py"
    broken = tmp_path / "api_program_broken.py"
    broken.write_text(program.read_text() + "\n\nNOT_A_STRING: str = dppipeline.plan({}).epsilon\n")
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    mypy = [str(Path(sys.executable).parent / "mypy"), "--strict", "--cache-dir", str(tmp_path)]

    def check(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*mypy, str(path)], capture_output=True, text=True, cwd=ROOT, env=env, check=False
        )

    good = check(program)
    assert good.returncode == 0, good.stdout
    bad = check(broken)
    assert bad.returncode == 1 and 'expression has type "float"' in bad.stdout, bad.stdout


# ------------------------------------------------------------ one ledger for every entry point


CAPPED = {**JOB, "budget": {"epsilon": 1.0, "delta": 0.0, "cap_epsilon": 1.5}}


def test_the_api_charges_the_ledger_the_cli_would(small_inputs, tmp_path, monkeypatch):
    """With $DPPIPELINE_LEDGER set and a cap in the job, the API records each release in that
    ledger and refuses the one the cap does not allow, as `dppipeline run` would."""
    frame = rows_of(small_inputs["parquet"])
    ledger = tmp_path / "shared.sqlite"
    monkeypatch.setenv("DPPIPELINE_LEDGER", str(ledger))
    dppipeline.release(CAPPED, frame, scope="s", echo=lambda _: None)
    with pytest.raises(dppipeline.BudgetExceeded, match="exhausted"):
        dppipeline.release(CAPPED, frame, scope="s", echo=lambda _: None)
    with Ledger(ledger) as book:
        assert [(r.scope, r.epsilon, r.state) for r in book.rows()] == [("s", 1.0, "committed")]


def test_without_a_named_ledger_the_state_folder_holds_it(small_inputs, tmp_path):
    """No ledger named, no $DPPIPELINE_LEDGER: ledger.sqlite in $DPPIPELINE_STATE_DIR (the
    test's own, see conftest), the file `dppipeline run` uses."""
    frame = rows_of(small_inputs["parquet"])
    with pytest.raises(dppipeline.UsageError, match="scope: required with a ledger"):
        dppipeline.release(JOB, frame, echo=lambda _: None)
    dppipeline.release(JOB, frame, scope="s", echo=lambda _: None)
    with Ledger(tmp_path / "state" / "ledger.sqlite") as book:
        assert [r.scope for r in book.rows()] == ["s"]


@pytest.mark.parametrize(
    "fields",
    [{"budget.cap_epsilon": 2.0}, {"budget.scope": "s"}, {"budget.window_days": 7}],
    ids=["cap", "scope", "window"],
)
def test_a_cap_or_scope_is_refused_without_a_ledger(small_inputs, tmp_path, fields):
    """`ledger=False` releases unrecorded only a job that states nothing a ledger enforces."""
    frame = rows_of(small_inputs["parquet"])
    job = dppipeline.load_job(JOB, **{k.replace(".", "__"): v for k, v in fields.items()})
    with pytest.raises(dppipeline.UsageError, match="only a ledger enforces it"):
        dppipeline.release(job, frame, ledger=False, echo=lambda _: None)
    with pytest.raises(dppipeline.UsageError, match="only a ledger enforces it"):
        dppipeline.release(JOB, frame, ledger=False, scope="s", echo=lambda _: None)
    assert not (tmp_path / "state" / "ledger.sqlite").exists()
    assert dppipeline.release(JOB, frame, ledger=False, echo=lambda _: None).manifest.ledger is None


def test_a_period_is_refused_for_rows_without_a_time_column(tmp_path):
    """A stated period is charged to the ledger's window; without a time column the rows
    cannot be held to it, so it is refused (nothing charged) rather than charged to any
    period the caller names."""
    rows = pd.DataFrame({"CUSTOMER_ID": [1, 2], "TERMINAL_ID": [1, 2], "TX_AMOUNT": [5.0, 6.0]})
    schema = [
        {"name": "CUSTOMER_ID", "type": "int64"},
        {"name": "TERMINAL_ID", "type": "int64"},
        {"name": "TX_AMOUNT", "type": "float64"},
    ]
    job = {**JOB, "input": {"schema": schema, "start_date": "2026-01-01", "end_date": "2026-01-07"}}
    ledger = tmp_path / "ledger.sqlite"
    with pytest.raises(dppipeline.UsageError, match="has no time column"):
        dppipeline.release(job, rows, ledger=ledger, scope="s", echo=lambda _: None)
    windowed = {**JOB, "input": {"schema": schema}}
    windowed["budget"] = {**JOB["budget"], "cap_epsilon": 5e12, "window_days": 7}
    with pytest.raises(dppipeline.UsageError, match=r"input\.start_date: required"):
        dppipeline.release(windowed, rows, ledger=ledger, scope="s", echo=lambda _: None)
    with Ledger(ledger) as book:
        assert book.rows() == []


@pytest.mark.slow
def test_every_run_of_a_pipeline_returns_the_one_charged_release(tmp_path):
    """A ReleaseTransform is charged once, when applied; running its pipeline three times
    returns the same released rows (noise drawn once: at epsilon 1 three draws would differ),
    and the ledger holds one row."""
    import apache_beam as beam

    from dppipeline.beam import ReleaseTransform

    rows = [
        {"CUSTOMER_ID": c, "TERMINAL_ID": c % 7, "TX_AMOUNT": float(c % 50)} for c in range(300)
    ]
    job = {
        **JOB,
        "budget": {"epsilon": 1.0, "delta": 1e-6},
        "partition_selection": {"public_partitions": "0..9"},
    }
    ledger = tmp_path / "ledger.sqlite"
    out = tmp_path / "runs"
    out.mkdir()

    def keep(rows: list[dict]) -> None:  # one file per execution
        frame = pd.DataFrame(rows).sort_values("TERMINAL_ID", ignore_index=True)
        frame.to_json(out / f"{uuid.uuid4().hex}.json")

    pipeline = beam.Pipeline()
    released = (
        pipeline
        | beam.Create(rows)
        | ReleaseTransform(job, ledger=ledger, scope="s", echo=lambda _: None)
    )
    _ = released["terminal_stats"] | beam.combiners.ToList() | beam.Map(keep)
    for _run in range(3):
        pipeline.run().wait_until_finish()
    runs = [pd.read_json(path) for path in sorted(out.iterdir())]
    assert len(runs) == 3
    truth = [sum(1 for r in rows if r["TERMINAL_ID"] == t) for t in range(10)]
    assert runs[0]["TERMINAL_ID"].tolist() == list(range(10))
    assert runs[0]["count"].tolist() != truth  # noise present
    for again in runs[1:]:
        pd.testing.assert_frame_equal(again, runs[0])
    with Ledger(ledger) as book:
        assert len(book.rows()) == 1
