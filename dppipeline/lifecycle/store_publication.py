"""Publishing a release to a store without atomic rename (S3, GCS, ADLS, HDFS through
`dppipeline.storage`): run-unique files, then one small last write.

Layout under an output `OUT` (a URI):

    OUT/_runs/<run_id>/...    a run's release: its datasets, then its manifest (written last)
    OUT/RELEASE.json          the pointer: {"run_id", "files", "replaces"}, one PUT, written
                              after the ledger commit; what readers follow (no leading `_`:
                              Spark and Hadoop skip such files even when named)

A run stages the release on local disk (the local and Spark engines write there as for a
local output; Beam's workers write `OUT/_runs/<run_id>/` themselves), then:

1. uploads the staged files to `OUT/_runs/<run_id>/`, manifest last. Crash: files that no
   pointer names, invisible; removed by the next run (or published by it if committed);
2. commits in the ledger;
3. writes `OUT/RELEASE.json` naming the run (and the run it replaces). Object stores make a PUT
   visible whole or not at all: readers see the old release or the new one. Crash before: the
   next run rolls the committed run forward (writes the pointer);
4. removes the replaced run's files. Crash before: the next run removes them (the pointer
   names them as replaced). A reader that listed the replaced release may fail mid-read; it
   reads the pointer again.

Concurrency on one host: the same lock file as a local output, kept under the state folder
(`$DPPIPELINE_STATE_DIR/locks`); across hosts the ledger's reservation per release key and
the pointer's single write decide (last writer wins).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dppipeline.errors import OutputError
from dppipeline.inputs.quarantine import state_dir
from dppipeline.lifecycle.failpoints import failpoint
from dppipeline.lifecycle.publication import RUN_ID, output_lock
from dppipeline.storage import Location, StorageError
from dppipeline.storage.releases import MANIFEST_NAME, POINTER_NAME, RUNS_FOLDER, release_pointer

POINTER_FORMAT = 1
# What a release folder on a store may hold: the pointer, the runs, and the `_PUBLISHED`
# marker a scheduler writes once it validated the release (the Airflow DAGs do).
RELEASE_ENTRIES = frozenset({POINTER_NAME, RUNS_FOLDER, "_PUBLISHED"})


def refuse_unsafe_store_target(
    output: Location, *, input_path: str | None = None, quarantine: Location | None = None
) -> None:
    """An output that is, holds or lies inside the input, or holds the quarantine, is refused
    (exit 1), as for a local output."""
    if output.uri.rstrip("/").count("/") < 3:  # `s3://bucket`: name a folder in it
        raise OutputError(f"output {output.display()}: name a release folder inside the bucket")
    for other, what in ((input_path, "the input folder"), (quarantine, "the quarantine folder")):
        if other is None:
            continue
        there = Location.of(other).uri.rstrip("/") + "/"
        here = output.uri.rstrip("/") + "/"
        if here == there:
            raise OutputError(f"output {output.display()} is {what}: a release never replaces it")
        if there.startswith(here):
            raise OutputError(f"output {output.display()} holds {what}")
        if here.startswith(there):
            raise OutputError(f"output {output.display()} is inside {what}")


def check_store_target(output: Location, overwrite: bool, **guard: Any) -> None:
    """`refuse_unsafe_store_target`, then: an output holding a release needs `overwrite`;
    one holding anything but a release (`RELEASE.json` and `_runs/`) is never written."""
    refuse_unsafe_store_target(output, **guard)
    try:
        entries = output.children() if output.is_dir() else []
    except StorageError as exc:
        raise OutputError(f"cannot list output {exc}") from None
    strangers = sorted(e.name for e, _ in entries if e.name not in RELEASE_ENTRIES)
    if strangers:
        raise OutputError(
            f"output {output.display()} holds {', '.join(strangers[:3])}"
            + (" and more" if len(strangers) > 3 else "")
            + ", not part of a release: a run writes only into an empty folder or a release"
        )
    if release_pointer(output) is not None and not overwrite:
        raise OutputError(
            f"release {output.display()} already exists; pass --overwrite to replace it"
        )


@contextmanager
def store_lock(output: Location) -> Iterator[None]:
    """The output lock of a local output, on a file named after the URI in the state folder."""
    name = hashlib.sha256(output.uri.encode()).hexdigest()[:32]
    with output_lock(state_dir().resolve() / "locks" / name):
        yield


def make_store_staging(run_id: str) -> Path:
    """A private local folder the engine writes the release into before it is uploaded."""
    root = state_dir().resolve() / "staging"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return Path(tempfile.mkdtemp(prefix=f"{run_id}-", dir=root))


def upload_run(output: Location, staging: Path, run_id: str) -> list[str]:
    """Step 1: the staged files under `OUT/_runs/<run_id>/`, manifest last; their names."""
    target = output.join(RUNS_FOLDER, run_id)
    files = sorted(
        (p for p in staging.rglob("*") if p.is_file()),
        key=lambda p: (p.name == MANIFEST_NAME, str(p)),
    )
    names = []
    for path in files:
        name = path.relative_to(staging).as_posix()
        try:
            target.join(name).write_bytes(path.read_bytes())
        except StorageError as exc:
            raise OutputError(f"cannot write the release: {exc}") from None
        names.append(name)
        failpoint("uploading")
    return names


def run_files(folder: Location) -> list[str]:
    """Step 1 for an engine whose workers wrote `OUT/_runs/<run_id>/` themselves (Beam): the
    files there, manifest last."""
    try:
        return sorted(folder.files(), key=lambda name: (name == MANIFEST_NAME, name))
    except StorageError as exc:
        raise OutputError(f"cannot list the release: {exc}") from None


def write_store_manifest(folder: Location, text: str) -> None:
    """The manifest, written last into a run's folder on the store."""
    try:
        folder.join(MANIFEST_NAME).write_bytes(text.encode())
    except StorageError as exc:
        raise OutputError(f"cannot write the release: {exc}") from None


def discard_staging(staging: Path | Location) -> None:
    """An uncommitted run's files: a local staging folder, or its folder on the store (a
    crash leaves the latter to the next run's `heal_store`)."""
    if isinstance(staging, Location):
        with contextlib.suppress(StorageError):  # else the next run removes it
            staging.delete_tree()
        return
    shutil.rmtree(staging, ignore_errors=True)


def publish_to_store(
    output: Location, staging: Path | Location, run_id: str, names: list[str]
) -> None:
    """Steps 3 and 4: the pointer, then the replaced run's files away."""
    previous = release_pointer(output)
    replaced = previous["run_id"] if previous is not None else None
    if replaced == run_id:  # already published (a roll-forward raced this run)
        return
    _write_pointer(output, run_id, names, replaced)
    failpoint("exchanged")
    if replaced is not None and replaced != run_id:
        _remove_run(output, replaced)
    if not isinstance(staging, Location):
        shutil.rmtree(staging, ignore_errors=True)


def _write_pointer(output: Location, run_id: str, names: list[str], replaces: str | None) -> None:
    pointer = {"format": POINTER_FORMAT, "run_id": run_id, "files": names, "replaces": replaces}
    try:
        output.join(POINTER_NAME).write_bytes(json.dumps(pointer, indent=1).encode())
    except StorageError as exc:
        raise OutputError(f"cannot write the release pointer: {exc}") from None


def _remove_run(output: Location, run_id: str) -> None:
    try:
        output.join(RUNS_FOLDER, run_id).delete_tree()
    except StorageError as exc:
        raise OutputError(f"cannot remove the replaced release: {exc}") from None


# What to do with a run's files that the pointer does not name (as for a local staging
# folder): "live", "publish" or "discard"; called with the run id and its manifest when
# complete (manifest written, its run id that run's), None otherwise.
Fate = Callable[[str, "dict[str, Any] | None"], str]


def heal_store(output: Location, fate: Fate) -> list[str]:
    """Finishes or undoes what crashed runs left under `OUT/_runs/`; one line per action."""
    runs = output.join(RUNS_FOLDER)
    try:
        found = [entry for entry, _ in runs.children()] if runs.is_dir() else []
    except StorageError as exc:
        raise OutputError(f"cannot list output {exc}") from None
    pointer = release_pointer(output)
    current = pointer["run_id"] if pointer is not None else None
    replaced = pointer.get("replaces") if pointer is not None else None
    done = []
    for entry in found:
        run_id = entry.name
        if run_id == current or not RUN_ID.match(run_id):
            continue
        if run_id == replaced:
            _remove_run(output, run_id)
            done.append(f"removed the replaced release left by run {run_id}")
            continue
        manifest = _run_manifest(entry)
        complete = manifest if manifest is not None and manifest.get("run_id") == run_id else None
        decision = fate(run_id, complete)
        if decision == "live":
            continue
        newer = current is None or run_id > current  # run ids start with their UTC time
        if decision == "publish" and complete is not None and newer:
            names = sorted(entry.files(), key=lambda name: (name == MANIFEST_NAME, name))
            _write_pointer(output, run_id, names, current)
            if current is not None:
                _remove_run(output, current)
            current, replaced = run_id, current
            done.append(f"published committed run {run_id} (its publication was cut)")
        else:
            _remove_run(output, run_id)
            done.append(f"removed the unpublished files of run {run_id}")
    return done


def _run_manifest(folder: Location) -> dict[str, Any] | None:
    try:
        content = json.loads(folder.join(MANIFEST_NAME).read_bytes())
    except (StorageError, ValueError):
        return None
    return content if isinstance(content, dict) else None
