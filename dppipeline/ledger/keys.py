"""Release keys: what makes two runs the same release, so a retry returns it instead of
drawing new noise (averaging two releases of the same data would weaken both); and what a run
reads by content, so that the same data is charged in one scope only."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dppipeline.inputs.files import file_stamp
from dppipeline.inputs.fingerprints import FileContent
from dppipeline.storage import Location


@dataclass(frozen=True)
class InputContent:
    """What a file run reads, by content (`inputs.fingerprints`), and whose data it is: the
    ledger refuses a reservation whose files were charged for the same privacy unit in
    another scope."""

    privacy_unit: str
    files: tuple[FileContent, ...]


@dataclass(frozen=True)
class ReleaseKey:
    """Scope, spec hash (the canonical spec, public key files by content), input fingerprint
    and date range. `content`: what a file run reads (None for in-memory rows); not part of
    the key, which keeps naming files by path and time."""

    scope: str
    spec_hash: str
    input_fingerprint: str
    start_date: dt.date
    end_date: dt.date
    content: InputContent | None = field(default=None, compare=False)

    @property
    def digest(self) -> str:
        blob = json.dumps(
            [
                self.scope,
                self.spec_hash,
                self.input_fingerprint,
                self.start_date.isoformat(),
                self.end_date.isoformat(),
            ]
        )
        return hashlib.sha256(blob.encode()).hexdigest()


def input_fingerprint(files: Sequence[Path | Location], root: str | Path | Location) -> str:
    """sha256 of each selected file's path (relative to the input root), size and mtime (an
    object's last-modified time on a store): cheap on any size of data, and changes when a
    file is rewritten."""
    digest = hashlib.sha256()
    base = Location.of(root)
    for path in sorted(files, key=str):
        size, mtime_ns = file_stamp(path)
        where = Location.of(path)
        rel = (
            os.path.relpath(where.path, base.path)
            if where.is_local and base.is_local
            else where.uri.removeprefix(base.uri).lstrip("/")
        )
        digest.update(f"{rel}\0{size}\0{mtime_ns}\n".encode())
    return digest.hexdigest()
