"""Publication: a complete staging folder becomes the release in one atomic step; the output
lock; what a target may be (only a release is ever replaced); and `heal`, which finishes or
undoes what a crashed run left beside its output (the crash tests of the whole run are in
test_run_sequence.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.files import read_tree, siblings, touch, write_release

from dppipeline.errors import OutputError
from dppipeline.lifecycle.publication import (
    MADE_BY,
    check_release_target,
    exchange,
    heal,
    make_staging,
    output_lock,
    publish,
    retired_path,
    staging_path,
)

RUN_A = "20260101T000000Z-aaaaaaaa"
RUN_B = "20260102T000000Z-bbbbbbbb"


def run_of(folder: Path) -> str | None:
    path = folder / "manifest.json"
    return json.loads(path.read_text())["run_id"] if path.is_file() else None


@pytest.fixture(params=["exchange", "two-renames"])
def swap_kind(request, monkeypatch) -> str:
    """Both ways a release replaces another: RENAME_EXCHANGE, and the fallback where the
    system cannot exchange."""
    if request.param == "two-renames":
        monkeypatch.setenv("DPPIPELINE_PUBLISH_NO_EXCHANGE", "1")
    return request.param


# --------------------------------------------------------------------------- publish


def test_first_publication_is_a_rename(tmp_path):
    output = tmp_path / "releases" / "out"
    staging = write_release(make_staging(output, RUN_A), RUN_A)
    publish(output, staging, RUN_A)
    assert run_of(output) == RUN_A
    assert siblings(output.parent) == ["out"]


def test_publication_onto_an_empty_folder(tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    publish(output, write_release(make_staging(output, RUN_A), RUN_A), RUN_A)
    assert run_of(output) == RUN_A
    assert siblings(tmp_path) == ["out"]


def test_a_new_release_replaces_the_old_one_and_nothing_is_left(tmp_path, swap_kind):
    output = tmp_path / "out"
    publish(output, write_release(make_staging(output, RUN_A), RUN_A, "old"), RUN_A)
    touch(output / "_PUBLISHED", RUN_A)  # a file only the old release had
    inode = output.stat().st_ino
    publish(output, write_release(make_staging(output, RUN_B), RUN_B, "new"), RUN_B)
    assert sorted(read_tree(output)) == ["manifest.json", "stats/part-00000.parquet"]
    assert read_tree(output)["stats/part-00000.parquet"] == "new"
    assert run_of(output) == RUN_B
    assert output.is_dir() and not output.is_symlink()  # a plain folder, as before
    assert output.stat().st_ino != inode  # the staging folder itself became the release
    assert siblings(tmp_path) == ["out"]


def test_exchange_swaps_two_folders_in_one_step(tmp_path):
    first = write_release(tmp_path / "first", RUN_A)
    second = write_release(tmp_path / "second", RUN_B)
    assert exchange(first, second), "RENAME_EXCHANGE is expected on Linux tmpfs/ext4/overlay"
    assert (run_of(first), run_of(second)) == (RUN_B, RUN_A)


def test_publish_never_replaces_a_folder_that_is_not_a_release(tmp_path):
    output = tmp_path / "out"
    touch(output / "thesis.tex", "years of work")
    with pytest.raises(OutputError, match="not a release"):
        publish(output, write_release(make_staging(output, RUN_A), RUN_A), RUN_A)
    assert read_tree(output) == {"thesis.tex": "years of work"}


# --------------------------------------------------------------------------- targets


def test_target_may_be_absent_empty_or_a_release(tmp_path):
    output = tmp_path / "out"
    assert check_release_target(output, overwrite=False) == output
    output.mkdir()
    assert check_release_target(output, overwrite=False) == output
    write_release(output, RUN_A)
    touch(output / "_PUBLISHED", RUN_A)  # the Airflow DAGs' marker is part of a release
    with pytest.raises(OutputError, match="already exists; pass --overwrite"):
        check_release_target(output, overwrite=False)
    assert check_release_target(output, overwrite=True) == output


@pytest.mark.parametrize(
    ("layout", "words"),
    [
        ("input", "is the input folder"),
        ("input-ancestor", "holds the input folder"),
        ("inside-input", "is inside the input folder"),
        ("ledger", "holds the ledger"),
        ("quarantine", "holds the quarantine folder"),
        ("not-a-release", "holds no dppipeline release"),
        ("release-and-more", "holds notes.txt, not part of its release"),
        ("symlink", "is a symbolic link"),
        ("file", "exists and is not a folder"),
    ],
)
def test_overwrite_refuses_anything_but_a_release(tmp_path, layout, words):
    """Issue 15 case 1: `--overwrite` replaced the input, an unrelated folder, a folder
    holding the ledger. Each is refused, naming why, and nothing is touched."""
    data = tmp_path / "data"
    source = touch(data / "tx" / "date=2026-01-01" / "part-0.parquet").parent.parent
    ledger = touch(tmp_path / "state" / "ledger.sqlite")
    quarantine = tmp_path / "q" / "run"
    output = {
        "input": source,
        "input-ancestor": data,
        "inside-input": source / "release",
        "ledger": ledger.parent,
        "quarantine": tmp_path / "q",
        "not-a-release": touch(tmp_path / "docs" / "index.md").parent,
        "release-and-more": write_release(tmp_path / "rel", RUN_A),
        "symlink": tmp_path / "link",
        "file": touch(tmp_path / "a-file"),
    }[layout]
    if layout == "release-and-more":
        touch(output / "notes.txt")
    if layout == "symlink":
        output.symlink_to(write_release(tmp_path / "real", RUN_A))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(OutputError, match=words) as refused:
        check_release_target(
            output, overwrite=True, input_path=source, ledger_file=ledger, quarantine=quarantine
        )
    assert refused.value.exit_code == 1
    assert str(output) in str(refused.value)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


# --------------------------------------------------------------------------- the lock

HOLD = """
import pathlib, sys, time
from dppipeline.lifecycle.publication import output_lock
with output_lock(pathlib.Path(sys.argv[1])):
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_one_run_at_a_time_per_output(tmp_path):
    output = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(output)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(OutputError, match="being written by another run"), output_lock(output):
            pass
        with output_lock(tmp_path / "other"):  # other outputs are not held up
            pass
    finally:
        holder.communicate("go\n", timeout=60)
    with output_lock(output):  # free again, once the holder is done
        assert (tmp_path / ".out.lock").exists()
    assert siblings(tmp_path) == []  # the lock file goes with the last holder


def test_a_killed_holder_leaves_no_lock(tmp_path):
    output = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(output)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "locked"
    holder.kill()
    holder.wait(timeout=60)
    with output_lock(output):  # the kernel released the flock with the process
        pass
    assert siblings(tmp_path) == []


# --------------------------------------------------------------------------- heal


def fate_of(decisions: dict[str, str]):
    seen = []

    def fate(run_id: str, manifest: dict | None) -> str:
        seen.append((run_id, manifest is not None))
        return decisions.get(run_id, "discard")

    fate.seen = seen  # type: ignore[attr-defined]
    return fate


def test_heal_removes_an_incomplete_staging_folder(tmp_path):
    output = write_release(tmp_path / "out", RUN_A, "old")
    touch(make_staging(output, RUN_B) / "stats" / "part-00000.parquet", "half")  # no manifest
    fate = fate_of({RUN_B: "publish"})  # even a committed run: an incomplete folder is no release
    assert heal(output, fate) == [f"removed the staging folder of run {RUN_B}"]
    assert fate.seen == [(RUN_B, False)]
    assert run_of(output) == RUN_A
    assert siblings(tmp_path) == ["out"]


def test_heal_rolls_a_committed_release_forward(tmp_path, swap_kind):
    """Crash between commit and publication: the committed release is published by the next
    run, which can then return it."""
    output = write_release(tmp_path / "out", RUN_A, "old")
    write_release(staging_path(output, RUN_B), RUN_B, "new")
    assert heal(output, fate_of({RUN_B: "publish"})) == [
        f"published committed run {RUN_B} (its publication was cut)"
    ]
    assert run_of(output) == RUN_B
    assert read_tree(output)["stats/part-00000.parquet"] == "new"
    assert siblings(tmp_path) == ["out"]


def test_heal_removes_an_uncommitted_release(tmp_path):
    output = write_release(tmp_path / "out", RUN_A, "old")
    write_release(staging_path(output, RUN_B), RUN_B, "new")
    assert heal(output, fate_of({})) == [f"removed the staging folder of run {RUN_B}"]
    assert run_of(output) == RUN_A
    assert siblings(tmp_path) == ["out"]


def test_heal_finishes_two_renames_cut_in_the_middle(tmp_path):
    """Without RENAME_EXCHANGE: the old release was moved aside, the new one not yet renamed
    in. A committed run is published; otherwise the old release comes back."""
    for decision, expected in (("publish", RUN_B), ("discard", RUN_A)):
        base = tmp_path / decision
        output = base / "out"
        write_release(retired_path(output, RUN_B), RUN_A, "old")
        write_release(staging_path(output, RUN_B), RUN_B, "new")
        heal(output, fate_of({RUN_B: decision}))
        assert run_of(output) == expected
        assert siblings(base) == ["out"]


def test_heal_after_an_exchange_cut_before_the_old_release_was_moved(tmp_path):
    """RENAME_EXCHANGE done: the output is the new release; the staging name holds the old."""
    output = write_release(tmp_path / "out", RUN_B, "new")
    write_release(staging_path(output, RUN_B), RUN_A, "old")
    assert heal(output, fate_of({RUN_B: "publish"})) == [
        f"removed the replaced release left by run {RUN_B}"
    ]
    assert run_of(output) == RUN_B
    assert siblings(tmp_path) == ["out"]


def test_heal_removes_a_retired_release_and_a_half_removed_one(tmp_path):
    output = write_release(tmp_path / "out", RUN_B, "new")
    write_release(retired_path(output, RUN_B), RUN_A, "old")
    touch(retired_path(output, RUN_A) / "stats" / "part-00000.parquet")  # manifest gone
    touch(retired_path(output, RUN_A) / MADE_BY, RUN_A)  # the record, removed last
    lines = heal(output, fate_of({}))
    assert sorted(lines) == [
        f"removed the retired release left by run {RUN_A}",
        f"removed the retired release left by run {RUN_B}",
    ]
    assert siblings(tmp_path) == ["out"]


def test_heal_never_restores_a_half_removed_release(tmp_path):
    output = tmp_path / "out"
    touch(retired_path(output, RUN_A) / "stats" / "part-00000.parquet")  # manifest removed first
    touch(retired_path(output, RUN_A) / MADE_BY, RUN_A)
    heal(output, fate_of({}))
    assert not output.exists()
    assert siblings(tmp_path) == []


@pytest.mark.parametrize("kind", ["staging", "retired"])
@pytest.mark.parametrize("decision", ["discard", "publish"])
def test_heal_never_removes_a_folder_no_run_made(tmp_path, kind, decision):
    """Issue 32: a user's folder named like a run's staging (or retired) folder, holding the
    user's file, was deleted by the next run to the output (the run id is in no ledger, so
    `discard`). A run removes only what it recorded as made, or a complete release."""
    output = write_release(tmp_path / "out", RUN_A)
    folder = (staging_path if kind == "staging" else retired_path)(output, RUN_B)
    notes = touch(folder / "notes.txt", "the user's")
    lines = heal(output, fate_of({RUN_B: decision}))
    assert lines == [f"left {folder.name} alone: no run of this product made it"]
    assert notes.read_text() == "the user's"
    assert run_of(output) == RUN_A


def test_a_published_release_holds_no_record_of_its_staging(tmp_path, swap_kind):
    """The staging folder's record is taken out before it becomes the release, and a
    replaced release's record goes with it."""
    output = tmp_path / "out"
    publish(output, write_release(make_staging(output, RUN_A), RUN_A, "old"), RUN_A)
    publish(output, write_release(make_staging(output, RUN_B), RUN_B, "new"), RUN_B)
    assert not (output / MADE_BY).exists()
    assert siblings(tmp_path) == ["out"]


def test_heal_leaves_live_runs_and_foreign_names_alone(tmp_path):
    output = write_release(tmp_path / "out", RUN_A)
    live = touch(staging_path(output, RUN_B) / "stats" / "part-00000.parquet").parent.parent
    older = touch(tmp_path / ".out.staging-0123456789ab" / "x")  # an older version's name
    other = touch(tmp_path / ".other.staging-20260101T000000Z-cccccccc" / "x")  # another output
    assert heal(output, fate_of({RUN_B: "live"})) == []
    assert live.is_dir() and older.is_file() and other.is_file()
    assert os.listdir(tmp_path)  # nothing removed
