"""Neighbouring datasets, on every surface: nothing a run leaves behind may depend on one customer.

DP promises that the release looks almost the same whether or not one customer is in the
data. The release's noise gives that; everything else a run leaves must give it exactly: the
exit status (or the exception), every line on stdout and stderr at DEBUG, the JVM's and Beam's
own output included (they end up in Airflow task logs and Spark/Beam UIs), the manifest, the
ledger's rows, the names and layout of every file written (the release's and the operator's
state folder's), the datasets' schemas with their metadata, and under public keys their rows in
the order written. The only data-dependent things a run may show are the rows read and rejected
of the raw input (the operator's line, removed before comparing), the rejected rows themselves
(operator-only quarantine, not compared), the released values (noisy) and, under private
selection, which partitions were released (and so how many).

Each case runs one job (every metric, public keys, private selection, a filtered global total,
a time bucket) on a base input and on the same input plus one adversarial customer, through one
surface: the CLI (`dppipeline -v run`) on each engine, the Python API on a pandas and a Spark
DataFrame, and the Beam `ReleaseTransform` in a caller's pipeline; tests_airflow/ runs the same
comparison through an Airflow task. Output is captured at the file-descriptor level (capfd), so
what the JVM and Beam's workers print is compared too. Meta-tests plant leaks the harness must
catch, one per thing it compares.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import pandas as pd
import pipeline_dp  # noqa: F401 (its import-time log lines, once per process, before any run)
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dppipeline import logs
from dppipeline.cli import main as cli
from dppipeline.engines.kernel import polars_tasks
from dppipeline.errors import InputError
from dppipeline.synthetic.transactions import generate

ADVERSARY = 9_000_001  # CUSTOMER_ID of the added customer
LONELY_TERMINAL = 7777  # a terminal only the adversary uses (public key of q_public)
SCOPE = "input/CUSTOMER_ID"  # what a file run calls the scope of `<root>/input`
JOB = """
name: neighbours
budget: {{epsilon: 1.0, delta: 1.0e-6}}
bounds: {{max_partitions_contributed: 3, max_contributions_per_partition: 2,
         min_value: 0.0, max_value: 200.0}}
input: {{max_rejected_fraction: 1.0{period}}}
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
# The same job as DP SQL (docs/reference/sql.md), one SELECT per query: the job's bounds are
# each SELECT's OPTIONS, its [0, 200] each aggregate's per-row bounds. The dialect has no
# input section: `sql` takes --max-rejected-fraction; `dppipeline.sql(query, frame)` has
# neither it nor a period, so in memory the day keys are listed (`{days}`) and the default
# max_rejected_fraction holds (its cases add no rejected rows).
SQL_BOUNDS = "max_groups_contributed = 3, max_contributions_per_partition = 2"
SQL_JOB = """
SELECT WITH DIFFERENTIAL_PRIVACY
  OPTIONS (epsilon = 1.0, delta = 1e-6, privacy_unit_column = CUSTOMER_ID, name = q_public,
           {bounds})
  TERMINAL_ID, COUNT(*),
  SUM(TX_AMOUNT, contribution_bounds_per_row => (0, 200)),
  AVG(TX_AMOUNT, contribution_bounds_per_row => (0, 200)),
  VARIANCE(TX_AMOUNT, contribution_bounds_per_row => (0, 200)),
  COUNT(DISTINCT CUSTOMER_ID),
  PERCENTILE_CONT(TX_AMOUNT, 0.5, contribution_bounds_per_row => (0, 200))
FROM transactions
RIGHT OUTER JOIN `{keys}` USING (TERMINAL_ID)
GROUP BY TERMINAL_ID;

SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (name = q_private, {bounds})
  TERMINAL_ID, COUNT(*),
  SUM(TX_AMOUNT, contribution_bounds_per_row => (0, 200)),
  AVG(TX_AMOUNT, contribution_bounds_per_row => (0, 200)),
  COUNT(DISTINCT CUSTOMER_ID)
FROM transactions
GROUP BY TERMINAL_ID;

SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (name = q_rare_global, {bounds})
  COUNT(*),
  SUM(TX_AMOUNT, contribution_bounds_per_row => (0, 5000)),
  AVG(TX_AMOUNT, contribution_bounds_per_row => (0, 5000)),
  VARIANCE(TX_AMOUNT, contribution_bounds_per_row => (0, 5000)),
  PERCENTILE_CONT(TX_AMOUNT, 0.9, contribution_bounds_per_row => (0, 5000)),
  COUNT(DISTINCT CUSTOMER_ID)
FROM transactions
WHERE TX_AMOUNT > 1000;

SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (name = q_day, {bounds})
  TERMINAL_ID, DATE_TRUNC(TX_DATETIME, DAY) AS day, COUNT(*),
  SUM(TX_AMOUNT, contribution_bounds_per_row => (0, 200))
FROM transactions
RIGHT OUTER JOIN `{keys}` USING (TERMINAL_ID)
RIGHT OUTER JOIN {days} USING (day)
GROUP BY TERMINAL_ID, day
"""
SQL_DAYS = "UNNEST(['2026-01-01', '2026-01-02'])"  # the days of PERIOD, listed
PRIVATE_QUERIES = ("q_private",)  # their released partitions are part of the (noisy) release
PERIOD = ", start_date: 2026-01-01, end_date: 2026-01-02"  # in-memory rows: the input's days


@dataclass(frozen=True)
class Trace:
    """Everything one run left behind that the harness compares, normalised (run ids, times,
    the run's root folder; see `_normalise`)."""

    outcome: str  # "ok", an exit code, or an exception's type and message
    stdout: tuple[str, ...]
    stderr: tuple[str, ...]
    files: tuple[str, ...]  # every file under the release and the state folder (names)
    manifest: str
    schemas: tuple[tuple[str, str], ...]  # per dataset: Arrow schema with its metadata
    public_rows: tuple[tuple[str, tuple], ...]  # public-key datasets: key rows, as written
    ledger: tuple[str, ...]  # every table's rows, without ids, times, hosts and fingerprints
    rows_read: int | None = field(default=None, compare=False)  # the operator's figure


def _rows_read(text: str) -> int | None:
    found = _ALLOWED.search(text)
    return None if found is None else int(found.group(1).replace(",", ""))


# --------------------------------------------------------------------------- the inputs


def _base(root: Path, fmt: str) -> Path:
    return generate(
        root / "input", fmt=fmt, customers=40, terminals=8, days=2, tx_per_day=120, seed=5
    ).output


def _adversary_rows(kind: str, day: str) -> dict[str, list]:
    """One customer's rows for a day, by kind of adversary (`all`: every kind at once)."""
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
    elif kind == "all":
        parts = [_adversary_rows(k, day) for k in KINDS]
        terminals = [t for p in parts for t in p["TERMINAL_ID"]]
        amounts = [a for p in parts for a in p["TX_AMOUNT"]]
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


def rows_in_memory(data: Path) -> pd.DataFrame:
    """The input as a caller holds it in memory: every row of every day, no folder column."""
    frames = [pd.read_parquet(path) for path in sorted(data.rglob("*.parquet"))]
    return pd.concat(frames, ignore_index=True)


# --------------------------------------------------------------------------- normalising


_ALLOWED = re.compile(r"\bread ([\d,]+) rows; rejected [\d,]+")  # the operator's raw-input line
_PRIVATE_RELEASED = re.compile(rf"\b({'|'.join(PRIVATE_QUERIES)}): released [\d,]+ partitions")
_TIMING = re.compile(r"\s*\b\d+\.\d+s\b")  # elapsed seconds, padded to a width
_RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{8}")
_ADDRESS = re.compile(r"\b0x[0-9a-f]{6,}\b")  # object addresses in library reprs
# Ledger columns that differ between any two runs (ids, clocks, hosts, leases) or name the
# input's files by a one-way hash of their sizes and footers (operator-only; a rerun's key).
_VOLATILE = re.compile(
    r"^(id|run_id|pid|process|host|host_id|note|release_key|input_fingerprint|fingerprint|.*_at)$"
)


def _normalise(text: str, root: Path) -> tuple[str, ...]:
    lines = []
    for raw in text.splitlines():
        if not raw.strip() or _ALLOWED.search(raw):
            continue
        line = raw.replace(str(root.resolve()), "<root>").replace(str(root), "<root>")
        line = _ADDRESS.sub("<addr>", _TIMING.sub(" <t>", _RUN_ID.sub("<run>", line)))
        lines.append(_PRIVATE_RELEASED.sub(r"\1: released <n> partitions", line))
    return tuple(lines)


def _files(root: Path) -> tuple[str, ...]:
    """Every file a run left under its release and state folders, by relative name (run ids
    normalised), with a Parquet file's writer and metadata. The quarantine's rows are raw
    input kept for the operator: whether there are any is the rejected count the operator line
    shows, so only the folder itself is listed."""
    found = []
    for top in ("release", "state"):
        for path in sorted((root / top).rglob("*")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith("state/quarantine/") or path.is_dir():
                continue
            name = _RUN_ID.sub("<run>", rel)
            if path.suffix == ".parquet":  # the writer and its key-value metadata too
                meta = pq.read_metadata(path)
                name = f"{name} {meta.created_by} {meta.metadata}"
            found.append(name)
    return tuple(found)


def _manifest(manifest: dict | None, root: Path) -> str:
    if manifest is None:
        return ""
    manifest = dict(manifest)
    for name in ("run_id", "created_at"):
        manifest.pop(name, None)
    queries = manifest.get("queries", {})
    for name in PRIVATE_QUERIES:
        if name in queries:
            queries[name] = {**queries[name], "released_partitions": "<released>"}
    if any(name in queries for name in PRIVATE_QUERIES):
        manifest["released_partitions"] = "<total released>"
    return "\n".join(_normalise(json.dumps(manifest, indent=1, sort_keys=True), root))


def _ledger(path: Path, root: Path) -> tuple[str, ...]:
    if not path.exists():
        return ()
    rows = []
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.row_factory = sqlite3.Row
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in sorted(t for t in tables if t != "sqlite_sequence"):
            for row in db.execute(f'SELECT * FROM "{table}"'):
                kept = {k: row[k] for k in row.keys() if not _VOLATILE.match(k)}  # noqa: SIM118
                text = f"{table}: {json.dumps(kept, sort_keys=True, default=str)}"
                rows.append(" ".join(_normalise(text, root)))
    return tuple(sorted(rows))


def _datasets(
    manifest: dict | None, read: Callable[[str], pa.Table]
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, tuple], ...]]:
    """(schemas with metadata, key rows of public-key datasets in the order written)."""
    if manifest is None:
        return (), ()
    schemas, public = [], []
    for name, query in sorted(manifest["queries"].items()):
        table = read(name)
        schemas.append((name, f"{table.schema}\n{table.schema.metadata}"))
        if query["partition_selection"]["type"] in ("public", "global"):
            keys = table.select(query["partition_by"]).to_pylist()
            public.append((name, tuple(tuple(sorted(r.items())) for r in keys)))
    return tuple(schemas), tuple(public)


# --------------------------------------------------------------------------- the surfaces


@dataclass(frozen=True)
class Run:
    """One run's place: `root` holds its input, key file, ledger, state and release at the
    same relative paths for both inputs of a pair, so paths compare equal."""

    root: Path
    fmt: str

    @property
    def data(self) -> Path:
        return self.root / "input"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.sqlite"

    @property
    def release(self) -> Path:
        return self.root / "release"

    def job(self, period: str = "") -> str:
        keys = self.root / "keys.csv"
        keys.write_text("TERMINAL_ID\n" + "".join(f"{k}\n" for k in [*range(10), LONELY_TERMINAL]))
        return JOB.format(keys=str(keys), period=period)

    def sql(self, days: str = "input_range") -> str:
        """SQL_JOB with this run's key file (`keys.csv` beside the query file)."""
        self.job()  # writes the key file
        return SQL_JOB.format(bounds=SQL_BOUNDS, keys="keys.csv", days=days)


@contextlib.contextmanager
def _state(run: Run):
    """The run's own state folder, and logging as the CLI sets it at -v (DEBUG), restored."""
    saved = os.environ.get("DPPIPELINE_STATE_DIR")
    os.environ["DPPIPELINE_STATE_DIR"] = str(run.root / "state")
    loggers = {
        name: (logging.getLogger(name), logging.getLogger(name).handlers[:])
        for name in ("", "dppipeline")
    }
    levels = {name: logger.level for name, (logger, _) in loggers.items()}
    try:
        yield
    finally:
        for name, (logger, handlers) in loggers.items():
            logger.handlers[:] = handlers
            logger.setLevel(levels[name])
        logging.getLogger("dppipeline").propagate = True
        if saved is None:
            os.environ.pop("DPPIPELINE_STATE_DIR", None)
        else:
            os.environ["DPPIPELINE_STATE_DIR"] = saved


def _outcome(exc: BaseException | None) -> str:
    if exc is None:
        return "ok"
    return f"{type(exc).__name__}: {exc}"


def cli_surface(engine: str) -> Callable[[Run], tuple[str, dict | None, Callable]]:
    """`dppipeline -v run` in this process (Spark reuses the test session)."""

    def run_cli(run: Run) -> tuple[str, dict | None, Callable]:
        job = run.root / "job.yaml"
        job.write_text(run.job())
        argv = [
            "-v", "run",
            "--config", str(job),
            "--engine", engine,
            "--input", str(run.data),
            "--format", run.fmt,
            "--output", str(run.release),
            "--ledger", f"sqlite:///{run.ledger}",
        ]  # fmt: skip
        return _cli_outcome(argv, run)

    return run_cli


def _cli_outcome(argv: list[str], run: Run) -> tuple[str, dict | None, Callable]:
    """`dppipeline argv` in this process: its exit status, the manifest and the datasets."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    manifest = json.loads((run.release / "manifest.json").read_text()) if code == 0 else None
    return f"exit {code}", manifest, lambda q: pq.read_table(run.release / q)


def api_surface(kind: str, spark=None) -> Callable[[Run], tuple[str, dict | None, Callable]]:
    """`dppipeline.release(job, frame, ...)` on a pandas or Spark DataFrame, publishing to
    the run's release folder, with the CLI's logging at DEBUG (a notebook's basicConfig)."""
    import dppipeline

    def run_api(run: Run) -> tuple[str, dict | None, Callable]:
        frame = rows_in_memory(run.data)
        data = frame if kind == "pandas" else spark.createDataFrame(frame)
        logs.configure(verbose=True)
        try:
            release = dppipeline.release(
                run.job(PERIOD), data, ledger=run.ledger, scope=SCOPE, output=run.release
            )
        except Exception as exc:
            return _outcome(exc), None, lambda q: None
        manifest = json.loads(release.manifest.to_json())
        return "ok", manifest, lambda q: pq.read_table(run.release / q)

    return run_api


def sql_cli_surface(engine: str) -> Callable[[Run], tuple[str, dict | None, Callable]]:
    """`dppipeline -v sql --file query.sql` in this process (SQL_JOB; Spark reuses the test
    session)."""

    def run_sql(run: Run) -> tuple[str, dict | None, Callable]:
        query = run.root / "query.sql"
        query.write_text(run.sql())
        argv = [
            "-v", "sql",
            "--file", str(query),
            "--engine", engine,
            "--input", str(run.data),
            "--format", run.fmt,
            "--max-rejected-fraction", "1.0",
            "--output", str(run.release),
            "--ledger", f"sqlite:///{run.ledger}",
        ]  # fmt: skip
        return _cli_outcome(argv, run)

    return run_sql


def sql_api_surface(run: Run) -> tuple[str, dict | None, Callable]:
    """`dppipeline.sql(query, frame, ...)` on a pandas DataFrame (SQL_JOB, the query's text
    with the key file's absolute path; day keys listed), with the CLI's logging at DEBUG."""
    import dppipeline

    frame = rows_in_memory(run.data)
    query = run.sql(days=SQL_DAYS).replace("`keys.csv`", f"`{run.root / 'keys.csv'}`")
    logs.configure(verbose=True)
    try:
        release = dppipeline.sql(query, frame, ledger=run.ledger, scope=SCOPE, output=run.release)
    except Exception as exc:
        return _outcome(exc), None, lambda q: None
    manifest = json.loads(release.manifest.to_json())
    return "ok", manifest, lambda q: pq.read_table(run.release / q)


def transform_surface(run: Run) -> tuple[str, dict | None, Callable]:
    """`ReleaseTransform` in the caller's Beam pipeline: each query's released rows collected
    to a JSON file by the caller (Beam gives them in no order: sorted by key here)."""
    import apache_beam as beam

    from dppipeline.beam import ReleaseTransform

    frame = rows_in_memory(run.data)
    records = [
        {**r, "TX_DATETIME": r["TX_DATETIME"].to_pydatetime()} for r in frame.to_dict("records")
    ]
    run.release.mkdir()
    logs.configure(verbose=True)

    def keep(query: str):
        def write(rows: list[dict]) -> None:
            table = pa.Table.from_pylist(rows) if rows else pa.table({})
            pq.write_table(table, run.release / f"{query}.parquet")

        return write

    try:
        pipeline = beam.Pipeline()
        transform = ReleaseTransform(run.job(PERIOD), ledger=run.ledger, scope=SCOPE)
        released = pipeline | beam.Create(records) | transform
        for query, rows in released.items():
            collected = rows | f"Collect[{query}]" >> beam.combiners.ToList()
            _ = collected | f"Keep[{query}]" >> beam.Map(keep(query))
        pipeline.run().wait_until_finish()
    except Exception as exc:
        return _outcome(exc), None, lambda q: None
    manifest = json.loads(transform.manifest.to_json())

    def read(query: str) -> pa.Table:
        table = pq.read_table(run.release / f"{query}.parquet")
        keys = manifest["queries"][query]["partition_by"]
        return table.sort_by([(k, "ascending") for k in keys]) if keys and table.num_rows else table

    return "ok", manifest, read


def trace(run: Run, surface: Callable, capfd) -> Trace:
    """Runs one surface once, capturing file descriptors 1 and 2, and returns its trace."""
    capfd.readouterr()
    with _state(run):
        try:
            outcome, manifest, read = surface(run)
        except Exception as exc:
            outcome, manifest, read = f"crash: {type(exc).__name__}", None, lambda q: None
    out, err = capfd.readouterr()
    schemas, public = _datasets(manifest, read)
    return Trace(
        outcome=" ".join(_normalise(outcome, run.root)),
        stdout=_normalise(out, run.root),
        stderr=_normalise(err, run.root),
        files=_files(run.root),
        manifest=_manifest(manifest, run.root),
        schemas=schemas,
        public_rows=public,
        ledger=_ledger(run.ledger, run.root),
        rows_read=_rows_read(err),
    )


def differences(a: Trace, b: Trace) -> list[str]:
    """Every way two runs' traces differ (empty: indistinguishable)."""
    found = []
    for item in fields(Trace):
        if not item.compare:
            continue
        left, right = getattr(a, item.name), getattr(b, item.name)
        if left == right:
            continue
        if isinstance(left, tuple) and isinstance(right, tuple):
            only = sorted(set(map(str, left)) ^ set(map(str, right)))
            found.append(f"{item.name} differs: {only[:4]}")
        else:
            found.append(f"{item.name} differs: {str(left)[:300]!r} != {str(right)[:300]!r}")
    return found


def neighbour_pair(
    tmp: Path, surface: Callable, kind: str, capfd, fmt: str = "parquet", sane: bool = True
) -> list[str]:
    """Runs a surface without and with the adversary, each in its own root (`sane`: the
    first run must release; off only for a plant that makes every run fail)."""
    base = _base(tmp / "without", fmt)
    with_adversary(base, tmp / "with" / "input", kind, fmt)
    without, with_ = Run(tmp / "without", fmt), Run(tmp / "with", fmt)
    first = trace(without, surface, capfd)
    # The comparison means something only if the surface released from the rows given.
    if sane:
        assert first.outcome in ("ok", "exit 0"), first.outcome
        assert first.rows_read is None or first.rows_read > 0
    return differences(first, trace(with_, surface, capfd))


KINDS = ("rare_value", "nan_amount", "many_terminals", "lonely_terminal")


@pytest.mark.parametrize("kind", [*KINDS, "all"])
@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_local_cli_runs_do_not_depend_on_one_customer(tmp_path, capfd, kind, fmt):
    assert neighbour_pair(tmp_path, cli_surface("local"), kind, capfd, fmt) == []


@pytest.mark.parametrize("kind", ["all", "lonely_terminal"])
def test_spark_cli_runs_do_not_depend_on_one_customer(tmp_path, spark, capfd, kind):
    assert neighbour_pair(tmp_path, cli_surface("spark"), kind, capfd) == []


@pytest.mark.beam
@pytest.mark.parametrize("kind", ["all", "lonely_terminal"])
def test_beam_cli_runs_do_not_depend_on_one_customer(tmp_path, capfd, kind):
    assert neighbour_pair(tmp_path, cli_surface("beam"), kind, capfd) == []


@pytest.mark.parametrize("kind", ["all", "nan_amount"])
def test_api_pandas_releases_do_not_depend_on_one_customer(tmp_path, capfd, kind):
    assert neighbour_pair(tmp_path, api_surface("pandas"), kind, capfd) == []


def test_api_spark_releases_do_not_depend_on_one_customer(tmp_path, spark, capfd):
    assert neighbour_pair(tmp_path, api_surface("spark", spark), "all", capfd) == []


@pytest.mark.beam
def test_beam_transform_releases_do_not_depend_on_one_customer(tmp_path, capfd):
    assert neighbour_pair(tmp_path, transform_surface, "all", capfd) == []


@pytest.mark.parametrize("kind", [*KINDS, "all"])
def test_local_sql_cli_runs_do_not_depend_on_one_customer(tmp_path, capfd, kind):
    assert neighbour_pair(tmp_path, sql_cli_surface("local"), kind, capfd) == []


def test_spark_sql_cli_runs_do_not_depend_on_one_customer(tmp_path, spark, capfd):
    assert neighbour_pair(tmp_path, sql_cli_surface("spark"), "all", capfd) == []


# No nan_amount here: in memory the SQL cannot raise max_rejected_fraction (see SQL_JOB).
@pytest.mark.parametrize("kind", ["rare_value", "many_terminals", "lonely_terminal"])
def test_sql_api_pandas_releases_do_not_depend_on_one_customer(tmp_path, capfd, kind):
    assert neighbour_pair(tmp_path, sql_api_surface, kind, capfd) == []


# --------------------------------------------------------------------------- planted leaks


def _leaky_aggregates(leak: str):
    """`polars_tasks.aggregate_task_rows` (a task's kept rows -> its aggregates, as the local
    engine calls it) with one leak put back, as a bug would."""
    exact = polars_tasks.aggregate_task_rows
    logger = logging.getLogger("dppipeline.local")

    def leaky(rows, task, unit, keys):
        aggregates = exact(rows, task, unit, keys)
        if leak == "pre-selection count in a log line":
            logger.info(f"{task.name}: {len(aggregates):,} partitions aggregated")
        elif leak == "pre-selection count at DEBUG":
            logger.debug(f"{task.name}: {len(aggregates):,} partitions aggregated")
        elif leak == "data-dependent crash" and task.name == "q_rare_global":
            if rows.height > 0:  # the task's rows: those its filter TX_AMOUNT > 1000 keeps
                raise ZeroDivisionError("an edge case only some data reach")
        elif leak == "value in an error message" and task.name == "q_private":
            raise InputError(f"{task.name}: partition too large ({len(aggregates)} partitions)")
        return aggregates

    return leaky


def _plant(leak: str, monkeypatch) -> None:
    """Puts one leak back into the code a local run goes through."""
    from dppipeline.core import manifest as manifest_module
    from dppipeline.engines import base
    from dppipeline.ledger import reservation
    from dppipeline.lifecycle import runner

    if leak in (
        "pre-selection count in a log line",
        "pre-selection count at DEBUG",
        "data-dependent crash",
        "value in an error message",
    ):
        monkeypatch.setattr(polars_tasks, "aggregate_task_rows", _leaky_aggregates(leak))
        return
    seen: dict[str, int] = {}
    stage = runner._stage

    def remembering_stage(job, engine, staging, **kw):  # the engine's counts, for the plants
        real_run = engine.run

        def run(job, staging):
            result = real_run(job, staging)
            seen["rows_read"] = result.rejects.rows_read
            return result

        engine.run = run
        return stage(job, engine, staging, **kw)

    monkeypatch.setattr(runner, "_stage", remembering_stage)
    if leak == "rows read in the manifest":
        to_json = manifest_module.Manifest.to_json

        def with_rows(self) -> str:
            return json.dumps({**json.loads(to_json(self)), "rows_read": seen["rows_read"]})

        monkeypatch.setattr(manifest_module.Manifest, "to_json", with_rows)
    elif leak == "a file named by a count":
        write = base.write_dataset

        def named(released, job, query, dataset_dir):
            rows = write(released, job, query, dataset_dir)
            (dataset_dir / f"_rows-{seen.get('rows_read', 0)}").touch()
            return rows

        monkeypatch.setattr(base, "write_dataset", named)
    elif leak == "a count in the ledger":
        commit = reservation.Reservation.commit

        def noted(self) -> None:
            commit(self)
            with contextlib.closing(sqlite3.connect(self.ledger.path)) as db, db:
                db.execute("UPDATE releases SET job = job || ?", (f" {seen['rows_read']}",))

        monkeypatch.setattr(reservation.Reservation, "commit", noted)
    else:
        raise ValueError(leak)


PLANTS = (
    "pre-selection count in a log line",
    "pre-selection count at DEBUG",
    "data-dependent crash",
    "value in an error message",
    "rows read in the manifest",
    "a file named by a count",
    "a count in the ledger",
)


@pytest.mark.slow
@pytest.mark.parametrize("leak", PLANTS)
def test_the_harness_catches_a_planted_leak(tmp_path, capfd, monkeypatch, leak):
    """The harness is only as good as what it notices: each leak, put back on purpose, makes
    the neighbouring pair distinguishable (one adversary doing every kind of thing)."""
    _plant(leak, monkeypatch)
    sane = leak != "value in an error message"  # both runs fail, their messages differ
    assert neighbour_pair(tmp_path, cli_surface("local"), "all", capfd, sane=sane), leak


def _plant_sql(leak: str, monkeypatch) -> None:
    """Puts one SQL-specific leak back: the front end telling the analyst about the data."""
    from dppipeline.api import sql as api_sql
    from dppipeline.dpsql.errors import SqlError

    if leak == "WHERE's kept rows in a progress line":
        exact = polars_tasks.aggregate_task_rows
        logger = logging.getLogger("dppipeline.dpsql")

        def telling(rows, task, unit, keys):
            if task.name == "q_rare_global":  # the SELECT with a WHERE
                logger.info(f"query.sql:36:7: WHERE kept {rows.height:,} rows")
            return exact(rows, task, unit, keys)

        monkeypatch.setattr(polars_tasks, "aggregate_task_rows", telling)
    elif leak == "a refusal naming a key without rows":
        release = api_sql.release

        def checking(job, data, **options):
            seen = set(data["TERMINAL_ID"])
            if LONELY_TERMINAL not in seen:  # a key table's key the data lacks, quoted
                raise SqlError(10, 1, "RIGHT OUTER JOIN", f"key {LONELY_TERMINAL} has no rows")
            return release(job, data, **options)

        monkeypatch.setattr(api_sql, "release", checking)
    else:
        raise ValueError(leak)


SQL_PLANTS = {
    "WHERE's kept rows in a progress line": (sql_cli_surface("local"), "rare_value", True),
    "a refusal naming a key without rows": (sql_api_surface, "lonely_terminal", False),
}


@pytest.mark.slow
@pytest.mark.parametrize("leak", SQL_PLANTS)
def test_the_harness_catches_a_planted_sql_leak(tmp_path, capfd, monkeypatch, leak):
    """The SQL surfaces through the same harness: a leak of the SQL front end, put back on
    purpose, makes the pair distinguishable (`sane` off where the base run is refused)."""
    surface, kind, sane = SQL_PLANTS[leak]
    _plant_sql(leak, monkeypatch)
    assert neighbour_pair(tmp_path, surface, kind, capfd, sane=sane), leak
