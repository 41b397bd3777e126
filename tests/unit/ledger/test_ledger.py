"""The privacy-budget ledger itself, on SQLite and on a real PostgreSQL server: the states and
their transitions, caps (stored, governed, with history) and rolling windows, leases and
repair, concurrent reservations across processes and hosts, schema migrations, URLs, and the
one-line errors of a ledger that cannot be used.

Tests parametrized with `ledger_url` run on both backends (see conftest.py and
postgres_server.py); the run sequence around the ledger is tested in test_run_sequence.py.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.cli import one_error_line, run_cli
from support.file_modes import bound_by_file_modes
from support.ledger import expire, states

from dppipeline.errors import UsageError
from dppipeline.ledger import (
    SCHEMA_VERSION,
    BudgetExceededError,
    BudgetHeldError,
    BudgetPolicy,
    Ledger,
    LedgerError,
    ReleaseKey,
    Reservation,
    ReservationLostError,
    input_fingerprint,
    parse_ledger_url,
)
from dppipeline.ledger import tables as ledger_tables

SCOPE = "shop/CUSTOMER_ID"


def jan(day: int) -> dt.date:
    return dt.date(2026, 1, day)


JAN_1 = jan(1)


def make_key(
    start: dt.date = JAN_1,
    end: dt.date | None = None,
    *,
    scope: str = SCOPE,
    spec_hash: str = "spec",
    fingerprint: str = "input",
) -> ReleaseKey:
    return ReleaseKey(scope, spec_hash, fingerprint, start, end or start)


def reserve(
    ledger: Ledger,
    run_id: str,
    *,
    epsilon: float = 1.0,
    delta: float = 0.0,
    policy: BudgetPolicy | None = None,
    start: dt.date = JAN_1,
    end: dt.date | None = None,
    scope: str = SCOPE,
    output: str = "/nonexistent/release",
) -> BudgetPolicy:
    return ledger.reserve(
        make_key(start, end, scope=scope, spec_hash=run_id),  # a distinct key per run
        run_id=run_id,
        job="job",
        epsilon=epsilon,
        delta=delta,
        output=output,
        policy=policy or BudgetPolicy(),
    )


def spend(ledger: Ledger, run_id: str, **kwargs) -> None:
    """One published release: reserve, read, commit."""
    reserve(ledger, run_id, **kwargs)
    ledger.mark_reading(run_id)
    ledger.commit(run_id)


# --------------------------------------------------------------------------- 1. the states


def test_states_follow_the_charge_rules(ledger_url):
    ledger = Ledger(ledger_url)
    everything = (SCOPE, BudgetPolicy(), jan(1), jan(1))

    reserve(ledger, "run-a", epsilon=1.0, delta=1e-6)
    assert states(ledger) == {"run-a": "reserved"}
    assert ledger.spent(*everything) == pytest.approx((1.0, 1e-6))  # reserved counts
    assert ledger.committed(make_key(spec_hash="run-a")) is None  # not published yet
    with pytest.raises(LedgerError, match="cannot become committed"):
        ledger.commit("run-a")  # nothing was read: nothing to commit

    ledger.mark_reading("run-a")
    (row,) = ledger.rows()
    assert (row.state, row.reading_at is not None, row.finished_at) == ("reading", True, None)
    with pytest.raises(LedgerError, match="reading; it cannot become aborted"):
        ledger.abort("run-a")  # data may have been read: it can no longer be released
    ledger.commit("run-a")
    (row,) = ledger.rows()
    assert row.state == "committed"
    assert row.finished_at is not None
    assert ledger.spent(*everything) == pytest.approx((1.0, 1e-6))  # committed counts
    assert ledger.committed(make_key(spec_hash="run-a")).run_id == "run-a"

    reserve(ledger, "run-b", epsilon=0.5, delta=2e-6)
    ledger.abort("run-b", note="failed before reading")
    assert ledger.spent(*everything) == pytest.approx((1.0, 1e-6))  # aborted is released
    assert ledger.row("run-b").note == "failed before reading"

    reserve(ledger, "run-c", epsilon=0.25)
    ledger.mark_reading("run-c")
    ledger.fail("run-c", note="failed after reading")  # charged: it read data
    assert ledger.spent(*everything) == pytest.approx((1.25, 1e-6))
    assert ledger.committed(make_key(spec_hash="run-c")) is None

    reserve(ledger, "run-d", epsilon=0.125)
    ledger.fail("run-d", note="a conservative caller")  # failing a reservation also charges
    assert ledger.spent(*everything) == pytest.approx((1.375, 1e-6))

    # A settled row never moves again; a run that is not recorded cannot settle.
    for settle, run_id in [
        (ledger.commit, "run-a"),
        (ledger.fail, "run-a"),
        (ledger.abort, "run-b"),
        (ledger.mark_reading, "run-b"),
        (ledger.commit, "run-c"),
        (ledger.abort, "run-c"),
        (ledger.commit, "never-reserved"),
    ]:
        with pytest.raises(ReservationLostError):
            settle(run_id)
    assert states(ledger) == {
        "run-a": "committed",
        "run-b": "aborted",
        "run-c": "failed",
        "run-d": "failed",
    }


def test_run_id_is_unique(ledger_url):
    ledger = Ledger(ledger_url)
    reserve(ledger, "run-a")
    with pytest.raises(LedgerError, match=r"run_id|UNIQUE|unique"):
        reserve(ledger, "run-a")
    assert len(ledger.rows()) == 1


def test_release_key_and_input_fingerprint(tmp_path):
    base = make_key()
    assert base.digest == make_key().digest
    for other in (
        make_key(scope="other/CUSTOMER_ID"),
        make_key(spec_hash="other"),
        make_key(fingerprint="other"),
        make_key(jan(1), jan(2)),
        make_key(jan(2)),
    ):
        assert other.digest != base.digest

    root = tmp_path / "in"
    (root / "a").mkdir(parents=True)
    files = [root / "a" / "1.csv", root / "2.csv"]
    for f in files:
        f.write_text("x\n")
    first = input_fingerprint(files, root)
    assert input_fingerprint(list(reversed(files)), root) == first  # order does not matter
    stat = files[0].stat()
    os.utime(files[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # touch
    touched = input_fingerprint(files, root)
    assert touched != first
    files[1].write_text("xy\n")
    os.utime(files[1], ns=(files[1].stat().st_atime_ns, stat.st_mtime_ns))
    assert input_fingerprint(files, root) not in (first, touched)  # size changed


# --------------------------------------------------------------------------- 2. URLs


def test_ledger_urls_follow_sqlalchemy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # SQLAlchemy's rules: three slashes = relative to the working folder, four = absolute.
    relative = parse_ledger_url("sqlite:///state/ledger.sqlite")
    assert relative.path == tmp_path / "state" / "ledger.sqlite"
    assert sa.engine.make_url("sqlite:///state/ledger.sqlite").database == "state/ledger.sqlite"
    absolute = parse_ledger_url("sqlite:////abs/ledger.sqlite")
    assert absolute.path == Path("/abs/ledger.sqlite")
    assert absolute.display == "/abs/ledger.sqlite"
    assert parse_ledger_url("plain/ledger.sqlite").path == tmp_path / "plain" / "ledger.sqlite"
    assert parse_ledger_url("a/../ledger.sqlite").path == tmp_path / "ledger.sqlite"

    postgres = parse_ledger_url("postgresql://dp:s3cret@db.example:5433/ledger?sslmode=require")
    assert postgres.path is None
    assert postgres.url.drivername == "postgresql+psycopg"  # psycopg 3
    assert postgres.url.password == "s3cret"  # still there to connect with
    assert postgres.display == "postgresql://dp:***@db.example:5433/ledger?sslmode=require"
    hidden = parse_ledger_url("postgres://dp@db/ledger?password=s3cret&sslmode=require")
    assert "s3cret" not in hidden.display
    assert hidden.display == "postgresql://dp@db/ledger?sslmode=require"
    assert parse_ledger_url("postgresql+psycopg://dp@db/x").url.drivername == "postgresql+psycopg"

    for bad, words in [
        ("mysql://db/ledger", "unsupported database 'mysql'"),
        ("sqlite://", "in-memory"),
        ("sqlite:///:memory:", "in-memory"),
        ("", "empty"),
    ]:
        with pytest.raises(UsageError, match=words):
            parse_ledger_url(bad)

    nested = tmp_path / "a" / "b" / "ledger.sqlite"
    Ledger(f"sqlite:///{nested}").close()  # creates its folder
    assert nested.is_file()


@pytest.mark.slow
def test_relative_sqlite_url_is_relative_to_the_working_folder(tmp_path, small_inputs):
    """Issue 15 case 3, the other way round: `sqlite:///rel` from two folders is two ledgers,
    as SQLAlchemy defines it, and each `[ledger]` line names the absolute file it used."""
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        result = subprocess.run(
            [sys.executable, "-m", "dppipeline", "run", "--input", small_inputs["parquet"],
             "--output", tmp_path / folder / "release", "--min-value", "0", "--max-value", "100",
             "--metrics", "count", "--ledger", "sqlite:///state/ledger.sqlite",
             "--max-partitions-contributed", "1", "--max-contributions-per-partition", "1"],
            cwd=tmp_path / folder, capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        expected = tmp_path / folder / "state" / "ledger.sqlite"
        ledger_lines = [ln for ln in result.stderr.splitlines() if ln.startswith("[ledger]")]
        assert ledger_lines, result.stderr
        assert all(f"(ledger {expected})" in ln for ln in ledger_lines), ledger_lines
        manifest = (tmp_path / folder / "release" / "manifest.json").read_text()
        assert f'"ledger": "{expected}"' in manifest
        assert [r.state for r in Ledger(f"sqlite:///{expected}").rows()] == ["committed"]


# --------------------------------------------------------------------------- 3. caps


def test_epsilon_cap_refuses_and_says_what_is_left(ledger_url):
    ledger = Ledger(ledger_url)
    policy = BudgetPolicy(cap_epsilon=2.5)
    spend(ledger, "run-1", policy=policy)  # 0 + 1 <= 2.5
    spend(ledger, "run-2", policy=policy)  # 1 + 1 <= 2.5
    with pytest.raises(BudgetExceededError) as refused:  # 2 + 1 > 2.5
        reserve(ledger, "run-3", policy=policy)
    message = str(refused.value)
    assert refused.value.exit_code == 3
    assert SCOPE in message
    assert "epsilon 1 needed, 0.5 left of 2.5" in message
    assert "delta" not in message.split(":", 1)[1]  # only the cap that refused is named
    assert [r.run_id for r in ledger.rows()] == ["run-1", "run-2"]  # nothing recorded
    reserve(ledger, "run-small", epsilon=0.5, policy=policy)  # exactly what is left still fits
    with pytest.raises(BudgetExceededError, match=re.escape("0 left of 2.5")):
        reserve(ledger, "run-tiny", epsilon=0.01, policy=policy)


def test_a_reservation_decides_on_the_states_rows_have_now(ledger_url):
    """A refusal is `held` (exit 75) only while a live run that read nothing holds the budget:
    once that run has read and committed, the same refusal is final (exit 3). Whatever the
    ledger remembers of rows it read before (run "a" was read while reserved), it decides on
    their states now."""
    ledger = Ledger(ledger_url)
    policy = BudgetPolicy(cap_epsilon=1.0)
    reserve(ledger, "a", epsilon=0.5, policy=policy)
    reserve(ledger, "b", epsilon=0.3, policy=policy)
    ledger.mark_reading("b")  # "b" holds nothing back: its budget stays spent
    with pytest.raises(BudgetHeldError, match="held by run a "):
        reserve(ledger, "c", epsilon=0.5, policy=policy)  # 1.3 > 1; 0.8 without "a"
    ledger.mark_reading("a")
    ledger.commit("a")
    with pytest.raises(BudgetExceededError) as refused:
        reserve(ledger, "c", epsilon=0.5, policy=policy)
    assert not isinstance(refused.value, BudgetHeldError)
    assert refused.value.exit_code == 3
    reserve(ledger, "c", epsilon=0.2, policy=policy)  # exactly what is left


def test_delta_cap_refuses_and_says_what_is_left(ledger_url):
    ledger = Ledger(ledger_url)
    policy = BudgetPolicy(cap_delta=2.5e-6)
    spend(ledger, "run-1", epsilon=5.0, delta=1e-6, policy=policy)  # no epsilon cap
    spend(ledger, "run-2", epsilon=5.0, delta=1e-6, policy=policy)
    with pytest.raises(BudgetExceededError) as refused:  # 2e-6 + 1e-6 > 2.5e-6
        reserve(ledger, "run-3", epsilon=5.0, delta=1e-6, policy=policy)
    assert "delta 1e-06 needed, 5e-07 left of 2.5e-06" in str(refused.value)
    assert "epsilon" not in str(refused.value)
    assert len(ledger.rows()) == 2


def test_both_caps_refusing_are_both_named(ledger_url):
    ledger = Ledger(ledger_url)
    policy = BudgetPolicy(cap_epsilon=1.5, cap_delta=1.5e-6)
    spend(ledger, "run-1", delta=1e-6, policy=policy)
    with pytest.raises(BudgetExceededError) as refused:
        reserve(ledger, "run-2", delta=1e-6, policy=policy)
    assert "epsilon 1 needed, 0.5 left of 1.5" in str(refused.value)
    assert "delta 1e-06 needed, 5e-07 left of 1.5e-06" in str(refused.value)


def test_float_sums_fit_the_cap(ledger_url):
    ledger = Ledger(ledger_url)
    policy = BudgetPolicy(cap_epsilon=0.3)
    for n in range(3):  # 0.1 + 0.1 + 0.1 == 0.30000000000000004 in floats
        spend(ledger, f"run-{n}", epsilon=0.1, policy=policy)
    with pytest.raises(BudgetExceededError, match=re.escape("0 left of 0.3")):
        reserve(ledger, "run-4", epsilon=0.1, policy=policy)
    with pytest.raises(BudgetExceededError):
        reserve(ledger, "run-5", epsilon=1e-9, policy=policy)  # the tolerance is not a budget


def test_tiny_delta_cap_is_not_swallowed_by_the_float_tolerance(ledger_url):
    ledger = Ledger(ledger_url)
    policy = BudgetPolicy(cap_delta=1e-12)
    spend(ledger, "run-1", epsilon=0.0, delta=1e-12, policy=policy)  # the whole cap
    with pytest.raises(BudgetExceededError):  # 2e-12 > 1e-12: must be refused
        reserve(ledger, "run-2", epsilon=0.0, delta=1e-12, policy=policy)


def test_failed_and_live_reservations_count_against_the_cap(ledger_url):
    ledger = Ledger(ledger_url)
    policy = BudgetPolicy(cap_epsilon=3.0)
    reserve(ledger, "reading", policy=policy)
    ledger.mark_reading("reading")
    reserve(ledger, "failed", policy=policy)
    ledger.mark_reading("failed")
    ledger.fail("failed")
    reserve(ledger, "reserved", policy=policy)
    with pytest.raises(BudgetExceededError, match="0 left of 3"):
        reserve(ledger, "one-too-many", policy=policy)
    ledger.abort("reserved")  # only a reservation that read nothing gives its budget back
    reserve(ledger, "fits-again", policy=policy)


def test_rolling_window_frees_budget_as_days_pass(ledger_url):
    ledger = Ledger(ledger_url)
    policy = BudgetPolicy(cap_epsilon=2.0, window_days=7)

    def spent_on(start: dt.date, end: dt.date | None = None) -> float:
        return ledger.spent(SCOPE, policy, start, end or start)[0]

    # Each window is 7 data days [lo, lo+6]; a release counts in every window its range
    # touches; a new release is checked against the fullest window its own range touches.
    spend(ledger, "jan01", start=jan(1), policy=policy)  # windows touching Jan 1 are empty
    spend(ledger, "jan02", start=jan(2), policy=policy)  # [Dec 27..Jan 2] holds Jan 1: 1+1<=2
    assert spent_on(jan(5)) == 2  # [Dec 30..Jan 5] holds Jan 1 and Jan 2
    assert spent_on(jan(7)) == 2  # [Jan 1..Jan 7] still does
    assert spent_on(jan(8)) == 1  # [Jan 2..Jan 8]: only Jan 2
    assert spent_on(jan(9)) == 0  # windows touching Jan 9 start on Jan 3 or later

    with pytest.raises(BudgetExceededError) as refused:
        reserve(ledger, "jan05", start=jan(5), policy=policy)
    assert "in a 7-day window" in str(refused.value)
    assert "epsilon 1 needed, 0 left of 2" in str(refused.value)

    spend(ledger, "jan09", start=jan(9), policy=policy)
    assert spent_on(jan(9), jan(9)) == 1
    assert spent_on(jan(3), jan(9)) == 2
    with pytest.raises(BudgetExceededError, match="0 left of 2"):
        reserve(ledger, "jan03-09", start=jan(3), end=jan(9), policy=policy)

    spend(ledger, "jan10-12", start=jan(10), end=jan(12), policy=policy)
    with pytest.raises(BudgetExceededError):
        reserve(ledger, "jan13-15", start=jan(13), end=jan(15), policy=policy)
    spend(ledger, "jan16", start=jan(16), policy=policy)

    assert states(ledger) == dict.fromkeys(
        ["jan01", "jan02", "jan09", "jan10-12", "jan16"], "committed"
    )


def test_without_a_window_the_cap_holds_for_all_time(ledger_url):
    ledger = Ledger(ledger_url)
    policy = BudgetPolicy(cap_epsilon=2.0)
    spend(ledger, "jan01", start=jan(1), policy=policy)
    spend(ledger, "feb01", start=dt.date(2026, 2, 1), policy=policy)
    with pytest.raises(BudgetExceededError, match="0 left of 2"):
        reserve(ledger, "dec31", start=dt.date(2026, 12, 31), policy=policy)
    reserve(ledger, "other", epsilon=2.0, scope="other/CUSTOMER_ID", policy=policy)


# --------------------------------------------------------------------------- 4. governed caps


def test_caps_are_stored_and_a_spec_can_neither_lift_nor_change_them(ledger_url):
    """Issue 14 case 1: a run without a cap, or with another cap, in a capped scope is held
    to (or refused by) the scope's stored cap."""
    ledger = Ledger(ledger_url)
    capped = BudgetPolicy(cap_epsilon=1.0)
    # The first job with a cap in an uncapped scope stores it, with a history row.
    assert reserve(ledger, "first", epsilon=0.5, policy=capped) == capped
    assert ledger.cap(SCOPE).policy == capped
    (created,) = ledger.cap_history(SCOPE)
    assert (created.changed_by, created.previous) == ("job job, run first", "no cap")

    # No cap in the spec: the stored cap applies (before: "cap -", and 0.5 more accepted).
    assert reserve(ledger, "uncapped", epsilon=0.5, policy=BudgetPolicy()) == capped
    with pytest.raises(BudgetExceededError, match="0 left of 1"):
        reserve(ledger, "uncapped-again", epsilon=0.5, policy=BudgetPolicy())

    # A looser (or any other) cap in the spec is refused before anything is recorded.
    for other in (
        BudgetPolicy(cap_epsilon=10.0),
        BudgetPolicy(cap_epsilon=0.5),  # tighter: still a change, which is governed too
        BudgetPolicy(cap_epsilon=1.0, window_days=30),
        BudgetPolicy(cap_epsilon=1.0, cap_delta=1e-6),
    ):
        with pytest.raises(BudgetExceededError) as refused:
            reserve(ledger, "other", epsilon=0.0, policy=other)
        assert refused.value.exit_code == 3
        assert "budget set-cap" in str(refused.value)
        assert "stored" in str(refused.value)
        with pytest.raises(BudgetExceededError, match="budget set-cap"):
            ledger.check(make_key(spec_hash="x"), epsilon=0.0, delta=0.0, policy=other)
    assert [r.run_id for r in ledger.rows()] == ["first", "uncapped"]

    # The equal cap restated is fine.
    reserve(ledger, "restated", epsilon=0.0, policy=BudgetPolicy(cap_epsilon=1.0))

    # `budget set-cap` changes it, with history; runs are then held to the new cap.
    change = ledger.set_cap(SCOPE, BudgetPolicy(cap_epsilon=2.0, window_days=7), "operator")
    assert change.previous == "cap epsilon 1 for all time"
    reserve(ledger, "after-raise", epsilon=0.5, policy=BudgetPolicy())
    assert [c.changed_by for c in ledger.cap_history(SCOPE)] == ["job job, run first", "operator"]
    assert [c.policy for c in ledger.cap_history()] == [
        capped,
        BudgetPolicy(cap_epsilon=2.0, window_days=7),
    ]
    with pytest.raises(BudgetExceededError, match="window_days unset"):
        reserve(ledger, "all-time", epsilon=0.0, policy=BudgetPolicy(cap_epsilon=2.0))


def test_a_refused_first_cap_is_not_stored(ledger_url):
    ledger = Ledger(ledger_url)
    with pytest.raises(BudgetExceededError, match=re.escape("0.5 left of 0.5")):
        reserve(ledger, "too-big", epsilon=1.0, policy=BudgetPolicy(cap_epsilon=0.5))
    assert ledger.cap(SCOPE) is None
    assert ledger.cap_history() == []


# --------------------------------------------------------------------------- 5. leases, repair


RESERVE_AND_EXIT = """
import datetime as dt, sys
from dppipeline.ledger import BudgetPolicy, Ledger, ReleaseKey
url, run_id, output, reading = sys.argv[1:]
key = ReleaseKey("shop/CUSTOMER_ID", run_id, "input", dt.date(2026, 1, 1), dt.date(2026, 1, 1))
ledger = Ledger(url)
ledger.reserve(key, run_id=run_id, job="job", epsilon=1.0, delta=0.0, output=output,
               policy=BudgetPolicy())
if reading == "1":
    ledger.mark_reading(run_id)
"""


def reserve_in_dead_process(url: str, run_id: str, output: Path, *, reading: bool) -> None:
    """A reservation by a process that then died without settling it, on another host: its
    recorded process proves nothing here, so only its lease can tell (a process gone from this
    host is settled at once: test_ledger_faults.py)."""
    done = subprocess.run(
        [sys.executable, "-c", RESERVE_AND_EXIT, url, run_id, str(output), str(int(reading))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    table = ledger_tables.releases
    with Ledger(url) as ledger, ledger._engine.begin() as conn:
        conn.execute(
            table.update()
            .where(table.c.run_id == run_id)
            .values(process="another-boot-id/4026531836/4242/1")
        )


def publish_fake_release(output: Path, run_id: str) -> None:
    (output / "stats").mkdir(parents=True)
    (output / "stats" / "part-00000.parquet").write_bytes(b"not really parquet")
    (output / "manifest.json").write_text(f'{{"run_id": "{run_id}"}}\n')


@pytest.mark.slow
def test_repair_settles_expired_leases_by_the_charge_rules(ledger_url, tmp_path):
    published, other, nothing = tmp_path / "published", tmp_path / "other", tmp_path / "nothing"
    reserve_in_dead_process(ledger_url, "published-run", published, reading=True)
    reserve_in_dead_process(ledger_url, "overwritten-run", other, reading=True)
    reserve_in_dead_process(ledger_url, "read-run", nothing, reading=True)
    reserve_in_dead_process(ledger_url, "unread-run", nothing, reading=False)
    reserve_in_dead_process(ledger_url, "alive-run", nothing, reading=True)
    publish_fake_release(published, "published-run")  # an older version's publish-then-commit
    publish_fake_release(other, "some-earlier-run")
    ledger = Ledger(ledger_url)
    # All their processes are gone, but only expired leases are settled.
    assert ledger.repair() == []
    for run_id in ("published-run", "overwritten-run", "read-run", "unread-run"):
        expire(ledger, run_id)

    settled = ledger.repair()
    assert sorted(settled) == [
        ("overwritten-run", "failed"),
        ("published-run", "committed"),
        ("read-run", "failed"),
        ("unread-run", "aborted"),
    ]
    assert states(ledger) == {
        "published-run": "committed",
        "overwritten-run": "failed",
        "read-run": "failed",
        "unread-run": "aborted",
        "alive-run": "reading",
    }
    notes = {r.run_id: r.note for r in ledger.rows()}
    assert notes["published-run"].endswith("expired; release found")
    assert notes["read-run"].endswith("expired while reading; charged")
    assert notes["unread-run"].endswith("expired before reading")
    assert ledger.repair() == []  # settled once
    # Committed, failed and the live reading run count; the aborted one does not.
    assert ledger.spent(SCOPE, BudgetPolicy(), jan(1), jan(1))[0] == pytest.approx(4.0)
    # repair(scope) touches only that scope.
    expire(ledger, "alive-run")
    assert ledger.repair("another/scope") == []
    assert states(ledger)["alive-run"] == "reading"


LIVE_HOLDER = """
import datetime as dt, pathlib, sys, time
from dppipeline.ledger import BudgetPolicy, Ledger, ReleaseKey, Reservation
url, ready, done = sys.argv[1:]
key = ReleaseKey("shop/CUSTOMER_ID", "live", "input", dt.date(2026, 1, 1), dt.date(2026, 1, 1))
with Reservation(Ledger(url), key, run_id="live", job="job", epsilon=1.0, delta=0.0,
                 output="/nowhere", policy=BudgetPolicy()) as spend:
    spend.reading()
    pathlib.Path(ready).touch()
    while not pathlib.Path(done).exists():
        time.sleep(0.02)
    spend.commit()
print("committed")
"""


def test_a_live_run_keeps_its_reservation_whatever_its_pid_says(ledger_url, tmp_path):
    """Issue 14 case 4: liveness is the lease. A row whose pid is unknown here (another pid
    namespace, another host) or reused by another process is left alone while its lease is
    renewed, and its run commits; only an expired lease is settled."""
    ledger = Ledger(ledger_url)
    ready, done = tmp_path / "ready", tmp_path / "done"
    env = {**os.environ, "DPPIPELINE_LEASE_SECONDS": "30", "DPPIPELINE_LEASE_RENEW_SECONDS": "1"}
    holder = subprocess.Popen(
        [sys.executable, "-c", LIVE_HOLDER, ledger_url, str(ready), str(done)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert holder.poll() is None, holder.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        table = ledger_tables.releases
        dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                                  capture_output=True, text=True, check=True).stdout  # fmt: skip
        for pid, host in ((int(dead_pid), "same-hostname"), (1, "other-host"), (None, None)):
            with ledger._engine.begin() as conn:  # what the old pid check would have seen
                conn.execute(
                    table.update().where(table.c.run_id == "live").values(pid=pid, host=host)
                )
            assert ledger.repair() == []
            assert states(ledger) == {"live": "reading"}
        # The heartbeat renews the lease while the run lives.
        first = ledger.row("live").lease_expires_at
        while ledger.row("live").lease_expires_at == first:
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.05)
        done.touch()
        out, err = holder.communicate(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert holder.returncode == 0, err
    assert out.strip() == "committed"
    assert states(ledger) == {"live": "committed"}


def test_a_settled_run_cannot_commit(ledger_url):
    ledger = Ledger(ledger_url)
    key = make_key(spec_hash="slow")
    with pytest.raises(ReservationLostError) as lost, Reservation(
        ledger, key, run_id="slow", job="job", epsilon=1.0, delta=0.0,
        output="/nowhere", policy=BudgetPolicy(),
    ) as spend:  # fmt: skip
        spend.reading()
        expire(ledger, "slow")  # it stalled past its lease ...
        assert ledger.repair() == [("slow", "failed")]  # ... and was settled as failed
        spend.commit()
    assert "slow is failed" in str(lost.value)
    assert "publishes nothing" in str(lost.value)
    assert states(ledger) == {"slow": "failed"}  # still charged
    assert lost.value.exit_code == 1


def test_a_reservation_settled_before_reading_cannot_start_reading(ledger_url):
    ledger = Ledger(ledger_url)
    reserve(ledger, "stalled")
    expire(ledger, "stalled")
    assert ledger.repair() == [("stalled", "aborted")]
    with pytest.raises(ReservationLostError, match="stalled is aborted"):
        ledger.mark_reading("stalled")  # its budget was freed: it must never read


def test_reservation_settles_itself_by_the_charge_rules(ledger_url):
    ledger = Ledger(ledger_url)

    def attempt(run_id: str, *, read: bool, error: type[BaseException]) -> None:
        with pytest.raises(error), Reservation(
            ledger, make_key(spec_hash=run_id), run_id=run_id, job="job", epsilon=1.0,
            delta=0.0, output="/nowhere", policy=BudgetPolicy(),
        ) as spend:  # fmt: skip
            if read:
                spend.reading()
            raise error()

    attempt("early", read=False, error=ValueError)
    attempt("late", read=True, error=ValueError)
    attempt("late-ctrl-c", read=True, error=KeyboardInterrupt)
    assert states(ledger) == {"early": "aborted", "late": "failed", "late-ctrl-c": "failed"}
    notes = {r.run_id: r.note for r in ledger.rows()}
    assert notes == {
        "early": "failed (ValueError) before reading",
        "late": "failed (ValueError) after reading; charged",
        "late-ctrl-c": "interrupted after reading; charged",
    }


def test_leases_use_the_database_clock(postgres, monkeypatch):
    """On PostgreSQL the lease is stamped by the server's clock, so a host whose clock is a
    day off still writes the same expiry as every other host."""
    from dppipeline.ledger import book

    class Skewed(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime.now(tz) + dt.timedelta(days=1)

    ledger = Ledger(postgres.new_database())
    monkeypatch.setattr(book.dt, "datetime", Skewed)
    reserve(ledger, "skewed")
    monkeypatch.undo()
    with ledger._engine.connect() as conn:
        server_now = conn.execute(sa.select(sa.func.clock_timestamp())).scalar_one()
    expiry = dt.datetime.fromisoformat(ledger.row("skewed").lease_expires_at)
    assert dt.timedelta(0) < expiry - server_now <= dt.timedelta(seconds=121)


# --------------------------------------------------------------------------- 6. concurrency

RACER = """
import datetime as dt, pathlib, sys, time
from dppipeline.ledger import BudgetExceededError, BudgetPolicy, Ledger, ReleaseKey, Reservation
url, ready, go, run_id = sys.argv[1:]
ledger = Ledger(url)
pathlib.Path(ready).touch()
while not pathlib.Path(go).exists():
    time.sleep(0.0002)
key = ReleaseKey("shop/CUSTOMER_ID", run_id, "input", dt.date(2026, 1, 1), dt.date(2026, 1, 1))
try:
    with Reservation(ledger, key, run_id=run_id, job="job", epsilon=1.0, delta=0.0,
                     output="/nowhere", policy=BudgetPolicy(cap_epsilon=3.0)) as spend:
        spend.reading()
        spend.commit()
except BudgetExceededError as exc:
    print(exc)
    sys.exit(3)
print("committed")
"""


def start_together(script: str, url: str, folder: Path, names: list[str], env=None) -> dict:
    """Starts one process per name, lets them all open the ledger, then releases them at
    once; returns name -> (exit code, stdout, stderr). Racers wait up to 100 s for the lock:
    on a loaded 2-core CI machine eight fsync-ing writers once took more than the default 10 s,
    and these tests are about who commits, not how long the wait is."""
    go = folder / "go"
    procs = {}
    for name in names:
        ready = folder / f"ready-{name}"
        proc = subprocess.Popen(
            [sys.executable, "-c", script, url, str(ready), str(go), name],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "DPPIPELINE_LEDGER_TIMEOUT": "100", **(env or {}).get(name, {})},
        )  # fmt: skip
        procs[name] = (proc, ready)
    deadline = time.monotonic() + 120
    while not all(ready.exists() for _, ready in procs.values()):
        assert time.monotonic() < deadline, "racers did not start"
        for proc, _ in procs.values():
            assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    go.touch()
    outcomes = {}
    for name, (proc, _) in procs.items():
        out, err = proc.communicate(timeout=300)
        outcomes[name] = (proc.returncode, out.strip(), err)
    return outcomes


@pytest.mark.slow  # 45-300 s in a loaded test-fast run (load 7-8 on 2 cores)
def test_eight_racers_for_three_releases_commit_exactly_three(ledger_url, tmp_path):
    Ledger(ledger_url).close()  # created before the race
    names = [f"racer-{n}" for n in range(8)]
    outcomes = start_together(RACER, ledger_url, tmp_path, names)
    winners = sorted(n for n, (code, _, _) in outcomes.items() if code == 0)
    assert len(winners) == 3, outcomes
    for name, (code, out, err) in outcomes.items():
        if name not in winners:
            assert code == 3, (out, err)
            assert "epsilon 1 needed, 0 left of 3" in out
    ledger = Ledger(ledger_url)
    assert states(ledger) == dict.fromkeys(winners, "committed")
    assert ledger.spent(SCOPE, BudgetPolicy(), jan(1), jan(1))[0] == 3.0


HOST = """
import datetime as dt, pathlib, sys, time
from dppipeline.ledger import BudgetExceededError, BudgetPolicy, Ledger, ReleaseKey, Reservation
url, ready, go, name = sys.argv[1:]
ledger = Ledger(url)
pathlib.Path(ready).touch()
while not pathlib.Path(go).exists():
    time.sleep(0.0002)
done = 0
for n in range(40):
    run_id = f"{name}-{n}"
    key = ReleaseKey("shared/CUSTOMER_ID", run_id, "input", dt.date(2026, 1, 1),
                     dt.date(2026, 1, 1))
    try:
        with Reservation(ledger, key, run_id=run_id, job="job", epsilon=0.25, delta=0.0,
                         output="/nowhere", policy=BudgetPolicy(cap_epsilon=5.0)) as spend:
            spend.reading()
            spend.commit()
        done += 1
    except BudgetExceededError:
        break
print(done)
"""


def test_two_hosts_sharing_one_postgresql_ledger_cannot_overspend(postgres, tmp_path):
    """Two "hosts" (their own host ids, their own connections) release as fast as they can
    into one scope capped at epsilon 5 (20 releases of 0.25): together exactly 20, never more;
    every row records the host that made it."""
    url = postgres.new_database()
    Ledger(url).close()
    hosts = {"host-a": {"DPPIPELINE_HOST_ID": "host-a"}, "host-b": {"DPPIPELINE_HOST_ID": "host-b"}}
    outcomes = start_together(HOST, url, tmp_path, list(hosts), env=hosts)
    for name, (code, _, err) in outcomes.items():
        assert code == 0, (name, err)
    counts = {name: int(out) for name, (_, out, _) in outcomes.items()}
    assert sum(counts.values()) == 20, counts
    ledger = Ledger(url)
    rows = ledger.rows()
    assert [r.state for r in rows] == ["committed"] * 20
    assert sum(r.epsilon for r in rows) == 5.0
    by_host = {h: sum(r.host_id == h for r in rows) for h in hosts}
    assert by_host == counts


def test_a_locked_scope_is_a_one_line_error_after_a_bounded_wait(postgres, tmp_path):
    url = postgres.new_database()
    Ledger(url).close()
    with Ledger(url) as holder, holder._engine.connect() as conn, conn.begin():
        holder._lock_scope(conn, SCOPE, "2026-01-01T00:00:00.000000+00:00", "holder")
        waiting = Ledger(url, timeout=0.3)
        with pytest.raises(LedgerError, match=r"is locked by another process \(waited 0.3 s"):
            reserve(waiting, "blocked")
    assert Ledger(url).rows() == []


# --------------------------------------------------------------------------- 7. schema


def table_shapes(ledger: Ledger) -> dict[str, list[tuple[str, bool]]]:
    inspector = sa.inspect(ledger._engine)
    return {
        name: sorted((c["name"], c["nullable"]) for c in inspector.get_columns(name))
        for name in sorted(inspector.get_table_names())
    }


def test_a_new_ledger_is_migrated_to_the_current_version(ledger_url):
    ledger = Ledger(ledger_url)
    assert ledger.schema_version == SCHEMA_VERSION
    with ledger._engine.connect() as conn:
        recorded = conn.execute(sa.select(ledger_tables.versions.c.version)).scalars().all()
    assert recorded == list(range(1, SCHEMA_VERSION + 1))
    assert set(table_shapes(ledger)) == {
        "charged_files",
        "ledger_schema_versions",
        "releases",
        "scope_cap_changes",
        "scopes",
    }
    spend(ledger, "run-a")
    ledger.close()
    reopened = Ledger(ledger_url)  # opening again migrates nothing and keeps the rows
    assert [r.run_id for r in reopened.rows()] == ["run-a"]


def test_a_version_1_ledger_is_upgraded_with_its_rows(ledger_url, tmp_path):
    """On SQLite, the file exactly as dppipeline 0.1 wrote it (its DDL, PRAGMA user_version,
    WAL); on PostgreSQL, a ledger stopped at version 1. Rows keep their ids and spends;
    `reserved` (which may have read data under version 1) becomes `reading` with a lease."""
    if ledger_url.startswith("sqlite"):
        path = Path(ledger_url.removeprefix("sqlite:///"))
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(ledger_tables.V1_SQLITE_DDL)
            db.execute("PRAGMA user_version = 1")
        insert_v1 = sqlite3.connect(path)
    else:
        engine = sa.create_engine(parse_ledger_url(ledger_url).url)
        with engine.begin() as conn:
            ledger_tables.migrate(conn, "test", "2026-01-01T00:00:00+00:00", target=1)
        insert_v1 = None
    rows = [
        (1, "old-committed", "committed", 1.0),
        (2, "old-aborted", "aborted", 0.5),
        (3, "old-reserved", "reserved", 0.25),
    ]
    sql = (
        "INSERT INTO releases (id, run_id, scope, job, spec_hash, input_fingerprint, "
        "start_date, end_date, release_key, epsilon, delta, state, output, pid, host, "
        "reserved_at, finished_at, note) VALUES "
    )
    values = [
        f"({i}, '{run}', '{SCOPE}', 'job', 'h', 'f', '2026-01-01', '2026-01-01', 'k{i}', {eps}, "
        f"0.0, '{state}', '/out', 4242, 'old-host', '2026-01-01T00:00:00+00:00', NULL, NULL)"
        for i, run, state, eps in rows
    ]
    if insert_v1 is not None:
        with insert_v1:
            insert_v1.execute(sql + ", ".join(values))
        insert_v1.close()
    else:
        with engine.begin() as conn:
            conn.execute(sa.text(sql + ", ".join(values)))
        engine.dispose()

    ledger = Ledger(ledger_url)
    assert ledger.schema_version == SCHEMA_VERSION
    assert states(ledger) == {
        "old-committed": "committed",
        "old-aborted": "aborted",
        "old-reserved": "reading",
    }
    assert [r.id for r in ledger.rows()] == [1, 2, 3]
    assert ledger.row("old-reserved").lease_expires_at is not None
    assert ledger.spent(SCOPE, BudgetPolicy(), jan(1), jan(1)) == (1.25, 0.0)
    assert ledger.scopes() == [SCOPE]
    assert ledger.cap(SCOPE) is None  # version 1 stored no caps
    # The new states work, and ids go on after the copied ones.
    spend(ledger, "new-run")
    assert ledger.row("new-run").id == 4
    expire(ledger, "old-reserved")
    assert ledger.repair() == [("old-reserved", "failed")]  # it may have read: charged
    if ledger_url.startswith("sqlite"):
        with sqlite3.connect(path) as db:  # an older dppipeline would now refuse the file
            assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_newer_schema_is_refused(ledger_url, tmp_path):
    ledger = Ledger(ledger_url)
    with ledger._engine.begin() as conn:
        conn.execute(
            ledger_tables.versions.insert().values(
                version=SCHEMA_VERSION + 1, applied_at="2030-01-01", description="future"
            )
        )
    ledger.close()
    with pytest.raises(UsageError) as refused:
        Ledger(ledger_url)
    message = str(refused.value)
    assert str(parse_ledger_url(ledger_url)) in message
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    assert "upgrade dppipeline" in message

    cli = run_cli("budget", "history", "--ledger", ledger_url)
    assert cli.returncode == 2, cli.stderr
    assert "schema version" in one_error_line(cli)


def test_a_newer_version_1_style_file_is_refused(tmp_path):
    path = tmp_path / "ledger.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(UsageError, match=f"schema version {SCHEMA_VERSION + 1}"):
        Ledger(f"sqlite:///{path}")
    with sqlite3.connect(path) as db:  # left as it was
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == []


# --------------------------------------------------------------------------- 8. errors


def test_a_corrupt_ledger_is_a_one_line_error(tmp_path):
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"this is not a database, just bytes\n" * 200)
    result = run_cli("budget", "show", "--ledger", path)
    assert result.returncode == 1
    line = one_error_line(result)
    assert f"ledger {path} is not a SQLite database or is corrupt" in line


@pytest.mark.slow
def test_a_locked_ledger_is_a_one_line_error_after_a_bounded_wait(tmp_path, small_inputs):
    path = tmp_path / "ledger.sqlite"
    Ledger(f"sqlite:///{path}").close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        result = run_cli(
            "run", "--input", small_inputs["parquet"], "--output", tmp_path / "release",
            "--min-value", "0", "--max-value", "100", "--ledger", path,
            "--max-partitions-contributed", "1", "--max-contributions-per-partition", "1",
            env={"DPPIPELINE_LEDGER_TIMEOUT": "0.5"},
        )  # fmt: skip
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result.returncode == 1
    line = one_error_line(result)
    assert f"ledger {path} is locked by another process (waited 0.5 s" in line
    assert not (tmp_path / "release").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in tmp_path.iterdir() if p.name.startswith("ledger.sqlite")
    )


def test_a_read_only_ledger_is_a_one_line_error(tmp_path):
    """Root ignores file modes (CI is root), so the CLI runs without root's file-mode override
    there (`file_modes`: from any checkout, a private one included)."""
    folder = Path(tempfile.mkdtemp(prefix="dppipeline-ro-"))
    try:
        path = folder / "ledger.sqlite"
        ledger = Ledger(f"sqlite:///{path}")
        spend(ledger, "run-a")
        ledger.close()
        for leftover in folder.glob("ledger.sqlite-*"):
            leftover.unlink()
        path.chmod(0o444)
        folder.chmod(0o555)
        argv = bound_by_file_modes(
            [sys.executable, "-m", "dppipeline", "budget", "show", "--ledger", str(path)]
        )
        env = {k: v for k, v in os.environ.items() if k != "DPPIPELINE_DEBUG"}
        result = subprocess.run(
            argv, capture_output=True, text=True, env=env, cwd=folder, timeout=120, check=False
        )
        assert result.returncode == 1, result.stderr
        line = one_error_line(result)
        assert f"{path}" in line
        assert "read-only" in line or "cannot open ledger" in line, line
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder, ignore_errors=True)


def test_an_unreachable_postgresql_ledger_never_shows_its_password(postgres):
    url = f"postgresql://postgres:hunter2@127.0.0.1:{postgres.port}/no_such_database"
    result = run_cli("budget", "show", "--ledger", url)
    assert result.returncode == 1
    line = one_error_line(result)
    assert "hunter2" not in result.stderr + result.stdout
    assert f"postgresql://postgres:***@127.0.0.1:{postgres.port}/no_such_database" in line
