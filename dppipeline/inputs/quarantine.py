"""Where rejected rows go: an operator-only folder, never inside or beside a release.

Rejected rows are raw input (customer ids, amounts): they stay with the operator, like the
ledger. The default is `<state dir>/quarantine/<run_id>/` (the state dir is
`$DPPIPELINE_STATE_DIR`, default `./state`, beside the default ledger); `input.quarantine` or
`--quarantine` choose another folder, which must not be the release's folder, inside it, its
parent folder or a folder directly beside it (whoever reads the release's folder sees those).
Folders are created with mode 0700 and files written with mode 0600. The manifest never names
the quarantine. A quarantine on a store (`s3://ops-bucket/quarantine`) is written locally by
the engine, under the state folder, then uploaded to `<uri>/<run_id>/` and removed locally;
who may read it there is the bucket's access policy.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dppipeline.errors import OutputError, UsageError
from dppipeline.settings import state_dir
from dppipeline.storage import Location, StorageError

FILE_NAME = "rejected.parquet"
_FOLDER_MODE, _FILE_MODE = 0o700, 0o600


def default_root() -> Path:
    return state_dir() / "quarantine"


def check_place(root: Path, output: Path) -> None:
    """Refuses a quarantine folder that whoever reads the release could see."""
    folder, release = Path(root).resolve(), Path(output).resolve()
    if folder == release or release in folder.parents:
        where = "inside the release folder"
    elif release.parent in (folder, folder.parent):
        where = "beside the release (in its parent folder)"
    else:
        return
    raise UsageError(
        f"--quarantine: {root} is {where}; rejected rows are raw input and must stay in an "
        "operator-only folder (default $DPPIPELINE_STATE_DIR/quarantine)"
    )


def run_folder(root: Path, run_id: str, output: Path) -> Path:
    """This run's quarantine folder (absolute; not created until rows are rejected)."""
    check_place(root, output)
    return Path(root).resolve() / run_id


PROBE_PREFIX = ".dppipeline-probe-"


def check_writable(folder: Path | Location, run_id: str) -> None:
    """Before any row is read: the quarantine can be written (a rejected row found after
    reading would otherwise fail a charged run). Local: a probe file made and removed in
    `folder`'s nearest existing ancestor, nothing else created. A store: a probe object
    written beside the run's folder there and removed (a missing bucket, a read-only
    credential or none fail here). One line naming the folder and the rule."""
    if isinstance(folder, Location) and not folder.is_local:
        probe = folder.parent.join(f"{PROBE_PREFIX}{run_id}")
        try:
            probe.write_bytes(b"")
            probe.delete_file()
        except StorageError as exc:
            raise OutputError(
                f"quarantine {folder.display()}: cannot write there ({_reason(exc)}); "
                "checked before reading, nothing was charged"
            ) from None
        return
    path = Path(folder)
    existing = next((p for p in (path, *path.parents) if p.exists()), path.anchor)
    local_probe = Path(existing) / f"{PROBE_PREFIX}{run_id}"
    try:
        os.close(os.open(local_probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE))
        local_probe.unlink()
    except OSError as exc:
        raise OutputError(
            f"quarantine {path}: cannot write into {existing} ({_reason(exc)}); checked "
            "before reading, nothing was charged"
        ) from None


def _reason(exc: OSError) -> str:
    """The errno's text for a local failure; the store's first line (after the location)."""
    if isinstance(exc, StorageError):
        return str(exc).split(": ", 1)[-1]
    if exc.errno:
        import errno  # noqa: PLC0415

        return f"{os.strerror(exc.errno)} ({errno.errorcode.get(exc.errno, exc.errno)})"
    return type(exc).__name__


def private_folder(folder: Path) -> Path:
    """Creates `folder` (and missing parents) readable by the owner only."""
    folder = Path(folder)
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(mode=_FOLDER_MODE, parents=True, exist_ok=True)
    for created in missing:
        created.chmod(_FOLDER_MODE)  # mkdir's mode is filtered by the umask
    folder.chmod(_FOLDER_MODE)
    return folder


def write_rejected(table: pa.Table, folder: Path) -> Path:
    """Writes the rejected rows as `rejected.parquet`, mode 0600 from its first byte."""
    path = private_folder(folder) / FILE_NAME
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _FILE_MODE)
    with os.fdopen(descriptor, "wb") as handle:
        pq.write_table(table, handle)
    path.chmod(_FILE_MODE)  # an existing file keeps its mode through O_TRUNC
    return path


def seal(path: Path) -> None:
    """Owner-only modes on a tree another writer made (Spark writes a folder of parts)."""
    path = Path(path)
    if path.is_dir():
        path.chmod(_FOLDER_MODE)
        for inner in path.rglob("*"):
            inner.chmod(_FOLDER_MODE if inner.is_dir() else _FILE_MODE)
    elif path.exists():
        path.chmod(_FILE_MODE)


def ship_quarantine(local: Path, remote: Location) -> None:
    """Uploads what an engine kept aside in `local` to `remote`, then removes the local copy
    (nothing when no row was rejected)."""
    local = Path(local)
    if not local.exists():
        return
    files = sorted(p for p in local.rglob("*") if p.is_file())
    try:
        for path in files:
            remote.join(path.relative_to(local).as_posix()).write_bytes(path.read_bytes())
    except StorageError as exc:
        raise OutputError(
            f"cannot write the quarantine: {exc}; the rejected rows stay in {local}"
        ) from None
    for path in files:
        path.unlink()
    for folder in sorted((p for p in local.rglob("*") if p.is_dir()), reverse=True):
        folder.rmdir()
    local.rmdir()
