"""The privacy-budget ledger: the release protocol, caps and rolling windows, concurrent
reservations, crash repair, idempotent releases, the `budget` commands and the schema version.

Every ledger here is a real SQLite file under tmp_path.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import re
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import DAYS, SMALL

from dppipeline.errors import DPPipelineError, InputError, UsageError
from dppipeline.ledger import (
    SCHEMA_VERSION,
    BudgetExceededError,
    BudgetPolicy,
    Ledger,
    ReleaseKey,
    input_fingerprint,
    ledger_path,
)

SCOPE = "shop/CUSTOMER_ID"
BOUNDS = ["--min-value", "0", "--max-value", "100"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STAGING = re.compile(r"^\.release\.staging-[0-9a-f]{12}$")


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
    output: str = "/nonexistent/release",
) -> None:
    ledger.reserve(
        make_key(start, end, spec_hash=run_id),  # a distinct key per run
        run_id=run_id,
        job="job",
        epsilon=epsilon,
        delta=delta,
        output=output,
        policy=policy or BudgetPolicy(),
    )


def spend(ledger: Ledger, run_id: str, **kwargs) -> None:
    """One published release: reserve, then commit."""
    reserve(ledger, run_id, **kwargs)
    ledger.commit(run_id)


def states(ledger: Ledger) -> dict[str, str]:
    return {row.run_id: row.state for row in ledger.rows()}


def run_cli(*args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DPPIPELINE_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "dppipeline", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def stderr_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def url_of(path: Path) -> str:
    return f"sqlite:///{path}"


# --------------------------------------------------------------------------- 1. the protocol


def test_reserve_commit_abort_change_state_and_spend(tmp_path):
    ledger = Ledger(url_of(tmp_path / "ledger.sqlite"))
    everything = (SCOPE, BudgetPolicy(), jan(1), jan(1))

    reserve(ledger, "run-a", epsilon=1.0, delta=1e-6)
    assert states(ledger) == {"run-a": "reserved"}
    assert ledger.spent(*everything) == pytest.approx((1.0, 1e-6))  # reserved counts
    assert ledger.committed(make_key(spec_hash="run-a")) is None  # not published yet

    ledger.commit("run-a")
    assert states(ledger) == {"run-a": "committed"}
    (row,) = ledger.rows()
    assert row.finished_at is not None
    assert ledger.spent(*everything) == pytest.approx((1.0, 1e-6))  # committed counts
    found = ledger.committed(make_key(spec_hash="run-a"))
    assert found is not None
    assert found.run_id == "run-a"

    reserve(ledger, "run-b", epsilon=0.5, delta=2e-6)
    assert ledger.spent(*everything) == pytest.approx((1.5, 3e-6))
    ledger.abort("run-b", note="gave up")
    assert states(ledger) == {"run-a": "committed", "run-b": "aborted"}
    assert ledger.rows()[1].note == "gave up"
    assert ledger.spent(*everything) == pytest.approx((1.0, 1e-6))  # aborted does not count
    assert ledger.committed(make_key(spec_hash="run-b")) is None

    # Only a reserved run can be settled, and only once.
    for settle, run_id in [
        (ledger.commit, "run-a"),  # already committed
        (ledger.abort, "run-a"),
        (ledger.commit, "run-b"),  # already aborted
        (ledger.abort, "run-b"),
        (ledger.commit, "never-reserved"),
        (ledger.abort, "never-reserved"),
    ]:
        with pytest.raises(RuntimeError, match="not reserved"):
            settle(run_id)
    assert states(ledger) == {"run-a": "committed", "run-b": "aborted"}


def test_run_id_is_unique(tmp_path):
    ledger = Ledger(url_of(tmp_path / "ledger.sqlite"))
    reserve(ledger, "run-a")
    with pytest.raises(sqlite3.IntegrityError):
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


def test_ledger_urls(tmp_path):
    assert ledger_path("sqlite:///state/ledger.sqlite") == Path("state/ledger.sqlite")
    assert ledger_path("sqlite:////abs/ledger.sqlite") == Path("/abs/ledger.sqlite")
    assert ledger_path("plain/ledger.sqlite") == Path("plain/ledger.sqlite")
    with pytest.raises(UsageError, match="only sqlite"):
        ledger_path("postgresql://db/ledger")
    nested = tmp_path / "a" / "b" / "ledger.sqlite"
    Ledger(url_of(nested)).close()  # creates its folder
    assert nested.is_file()


# --------------------------------------------------------------------------- 2. caps


def test_epsilon_cap_refuses_and_says_what_is_left(tmp_path):
    ledger = Ledger(url_of(tmp_path / "ledger.sqlite"))
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


def test_delta_cap_refuses_and_says_what_is_left(tmp_path):
    ledger = Ledger(url_of(tmp_path / "ledger.sqlite"))
    policy = BudgetPolicy(cap_delta=2.5e-6)
    spend(ledger, "run-1", epsilon=5.0, delta=1e-6, policy=policy)  # no epsilon cap
    spend(ledger, "run-2", epsilon=5.0, delta=1e-6, policy=policy)
    with pytest.raises(BudgetExceededError) as refused:  # 2e-6 + 1e-6 > 2.5e-6
        reserve(ledger, "run-3", epsilon=5.0, delta=1e-6, policy=policy)
    assert "delta 1e-06 needed, 5e-07 left of 2.5e-06" in str(refused.value)
    assert "epsilon" not in str(refused.value)
    assert len(ledger.rows()) == 2


def test_both_caps_refusing_are_both_named(tmp_path):
    ledger = Ledger(url_of(tmp_path / "ledger.sqlite"))
    policy = BudgetPolicy(cap_epsilon=1.5, cap_delta=1.5e-6)
    spend(ledger, "run-1", delta=1e-6, policy=policy)
    with pytest.raises(BudgetExceededError) as refused:
        reserve(ledger, "run-2", delta=1e-6, policy=policy)
    assert "epsilon 1 needed, 0.5 left of 1.5" in str(refused.value)
    assert "delta 1e-06 needed, 5e-07 left of 1.5e-06" in str(refused.value)


def test_float_sums_fit_the_cap(tmp_path):
    ledger = Ledger(url_of(tmp_path / "ledger.sqlite"))
    policy = BudgetPolicy(cap_epsilon=0.3)
    for n in range(3):  # 0.1 + 0.1 + 0.1 == 0.30000000000000004 in floats
        spend(ledger, f"run-{n}", epsilon=0.1, policy=policy)
    with pytest.raises(BudgetExceededError, match=re.escape("0 left of 0.3")):
        reserve(ledger, "run-4", epsilon=0.1, policy=policy)
    with pytest.raises(BudgetExceededError):
        reserve(ledger, "run-5", epsilon=1e-9, policy=policy)  # the tolerance is not a budget


def test_tiny_delta_cap_is_not_swallowed_by_the_float_tolerance(tmp_path):
    ledger = Ledger(url_of(tmp_path / "ledger.sqlite"))
    policy = BudgetPolicy(cap_delta=1e-12)
    spend(ledger, "run-1", epsilon=0.0, delta=1e-12, policy=policy)  # the whole cap
    with pytest.raises(BudgetExceededError):  # 2e-12 > 1e-12: must be refused
        reserve(ledger, "run-2", epsilon=0.0, delta=1e-12, policy=policy)


# --------------------------------------------------------------------------- 3. rolling window


def test_rolling_window_frees_budget_as_days_pass(tmp_path):
    ledger = Ledger(url_of(tmp_path / "ledger.sqlite"))
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

    # Jan 5: the window [Dec 30..Jan 5] holds 2, and 2 + 1 > 2.
    with pytest.raises(BudgetExceededError) as refused:
        reserve(ledger, "jan05", start=jan(5), policy=policy)
    assert "in a 7-day window" in str(refused.value)
    assert "epsilon 1 needed, 0 left of 2" in str(refused.value)

    # Jan 9: Jan 1 and Jan 2 are outside every 7-day window touching Jan 9 -> 0 + 1 <= 2.
    spend(ledger, "jan09", start=jan(9), policy=policy)

    # Jan 3..Jan 9 touches the windows lo = Dec 28 .. Jan 9; [Dec 28..Jan 3] holds Jan 1 and
    # Jan 2 -> 2 + 1 > 2: refused, although every window touching its last day holds only
    # Jan 9 (1 + 1 <= 2).
    assert spent_on(jan(9), jan(9)) == 1
    assert spent_on(jan(3), jan(9)) == 2
    with pytest.raises(BudgetExceededError, match="0 left of 2"):
        reserve(ledger, "jan03-09", start=jan(3), end=jan(9), policy=policy)

    # Jan 10..Jan 12 touches lo = Jan 4 .. Jan 12; the fullest holds Jan 9 only -> 1 + 1 <= 2.
    spend(ledger, "jan10-12", start=jan(10), end=jan(12), policy=policy)
    # Jan 13..Jan 15: [Jan 7..Jan 13] holds Jan 9 and Jan 10..12 -> 2 + 1 > 2: refused.
    with pytest.raises(BudgetExceededError):
        reserve(ledger, "jan13-15", start=jan(13), end=jan(15), policy=policy)
    # Jan 16: the windows lo = Jan 10 .. Jan 16 hold Jan 10..12 only -> 1 + 1 <= 2.
    spend(ledger, "jan16", start=jan(16), policy=policy)

    assert states(ledger) == dict.fromkeys(
        ["jan01", "jan02", "jan09", "jan10-12", "jan16"], "committed"
    )


def test_without_a_window_the_cap_holds_for_all_time(tmp_path):
    ledger = Ledger(url_of(tmp_path / "ledger.sqlite"))
    policy = BudgetPolicy(cap_epsilon=2.0)
    spend(ledger, "jan01", start=jan(1), policy=policy)
    spend(ledger, "feb01", start=dt.date(2026, 2, 1), policy=policy)
    with pytest.raises(BudgetExceededError, match="0 left of 2"):
        reserve(ledger, "dec31", start=dt.date(2026, 12, 31), policy=policy)
    # Scopes are separate budgets.
    ledger.reserve(
        make_key(scope="other/CUSTOMER_ID"),
        run_id="other",
        job="job",
        epsilon=2.0,
        delta=0.0,
        output="/nowhere",
        policy=policy,
    )


# --------------------------------------------------------------------------- 4. concurrency

RACER = """
import json, pathlib, sys, time
from dppipeline.ledger import BudgetExceededError, BudgetPolicy, Ledger, ReleaseKey
import datetime as dt
url, ready, go, run_id = sys.argv[1:]
ledger = Ledger(url)
pathlib.Path(ready).touch()
while not pathlib.Path(go).exists():
    time.sleep(0.0002)
key = ReleaseKey("shop/CUSTOMER_ID", run_id, "input", dt.date(2026, 1, 1), dt.date(2026, 1, 1))
try:
    ledger.reserve(key, run_id=run_id, job="job", epsilon=1.0, delta=0.0, output="/nowhere",
                   policy=BudgetPolicy(cap_epsilon=2.0))
except BudgetExceededError as exc:
    print(exc)
    sys.exit(3)
print("reserved")
"""


def test_racing_processes_cannot_both_take_the_last_budget(tmp_path):
    url = url_of(tmp_path / "ledger.sqlite")
    ledger = Ledger(url)
    spend(ledger, "earlier", policy=BudgetPolicy(cap_epsilon=2.0))  # 1 of 2 left: one more
    go = tmp_path / "go"
    racers = {}
    for n in range(4):
        ready = tmp_path / f"ready-{n}"
        proc = subprocess.Popen(
            [sys.executable, "-c", RACER, url, str(ready), str(go), f"racer-{n}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        racers[f"racer-{n}"] = (proc, ready)
    deadline = time.monotonic() + 60
    while not all(ready.exists() for _, ready in racers.values()):  # all have the ledger open
        assert time.monotonic() < deadline, "racers did not start"
        assert all(proc.poll() is None for proc, _ in racers.values())
        time.sleep(0.01)
    go.touch()  # start them at the same moment
    outcomes = {}
    for run_id, (proc, _) in racers.items():
        out, err = proc.communicate(timeout=60)
        outcomes[run_id] = (proc.returncode, out.strip(), err)

    winners = [run_id for run_id, (code, _, _) in outcomes.items() if code == 0]
    assert len(winners) == 1, outcomes
    for run_id, (code, out, err) in outcomes.items():
        if run_id not in winners:
            assert code == 3, (out, err)
            assert "epsilon 1 needed, 0 left of 2" in out
    assert states(ledger) == {"earlier": "committed", winners[0]: "reserved"}


# --------------------------------------------------------------------------- 5. kill and repair


@pytest.fixture
def big_input(tmp_path) -> Path:
    """About a million rows (~40 MB of CSV): reading takes the local engine ~1 s, long enough
    to kill the run while it writes its release."""
    from dppipeline.synth import generate

    return generate(
        tmp_path / "big",
        fmt="csv",
        customers=5000,
        terminals=500,
        days=10,
        tx_per_day=100_000,
        start_date=DAYS[0],
        seed=3,
    ).output


def test_sigkill_mid_write_leaves_a_reservation_that_the_next_run_repairs(tmp_path, big_input):
    ledger_file = tmp_path / "ledger.sqlite"
    ledger = Ledger(url_of(ledger_file))  # created before the run, so it can be polled
    dest = tmp_path / "dest"
    output = dest / "release"
    args = [
        "run", "--input", big_input, "--format", "csv", "--output", output,
        "--ledger", url_of(ledger_file), *BOUNDS,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "DPPIPELINE_DEBUG"}
    with (tmp_path / "killed.stderr").open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dppipeline", *map(str, args)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
        try:
            deadline = time.monotonic() + 90
            while True:
                if proc.poll() is not None:
                    pytest.fail(
                        "the run ended before it could be killed (make big_input bigger): "
                        + (tmp_path / "killed.stderr").read_text()[-2000:]
                    )
                reserved = [r for r in ledger.rows() if r.state == "reserved"]
                writing = dest.is_dir() and any(STAGING.match(p.name) for p in dest.iterdir())
                if reserved and writing:
                    break
                assert time.monotonic() < deadline, "the run never reserved and started writing"
                time.sleep(0.005)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=60)  # reaped: its pid is no longer alive
    assert proc.returncode == -signal.SIGKILL

    # Nothing published, nothing visible; the kill left its hidden staging folder behind.
    assert not output.exists()
    names = sorted(p.name for p in dest.iterdir())
    assert [n for n in names if not n.startswith(".")] == []
    assert len(names) == 1
    assert STAGING.match(names[0]), names
    leftover = names[0]
    (killed,) = ledger.rows()
    assert killed.state == "reserved"
    assert killed.output == str(output.resolve())
    assert killed.finished_at is None

    # The same command again: settles the dead run's reservation (nothing was published, so
    # aborted, freeing its budget), then publishes.
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    assert f"settled interrupted run {killed.run_id}: aborted" in again.stderr
    first, second = ledger.rows()
    assert first.run_id == killed.run_id
    assert first.state == "aborted"
    assert first.note == "repaired: no release published"
    assert second.state == "committed"
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["run_id"] == second.run_id
    assert ledger.spent(first.scope, BudgetPolicy(), DAYS[0], DAYS[0]) == pytest.approx(
        (second.epsilon, second.delta)
    )
    # The new run publishes cleanly; the killed run's staging folder is not cleaned up.
    assert sorted(p.name for p in dest.iterdir()) == sorted([leftover, "release"])


RESERVE_AND_EXIT = """
import datetime as dt, sys
from dppipeline.ledger import BudgetPolicy, Ledger, ReleaseKey
url, run_id, output = sys.argv[1:]
key = ReleaseKey("shop/CUSTOMER_ID", run_id, "input", dt.date(2026, 1, 1), dt.date(2026, 1, 1))
Ledger(url).reserve(key, run_id=run_id, job="job", epsilon=1.0, delta=0.0, output=output,
                    policy=BudgetPolicy())
"""


def reserve_in_dead_process(url: str, run_id: str, output: Path) -> None:
    """A reservation by a process that then died without committing or aborting."""
    done = subprocess.run(
        [sys.executable, "-c", RESERVE_AND_EXIT, url, run_id, str(output)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def publish_fake_release(output: Path, run_id: str) -> None:
    (output / "stats").mkdir(parents=True)
    (output / "stats" / "part-00000.parquet").write_bytes(b"not really parquet")
    (output / "manifest.json").write_text(json.dumps({"run_id": run_id}) + "\n")


def test_repair_commits_a_published_release_and_aborts_the_rest(tmp_path):
    url = url_of(tmp_path / "ledger.sqlite")
    published, other, nothing = tmp_path / "published", tmp_path / "other", tmp_path / "nothing"
    reserve_in_dead_process(url, "published-run", published)  # killed after the rename
    reserve_in_dead_process(url, "overwritten-run", other)  # folder holds another run's release
    reserve_in_dead_process(url, "unpublished-run", nothing)  # killed before the rename
    publish_fake_release(published, "published-run")
    publish_fake_release(other, "some-earlier-run")
    ledger = Ledger(url)
    reserve(ledger, "live-run")  # this process is alive: left alone
    assert set(states(ledger).values()) == {"reserved"}

    settled = ledger.repair()
    assert sorted(settled) == [
        ("overwritten-run", "aborted"),
        ("published-run", "committed"),
        ("unpublished-run", "aborted"),
    ]
    assert states(ledger) == {
        "published-run": "committed",
        "overwritten-run": "aborted",
        "unpublished-run": "aborted",
        "live-run": "reserved",
    }
    notes = {r.run_id: r.note for r in ledger.rows()}
    assert notes["published-run"] == "repaired: release found"
    assert notes["unpublished-run"] == notes["overwritten-run"] == "repaired: no release published"
    assert ledger.repair() == []  # settled once
    # The committed repair counts as spent; the aborted ones do not; the live one does.
    assert ledger.spent(SCOPE, BudgetPolicy(), jan(1), jan(1))[0] == pytest.approx(2.0)
    # repair(scope) touches only that scope.
    reserve_in_dead_process(url, "dead-again", nothing)
    assert ledger.repair("another/scope") == []
    assert states(ledger)["dead-again"] == "reserved"


# --------------------------------------------------------------------------- 6. idempotence


def job_spec(input_dir: Path, output: Path, keys: Path, **extra):
    from dppipeline.spec import build_spec

    overrides = {
        "input.path": str(input_dir),
        "output": str(output),
        "bounds.min_value": 0.0,
        "bounds.max_value": 100.0,
        "partition_selection.public_partitions": str(keys),
    }
    overrides.update(extra)
    return build_spec({}, overrides)


@pytest.fixture
def own_input(tmp_path, small_inputs) -> tuple[Path, Path]:
    """A copy of the small parquet input (tests may touch it) and its public key list."""
    folder = tmp_path / "tx"
    shutil.copytree(small_inputs["parquet"], folder)
    keys = tmp_path / "keys.csv"
    keys.write_text("TERMINAL_ID\n" + "".join(f"{k}\n" for k in range(SMALL["terminals"])))
    return folder, keys


def released_values(files: dict[str, bytes]) -> dict[str, list]:
    (name,) = [n for n in files if n.endswith(".parquet")]
    return pq.read_table(io.BytesIO(files[name])).to_pydict()


def test_same_key_returns_the_same_release_without_new_spend(tmp_path, own_input):
    from dppipeline.runner import run_job

    folder, keys = own_input
    url = url_of(tmp_path / "ledger.sqlite")
    ledger = Ledger(url)
    out, copy, fresh = tmp_path / "out", tmp_path / "copy", tmp_path / "fresh"
    said: list[str] = []

    first = run_job(job_spec(folder, out, keys), "local", ledger=url, echo=said.append)
    assert states(ledger) == {first.run_id: "committed"}
    published = tree_bytes(out)
    assert "manifest.json" in published
    assert len(published) >= 2
    assert json.loads(published["manifest.json"])["run_id"] == first.run_id

    # Same key, same output: the committed release, untouched; no noise, no row, no spend.
    said.clear()
    again = run_job(job_spec(folder, out, keys), "local", ledger=url, echo=said.append)
    assert again.run_id == first.run_id
    assert again.manifest == first.manifest
    assert tree_bytes(out) == published
    assert len(ledger.rows()) == 1
    assert any("no new noise drawn" in line for line in said), said
    assert not any("reserved" in line for line in said), said

    # Same key, another output: a byte-identical copy, still one row.
    copied = run_job(job_spec(folder, copy, keys), "local", ledger=url, echo=said.append)
    assert copied.run_id == first.run_id
    assert copied.output == copy
    assert tree_bytes(copy) == published
    assert len(ledger.rows()) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []

    # --new-release --overwrite: new noise, a second row.
    redrawn = run_job(
        job_spec(folder, out, keys),
        "local",
        ledger=url,
        new_release=True,
        overwrite=True,
        echo=said.append,
    )
    assert redrawn.run_id != first.run_id
    assert states(ledger) == {first.run_id: "committed", redrawn.run_id: "committed"}
    now = tree_bytes(out)
    assert json.loads(now["manifest.json"])["run_id"] == redrawn.run_id
    before, after = released_values(published), released_values(now)
    assert before["TERMINAL_ID"] == after["TERMINAL_ID"]  # the same public partitions
    assert before["count"] != after["count"]  # with other noise
    assert tree_bytes(copy) == published  # the copy of the first release is untouched
    # The key's release is now the newest one.
    assert run_job(job_spec(folder, out, keys), "local", ledger=url, echo=said.append).run_id == (
        redrawn.run_id
    )

    # A rewritten input day (same bytes, new mtime) is a new key: a new release and row.
    day_file = next(folder.rglob("*.parquet"))
    stat = day_file.stat()
    os.utime(day_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    changed = run_job(job_spec(folder, fresh, keys), "local", ledger=url, echo=said.append)
    assert changed.run_id not in (first.run_id, redrawn.run_id)
    rows = ledger.rows()
    assert len(rows) == 3
    assert rows[2].run_id == changed.run_id
    assert rows[2].state == "committed"
    assert rows[2].release_key != rows[0].release_key
    assert rows[0].release_key == rows[1].release_key
    assert json.loads((fresh / "manifest.json").read_text())["run_id"] == changed.run_id


def test_same_key_never_returns_another_keys_release(tmp_path, own_input):
    from dppipeline.runner import run_job

    folder, keys = own_input
    url = url_of(tmp_path / "ledger.sqlite")
    out = tmp_path / "out"
    all_days = job_spec(folder, out, keys)
    last_two = job_spec(folder, out, keys, **{"input.start_date": DAYS[1]})  # another key
    first = run_job(all_days, "local", ledger=url, echo=lambda _: None)
    run_job(last_two, "local", ledger=url, overwrite=True, echo=lambda _: None)
    try:
        again = run_job(all_days, "local", ledger=url, echo=lambda _: None)
    except DPPipelineError:
        return  # refusing is right: the folder no longer holds the first release
    # Returned as the first release: the files must be the first release's.
    assert again.run_id == first.run_id
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk["run_id"] == again.run_id, on_disk["input"]


class BrokenEngine:
    """An engine that fails while writing, and records whether data was read."""

    name = "broken"

    def __init__(self) -> None:
        self.runs = 0

    def prepare(self) -> None:
        pass

    def run(self, job, dataset_dir):
        self.runs += 1
        raise InputError("disk on fire")


def test_failed_run_aborts_and_refused_run_reads_nothing(tmp_path, own_input):
    from dppipeline.runner import run_job

    folder, keys = own_input
    url = url_of(tmp_path / "ledger.sqlite")
    ledger = Ledger(url)
    out = tmp_path / "out"
    engine = BrokenEngine()
    with pytest.raises(InputError, match="disk on fire"):
        run_job(job_spec(folder, out, keys), engine, ledger=url, echo=lambda _: None)
    assert engine.runs == 1
    (row,) = ledger.rows()
    assert row.state == "aborted"
    assert row.note == "run failed before publishing"
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []

    capped = job_spec(folder, out, keys, **{"budget.cap_epsilon": 0.5})  # epsilon 1 > 0.5
    with pytest.raises(BudgetExceededError, match=re.escape("0.5 left of 0.5")):
        run_job(capped, engine, ledger=url, echo=lambda _: None)
    assert engine.runs == 1  # refused before any data was read
    assert len(ledger.rows()) == 1
    assert not out.exists()


# --------------------------------------------------------------------------- 7. the CLI


def test_cli_refuses_over_cap_with_exit_3_then_reports(tmp_path, small_inputs):
    ledger_file = tmp_path / "ledger.sqlite"
    url = url_of(ledger_file)
    run = [
        "run", "--input", small_inputs["parquet"], *BOUNDS, "--ledger", url,
        "--scope", SCOPE, "--cap-epsilon", "1.5",
    ]  # fmt: skip
    published = run_cli(*run, "--output", tmp_path / "r1")
    assert published.returncode == 0, published.stderr
    (row,) = Ledger(url).rows()
    assert (row.scope, row.state, row.epsilon) == (SCOPE, "committed", 1.0)

    refused = run_cli(*run, "--output", tmp_path / "r2", "--new-release")
    assert refused.returncode == 3, refused.stderr
    assert "Traceback" not in refused.stderr
    lines = stderr_lines(refused)
    assert len(lines) == 1, refused.stderr
    assert lines[0].startswith("dppipeline run: error:")
    assert repr(SCOPE) in lines[0]
    assert "0.5 left" in lines[0]
    assert "epsilon 1 needed" in lines[0]
    assert not (tmp_path / "r2").exists()
    assert [r.run_id for r in Ledger(url).rows()] == [row.run_id]

    # budget show: the scope, its one release and its spend; with caps, what is left.
    config = tmp_path / "caps.yaml"
    config.write_text("budget:\n  cap_epsilon: 1.5\n")
    show = run_cli("budget", "show", "--ledger", url, "--config", config)
    assert show.returncode == 0, show.stderr
    (line,) = [ln for ln in show.stdout.splitlines() if SCOPE in ln]
    assert line.split()[:4] == [SCOPE, "1", "1", "1e-06"]
    assert "epsilon left 0.5" in line
    assert f"schema v{SCHEMA_VERSION}" in show.stdout

    history = run_cli("budget", "history", "--ledger", url)
    assert history.returncode == 0, history.stderr
    (line,) = [ln for ln in history.stdout.splitlines() if row.run_id in ln]
    assert line.split()[:3] == ["1", "committed", SCOPE]
    assert f"{DAYS[0]}..{DAYS[-1]}" in line
    assert str(tmp_path / "r1") in line

    # budget plot: a PNG drawn from the ledger; an empty ledger still gives a (blank) chart.
    chart, blank = tmp_path / "charts" / "chart.png", tmp_path / "blank.png"
    plotted = run_cli("budget", "plot", "--ledger", url, "--output", chart)
    assert plotted.returncode == 0, plotted.stderr
    assert plotted.stdout.strip() == str(chart)
    empty_url = url_of(tmp_path / "empty.sqlite")
    empty = run_cli("budget", "plot", "--ledger", empty_url, "--output", blank)
    assert empty.returncode == 0, empty.stderr
    for png in (chart, blank):
        data = png.read_bytes()
        assert data[:8] == PNG_SIGNATURE
        assert len(data) > 1024
        width, height = struct.unpack(">II", data[16:24])
        assert width > height > 100
    assert chart.read_bytes() != blank.read_bytes()  # the release is drawn
    for command in ("show", "history"):
        nothing = run_cli("budget", command, "--ledger", empty_url)
        assert nothing.returncode == 0, nothing.stderr
        assert "no releases yet" in nothing.stdout


# --------------------------------------------------------------------------- 8. schema


def test_new_ledger_has_the_current_schema_version(tmp_path):
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(url_of(path))
    assert ledger.schema_version == SCHEMA_VERSION
    ledger.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    reopened = Ledger(url_of(path))  # opening again migrates nothing and keeps the rows
    reserve(reopened, "run-a")
    reopened.close()
    assert [r.run_id for r in Ledger(url_of(path)).rows()] == ["run-a"]


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "ledger.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(UsageError) as refused:
        Ledger(url_of(path))
    message = str(refused.value)
    assert str(path) in message
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    assert "upgrade dppipeline" in message
    with sqlite3.connect(path) as db:  # left as it was
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == []

    cli = run_cli("budget", "history", "--ledger", url_of(path))
    assert cli.returncode == 2, cli.stderr
    lines = stderr_lines(cli)
    assert len(lines) == 1, cli.stderr
    assert "schema version" in lines[0]


def test_repair_leaves_young_reservations_of_other_hosts_alone(tmp_path):
    """Another host's process cannot be checked from here: its reservation is settled only
    once older than FOREIGN_RESERVATION_TTL, never while it may still be running."""
    import sqlite3

    from dppipeline.ledger import FOREIGN_RESERVATION_TTL

    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(url_of(path))
    reserve(ledger, "young")
    reserve(ledger, "old")
    stale = dt.datetime.now(dt.UTC) - FOREIGN_RESERVATION_TTL - dt.timedelta(minutes=1)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE releases SET host = 'worker-b'")
        db.execute(
            "UPDATE releases SET reserved_at = ? WHERE run_id = 'old'",
            (stale.isoformat(timespec="seconds"),),
        )
    assert ledger.repair() == [("old", "aborted")]
    states = {r.run_id: r.state for r in ledger.rows()}
    assert states == {"young": "reserved", "old": "aborted"}
