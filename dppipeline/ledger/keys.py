"""Release keys: what makes two runs the same release, so a retry returns it instead of
drawing new noise (averaging two releases of the same data would weaken both)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ReleaseKey:
    """Scope, spec hash (the canonical spec, public key files by content), input fingerprint
    and date range."""

    scope: str
    spec_hash: str
    input_fingerprint: str
    start_date: dt.date
    end_date: dt.date

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


def input_fingerprint(files: list[Path], root: Path) -> str:
    """sha256 of each selected file's path (relative to the input root), size and mtime:
    cheap on any size of data, and changes when a file is rewritten."""
    digest = hashlib.sha256()
    for path in sorted(files):
        stat = path.stat()
        rel = os.path.relpath(path, root)
        digest.update(f"{rel}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()
