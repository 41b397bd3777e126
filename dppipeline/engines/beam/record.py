"""The release record of a Beam transform: noise drawn once per ledger charge.

`ReleaseTransform` is charged when it is applied, but the caller may run its pipeline many
times (or launch it as a template). Without a record every execution would draw fresh noise
for the one charge, and averaging the executions' releases would undo the noise. So each
partition shard's released tables are kept in the record the first time the shard is
released; every later release of that shard (another execution, a retried bundle) returns the
recorded tables instead of drawing noise again. Every shard is released in every execution
(an empty shard too), so the whole release is recorded by the first execution that finishes.

A local record is claimed atomically: the tables are written into a private temporary folder
that is renamed onto the shard's folder, which fails if another execution got there first;
the loser discards its tables and returns the winner's. On an object store, where Beam's file
systems have no atomic rename, the record is complete once its `_COMPLETE` marker is written:
two executions running at the same moment may each release a shard once (documented).
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from dppipeline.inputs.quarantine import private_folder
from dppipeline.storage import Location, is_uri

COMPLETE = "_COMPLETE"


class ReleaseRecord:
    """A folder of released shards: `shard-SSSSS/<query>.parquet` for every query."""

    def __init__(self, folder: str, queries: tuple[str, ...]):
        self.folder, self._queries = folder, queries

    @property
    def _local(self) -> bool:
        return not is_uri(self.folder) or Location.of(self.folder).is_local

    def _shard(self, shard: int) -> str:
        return FileSystems.join(self.folder, f"shard-{shard:05d}")

    def recorded(self, shard: int) -> dict[str, pa.Table] | None:
        """The shard's recorded tables, or None when no execution released it yet."""
        folder = self._shard(shard)
        if not FileSystems.exists(FileSystems.join(folder, COMPLETE)):
            return None
        tables = {}
        for query in self._queries:
            with FileSystems.open(
                FileSystems.join(folder, f"{query}.parquet"),
                compression_type=CompressionTypes.UNCOMPRESSED,
            ) as handle:
                tables[query] = pq.read_table(pa.BufferReader(handle.read()))
        return tables

    def keep(self, shard: int, tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
        """Records `tables` as the shard's release unless another execution recorded it
        first; returns the recorded tables (these, or the first execution's)."""
        if self._local:
            return self._keep_local(shard, tables)
        folder = self._shard(shard)
        for query, table in tables.items():
            _write(FileSystems.join(folder, f"{query}.parquet"), table)
        _write_marker(FileSystems.join(folder, COMPLETE))
        return tables

    def _keep_local(self, shard: int, tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
        root = private_folder(
            Path(Location.of(self.folder).path if is_uri(self.folder) else self.folder)
        )
        temporary = root / f".shard-{shard:05d}.{uuid.uuid4().hex}"
        temporary.mkdir(mode=0o700)
        try:
            for query, table in tables.items():
                pq.write_table(table, temporary / f"{query}.parquet")
            (temporary / COMPLETE).touch(mode=0o600)
            os.rename(temporary, root / f"shard-{shard:05d}")
        except OSError as exc:
            shutil.rmtree(temporary, ignore_errors=True)
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            recorded = self.recorded(shard)
            assert recorded is not None, "a shard folder is renamed in complete"
            return recorded
        return tables


def _write(path: str, table: pa.Table) -> None:
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        pq.write_table(table, handle)


def _write_marker(path: str) -> None:
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(b"")
