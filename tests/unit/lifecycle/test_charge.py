"""The one charge sequence (`lifecycle.charge`): `run` and `tune` spend by the same steps,
and each rule of the sequence holds against a real SQLite ledger: nothing charged before
`reading`, charged from `reading` on, a commit only while the reservation is still this run's,
and SIGINT/SIGTERM held back from the commit to the end of publication."""

from __future__ import annotations

import ast
import datetime as dt
import signal
from pathlib import Path

import pytest
from support import REPO
from support.data import SMALL, job_spec, quiet
from support.ledger import expire

from dppipeline.analysis.tune import tune
from dppipeline.ledger import BudgetPolicy, Ledger, ReleaseKey, Reservation, ReservationLostError
from dppipeline.lifecycle.charge import charged
from dppipeline.lifecycle.failpoints import FailpointError
from dppipeline.lifecycle.runner import run_job
from dppipeline.storage.releases import published_run_id

# A failpoint's `error` at each stage of the sequence -> the ledger row it leaves.
OUTCOMES = {
    "reserved": "aborted",
    "reading": "failed",
    "staged": "failed",
    "committed": "committed",
    "published": "committed",
}


@pytest.fixture
def keys(tmp_path) -> Path:
    path = tmp_path / "keys.csv"
    path.write_text("TERMINAL_ID\n" + "".join(f"{k}\n" for k in range(SMALL["terminals"])))
    return path


@pytest.mark.parametrize("stage", list(OUTCOMES))
def test_run_and_tune_stop_at_the_same_stage_with_the_same_ledger_row(
    tmp_path, small_inputs, keys, monkeypatch, stage
):
    """A failpoint at any stage of the charge sequence stops a release and a tune alike:
    the same exception, the same ledger state and note, nothing visible before publication."""
    out, tuned = tmp_path / "out", tmp_path / "tuned" / "tune.json"
    spec = job_spec(small_inputs["parquet"], out, keys)
    run_ledger = f"sqlite:///{tmp_path / 'run.sqlite'}"
    tune_ledger = f"sqlite:///{tmp_path / 'tune.sqlite'}"
    monkeypatch.setenv("DPPIPELINE_FAILPOINT", f"{stage}:error")
    with pytest.raises(FailpointError, match=stage):
        run_job(spec, "local", ledger=run_ledger, echo=quiet)
    with pytest.raises(FailpointError, match=stage):
        tune(spec, query_name=None, epsilon=0.5, partitions=None, ledger=tune_ledger,
             output=tuned, progress=quiet)  # fmt: skip
    (run_row,) = Ledger(run_ledger).rows()
    (tune_row,) = Ledger(tune_ledger).rows()
    assert run_row.state == tune_row.state == OUTCOMES[stage]
    assert run_row.note == tune_row.note
    published = stage == "published"
    assert (published_run_id(out) is not None) == tuned.exists() == published
    if OUTCOMES[stage] != "committed":  # discarded: no staging folder, no partial file left
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
        assert list(tuned.parent.iterdir()) == []


class FileOutput:
    """A real output for the sequence: one file staged in `folder/staging`, published by a
    rename to `folder/published`; records which steps the sequence asked for."""

    def __init__(self, folder: Path, during_stage=lambda: None):
        self.staging, self.published = folder / "staging", folder / "published"
        self.during_stage = during_stage
        self.steps: list[str] = []

    def prepare(self) -> None:
        self.steps.append("prepare")

    def stage(self) -> str:
        self.steps.append("stage")
        self.staging.write_text("released\n")
        self.during_stage()
        return "staged"

    def seal(self) -> None:
        self.steps.append("seal")

    def publish(self) -> None:
        self.steps.append("publish")
        self.staging.replace(self.published)

    def discard(self) -> None:
        self.steps.append("discard")
        self.staging.unlink(missing_ok=True)


def reservation(ledger: Ledger, run_id: str = "run-1") -> Reservation:
    day = dt.date(2026, 1, 1)
    key = ReleaseKey("scope", "spec", "input", day, day)
    return Reservation(
        ledger, key, run_id=run_id, job="job", epsilon=1.0, delta=0.0, output="out",
        policy=BudgetPolicy(),
    )  # fmt: skip


def test_a_whole_sequence_commits_then_publishes(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    output = FileOutput(tmp_path)
    assert charged(reservation(Ledger(url)), output) == "staged"
    assert output.steps == ["prepare", "stage", "seal", "publish"]
    assert [r.state for r in Ledger(url).rows()] == ["committed"]
    assert output.published.read_text() == "released\n"


def test_without_a_ledger_the_same_steps_run_and_nothing_is_recorded(tmp_path):
    output = FileOutput(tmp_path)
    assert charged(None, output) == "staged"
    assert output.steps == ["prepare", "stage", "seal", "publish"]
    assert output.published.exists()


def test_a_reservation_settled_by_another_process_is_never_committed(tmp_path):
    """The commit is conditional on the row still being this run's live reservation: a run
    whose lease ran out and was settled meanwhile publishes nothing, and stays charged."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"

    def settled_by_another_process() -> None:
        other = Ledger(url)
        expire(other, "run-1")
        assert other.repair() == [("run-1", "failed")]

    output = FileOutput(tmp_path, settled_by_another_process)
    with pytest.raises(ReservationLostError, match="publishes nothing"):
        charged(reservation(Ledger(url)), output)
    assert output.steps == ["prepare", "stage", "seal", "discard"]
    assert [r.state for r in Ledger(url).rows()] == ["failed"]
    assert not output.published.exists() and not output.staging.exists()


class InterruptedCommit(Ledger):
    """A ledger whose commit is followed at once by a Ctrl-C (SIGINT to this process)."""

    def commit(self, run_id: str, note: str | None = None) -> None:
        super().commit(run_id, note)
        signal.raise_signal(signal.SIGINT)


def test_a_signal_during_the_commit_waits_until_the_release_is_published(tmp_path):
    """SIGINT arriving as the commit returns is held back until publication ends: the
    committed output is published, then the interrupt takes effect."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    output = FileOutput(tmp_path)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            charged(reservation(InterruptedCommit(url)), output)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert output.steps == ["prepare", "stage", "seal", "publish"]
    assert [r.state for r in Ledger(url).rows()] == ["committed"]
    assert output.published.read_text() == "released\n"


def test_a_failure_before_reading_releases_the_budget(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    output = FileOutput(tmp_path)

    def broken() -> None:
        raise OSError("staging folder not writable")

    output.prepare = broken  # type: ignore[method-assign]
    with pytest.raises(OSError, match="not writable"):
        charged(reservation(Ledger(url)), output)
    (row,) = Ledger(url).rows()
    assert (row.state, row.note) == ("aborted", "failed (OSError) before reading")


# Calls that belong to the charge sequence: only `lifecycle/charge.py` makes them.
SEQUENCE_CALLS = {"signals_deferred", "reading", "mark_reading"}


def test_only_the_charge_module_runs_the_sequence():
    """No third copy: outside `lifecycle/charge.py` (and the ledger that implements the
    steps) no module marks `reading` or holds signals back around a commit."""
    package = REPO / "dppipeline"
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative == "lifecycle/charge.py" or relative.startswith("ledger/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in SEQUENCE_CALLS:
                    found.append(f"{relative}:{node.lineno} {name}")
    assert found == []
