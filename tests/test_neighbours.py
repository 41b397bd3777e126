"""Neighbouring datasets: nothing a run shows may depend on one customer.

DP promises that the release looks almost the same whether or not one customer is in the
data. The release's noise gives that; everything else a run emits must give it exactly: the
exit status, every line on stdout and stderr (they end up in Airflow task logs and Spark/Beam
UIs), the output's datasets and schemas, and under public keys its rows. The only
data-dependent figures a run may print are the rows read and rejected of the raw input (the
operator's line, removed before comparing).

Each case runs one job (every metric, public keys, private selection, a filtered global total,
a time bucket) on a base input and on the same input plus one adversarial customer, and
compares what the two runs emit. A meta-test plants three leaks the harness must catch.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dppipeline.commands import cli
from dppipeline.commands.generate import generate
from dppipeline.engines.shared import polars_tasks
from dppipeline.errors import InputError

ADVERSARY = 9_000_001  # CUSTOMER_ID of the added customer
LONELY_TERMINAL = 7777  # a terminal only the adversary uses (public key of q_public)
START = "2026-03-01"
JOB = """
name: neighbours
budget: {{epsilon: 1.0, delta: 1.0e-6}}
bounds: {{max_partitions_contributed: 3, max_contributions_per_partition: 2,
         min_value: 0.0, max_value: 200.0}}
input: {{max_rejected_fraction: 1.0}}
queries:
  - name: q_public
    partition_by: [TERMINAL_ID]
    metrics: [count, sum, mean, variance, privacy_id_count, "percentile(50)"]
    partition_selection: {{public_partitions: {keys}}}
  - name: q_private
    partition_by: [TERMINAL_ID]
    metrics: [count, sum, mean, privacy_id_count]
  - name: q_rare_global
    filter: "TX_AMOUNT > 1000"
    partition_by: []
    metrics: [count, sum, mean, variance, "percentile(90)", privacy_id_count]
    bounds: {{min_value: 0.0, max_value: 5000.0}}
  - name: q_day
    partition_by: [TERMINAL_ID, day]
    metrics: [count, sum]
    partition_selection:
      public_partitions: {{TERMINAL_ID: {keys}, day: input_range}}
"""


@dataclass(frozen=True)
class RunOutcome:
    """What one run showed: exit code, normalised output lines, datasets and their schemas,
    the release's files and their Parquet metadata, and the key rows of public-key
    datasets."""

    exit_code: int
    stdout: tuple[str, ...]
    stderr: tuple[str, ...]
    schemas: dict[str, str]
    public_rows: dict[str, tuple]
    files: tuple[tuple[str, object], ...] = ()


# --------------------------------------------------------------------------- the inputs


def _base(root: Path, fmt: str) -> Path:
    return generate(
        root / "input", fmt=fmt, customers=40, terminals=8, days=2, tx_per_day=120, seed=5
    ).output


def _adversary_rows(kind: str, day: str) -> dict[str, list]:
    """One customer's rows for a day, by kind of adversary."""
    when = f"{day} 12:00:00"
    if kind == "rare_value":  # the only rows the q_rare_global filter keeps
        terminals, amounts = [1, 1], [4000.0, 4500.0]
    elif kind == "nan_amount":
        terminals, amounts = [2, 3], [float("nan"), 10.0]
    elif kind == "many_terminals":  # far more partitions than L0
        terminals = list(range(500))
        amounts = [10.0] * 500
    elif kind == "lonely_terminal":  # alone in a partition (public key; private candidate)
        terminals, amounts = [LONELY_TERMINAL] * 3, [50.0, 60.0, 70.0]
    else:
        raise ValueError(kind)
    n = len(terminals)
    return {
        "TRANSACTION_ID": list(range(10_000_000, 10_000_000 + n)),
        "TX_DATETIME": [when] * n,
        "CUSTOMER_ID": [ADVERSARY] * n,
        "TERMINAL_ID": terminals,
        "TX_AMOUNT": amounts,
    }


def with_adversary(base: Path, out: Path, kind: str, fmt: str) -> Path:
    """A copy of `base` with the adversary's rows appended to each day's file."""
    shutil.copytree(base, out)
    for path in sorted(out.rglob(f"*.{fmt}")):
        day = re.search(r"\d{4}-\d{2}-\d{2}", str(path)).group(0)
        extra = _adversary_rows(kind, day)
        if fmt == "csv":
            lines = [
                ",".join(str(extra[c][i]) for c in extra) for i in range(len(extra["CUSTOMER_ID"]))
            ]
            with path.open("a") as handle:
                handle.write("".join(line + "\n" for line in lines))
        else:
            table = pq.read_table(path)
            added = pa.table(
                {
                    "TRANSACTION_ID": pa.array(extra["TRANSACTION_ID"], pa.int64()),
                    "TX_DATETIME": pa.array(
                        np.array(extra["TX_DATETIME"], dtype="datetime64[us]"), pa.timestamp("us")
                    ),
                    "CUSTOMER_ID": pa.array(extra["CUSTOMER_ID"], pa.int64()),
                    "TERMINAL_ID": pa.array(extra["TERMINAL_ID"], pa.int64()),
                    "TX_AMOUNT": pa.array(extra["TX_AMOUNT"], pa.float64()),
                }
            ).cast(table.schema)
            pq.write_table(pa.concat_tables([table, added]), path)
    return out


# --------------------------------------------------------------------------- running


_ALLOWED = re.compile(r"\bread [\d,]+ rows; rejected [\d,]+")  # the operator's raw-input line
_RELEASED = re.compile(r"released [\d,]+ partitions")  # a released (noisy) figure
_TIMING = re.compile(r"\s+\d+\.\d+s\b")
_RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{8}")


def _normalise(text: str, root: Path) -> tuple[str, ...]:
    lines = []
    for raw in text.splitlines():
        if not raw.strip() or _ALLOWED.search(raw):
            continue
        line = _TIMING.sub(" <t>", _RUN_ID.sub("<run>", raw.replace(str(root), "<root>")))
        lines.append(_RELEASED.sub("released <n> partitions", line))
    return tuple(lines)


def run_once(root: Path, data: Path, engine: str, fmt: str, keys: str) -> RunOutcome:
    """One `dppipeline run` in this process (so Spark reuses the test session), its output
    captured as the user would see it."""
    job = root / "job.yaml"
    job.write_text(JOB.format(keys=keys))
    out, err = io.StringIO(), io.StringIO()
    argv = [
        "run",
        "--config", str(job),
        "--engine", engine,
        "--input", str(data),
        "--format", fmt,
        "--output", str(root / "release"),
        "--ledger", f"sqlite:///{root / 'ledger.sqlite'}",
    ]  # fmt: skip
    state = os.environ.get("DPPIPELINE_STATE_DIR")
    os.environ["DPPIPELINE_STATE_DIR"] = str(root / "state")  # the quarantine's home
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
        except Exception as exc:  # a crash the CLI did not turn into an exit code
            code, err = -1, io.StringIO(f"crash: {type(exc).__name__}")
        finally:
            if state is None:
                os.environ.pop("DPPIPELINE_STATE_DIR", None)
            else:
                os.environ["DPPIPELINE_STATE_DIR"] = state
    release = root / "release"
    schemas, public, files = {}, {}, ()
    if code == 0:
        files = tuple(
            (name, _file_metadata(release / name))
            for name in sorted(p.relative_to(release).as_posix() for p in release.rglob("*"))
        )
        manifest = json.loads((release / "manifest.json").read_text())
        for name, query in manifest["queries"].items():
            table = pq.read_table(release / query["dataset"])
            schemas[name] = str(table.schema.remove_metadata())
            if query["partition_selection"]["type"] in ("public", "global"):
                keys_only = table.select(query["partition_by"]).to_pylist()
                public[name] = tuple(sorted(tuple(sorted(r.items())) for r in keys_only))
    return RunOutcome(
        code,
        _normalise(out.getvalue(), root),
        _normalise(err.getvalue(), root),
        schemas,
        public,
        files,
    )


def _file_metadata(path: Path) -> object:
    """A Parquet file's writer and key-value metadata (the Arrow schema); None otherwise."""
    if path.suffix != ".parquet":
        return None
    meta = pq.read_metadata(path)
    return meta.created_by, meta.metadata


def differences(a: RunOutcome, b: RunOutcome) -> list[str]:
    """Every way two runs' observable outcomes differ (empty: indistinguishable)."""
    found = []
    if a.exit_code != b.exit_code:
        found.append(f"exit code {a.exit_code} != {b.exit_code}")
    for name in ("stdout", "stderr"):
        left, right = getattr(a, name), getattr(b, name)
        if left != right:
            only = sorted(set(left) ^ set(right))
            found.append(f"{name} differs: {only[:4]}")
    if a.schemas != b.schemas:
        found.append(f"schemas differ: {sorted(set(a.schemas.items()) ^ set(b.schemas.items()))}")
    if a.public_rows != b.public_rows:
        found.append("public-key rows differ")
    if a.files != b.files:
        only = [f for f in a.files if f not in b.files] + [f for f in b.files if f not in a.files]
        found.append(f"files differ: {only[:4]}")
    return found


def neighbour_pair(tmp: Path, engine: str, fmt: str, kind: str) -> list[str]:
    """Runs the job without and with the adversary; each run has its own root holding its
    input, keys, ledger and release at the same relative paths, so paths compare equal."""
    base = _base(tmp / "without", fmt)
    with_adversary(base, tmp / "with" / "input", kind, fmt)
    outcomes = []
    for root in (tmp / "without", tmp / "with"):
        keys = root / "keys.csv"
        keys.write_text("TERMINAL_ID\n" + "".join(f"{k}\n" for k in [*range(10), LONELY_TERMINAL]))
        outcomes.append(run_once(root, root / "input", engine, fmt, str(keys)))
    return differences(*outcomes)


KINDS = ("rare_value", "nan_amount", "many_terminals", "lonely_terminal")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_local_runs_do_not_depend_on_one_customer(tmp_path, kind, fmt):
    assert neighbour_pair(tmp_path, "local", fmt, kind) == []


@pytest.mark.parametrize("kind", KINDS)
def test_spark_runs_do_not_depend_on_one_customer(tmp_path, spark, kind):
    assert neighbour_pair(tmp_path, "spark", "parquet", kind) == []


@pytest.mark.parametrize("kind", KINDS)
def test_beam_runs_do_not_depend_on_one_customer(tmp_path, kind):
    assert neighbour_pair(tmp_path, "beam", "parquet", kind) == []


# --------------------------------------------------------------------------- planted leaks


def _planted(leak: str):
    """`polars_tasks.aggregate_task_rows` (a task's kept rows -> its aggregates, as the local
    engine calls it) with one leak put back, as a bug would."""
    exact = polars_tasks.aggregate_task_rows
    logger = logging.getLogger("dppipeline.local")

    def leaky(rows, task, unit, keys):
        aggregates = exact(rows, task, unit, keys)
        if leak == "pre-selection count in a log line":
            logger.info(f"{task.name}: {len(aggregates):,} partitions aggregated")
        elif leak == "data-dependent crash" and task.name == "q_rare_global":
            if rows.height > 0:  # the task's rows: those its filter TX_AMOUNT > 1000 keeps
                raise ZeroDivisionError("an edge case only some data reach")
        elif leak == "value in an error message" and task.name == "q_private":
            raise InputError(f"{task.name}: partition too large ({len(aggregates)} partitions)")
        return aggregates

    return leaky


@pytest.mark.parametrize(
    "leak",
    ["pre-selection count in a log line", "data-dependent crash", "value in an error message"],
)
def test_the_harness_catches_a_planted_leak(tmp_path, monkeypatch, leak):
    """The harness is only as good as what it notices: each leak, put back on purpose, makes
    some neighbouring pair distinguishable."""
    monkeypatch.setattr(polars_tasks, "aggregate_task_rows", _planted(leak))
    found = {kind: neighbour_pair(tmp_path / kind, "local", "parquet", kind) for kind in KINDS}
    assert any(found.values()), f"planted leak not caught: {leak}"
