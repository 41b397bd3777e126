"""The same data is charged in one scope only: content fingerprints of input files
(`inputs/fingerprints.py`) and the ledger's rule on them (`charged_files`, schema v4).

A scope is a name (the input folder's, or `budget.scope`); these tests copy, link and rename
the data a scope has charged, name it by another scope, change one day of it, read it with
another layout, and check that the ledger refuses it in the second scope before any data is
read, on SQLite and on a real PostgreSQL server, while reruns in the same scope and another
privacy unit on the same files go on as before. Real components only: generated Parquet and
CSV, the local engine, pyarrow.fs on local disk and on an S3 server (moto).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from support.data import DAYS, SMALL, job_spec, quiet

from dppipeline.errors import BudgetExceededError
from dppipeline.inputs.files import discover_files, discover_partitions
from dppipeline.inputs.fingerprints import (
    EDGE,
    FileContent,
    file_fingerprint,
    footer_rows,
    input_contents,
)
from dppipeline.ledger import (
    SCHEMA_VERSION,
    BudgetPolicy,
    InputContent,
    Ledger,
    LedgerError,
    ReleaseKey,
    parse_ledger_url,
)
from dppipeline.ledger import tables as ledger_tables
from dppipeline.lifecycle.runner import check_budget, release_key, run_job

TX = "tx/CUSTOMER_ID"


@pytest.fixture
def tx(tmp_path, small_inputs) -> tuple[Path, Path]:
    """A copy of the small Parquet input named `tx` (scope tx/CUSTOMER_ID) and a key list."""
    folder = tmp_path / "tx"
    shutil.copytree(small_inputs["parquet"], folder)
    keys = tmp_path / "keys" / "terminals.csv"
    keys.parent.mkdir()
    keys.write_text("TERMINAL_ID\n" + "".join(f"{k}\n" for k in range(SMALL["terminals"])))
    return folder, keys


def contents(root: Path | str, fmt: str = "parquet") -> list[str | None]:
    days = discover_partitions(root, fmt)
    return [f.fingerprint for f in input_contents(days, root, fmt)]


def charged(url: str) -> list[tuple[str, str, str | None, str]]:
    """(scope, privacy unit, day, file) of every recorded file, in insertion order."""
    engine = sa.create_engine(parse_ledger_url(url).url)
    c, r = ledger_tables.charged_files, ledger_tables.releases
    query = (
        sa.select(r.c.scope, c.c.privacy_unit, c.c.day, c.c.file)
        .join_from(c, r, r.c.run_id == c.c.run_id)
        .order_by(c.c.id)
    )
    with engine.connect() as conn:
        found = [tuple(row) for row in conn.execute(query)]
    engine.dispose()
    return found


def rewrite_without_a_row(path: Path) -> None:
    """One day corrected: the same file with its first row removed."""
    table = pq.read_table(path)
    pq.write_table(table.slice(1), path)


# --------------------------------------------------------------------------- fingerprints


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_a_copied_linked_or_renamed_input_has_the_same_fingerprints(tmp_path, small_inputs, fmt):
    """Paths, folder and file names, symbolic links and modification times do not count."""
    source = small_inputs[fmt]
    original = contents(source, fmt)
    assert len(original) == SMALL["days"] and all(original)
    assert len(set(original)) == len(original)  # three days, three fingerprints

    copy = tmp_path / "elsewhere" / "card-data"
    shutil.copytree(source, copy)
    for path in copy.rglob("*"):
        os.utime(path, (1e9, 1e9))  # other times
    assert contents(copy, fmt) == original

    links = tmp_path / "links"
    links.mkdir()
    for entry in sorted(Path(source).iterdir()):
        (links / entry.name).symlink_to(entry.resolve())
    assert contents(links, fmt) == original

    if fmt == "parquet":  # part files renamed inside their day
        for part in copy.rglob("*.parquet"):
            part.rename(part.with_name("renamed-" + part.name))
        assert contents(copy, fmt) == original


def test_a_changed_file_has_another_fingerprint(tmp_path, small_inputs):
    parquet = tmp_path / "p"
    shutil.copytree(small_inputs["parquet"], parquet)
    before = contents(parquet)
    rewrite_without_a_row(next((parquet / f"date={DAYS[1]}").glob("*.parquet")))
    after = contents(parquet)
    assert after[0] == before[0] and after[2] == before[2]
    assert after[1] != before[1]

    csv = tmp_path / "c"
    shutil.copytree(small_inputs["csv"], csv)
    before = contents(csv, "csv")
    day = csv / f"{DAYS[2]}.csv"
    lines = day.read_text().splitlines(keepends=True)
    day.write_text("".join(lines[:1] + lines[2:]))  # one row fewer
    after = contents(csv, "csv")
    assert after[:2] == before[:2] and after[2] != before[2]


def test_fingerprints_read_no_parquet_data_page(tmp_path, small_inputs):
    """The fingerprint is the size and the footer: zeroing every byte between the header and
    the footer (all data pages) leaves it as it was, and it still computes."""
    source = next(Path(small_inputs["parquet"]).rglob("*.parquet"))
    path = tmp_path / "part.parquet"
    shutil.copy(source, path)
    before = file_fingerprint(path, "parquet")
    data = bytearray(path.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    data[4:-footer] = bytes(len(data) - 4 - footer)
    path.write_bytes(bytes(data))
    with pytest.raises(OSError):  # the pages are really gone
        pq.read_table(path)
    assert file_fingerprint(path, "parquet") == before


def test_a_large_csv_is_identified_by_its_size_and_ends(tmp_path):
    """Beyond 2 x 64 KiB a CSV is read at its ends only: a changed first or last line or a
    changed size is another fingerprint; a same-size change in the middle is not (it errs
    toward refusing a release, never toward a second cap)."""
    header = "TRANSACTION_ID,TX_DATETIME,CUSTOMER_ID,TERMINAL_ID,TX_AMOUNT\n"
    rows = [f"{i},2026-01-01 00:00:00,{i % 97},{i % 13},{i % 50}.25\n" for i in range(9000)]
    text = header + "".join(rows)
    assert len(text) > 3 * EDGE
    path = tmp_path / "2026-01-01.csv"
    path.write_text(text)
    base = file_fingerprint(path, "csv")
    middle = len(text) // 2
    path.write_text(text[:middle] + ("7" if text[middle] != "7" else "8") + text[middle + 1 :])
    assert file_fingerprint(path, "csv") == base
    for changed in (text.replace("0,2026", "1,2026", 1), text + rows[0], text[:-6] + "9.25\n"):
        path.write_text(changed)
        assert file_fingerprint(path, "csv") != base


def test_files_without_rows_have_no_fingerprint(tmp_path):
    """An empty day holds no one's data and looks alike in every dataset: not recorded."""
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"a": pa.array([], pa.int64())}), empty)
    assert file_fingerprint(empty, "parquet") is None
    header = tmp_path / "2026-01-01.csv"
    header.write_text("TRANSACTION_ID,TX_AMOUNT\n\n")
    assert file_fingerprint(header, "csv") is None
    one = tmp_path / "one.parquet"
    pq.write_table(pa.table({"a": [1]}), one)
    assert file_fingerprint(one, "parquet") is not None


def test_the_footer_row_count_is_pyarrows(tmp_path, small_inputs):
    """`footer_rows` reads num_rows from the Thrift bytes; pyarrow's parser is the truth, on
    footers with nested, map and boolean columns, many row groups, a page index, no
    statistics, 400 columns, and none."""
    table = pa.table(
        {
            "b": [True, False, None] * 1000,
            "m": pa.array([[("k", 1)]] * 3000, pa.map_(pa.string(), pa.int64())),
            "l": [[1, 2]] * 3000,
            "s": [{"x": 1, "y": "z"}] * 3000,
        }
    )
    files = list(Path(small_inputs["parquet"]).rglob("*.parquet"))
    for name, kwargs in {
        "groups": {"row_group_size": 700, "write_page_index": True},
        "plain": {"write_statistics": False, "compression": "zstd", "version": "1.0"},
    }.items():
        pq.write_table(table, tmp_path / f"{name}.parquet", **kwargs)
        files.append(tmp_path / f"{name}.parquet")
    pq.write_table(pa.table({f"c{i}": list(range(10)) for i in range(400)}), tmp_path / "w.parquet")
    pq.write_table(pa.table({"a": pa.array([], pa.int64())}), tmp_path / "e.parquet")
    files += [tmp_path / "w.parquet", tmp_path / "e.parquet"]
    for path in files:
        data = path.read_bytes()
        length = int.from_bytes(data[-8:-4], "little")
        assert footer_rows(data[-8 - length : -8]) == pq.read_metadata(path).num_rows, path


def test_fingerprints_on_a_store_equal_the_local_ones(s3, small_inputs):
    """Through pyarrow's S3 client (ranged reads at the ends of objects): the same values."""
    bucket = s3.new_bucket("fingerprints")
    s3.upload(small_inputs["parquet"], f"{bucket}/somewhere/tx")
    s3.upload(small_inputs["csv"], f"{bucket}/csv")
    assert contents(f"{bucket}/somewhere/tx") == contents(small_inputs["parquet"])
    assert contents(f"{bucket}/csv", "csv") == contents(small_inputs["csv"], "csv")


def test_fingerprints_through_the_spark_engines_file_systems(spark, small_inputs):
    """With the Spark engine every remote location goes through Hadoop's FileSystem API, a
    context variable the fingerprinting threads must see: on `viewfs://` (which pyarrow
    cannot open), mounted on the local input, the same values."""
    import uuid

    from dppipeline.engines.spark.hadoop_fs import hadoop_resolver
    from dppipeline.storage import remote_filesystems

    cluster = f"fp{uuid.uuid4().hex[:8]}"
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    conf.set(f"fs.viewfs.mounttable.{cluster}.link./tx", f"file://{small_inputs['parquet']}")
    with remote_filesystems(hadoop_resolver(lambda: spark)):
        assert contents(f"viewfs://{cluster}/tx") == contents(small_inputs["parquet"])


# --------------------------------------------------------------------------- the ledger's rule


def content(*fingerprints: str, unit: str = "CUSTOMER_ID") -> InputContent:
    return InputContent(
        unit,
        tuple(
            FileContent(DAYS[0] + dt.timedelta(days=n), f"day-{n}.parquet", fp)
            for n, fp in enumerate(fingerprints)
        ),
    )


def key(scope: str, run_id: str, data: InputContent | None) -> ReleaseKey:
    return ReleaseKey(scope, run_id, "input", DAYS[0], DAYS[-1], content=data)


def reserve(ledger: Ledger, run_id: str, scope: str, data: InputContent | None) -> None:
    ledger.reserve(
        key(scope, run_id, data),
        run_id=run_id,
        job="job",
        epsilon=0.5,
        delta=0.0,
        output="/nowhere",
        policy=BudgetPolicy(),
    )


def check(ledger: Ledger, scope: str, data: InputContent | None) -> BudgetPolicy:
    return ledger.check(key(scope, "check", data), epsilon=0.5, delta=0.0, policy=BudgetPolicy())


def test_files_charged_in_one_scope_are_refused_in_another(ledger_url):
    """Any file charged (not aborted) for the same privacy unit in another scope refuses the
    whole reservation, and `check` says so without writing; the same scope, another privacy
    unit, other files and an aborted reservation's files do not."""
    ledger = Ledger(ledger_url)
    reserve(ledger, "a1", TX, content("f1", "f2"))
    ledger.mark_reading("a1")
    ledger.fail("a1")  # failed after reading: still charged
    refused = content("f0", "f2", "f1")
    for attempt in (lambda: check(ledger, "card/CUSTOMER_ID", refused),
                    lambda: reserve(ledger, "b1", "card/CUSTOMER_ID", refused)):  # fmt: skip
        with pytest.raises(BudgetExceededError) as error:
            attempt()
        assert str(error.value) == (
            f"the input's day {DAYS[1]} (day-1.parquet) and 1 more of its files were already "
            f"charged in scope '{TX}' (run a1, privacy unit CUSTOMER_ID); the same data stays "
            f"in that scope: run with --scope {TX} (budget.scope)"
        )
    assert ledger.row("b1") is None
    assert "card/CUSTOMER_ID" not in ledger.scopes()  # the refused scope was not created

    reserve(ledger, "a2", TX, content("f1", "f2", "f3"))  # the same scope: a later night
    reserve(ledger, "c1", "card/TRANSACTION_ID", content("f1", "f2", unit="TRANSACTION_ID"))
    reserve(ledger, "d1", "other/CUSTOMER_ID", content("f9"))
    reserve(ledger, "m1", "memory/CUSTOMER_ID", None)  # in-memory rows: nothing to compare
    ledger.abort("d1")
    reserve(ledger, "e1", "more/CUSTOMER_ID", content("f9", None))  # f9 was aborted: free
    assert check(ledger, "card/CUSTOMER_ID", content("f7")) == BudgetPolicy()
    with pytest.raises(BudgetExceededError, match="already charged in scope 'more/CUSTOMER_ID'"):
        check(ledger, "card/CUSTOMER_ID", content("f9"))
    data = ledger.scope_data()
    assert data[TX].days == 3 and data[TX].files == 3
    assert (data[TX].first_day, data[TX].last_day) == (DAYS[0], DAYS[2])
    assert "memory/CUSTOMER_ID" not in data and "other/CUSTOMER_ID" not in data


def test_two_scopes_racing_for_the_same_files_queue_on_postgresql(postgres):
    """While one reservation's transaction holds the privacy unit's content lock (between
    its lookup and its insert), another scope's reservation of files for that unit waits,
    boundedly; a reservation for another privacy unit does not."""
    from dppipeline.ledger import content as ledger_content

    url = postgres.new_database()
    Ledger(url).close()
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with Ledger(url) as holder, holder._engine.connect() as conn, conn.begin():
            holder._lock_scope(conn, TX, "2026-01-01T00:00:00.000000+00:00", "holder")
            ledger_content.refuse_content_of_other_scopes(
                conn, key(TX, "x", content("f1")), lock=True
            )
            holding.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(60)
        waiting = Ledger(url, timeout=0.3)
        with pytest.raises(LedgerError, match=r"is locked by another process \(waited 0.3 s"):
            reserve(waiting, "b1", "card/CUSTOMER_ID", content("f1"))
        reserve(waiting, "c1", "card/TRANSACTION_ID", content("f1", unit="TRANSACTION_ID"))
    finally:
        release.set()
        holder.join()
    assert [r.run_id for r in Ledger(url).rows()] == ["c1"]


def test_a_version_3_ledger_is_upgraded_with_its_rows(ledger_url):
    """A ledger stopped at schema v3 (with a release and its events) gains `charged_files`:
    its rows stay, its old release is still charged (its files are unknown: it cannot refuse
    anyone), and new reservations record and compare files."""
    engine = sa.create_engine(parse_ledger_url(ledger_url).url)
    with engine.begin() as conn:
        ledger_tables.migrate(conn, "test", "2026-01-01T00:00:00+00:00", target=3)
        conn.execute(
            sa.text(
                "INSERT INTO releases (run_id, scope, job, spec_hash, input_fingerprint, "
                "start_date, end_date, release_key, epsilon, delta, state, output, "
                "reserved_at, events) VALUES ('old', :scope, 'job', 'h', 'f', '2026-01-01', "
                "'2026-01-03', 'k', 1.0, 0.0, 'committed', '/out', "
                "'2026-01-01T00:00:00+00:00', NULL)"
            ),
            {"scope": TX},
        )
        assert not sa.inspect(conn).has_table("charged_files")
    engine.dispose()

    ledger = Ledger(ledger_url)
    assert ledger.schema_version == SCHEMA_VERSION >= 4
    assert [(r.run_id, r.state, r.epsilon) for r in ledger.rows()] == [("old", "committed", 1.0)]
    assert ledger.spent(TX, BudgetPolicy(), DAYS[0], DAYS[0]) == (1.0, 0.0)
    reserve(ledger, "new", "card/CUSTOMER_ID", content("f1"))  # old files are unknown
    with pytest.raises(BudgetExceededError, match="scope 'card/CUSTOMER_ID' \\(run new"):
        reserve(ledger, "again", TX, content("f1"))
    with ledger._engine.connect() as conn:
        recorded = conn.execute(sa.select(ledger_tables.versions.c.version)).scalars().all()
    assert recorded == list(range(1, SCHEMA_VERSION + 1))
    if ledger_url.startswith("sqlite"):
        path = parse_ledger_url(ledger_url).path
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


# --------------------------------------------------------------------------- runs


def test_a_renamed_copy_of_the_input_is_refused_before_reading(ledger_url, tmp_path, tx):
    """`data/tx` released in tx/CUSTOMER_ID; the same folder copied to `card` (its default
    scope card/CUSTOMER_ID) is refused by `run` and `run --check-budget` before anything is
    read or recorded; with `--scope tx/CUSTOMER_ID` a new release of it is reserved in tx's
    scope."""
    folder, keys = tx
    run_job(job_spec(folder, tmp_path / "a", keys), "local", ledger=ledger_url, echo=quiet)
    copy = tmp_path / "elsewhere" / "card"
    shutil.copytree(folder, copy)
    again = job_spec(copy, tmp_path / "b", keys)
    for attempt in (lambda: check_budget(again, ledger_url, quiet),
                    lambda: run_job(again, "local", ledger=ledger_url, echo=quiet)):  # fmt: skip
        with pytest.raises(BudgetExceededError) as error:
            attempt()
        message = str(error.value)
        assert f"day {DAYS[0]} (date={DAYS[0]}/" in message
        assert "and 2 more of its files were already charged in scope 'tx/CUSTOMER_ID'" in message
        assert message.endswith("run with --scope tx/CUSTOMER_ID (budget.scope)")
    assert [r.scope for r in Ledger(ledger_url).rows()] == [TX]
    assert not (tmp_path / "b").exists()

    in_tx = job_spec(copy, tmp_path / "b", keys, **{"budget.scope": TX})
    run_job(in_tx, "local", ledger=ledger_url, echo=quiet, new_release=True)
    assert [r.scope for r in Ledger(ledger_url).rows()] == [TX, TX]
    assert {scope for scope, *_ in charged(ledger_url)} == {TX}
    assert len(charged(ledger_url)) == 2 * SMALL["days"]


def test_a_copy_with_one_day_changed_is_refused_for_its_unchanged_days(tmp_path, tx):
    """The rule is per file: a copy whose day 2 was corrected is refused while it includes a
    day charged in tx (the message names the first); its changed day alone is new data, and
    from then on belongs to the copy's scope."""
    folder, keys = tx
    url = f"sqlite:///{tmp_path / 'state' / 'ledger.sqlite'}"
    run_job(job_spec(folder, tmp_path / "a", keys), "local", ledger=url, echo=quiet)
    copy = tmp_path / "corrected"
    shutil.copytree(folder, copy)
    rewrite_without_a_row(next((copy / f"date={DAYS[1]}").glob("*.parquet")))
    whole = job_spec(copy, tmp_path / "b", keys)
    with pytest.raises(BudgetExceededError, match=f"day {DAYS[0]} .* and 1 more of its files"):
        run_job(whole, "local", ledger=url, echo=quiet)
    changed = {"input.start_date": str(DAYS[1]), "input.end_date": str(DAYS[1])}
    run_job(job_spec(copy, tmp_path / "c", keys, **changed), "local", ledger=url, echo=quiet)
    assert charged(url)[-1] == ("corrected/CUSTOMER_ID", "CUSTOMER_ID", str(DAYS[1]),
                                f"date={DAYS[1]}/part-00000.parquet")  # fmt: skip
    in_tx = job_spec(copy, tmp_path / "d", keys, **changed, **{"budget.scope": TX})
    with pytest.raises(BudgetExceededError, match=f"day {DAYS[1]} .* scope 'corrected/"):
        run_job(in_tx, "local", ledger=url, echo=quiet)  # now charged in `corrected`


def test_another_privacy_unit_on_the_same_files_is_another_scope(tmp_path, tx):
    """Transactions as the privacy unit, on the files charged for customers: allowed, and
    recorded for that unit."""
    folder, keys = tx
    url = f"sqlite:///{tmp_path / 'state' / 'ledger.sqlite'}"
    run_job(job_spec(folder, tmp_path / "a", keys), "local", ledger=url, echo=quiet)
    by_tx = job_spec(folder, tmp_path / "b", keys, privacy_unit="TRANSACTION_ID",
                     **{"budget.scope": "card-data"})  # fmt: skip
    run_job(by_tx, "local", ledger=url, echo=quiet)
    units = {(scope, unit) for scope, unit, *_ in charged(url)}
    assert units == {(TX, "CUSTOMER_ID"), ("card-data", "TRANSACTION_ID")}


def test_the_same_csv_day_read_with_layout_files_is_refused(tmp_path, small_inputs):
    """Files are compared whatever the layout: a day released from the daily CSV layout, read
    again as one file of a `files` input in another scope, is refused naming the file."""
    keys = tmp_path / "terminals.csv"
    keys.write_text("TERMINAL_ID\n" + "".join(f"{k}\n" for k in range(SMALL["terminals"])))
    url = f"sqlite:///{tmp_path / 'state' / 'ledger.sqlite'}"
    run_job(job_spec(small_inputs["csv"], tmp_path / "a", keys), "local", ledger=url, echo=quiet)
    loose = tmp_path / "loose" / "exports"
    loose.mkdir(parents=True)
    shutil.copy(Path(small_inputs["csv"]) / f"{DAYS[2]}.csv", loose / "export.csv")
    files = {"input.layout": "files", "input.start_date": str(DAYS[2]),
             "input.end_date": str(DAYS[2])}  # fmt: skip
    spec = job_spec(loose.parent, tmp_path / "b", keys, **files)
    assert discover_files(loose.parent, "csv")[0].files == (loose / "export.csv",)
    with pytest.raises(BudgetExceededError, match=r"the input's file exports/export\.csv was"):
        run_job(spec, "local", ledger=url, echo=quiet)


def test_in_memory_rows_carry_no_content(tmp_path, tx):
    from dppipeline.lifecycle.runner import InputRows

    folder, keys = tx
    spec = job_spec(folder, tmp_path / "a", keys)
    memory = spec.model_copy(update={"input": spec.input.model_copy(update={"path": None})})
    memory = memory.model_copy(
        update={"budget": memory.budget.model_copy(update={"scope": "api/CUSTOMER_ID"})}
    )
    assert release_key(memory, [], rows=InputRows(rows=None, dataset_id="d")).content is None
    days = discover_partitions(folder, "parquet")
    assert release_key(spec, days).content == InputContent(
        "CUSTOMER_ID", input_contents(days, folder, "parquet")
    )


@pytest.mark.slow
def test_the_cli_refuses_a_copy_with_exit_3_and_one_line(tmp_path, tx):
    folder, keys = tx
    ledger = tmp_path / "state" / "ledger.sqlite"
    bounds = ["--max-partitions-contributed", "1", "--max-contributions-per-partition", "1"]
    args = ["--min-value", "0", "--max-value", "100", "--public-partitions", keys, *bounds]

    def run(source: Path, output: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dppipeline", "run", "--input", source, "--output",
             tmp_path / output, "--ledger", ledger, *args, *extra],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip

    assert run(folder, "a").returncode == 0
    shutil.copytree(folder, tmp_path / "tx-copy")
    for extra in ([], ["--check-budget"]):
        refused = run(tmp_path / "tx-copy", "b", *extra)
        assert refused.returncode == 3, refused.stderr
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert "already charged in scope 'tx/CUSTOMER_ID'" in lines[0]
        assert lines[0].endswith("run with --scope tx/CUSTOMER_ID (budget.scope)")
    shown = subprocess.run(
        [sys.executable, "-m", "dppipeline", "budget", "show", "--ledger", ledger],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert f"tx/CUSTOMER_ID: data charged {DAYS[0]}..{DAYS[-1]} (3 days, 3 files" in shown
