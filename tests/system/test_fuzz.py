"""Fuzzing what a user hands the CLI: random bytes, corrupt CSV and Parquet day files and random
YAML specs go to `dppipeline run` (local engine) and `dppipeline plan`.

Whatever the input, a command ends in one of two ways: exit 0 with a complete release, or a
non-zero exit with exactly one error line. Never a traceback, a bug (exit 70), a partial
release, a staging folder or a ledger reservation left behind.

The CLI runs in this process (`cli.main`), its output captured at the file descriptors, so a
Rust panic or a C library's message would show as well: a process per example costs 2 s of
imports, in process a run takes 0.1 s. `test_cli.py` checks the same contract on subprocesses.

Deterministic by default (the same examples every run, so CI does not fail at random);
`DPPIPELINE_FUZZ_RANDOM=1 DPPIPELINE_FUZZ_EXAMPLES=500` explores further.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import sqlite3
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dppipeline.cli import main as cli
from dppipeline.spec.loader import MAX_SPEC_BYTES
from dppipeline.synthetic.transactions import generate

FUZZ = settings(
    max_examples=int(os.environ.get("DPPIPELINE_FUZZ_EXAMPLES", "30")),
    deadline=None,
    derandomize=not os.environ.get("DPPIPELINE_FUZZ_RANDOM"),
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
BOUNDS = ["--min-value", "0", "--max-value", "100", "--public-partitions", "0..9"]
PROGRESS = re.compile(r"^\[(ledger|local|tune)\] ")  # the run's progress lines
LIVE = ("reserved", "reading")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """Two days, ten terminals, in both layouts: small, so one run takes a tenth of a second."""
    base = tmp_path_factory.mktemp("fuzz_inputs")
    small = {"customers": 40, "terminals": 10, "days": 2, "tx_per_day": 60, "seed": 3}
    return {fmt: generate(base / fmt, fmt=fmt, **small).output for fmt in ("parquet", "csv")}


@pytest.fixture(autouse=True)
def _restore_modules():
    """`cli.main` marks apache_beam absent for run and plan (see
    `_skip_unused_pipeline_dp_imports`); other tests of this process may need it."""
    names = ("apache_beam", "dp_accounting.pld")
    saved = {n: sys.modules[n] for n in names if n in sys.modules}
    yield
    for name in names:
        if sys.modules.get(name, 0) is None and name not in saved:
            del sys.modules[name]


class Workspace:
    """One example's folders: a copy of the input, the release's parent, the ledger."""

    def __init__(self, root: Path, source: Path | None):
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        self.root = root
        self.input = root / "input"
        if source is not None:
            shutil.copytree(source, self.input)
        self.parent = root / "releases"
        self.parent.mkdir()
        self.output = self.parent / "release"
        self.ledger = root / "state" / "ledger.sqlite"
        self.quarantine = root / "quarantine"

    def day_files(self, fmt: str) -> list[Path]:
        return sorted(self.input.rglob("*.csv" if fmt == "csv" else "*.parquet"))

    def run_args(self, fmt: str, *extra: str) -> list[str]:
        return [
            "run",
            "--engine",
            "local",
            "--input",
            str(self.input),
            "--format",
            fmt,
            "--output",
            str(self.output),
            "--ledger",
            f"sqlite:///{self.ledger}",
            "--quarantine",
            str(self.quarantine),
            *extra,
        ]


def call_cli(capfd, args: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `dppipeline ARGS`. On a bug (exit 70) the command runs
    once more with DPPIPELINE_DEBUG=1, so that the test fails with the bug's own exception
    and traceback (and hypothesis tells distinct bugs apart by where they are raised)."""
    capfd.readouterr()
    code = _main(args)
    out, err = capfd.readouterr()
    if code == 70:
        os.environ["DPPIPELINE_DEBUG"] = "1"
        try:
            _main(args)
        finally:
            del os.environ["DPPIPELINE_DEBUG"]
            capfd.readouterr()
    return code, out, err


def _main(args: list[str]) -> int:
    try:
        return cli.main(args)
    except SystemExit as exit_:  # argparse's own usage errors
        return exit_.code if isinstance(exit_.code, int) else 2


def check_outcome(ws: Workspace, command: str, code: int, out: str, err: str) -> None:
    """The contract: exit 0 and a complete release, or a non-zero exit and one error line;
    nothing else on stderr but progress lines; no partial output; no live reservation."""
    assert "Traceback" not in err + out, err
    assert code != 70, err  # a bug: an exception nobody mapped to a one-line error
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(f"dppipeline {command}: error: ")]
    others = [line for line in lines if line not in errors and not PROGRESS.match(line)]
    assert not others, err
    if code == 0:
        assert not errors, err
    else:
        assert len(errors) == 1, err
        assert code in (1, 2, 3), err
    if command == "run":
        left = sorted(p.name for p in ws.parent.iterdir())
        if code == 0:
            assert left == ["release"], left
            assert (ws.output / "manifest.json").is_file()
        else:
            assert left == [], left  # no release, no staging or retired folder
    if ws.ledger.exists():
        with sqlite3.connect(ws.ledger) as db:
            try:
                states = [row[0] for row in db.execute("SELECT state FROM releases")]
            except sqlite3.OperationalError:  # the run failed before creating the table
                states = []
        assert not set(states) & set(LIVE), states
        assert states.count("committed") == (1 if code == 0 and command == "run" else 0)


def run_on(ws: Workspace, capfd, fmt: str, *extra: str) -> None:
    code, out, err = call_cli(capfd, ws.run_args(fmt, *extra))
    check_outcome(ws, "run", code, out, err)


# --- random bytes as a day file ---------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "csv"])  # a whole file of bytes: no header first
@FUZZ
@given(data=st.binary(max_size=3000))
@example(data=b"\xff\xfe\x00bad")
@example(data=b"PAR1")
@example(data=b"")
def test_random_bytes_as_a_day_file(tmp_path, capfd, inputs, fmt, data):
    ws = Workspace(tmp_path / "ws", inputs[fmt])
    ws.day_files(fmt)[0].write_bytes(data)
    run_on(ws, capfd, fmt, *BOUNDS)


@FUZZ
@given(text=st.text(max_size=3000))
@example(text="\ufeffTRANSACTION_ID,TX_DATETIME\n1,2")
def test_random_text_as_a_csv_day_file(tmp_path, capfd, inputs, text):
    ws = Workspace(tmp_path / "ws", inputs["csv"])
    ws.day_files("csv")[0].write_bytes(text.encode("utf-8", "surrogatepass"))
    run_on(ws, capfd, "csv", *BOUNDS)


# --- CSV corruptions --------------------------------------------------------------------------

NASTY = [
    ",",
    '"',
    "\n",
    "\r\n",
    "\r",
    "\x00",
    "\ufeff",
    "é",
    "NaN",
    "inf",
    "-1e400",
    "99999999999999999999999",
    "11.7",
    "2026-13-45 25:61:61",
    "2026-01-01T10:00:00+05:00",
    '"a,b"',
    ",,,,,",
    "\t",
    " ",
    "",
]


def edits_of(payloads: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(
        st.tuples(
            st.sampled_from(["insert", "delete", "replace", "truncate", "duplicate"]),
            st.floats(0, 1),
            st.floats(0, 0.2),
            payloads,
        ),
        min_size=1,
        max_size=6,
    )


def edited(data, edits):
    """`data` (text or bytes) with each edit applied: insert, delete, replace, truncate or
    duplicate a span, at a fraction of its length."""
    for op, where, length, payload in edits:
        at = int(where * len(data))
        span = int(length * len(data))
        if op == "insert":
            data = data[:at] + payload + data[at:]
        elif op == "delete":
            data = data[:at] + data[at + span :]
        elif op == "replace":
            data = data[:at] + payload + data[at + len(payload) :]
        elif op == "truncate":
            data = data[:at]
        else:
            data = data[:at] + data[at : at + span] + data[at:]
    return data


@FUZZ
@given(
    edits=edits_of(st.one_of(st.sampled_from(NASTY), st.text(max_size=20))), which=st.integers(0, 1)
)
@example(edits=[("insert", 0.5, 0.0, ",000.50")], which=0)  # a field too many (issue 15)
@example(edits=[("insert", 0.5, 0.0, '"')], which=0)  # an unterminated quote
@example(edits=[("insert", 0.0, 0.0, "\ufeff")], which=1)  # a byte-order mark
def test_corrupt_csv_text(tmp_path, capfd, inputs, edits, which):
    ws = Workspace(tmp_path / "ws", inputs["csv"])
    day = ws.day_files("csv")[which]
    day.write_bytes(edited(day.read_text(), edits).encode("utf-8", "surrogatepass"))
    run_on(ws, capfd, "csv", *BOUNDS, "--max-rejected-fraction", "0.5")


@FUZZ
@given(edits=edits_of(st.binary(max_size=20)), which=st.integers(0, 1))
@example(edits=[("insert", 0.3, 0.0, b"\xff\xfe")], which=1)
def test_corrupt_csv_bytes(tmp_path, capfd, inputs, edits, which):
    ws = Workspace(tmp_path / "ws", inputs["csv"])
    day = ws.day_files("csv")[which]
    day.write_bytes(edited(day.read_bytes(), edits))
    run_on(ws, capfd, "csv", *BOUNDS, "--max-rejected-fraction", "0.5")


# --- Parquet corruptions ----------------------------------------------------------------------


@FUZZ
@given(
    which=st.integers(0, 1),
    edits=st.lists(
        st.tuples(
            st.sampled_from(["flip", "truncate", "zero", "append"]),
            st.floats(0, 1),
            st.integers(1, 64),
        ),
        min_size=1,
        max_size=4,
    ),
)
@example(which=0, edits=[("truncate", 0.5, 1)])
@example(which=1, edits=[("flip", 0.999, 8)])  # the footer
def test_corrupt_parquet_bytes(tmp_path, capfd, inputs, which, edits):
    ws = Workspace(tmp_path / "ws", inputs["parquet"])
    day = ws.day_files("parquet")[which]
    data = bytearray(day.read_bytes())
    for op, where, size in edits:
        at = min(int(where * len(data)), max(len(data) - 1, 0))
        if op == "flip":
            for i in range(at, min(at + size, len(data))):
                data[i] ^= 0xA5
        elif op == "truncate":
            del data[at:]
        elif op == "zero":
            data[at : at + size] = bytes(len(data[at : at + size]))
        else:
            data += bytes(range(size))
    day.write_bytes(bytes(data))
    run_on(ws, capfd, "parquet", *BOUNDS)


COLUMNS = ["TRANSACTION_ID", "TX_DATETIME", "CUSTOMER_ID", "TERMINAL_ID", "TX_AMOUNT", "EXTRA"]
CELLS = {
    "int": st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    "small": st.one_of(st.none(), st.integers(-3, 12)),
    "float": st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    "text": st.one_of(st.none(), st.text(max_size=12)),
    "time": st.one_of(st.none(), st.integers(0, 400_000_000_000_000)),  # microseconds
}
ARROW = {
    "int": pa.int64(),
    "small": pa.int64(),
    "float": pa.float64(),
    "text": pa.string(),
    "time": pa.timestamp("us"),
}


@st.composite
def odd_tables(draw) -> pa.Table:
    """Valid Parquet with a schema or values the job may not expect: missing, extra or
    retyped columns, nulls, NaN, infinities, huge ids, far-away timestamps."""
    names = draw(st.lists(st.sampled_from(COLUMNS), min_size=1, max_size=6, unique=True))
    rows = draw(st.integers(0, 8))
    columns = {}
    for name in names:
        kind = draw(st.sampled_from(sorted(CELLS)))
        values = draw(st.lists(CELLS[kind], min_size=rows, max_size=rows))
        columns[name] = pa.array(values, type=ARROW[kind])
    return pa.table(columns)


@FUZZ
@given(table=odd_tables(), which=st.integers(0, 1))
def test_parquet_with_odd_schema_or_values(tmp_path, capfd, inputs, table, which):
    ws = Workspace(tmp_path / "ws", inputs["parquet"])
    pq.write_table(table, ws.day_files("parquet")[which])
    run_on(ws, capfd, "parquet", *BOUNDS, "--max-rejected-fraction", "1")


# --- random YAML specs ------------------------------------------------------------------------

FIELDS = [
    "name",
    "metrics",
    "noise",
    "budget",
    "epsilon",
    "delta",
    "bounds",
    "min_value",
    "max_value",
    "max_partitions_contributed",
    "partition_selection",
    "public_partitions",
    "pre_threshold",
    "queries",
    "filter",
    "partition_by",
    "input",
    "start_date",
    "value",
    "confidence_intervals",
    "window_days",
    "budget_weight",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=15),
    st.sampled_from(
        ["count", "sum", "mean", "percentile(50)", "TERMINAL_ID", "day", "1..5", "2026-02-30"]
    ),
    st.sampled_from(["TERMINAL_ID in (1, 2", "TX_AMOUNT > 1e5", "TERMINAL_ID = 1 or X = 2"]),
)
SPEC_DATA = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(FIELDS), inner, max_size=5),
    ),
    max_leaves=25,
)
YAML_FRAGMENTS = [
    "&a ",
    "*a",
    "<<: *a\n",
    "!!binary x\n",
    "!!python/object:os.system\n",
    "!!timestamp 2026-02-30\n",
    "!!int 0x",
    "!!map ",
    "!!bool ",
    "!!set ",
    "\t",
    "- ",
    ": ",
    "{",
    "[",
    "'",
    '"',
    "\n  ",
    "budget:\n",
    "budget: {epsilon: 1}\n",
    "%YAML 1.1\n",
    "---\n",
    "? ",
]


@st.composite
def yaml_texts(draw) -> bytes:
    data = draw(st.dictionaries(st.sampled_from(FIELDS), SPEC_DATA, max_size=6))
    text = yaml.safe_dump(data, allow_unicode=draw(st.booleans()))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(YAML_FRAGMENTS)) + text[at:]
    return text.encode("utf-8", "surrogatepass")


BOMB = b"".join(
    [b"a: &a [x,x,x,x,x,x,x,x,x]\n"]
    + [
        f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n".encode()
        for i in range(9)
    ]
)


@FUZZ
@given(text=yaml_texts(), command=st.sampled_from(["plan", "run"]))
@example(text=BOMB, command="plan")
@example(text=b"budget: {epsilon: 1}\nbudget: {epsilon: 2}\n", command="run")
@example(text=b"name: " + b"A" * 1_000_000 + b"\n", command="plan")
@example(text=b"x" * (MAX_SPEC_BYTES + 1), command="plan")
@example(text=b"!!int 0x{}\n", command="plan")  # found by this test: a ValueError from PyYAML
@example(text=b"budget: !!map [a]\n", command="plan")
def test_random_yaml_spec(tmp_path, capfd, inputs, text, command):
    ws = Workspace(tmp_path / "ws", inputs["parquet"] if command == "run" else None)
    config = ws.root / "job.yaml"
    config.write_bytes(text)
    if command == "plan":
        code, out, err = call_cli(capfd, ["plan", "--config", str(config)])
    else:
        code, out, err = call_cli(capfd, ws.run_args("parquet", "--config", str(config)))
    check_outcome(ws, command, code, out, err)
    assert all(len(line) <= 2100 for line in err.splitlines()), "an error line too long"


def test_the_bomb_is_what_the_issue_describes():
    """Ten levels of nine aliases: billions of values from a few hundred bytes."""
    assert len(BOMB) < 350
    assert yaml.compose(io.StringIO(BOMB.decode())) is not None  # valid YAML, cheap to compose
