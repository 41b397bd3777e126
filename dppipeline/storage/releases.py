"""Where a published release's files are: its manifest, and the pointer object stores use.

The publication protocol on stores without an atomic rename (object stores): a release's
files live under `<release>/_runs/<run_id>/`, and `<release>/RELEASE.json`, written last in
one PUT, names the run that is the release. Readers follow it; without it the folder itself is
the release (local disks publish by rename). The manifest's content is `core.manifest`'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dppipeline.errors import InputError
from dppipeline.storage.location import Location, StorageError

MANIFEST_NAME = "manifest.json"
POINTER_NAME = "RELEASE.json"
RUNS_FOLDER = "_runs"


def release_pointer(release: str | Path | Location) -> dict[str, Any] | None:
    """The pointer object of a release on a store, when there is a readable one."""
    where = Location.of(release).join(POINTER_NAME)
    try:
        if where.is_local:
            text = where.path.read_bytes()
        elif where.is_file():
            text = where.read_bytes()
        else:
            return None
        pointer = json.loads(text)
    except (OSError, ValueError):
        return None
    if not isinstance(pointer, dict) or not isinstance(pointer.get("run_id"), str):
        return None
    return pointer


def release_folder(release: str | Path | Location) -> Location:
    """Where a release's files are: the run its pointer names, or the folder itself."""
    where = Location.of(release)
    pointer = release_pointer(where)
    if pointer is None:
        return where
    return where.join(RUNS_FOLDER, pointer["run_id"])


def _manifest_text(folder: Location) -> str:
    path = folder.join(MANIFEST_NAME)
    return path.path.read_text() if path.is_local else path.read_bytes().decode()


def manifest_text(release: str | Path | Location) -> tuple[str, str]:
    """(how errors name the manifest file, its text) of a release (local folder, or a
    store's pointer); InputError when it is missing or cannot be read."""
    folder = release_folder(release)
    path = folder.join(MANIFEST_NAME).display()
    try:
        return path, _manifest_text(folder)
    except FileNotFoundError:
        shown = Location.of(release).display()
        raise InputError(f"{shown}: no {MANIFEST_NAME}: not a published release") from None
    except StorageError as exc:
        if not folder.join(MANIFEST_NAME).exists():
            shown = Location.of(release).display()
            raise InputError(f"{shown}: no {MANIFEST_NAME}: not a published release") from None
        raise InputError(f"cannot read {exc}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None


def published_run_id(release: str | Path | Location) -> str | None:
    """The run id in a release's manifest; None when there is no readable manifest."""
    try:
        run_id = json.loads(_manifest_text(release_folder(release))).get("run_id")
    except (OSError, ValueError, AttributeError):  # AttributeError: not a JSON object
        return None
    return run_id if isinstance(run_id, str) else None
