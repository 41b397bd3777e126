"""Publishing a release: a complete staging folder becomes the visible release in one step,
and every run first repairs what a crashed run left beside its output.

Names beside an output `OUT` (all hidden, all carrying the run id):

    .OUT.lock                 an exclusive flock held by the run publishing to OUT
    .OUT.staging-<run_id>/    the release being written (complete once its manifest is there)
    .OUT.retired-<run_id>/    the release it replaced, being removed

A run records each folder it makes there: `.dppipeline-run` inside it names the run (written
when the staging folder is made, taken out just before it becomes the release; written into a
retired release before it is removed, and removed last). `heal` removes only a folder that
holds that record or is a complete release of this product and nothing else: a user's folder
that merely has such a name is left alone, whatever it holds.

The order, and what a crash at each step leaves (the next run to OUT, holding the lock, repairs
it with `heal` before anything else; the ledger says which runs committed):

1. lock `.OUT.lock` for the whole run (another run to OUT fails at once, exit 1: retry later);
2. write `.OUT.staging-<run_id>/`, manifest last, then fsync it. Crash: an incomplete or
   uncommitted staging folder, removed by the next run;
3. commit in the ledger. Crash: a committed, complete staging folder that was never swapped
   in: the next run publishes it (rolls forward), so a rerun returns that release;
4. publish: a first release is renamed onto the absent or empty OUT; a new one is swapped with
   the old one by `renameat2(RENAME_EXCHANGE)`, one atomic step, OUT stays a plain folder.
   Readers see the old release or the new one, never neither. Crash: the staging name holds
   the old release while OUT holds the new one: removed by the next run;
5. rename the old release to `.OUT.retired-<run_id>` and remove it (manifest first, so a
   folder with a manifest is always whole). Crash: a retired folder, removed by the next run.

Where RENAME_EXCHANGE is missing (not Linux, old kernels, some network file systems), step 4 is
two renames: OUT -> `.OUT.retired-<run_id>`, then staging -> OUT. A crash between them leaves no
release at OUT until the next run, which publishes the committed staging folder (or, if the run
did not commit, puts the retired release back).

A run never deletes anything but releases of its own product: `check_release_target` refuses
any other target (see its docstring), and `publish` never replaces a folder that is not one.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from dppipeline import settings
from dppipeline.errors import OutputError
from dppipeline.lifecycle.failpoints import failpoint

MANIFEST = "manifest.json"
# Files a release folder may hold besides its datasets: the manifest, and the `_PUBLISHED`
# marker the Airflow DAGs write into a validated release (and its temporary file).
RELEASE_FILES = frozenset({MANIFEST, "_PUBLISHED", "._PUBLISHED.tmp"})
RUN_ID = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{8}$")
# The record a run keeps inside each staging or retired folder it made (see the docstring).
MADE_BY = ".dppipeline-run"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def staging_path(output: Path, run_id: str) -> Path:
    return output.parent / f".{output.name}.staging-{run_id}"


def retired_path(output: Path, run_id: str) -> Path:
    return output.parent / f".{output.name}.retired-{run_id}"


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """A folder's manifest when it is a readable JSON object; None otherwise."""
    try:
        content = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return content if isinstance(content, dict) else None


def release_entries(manifest: dict[str, Any]) -> set[str] | None:
    """The entries a release folder may hold, by its manifest; None when the manifest is
    not one of this product's (manifest_version, run_id, job and its datasets)."""
    if not (
        isinstance(manifest.get("manifest_version"), int)
        and isinstance(manifest.get("run_id"), str)
        and isinstance(manifest.get("job"), str)
    ):
        return None
    queries = manifest.get("queries")
    if isinstance(queries, dict):
        datasets = {q.get("dataset") for q in queries.values() if isinstance(q, dict)}
    else:
        datasets = {manifest["job"]}
    if not all(isinstance(d, str) and d and "/" not in d for d in datasets):
        return None
    return set(RELEASE_FILES) | datasets  # type: ignore[arg-type]


def _is_empty_or_absent(folder: Path) -> bool:
    if not os.path.lexists(folder):
        return True
    return folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir())


def _within(path: Path, folder: Path) -> bool:
    return path == folder or path.is_relative_to(folder)


def refuse_unsafe_target(
    output: str | Path,
    *,
    input_path: str | Path | None = None,
    ledger_file: Path | None = None,
    quarantine: Path | None = None,
) -> Path:
    """Refuses (exit 1, naming why) an output no run may write, whatever the flags: `.`, `..`,
    a symbolic link or a file; a folder that is, holds or lies inside the input; a folder
    holding the ledger file or the quarantine folder."""
    output = Path(output)
    if output.name in ("", ".."):  # `.`, `/`, `x/..`: no name of their own, so the staging
        # folder and the lock would go elsewhere (into x for `x/..`) and the swap would fail
        raise OutputError(f"output {output}: name the release folder itself, not . or ..")
    if output.is_symlink():
        raise OutputError(f"output {output} is a symbolic link: give the folder itself")
    if output.exists() and not output.is_dir():
        raise OutputError(f"output {output} exists and is not a folder")
    target = output.resolve()
    if input_path is not None:
        source = Path(input_path).resolve()
        if target == source:
            raise OutputError(f"output {output} is the input folder: a release never replaces it")
        if _within(source, target):
            raise OutputError(f"output {output} holds the input folder {input_path}")
        if _within(target, source):
            raise OutputError(f"output {output} is inside the input folder {input_path}")
    if ledger_file is not None and _within(ledger_file.resolve(), target):
        raise OutputError(f"output {output} holds the ledger {ledger_file}")
    if quarantine is not None and _within(quarantine.resolve(), target):
        raise OutputError(f"output {output} holds the quarantine folder {quarantine}")
    return output


def check_release_target(
    output: str | Path,
    overwrite: bool,
    *,
    input_path: str | Path | None = None,
    ledger_file: Path | None = None,
    quarantine: Path | None = None,
) -> Path:
    """`refuse_unsafe_target`, then: an existing non-empty folder needs `overwrite`, and even
    then must be a release of this product holding nothing but its release (manifest,
    datasets, `_PUBLISHED`): only a release is ever replaced, nothing else is ever deleted."""
    output = refuse_unsafe_target(
        output, input_path=input_path, ledger_file=ledger_file, quarantine=quarantine
    )
    if _is_empty_or_absent(output):
        return output
    if not overwrite:
        raise OutputError(f"release {output} already exists; pass --overwrite to replace it")
    manifest = read_manifest(output)
    if manifest is None or release_entries(manifest) is None:
        raise OutputError(
            f"output {output} is not empty and holds no dppipeline release (no {MANIFEST} of "
            "one): --overwrite replaces only a release"
        )
    _refuse_strangers(output, manifest)
    return output


def _refuse_strangers(output: Path, manifest: dict[str, Any]) -> None:
    """Raises OutputError when the release folder `output` holds anything its manifest does
    not name: replacing the release would delete it."""
    allowed = release_entries(manifest) or set()
    strangers = sorted(p.name for p in output.iterdir() if p.name not in allowed)
    if strangers:
        raise OutputError(
            f"output {output} holds {', '.join(strangers[:3])}"
            + (" and more" if len(strangers) > 3 else "")
            + ", not part of its release: --overwrite replaces only a release (move them)"
        )


# -------------------------------------------------------------------------------------------
# The lock


@contextmanager
def output_lock(output: Path) -> Iterator[None]:
    """Holds `.OUT.lock` (flock, exclusive) while the block runs; fails at once when another
    run holds it. The file is removed at the end; a lock taken on a file that was removed
    meanwhile is dropped and taken again on the new file."""
    output.parent.mkdir(parents=True, exist_ok=True)
    path = output.parent / f".{output.name}.lock"
    for _ in range(100):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputError(
                f"output {output} is being written by another run (it holds {path}); retry "
                "when that run ends"
            ) from None
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)
    else:  # pragma: no cover - would need 100 runs finishing in between
        raise OutputError(f"output {output}: could not take {path}; retry")
    try:
        yield
    finally:
        with suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


# -------------------------------------------------------------------------------------------
# Staging and publication


def make_staging(output: Path, run_id: str) -> Path:
    """The run's staging folder, made now (never one that exists) and recorded as made."""
    staging = staging_path(output, run_id)
    staging.mkdir(parents=True)
    _record_made(staging, run_id)
    return staging


def _record_made(folder: Path, run_id: str) -> None:
    (folder / MADE_BY).write_text(run_id + "\n")


def made_by_run(folder: Path, run_id: str) -> bool:
    """Did run `run_id` make `folder` (a staging or retired name)? Its record says so, or
    it is a complete release of this product holding nothing else (a staging folder whose
    record was taken out just before publication; a release just moved aside)."""
    try:
        if (folder / MADE_BY).read_text().strip() == run_id:
            return True
    except (OSError, UnicodeDecodeError):
        pass
    manifest = read_manifest(folder)
    allowed = release_entries(manifest) if manifest is not None else None
    if allowed is None:
        return False
    return all(entry.name in allowed for entry in folder.iterdir())


def fsync_tree(folder: Path) -> None:
    """Every file and folder under `folder` (and itself) on disk."""
    for path in sorted(folder.rglob("*"), reverse=True):
        _fsync(path)
    _fsync(folder)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@cache
def _renameat2() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:  # a C library older than glibc 2.28
        return None
    function.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    function.restype = ctypes.c_int
    return function


def exchange(first: Path, second: Path) -> bool:
    """Swaps two existing folders atomically (renameat2 RENAME_EXCHANGE); False when this
    system cannot ($DPPIPELINE_PUBLISH_NO_EXCHANGE=1 says so too, for tests)."""
    function = _renameat2()
    if function is None or settings.publish_no_exchange():
        return False
    if function(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE):
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            return False
        raise OSError(code, os.strerror(code), str(second))
    return True


def publish(output: Path, staging: Path, run_id: str) -> None:
    """Makes the complete release in `staging` the release at `output` (see the module
    docstring for the steps and their crash safety). The caller holds the output lock."""
    parent = output.parent
    with suppress(FileNotFoundError):
        (staging / MADE_BY).unlink()  # the release is complete: its manifest says whose it is
    if _is_empty_or_absent(output):
        os.rename(staging, output)  # onto nothing, or onto an empty folder: one atomic step
        failpoint("exchanged")
    else:
        manifest = read_manifest(output)
        if manifest is None or release_entries(manifest) is None:
            raise OutputError(f"output {output} is not a release: it is never replaced")
        _refuse_strangers(output, manifest)  # also when `heal` rolls a release forward
        retired = retired_path(output, run_id)
        if exchange(staging, output):
            failpoint("exchanged")
            os.rename(staging, retired)  # the old release, out of the way
        else:
            os.rename(output, retired)  # two steps: `heal` finishes them after a crash
            failpoint("exchanged")
            os.rename(staging, output)
        _fsync(parent)
        _record_made(retired, run_id)  # a crash while it is removed leaves it recognisable
        remove_release(retired)
    _fsync(parent)


def remove_release(folder: Path) -> None:
    """Removes a release folder, its manifest first: a folder that still has a manifest is
    always complete; the run's record (`MADE_BY`) last, so a half-removed folder is still
    known as the run's. A symbolic link is never followed (nor removed)."""
    if folder.is_symlink():
        return
    with suppress(FileNotFoundError):
        (folder / MANIFEST).unlink()
    with suppress(FileNotFoundError, NotADirectoryError):
        for entry in folder.iterdir():
            if entry.name == MADE_BY:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with suppress(FileNotFoundError):
                    entry.unlink()
    shutil.rmtree(folder, ignore_errors=True)


# -------------------------------------------------------------------------------------------
# Repairing what crashed runs left


@dataclass
class Leftovers:
    """A crashed run's folders beside the output."""

    run_id: str
    staging: Path | None = None
    retired: Path | None = None


def leftovers(output: Path) -> list[Leftovers]:
    """Staging and retired folders of runs to `output`, by run id (older names are ignored)."""
    found: dict[str, Leftovers] = {}
    if not output.parent.is_dir():
        return []
    for entry in output.parent.iterdir():
        for kind in ("staging", "retired"):
            prefix = f".{output.name}.{kind}-"
            run_id = entry.name.removeprefix(prefix)
            if (
                entry.name.startswith(prefix)
                and RUN_ID.match(run_id)
                and entry.is_dir()
                and not entry.is_symlink()  # runs make folders: a link is someone else's
            ):
                setattr(found.setdefault(run_id, Leftovers(run_id)), kind, entry)
    return [found[k] for k in sorted(found)]


# What to do with a run's staging folder: "live" (leave everything alone), "publish" (roll a
# committed release forward) or "discard". Called with the run id and the staging folder's
# manifest when it is complete (its run id is that run's), None otherwise.
Fate = Callable[[str, "dict[str, Any] | None"], str]


def heal(output: Path, fate: Fate) -> list[str]:
    """Finishes or undoes what crashed runs left beside `output`; returns one line per action.
    The caller holds the output lock, so no live run of this version writes here."""
    done = []
    for left in leftovers(output):
        staged = read_manifest(left.staging) if left.staging is not None else None
        complete = staged if staged is not None and staged.get("run_id") == left.run_id else None
        decision = fate(left.run_id, complete)
        if decision == "live":
            continue
        current = read_manifest(output)
        swapped = current is not None and current.get("run_id") == left.run_id
        for kind in ("staging", "retired"):
            folder = getattr(left, kind)
            if folder is None or (kind == "staging" and swapped and read_manifest(folder)):
                continue  # the release this run replaced, moved here by the exchange
            if not made_by_run(folder, left.run_id):
                setattr(left, kind, None)
                done.append(f"left {folder.name} alone: no run of this product made it")
        if left.staging is not None:
            if swapped:
                remove_release(left.staging)  # swapped in already: this is the old release
                done.append(f"removed the replaced release left by run {left.run_id}")
            elif decision == "publish" and complete is not None:
                publish(output, left.staging, left.run_id)
                done.append(f"published committed run {left.run_id} (its publication was cut)")
            else:
                remove_release(left.staging)
                done.append(f"removed the staging folder of run {left.run_id}")
        if left.retired is not None and left.retired.exists():
            if _is_empty_or_absent(output) and read_manifest(left.retired) is not None:
                with suppress(FileNotFoundError):
                    (left.retired / MADE_BY).unlink()
                os.rename(left.retired, output)  # onto nothing or an empty folder
                done.append(f"restored the release that run {left.run_id} was replacing")
            else:
                remove_release(left.retired)
                done.append(f"removed the retired release left by run {left.run_id}")
    if done:
        _fsync(output.parent)
    return done
