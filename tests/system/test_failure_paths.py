"""Issue 32's failure paths (items 5-9): what can be checked before reading is checked before
the ledger charges anything, every known cause is one line with its documented exit code, the
API raises its typed errors without quoting a cell, long CSV fields are read, and a run
neither writes a local `s3:` folder nor deletes a folder it did not create.

Every run here is a real `dppipeline` process (or the real API) on the small generated input;
the ledger is a real SQLite file read back after the run.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from support.cli import run_cli

from dppipeline.cli.main import main
from dppipeline.engines.beam.engine import BeamEngine
from dppipeline.lifecycle.runner import run_job
from dppipeline.spec.model import build_spec

BOUNDS = ["--min-value", "0", "--max-value", "100", "--max-partitions-contributed", "1",
          "--max-contributions-per-partition", "1"]  # fmt: skip
CHARGED = {"reading", "failed", "committed"}


def one_line(result: subprocess.CompletedProcess[str], exit_code: int, *words: str) -> str:
    """The run failed with `exit_code` and one error line (progress lines start with `[`)
    holding each of `words`; no traceback."""
    assert result.returncode == exit_code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [
        line for line in result.stderr.splitlines() if line.strip() and not line.startswith("[")
    ]
    assert len(errors) == 1, result.stderr[-3000:]
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def ledger_states(ledger: Path) -> list[str]:
    if not ledger.exists():
        return []
    with sqlite3.connect(ledger) as db:
        return [row[0] for row in db.execute("SELECT state FROM releases")]


# --------------------------------------------------------------------- 6c: secrets in any URI


@pytest.mark.parametrize("flag", ["--quarantine", "--config"])
def test_credentials_in_any_uri_flag_are_refused_in_one_line(tmp_path, small_inputs, flag):
    """`--quarantine` and `--config` refuse a URI with credentials as `--input` does: exit 2,
    one line naming the flag and the rule, the secret never printed, nothing recorded."""
    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
    ledger = tmp_path / "ledger.sqlite"
    result = run_cli(
        "run", "--input", small_inputs["parquet"], "--output", tmp_path / "out", *BOUNDS,
        "--ledger", f"sqlite:///{ledger}", flag, f"s3://AKIAEXAMPLE:{secret}@bank/x",
    )  # fmt: skip
    one_line(result, 2, flag, "s3://bank/x", "credentials in a URI are refused")
    assert secret not in result.stderr + result.stdout
    assert not (tmp_path / "out").exists()
    assert ledger_states(ledger) == []


# ------------------------------------------------ 9d: publication deletes only what it made


def test_a_run_keeps_a_users_folder_named_like_a_staging_folder(tmp_path, small_inputs):
    """A folder `.out.staging-<run id>` that no run made (a user's, with a file in it) is left
    as it is by the next run to `out`, which publishes its own release beside it."""
    users = tmp_path / ".out.staging-20260102T000000Z-bbbbbbbb"
    users.mkdir()
    (users / "notes.txt").write_text("the user's")
    result = run_cli(
        "run", "--input", small_inputs["parquet"], "--output", tmp_path / "out", *BOUNDS,
        "--ledger", f"sqlite:///{tmp_path / 'ledger.sqlite'}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (users / "notes.txt").read_text() == "the user's"
    assert (tmp_path / "out" / "manifest.json").is_file()
    assert f"left {users.name} alone" in result.stderr


# -------------------------------------------------------------- 9b: a scope's length is bounded


@pytest.mark.parametrize("how", ["--scope", "set-cap"])
def test_a_scope_longer_than_200_characters_is_a_spec_error(tmp_path, small_inputs, how):
    """A 1M-character scope was accepted and echoed on every `[ledger]` line: now a usage
    error (exit 2) naming the field and the limit, the scope itself never echoed whole."""
    from dppipeline.spec.limits import MAX_SCOPE_CHARS

    ledger = tmp_path / "ledger.sqlite"
    scope = "s" * 100_000  # one argument may hold at most 128 kB
    if how == "--scope":
        result = run_cli(
            "run", "--input", small_inputs["parquet"], "--output", tmp_path / "out", *BOUNDS,
            "--ledger", f"sqlite:///{ledger}", "--scope", scope,
        )  # fmt: skip
        line = one_line(result, 2, "--scope (budget.scope)", f"at most {MAX_SCOPE_CHARS}")
    else:
        result = run_cli("budget", "set-cap", scope, "--epsilon", "1",
                         "--ledger", f"sqlite:///{ledger}")  # fmt: skip
        line = one_line(result, 2, "scope", f"at most {MAX_SCOPE_CHARS}")
    assert len(line) < 500
    assert ledger_states(ledger) == []
    assert not (tmp_path / "out").exists()
    at_limit = build_scope("s" * MAX_SCOPE_CHARS)
    assert at_limit == "s" * MAX_SCOPE_CHARS


def build_scope(scope: str) -> str | None:
    from dppipeline.spec.model import build_spec

    return build_spec({}, {"budget.scope": scope, "metrics": ["count"]}).budget.scope


# ------------------------------------------------------- 9a: generate writes to a URI's store


def test_generate_to_a_store_uri_writes_there_and_no_local_folder(s3, tmp_path):
    """`generate --output s3://bank/gen --format csv` wrote a local folder `./s3:/bank/gen`
    and exited 0. The files now go to the bucket (the same bytes as a local run's), and
    nothing is made in the working folder."""
    bucket = s3.new_bucket("gen-bank")
    flags = ["--format", "csv", "--days", "2", "--tx-per-day", "40", "--customers", "20",
             "--terminals", "5"]  # fmt: skip
    result = run_cli("generate", "--output", f"{bucket}/gen", *flags, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.listdir(tmp_path) == []
    assert run_cli("generate", "--output", tmp_path / "local", *flags).returncode == 0
    local = sorted(p.name for p in (tmp_path / "local").iterdir())
    assert s3.keys(f"{bucket}/gen") == local == ["2026-01-01.csv", "2026-01-02.csv"]
    for name in local:
        assert s3.read(f"{bucket}/gen/{name}") == (tmp_path / "local" / name).read_bytes()


def test_generate_to_an_unknown_scheme_is_refused_in_one_line(tmp_path):
    result = run_cli("generate", "--output", "ftp://bank/gen", "--days", "1", cwd=tmp_path)
    one_line(result, 2, "ftp://bank/gen", "unknown storage scheme")
    assert os.listdir(tmp_path) == []


# ------------------------------------- 5: what can be checked before reading charges nothing


def without_root_override() -> list[str]:
    """A command prefix under which file modes hold (root drops CAP_DAC_OVERRIDE)."""
    import shutil

    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: file modes cannot be enforced")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


def run_as_user(*args: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DPPIPELINE_DEBUG"}
    argv = [*without_root_override(), sys.executable, "-m", "dppipeline", *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300,
                          check=False)  # fmt: skip


def test_an_unwritable_quarantine_fails_before_reading_and_charges_nothing(tmp_path, small_inputs):
    """The quarantine folder was found unwritable only when a rejected row was written,
    after reading: the run was charged. Now a probe fails first: exit 1, one line naming
    the quarantine and the rule; no ledger row, no release."""
    quarantine = tmp_path / "ops" / "quarantine"
    quarantine.mkdir(parents=True)
    quarantine.chmod(0o555)
    ledger = tmp_path / "ledger.sqlite"
    try:
        result = run_as_user(
            "run", "--input", small_inputs["parquet"], "--output", tmp_path / "out", *BOUNDS,
            "--ledger", f"sqlite:///{ledger}", "--quarantine", quarantine,
        )  # fmt: skip
    finally:
        quarantine.chmod(0o755)
    one_line(result, 1, f"quarantine {quarantine}", "Permission denied (EACCES)",
             "before reading")  # fmt: skip
    assert not set(ledger_states(ledger)) & CHARGED
    assert not (tmp_path / "out").exists()
    assert list(quarantine.iterdir()) == []


@pytest.mark.slow
def test_an_output_under_a_read_only_folder_charges_nothing(tmp_path, small_inputs):
    parent = tmp_path / "read-only"
    parent.mkdir()
    parent.chmod(0o555)
    ledger = tmp_path / "ledger.sqlite"
    try:
        result = run_as_user(
            "run", "--input", small_inputs["parquet"], "--output", parent / "out", *BOUNDS,
            "--ledger", f"sqlite:///{ledger}",
        )  # fmt: skip
    finally:
        parent.chmod(0o755)
    one_line(result, 1, str(parent), "Permission denied (EACCES)")
    assert not set(ledger_states(ledger)) & CHARGED
    assert list(parent.iterdir()) == []


@pytest.mark.parametrize("where", ["output", "quarantine"])
def test_a_missing_bucket_fails_before_reading_and_charges_nothing(
    s3, tmp_path, small_inputs, where
):
    """A missing output bucket (or quarantine bucket) was found when the release was
    uploaded, after reading: charged. Now: exit 1, one line naming the location, before
    reading; no ledger row charged, nothing written."""
    bucket = s3.new_bucket(f"present-{where}")
    output = f"{bucket}/out" if where == "quarantine" else "s3://no-such-bucket/out"
    quarantine = "s3://no-such-bucket/q" if where == "quarantine" else f"{bucket}/q"
    ledger = tmp_path / "ledger.sqlite"
    result = run_cli(
        "run", "--input", small_inputs["parquet"], "--output", output, *BOUNDS,
        "--ledger", f"sqlite:///{ledger}", "--quarantine", quarantine,
    )  # fmt: skip
    named = output if where == "output" else quarantine
    one_line(result, 1, f"{where} {named}", "before reading")
    assert "reading" not in [line.split("] ")[0] for line in result.stderr.splitlines()]
    assert not set(ledger_states(ledger)) & CHARGED
    assert s3.keys(bucket) == []


# ------------------------------------------------------ 6b: SIGTERM inside a Beam DoFn -> 143

BEAM_SIGTERM = """
import os, signal, sys
import apache_beam as beam
from dppipeline.cli import main as cli
from dppipeline.engines.beam import engine as beam_engine

build = beam_engine.BeamEngine._build

def _build(self, pipeline, job, **kwargs):  # one more step: SIGTERM sent from inside a DoFn
    build(self, pipeline, job, **kwargs)
    _ = (pipeline | "stop" >> beam.Create([0])
         | beam.Map(lambda _: os.kill(os.getpid(), signal.SIGTERM)))

beam_engine.BeamEngine._build = _build
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.beam
def test_sigterm_inside_a_beam_step_exits_143(tmp_path, small_inputs):
    """Airflow stops a task with SIGTERM. Raised inside a Beam DoFn, it came out as Beam's
    RuntimeError (exit 70, 'internal error'): now `terminated`, exit 143, no traceback, the
    run charged (it was reading) and nothing left beside the output."""
    ledger = tmp_path / "ledger.sqlite"
    env = {k: v for k, v in os.environ.items() if k != "DPPIPELINE_DEBUG"}
    result = subprocess.run(
        [sys.executable, "-c", BEAM_SIGTERM, "run", "--engine", "beam",
         "--input", str(small_inputs["parquet"]), "--output", str(tmp_path / "out" / "release"),
         *BOUNDS, "--ledger", f"sqlite:///{ledger}"],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 143, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "internal error" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "dppipeline run: terminated"
    assert ledger_states(ledger) == ["failed"]
    assert os.listdir(tmp_path / "out") == []


# ------------------------------------- 6a: a page Spark decodes lazily fails naming its file


def ids_past_the_dictionary(path: Path, column: str = "CUSTOMER_ID") -> None:
    """`path` rewritten uncompressed, then four of `column`'s dictionary ids in its data page
    set to all ones: past the dictionary (its size is not a power of two), the page's
    structure intact. Spark decodes the ids lazily, after its read that names a file."""
    table = pq.read_table(path)
    distinct = pc.count_distinct(table.column(column)).as_py()
    assert distinct & (distinct - 1), distinct  # not a power of two: all ones is past the end
    pq.write_table(table, path, compression="none")
    group = pq.read_metadata(path).row_group(0)
    chunk = next(
        group.column(i) for i in range(group.num_columns)
        if group.column(i).path_in_schema == column
    )  # fmt: skip
    end = chunk.dictionary_page_offset + chunk.total_compressed_size  # the data page's end
    data = bytearray(path.read_bytes())
    data[end - 40 : end - 36] = b"\xff" * 4  # bit-packed ids, before the last group's padding
    path.write_bytes(bytes(data))


def test_a_page_with_ids_past_its_dictionary_fails_naming_the_file(
    tmp_path, small_inputs, engine, capsys, recwarn, monkeypatch
):
    """Spark exited 70 with `ArrayIndexOutOfBoundsException` and no file; local and Beam
    exit 1 naming it. Every engine now: exit 1, one line naming the file and `cannot read as
    parquet`, no traceback (nor PySpark's warning quoting the Java trace), and the run
    charged as failed after reading, as local charges it."""
    monkeypatch.delenv("DPPIPELINE_DEBUG", raising=False)
    root = tmp_path / "in"
    shutil.copytree(small_inputs["parquet"], root)
    path = sorted(root.glob("date=*/*.parquet"))[1]
    ids_past_the_dictionary(path)
    ledger = tmp_path / "ledger.sqlite"
    code = main(
        ["run", "--engine", engine, "--input", str(root), "--output", str(tmp_path / "out"),
         *BOUNDS, "--ledger", f"sqlite:///{ledger}"]
    )  # fmt: skip
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.strip() and not line.startswith("[")]
    assert code == 1, err[-3000:]
    assert "Traceback" not in err
    assert len(errors) == 1, err[-3000:]
    assert errors[0].startswith(f"dppipeline run: error: {path}: cannot read as parquet: ")
    assert not [w for w in recwarn if "toPandas" in str(w.message)]
    assert ledger_states(ledger) == ["failed"]
    assert not (tmp_path / "out").exists()


# ------------------------- 9c: the day-folder rule holds whether or not a query reads the time

OFF_DAY = "TX_DATETIME is not on its daily partition's day (UTC)"
READS_TIME = {
    "queries": [
        {"name": "terminal_stats", "partition_by": ["TERMINAL_ID"], "metrics": ["count", "sum"],
         "value": "TX_AMOUNT", "filter": "TX_DATETIME >= '2000-01-01 00:00:00'"}
    ]
}  # fmt: skip


def engine_object(name: str):
    if name == "beam":
        return BeamEngine(unit_shards=2, partition_shards=2)
    return name  # Spark: the session the `engine` fixture started


@pytest.mark.parametrize("job", ["no time column", "a time filter"])
def test_a_row_dated_outside_its_day_folder_is_rejected_whatever_the_job_reads(
    tmp_path, small_inputs, engine, job
):
    """A row dated the day before its `date=` folder was read and released, charged to the
    wrong window, when no query named the time column (the column was pruned, and the rule
    with it). With layout daily every engine reads the time column and rejects the row, as
    it does for a job that reads the column: counted, and quarantined with its reason."""
    root = tmp_path / "in"
    shutil.copytree(small_inputs["parquet"], root)
    path = sorted(root.glob("date=*/*.parquet"))[1]
    table = pq.read_table(path)
    times = table.column("TX_DATETIME").to_pylist()
    times[4] -= dt.timedelta(days=1)  # row 5: the day before its folder's
    column = pa.array(times, table.schema.field("TX_DATETIME").type)
    pq.write_table(
        table.set_column(table.schema.get_field_index("TX_DATETIME"), "TX_DATETIME", column), path
    )
    rows = sum(pq.read_metadata(p).num_rows for p in root.glob("date=*/*.parquet"))
    values = {
        "input.path": str(root), "input.format": "parquet", "input.max_rejected_fraction": 0.01,
        "output": str(tmp_path / "out"), "budget.epsilon": 1e7,
        "bounds.min_value": 0.0, "bounds.max_value": 100.0,
        "bounds.max_partitions_contributed": 1, "bounds.max_contributions_per_partition": 1,
    }  # fmt: skip
    spec = build_spec(READS_TIME if job == "a time filter" else {}, values)
    said: list[str] = []
    result = run_job(spec, engine_object(engine), echo=said.append)
    assert any(f"] read {rows:,} rows; rejected 1 (kept aside in " in line for line in said), said
    quarantine = Path(os.environ["DPPIPELINE_STATE_DIR"]) / "quarantine" / result.run_id
    rejected = pd.read_parquet(quarantine / "rejected.parquet")
    found = rejected[["_source_file", "_row", "_reason"]].to_numpy().tolist()
    assert found == [[str(path), 5, OFF_DAY]]


# ------------------------------------------------------- 8: CSV fields of any length are read


def with_long_note(source: Path, target: Path, length: int) -> Path:
    """The CSV input copied with one more column, NOTE, that the job does not read: a quoted
    field of `length` characters (a comma and a line break inside) on the first row of each
    file, empty elsewhere."""
    target.mkdir()
    for path in sorted(source.glob("*.csv")):
        header, *rows = path.read_text().splitlines()
        note = '"' + "n" * (length // 2) + ",\n" + "n" * (length - length // 2 - 2) + '"'
        lines = [f"{header},NOTE", f"{rows[0]},{note}", *(f"{row}," for row in rows[1:])]
        (target / path.name).write_text("\n".join(lines) + "\n")
    return target


@pytest.mark.slow
def test_a_quoted_csv_field_longer_than_131072_characters_is_read(tmp_path, small_inputs):
    """Python's csv module refuses a field over 131,072 characters by default: a valid file
    was reported as a 'malformed quoted field' (and the run charged). Now the records are the
    same as without the long field, and the CLI's release reads every row."""
    from dppipeline.inputs.csv_records import read_csv_records
    from dppipeline.spec.schema import load_schema

    long = with_long_note(small_inputs["csv"], tmp_path / "long", 300_000)
    short = with_long_note(small_inputs["csv"], tmp_path / "short", 10)
    schema = load_schema("transactions")
    for path in sorted(long.glob("*.csv")):
        got = read_csv_records(path.read_bytes(), str(path), schema)
        want = read_csv_records((short / path.name).read_bytes(), str(path), schema)
        assert got.equals(want)
        assert got.height > 100
    ledger = tmp_path / "ledger.sqlite"
    result = run_cli(
        "run", "--input", long, "--format", "csv", "--output", tmp_path / "out", *BOUNDS,
        "--ledger", f"sqlite:///{ledger}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rejected 0" in result.stderr
    assert ledger_states(ledger) == ["committed"]


# ------------------------------------------- 7: the API's errors are typed and quote no cell

SECRET_CELL = "Alice Smith 4111111111111111"


def _mixed(frame):
    frame["TX_AMOUNT"] = frame["TX_AMOUNT"].astype(object)
    frame.loc[3, "TX_AMOUNT"] = SECRET_CELL
    return frame, "TX_AMOUNT", "more than one type"


def _twice(frame):
    frame.columns = [*frame.columns[:-1], "TERMINAL_ID"]  # TX_AMOUNT renamed: a second one
    return frame, "TERMINAL_ID", "appears twice"


def _huge(frame):
    frame["CUSTOMER_ID"] = frame["CUSTOMER_ID"].astype(object)
    frame.loc[2, "CUSTOMER_ID"] = 2**70
    return frame, "CUSTOMER_ID", "64-bit"


@pytest.mark.parametrize("damage", [_mixed, _twice, _huge], ids=["mixed", "twice", "2**70"])
def test_the_api_raises_input_error_naming_the_column_not_the_value(tmp_path, small_inputs, damage):
    """pyarrow's ArrowInvalid quoted the cell ('Could not convert 'Alice Smith ...''),
    duplicate names raised a plain ValueError and 2**70 an OverflowError. Now each is the
    documented InputError naming the column and the rule, and nothing is charged."""
    import pandas as pd

    import dppipeline

    frame = pd.read_parquet(small_inputs["parquet"]).drop(columns=["date"])
    frame = frame[["TRANSACTION_ID", "TX_DATETIME", "CUSTOMER_ID", "TERMINAL_ID", "TX_AMOUNT"]]
    frame, column, rule = damage(frame.copy())
    job = {"bounds": {"min_value": 0, "max_value": 100, "max_partitions_contributed": 1,
                      "max_contributions_per_partition": 1}}  # fmt: skip
    ledger = tmp_path / "ledger.sqlite"
    with pytest.raises(dppipeline.InputError) as caught:
        dppipeline.release(job, frame, ledger=f"sqlite:///{ledger}", scope="api-frames")
    message = str(caught.value)
    assert f"column {column!r}" in message and rule in message, message
    assert SECRET_CELL not in message and "4111" not in message and str(2**70) not in message
    assert not set(ledger_states(ledger)) & CHARGED
