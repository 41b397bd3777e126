"""The run reads the public key files a job names, and hands them to core as values.

`core.tasks` turns them into key sets (canonical types, ranges, time buckets) and reads no
file itself; `inputs.files.key_lines` is the one reader of a key file's text.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dppipeline.core.tasks import KeyFile, KeyFileRequest, key_file_requests
from dppipeline.inputs.files import key_lines
from dppipeline.spec.model import JobSpec
from dppipeline.storage import Location


def read_key_file(source: str | Path, columns: Sequence[str]) -> KeyFile:
    """One key file's lines: the texts of `columns` per key (`key_lines`'s errors)."""
    lines = key_lines(source, columns)
    where = Location.of(source).display()
    return KeyFile(where, tuple((number, tuple(texts)) for number, texts in lines))


def read_key_files(spec: JobSpec) -> dict[KeyFileRequest, KeyFile]:
    """Every public key file the job's queries name, read once each; none may be the input
    (`JobSpec.refuse_input_as_keys`)."""
    spec.refuse_input_as_keys()
    return {
        (source, columns): read_key_file(source, columns)
        for source, columns in key_file_requests(spec)
    }
