"""A released dataset's one Parquet file, written the same way by every engine.

Everything in a release besides the released values must be a function of public parameters
and of the released rows: a folder holding whatever files an engine's writer chose (Spark's
`part-<uuid>` names, `_SUCCESS` and `.crc` files, as many parts as adaptive execution made
tasks) or rows in the order tasks happened to finish would tell which engine path ran, and
that path follows the data. So each dataset is one file, `RELEASE_FILE`, holding the rows
sorted by the partition key columns (ascending; int64 and dates by value, text by its UTF-8
bytes, as Spark, pyarrow and Python all order them), written by pyarrow with `PARQUET_OPTIONS`
in row groups of exactly `ROW_GROUP_ROWS` rows (the last one shorter), with the release's Arrow
schema and no other metadata. Two releases with the same number of rows have the same layout,
whichever engine, driver or executors wrote them.

`ReleaseWriter` takes rows already in key order, in chunks, so an engine can stream a large
release through it; `merge_sorted_parts` merges key-sorted parts (Beam's partition shards) into
it with a bounded number of rows in memory.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

RELEASE_FILE = "part-00000.parquet"
# Rows per row group: where one ends depends on the row count only, never on how an engine
# batched the rows (64Ki rows of a few float64 columns: a few MB per group).
ROW_GROUP_ROWS = 65_536
# Stated, not left to pyarrow's defaults, so that a default changing in an upgrade changes
# every engine's files alike.
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "snappy",
    "version": "2.6",
    "use_dictionary": True,
    "write_statistics": True,
    "data_page_version": "1.0",
    "store_schema": True,
}
# Rows a merge of parts holds at once, over all parts (`merge_sorted_parts`).
MERGE_ROWS_IN_MEMORY = 1_000_000


def key_order(keys: Sequence[str]) -> list[tuple[str, str]]:
    return [(key, "ascending") for key in keys]


def sort_by_keys(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The rows in release order: by the key columns, ascending (no keys: one row, as is)."""
    return table.sort_by(key_order(keys)) if keys and table.num_rows > 1 else table


class ReleaseWriter:
    """Writes one dataset's `RELEASE_FILE` to `sink` (a path or a writable file object) from
    rows handed over in key order, in chunks of any size; `close` writes the rest (a release
    of no rows is a file with the schema and no row group) and returns the rows written."""

    def __init__(self, sink: Any, schema: pa.Schema):
        self._schema = schema.remove_metadata()
        self._writer = pq.ParquetWriter(sink, self._schema, **PARQUET_OPTIONS)
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self.rows = 0

    def write(self, rows: pa.Table | pa.RecordBatch) -> None:
        """Appends rows (their columns cast to the release schema, extra columns dropped)."""
        if isinstance(rows, pa.RecordBatch):
            rows = pa.Table.from_batches([rows])
        if rows.num_rows == 0:
            return
        self._pending.append(rows.select(self._schema.names).cast(self._schema))
        self._pending_rows += rows.num_rows
        if self._pending_rows >= ROW_GROUP_ROWS:
            self._flush(whole_groups_only=True)

    def _flush(self, *, whole_groups_only: bool) -> None:
        table = pa.concat_tables(self._pending).combine_chunks()
        full = table.num_rows - table.num_rows % ROW_GROUP_ROWS if whole_groups_only else None
        end = table.num_rows if full is None else full
        for start in range(0, end, ROW_GROUP_ROWS):
            group = table.slice(start, min(ROW_GROUP_ROWS, end - start))
            self._writer.write_table(group, row_group_size=ROW_GROUP_ROWS)
            self.rows += group.num_rows
        rest = table.slice(end)
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows = rest.num_rows

    def close(self) -> int:
        if self._pending_rows:
            self._flush(whole_groups_only=False)
        self._writer.close()
        return self.rows

    def __enter__(self) -> ReleaseWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:  # a failed run's file is never published; free the writer
            self._writer.close()


def write_release_file(sink: Any, table: pa.Table, schema: pa.Schema, keys: Sequence[str]) -> int:
    """A whole release held in memory -> `RELEASE_FILE`, sorted; returns its rows."""
    with ReleaseWriter(sink, schema) as writer:
        writer.write(sort_by_keys(table, keys))
    return writer.rows


@dataclass
class SortedPart:
    """One part of a release whose rows are sorted by key and whose row groups
    `read(i)` (0 <= i < `row_groups`) returns in order."""

    read: Callable[[int], pa.Table]
    row_groups: int


@dataclass
class _Cursor:
    part: SortedPart
    loaded: int  # row groups read so far
    rows: pa.Table  # rows read and not yet merged, in key order

    @property
    def more(self) -> bool:
        return self.loaded < self.part.row_groups

    def refill(self) -> None:
        while self.rows.num_rows == 0 and self.more:
            self.rows = self.part.read(self.loaded)
            self.loaded += 1

    def key(self, i: int, keys: Sequence[str]) -> tuple:
        return tuple(self.rows.column(k)[i].as_py() for k in keys)

    def count_up_to(self, frontier: tuple, keys: Sequence[str]) -> int:
        """How many of the loaded rows have keys <= frontier (a binary search)."""
        return bisect.bisect_right(
            range(self.rows.num_rows), frontier, key=lambda i: self.key(i, keys)
        )


def merge_sorted_parts(parts: Sequence[SortedPart], keys: Sequence[str], writer: ReleaseWriter):
    """Merges parts sorted by `keys` (each key in one part at most) into `writer`, in rounds:
    the frontier is the smallest last loaded key among parts with row groups still unread;
    every part gives its loaded rows up to it (all of them once every part is loaded), and
    the round's rows, sorted, go to the writer. Each round uses up at least one loaded row
    group, so memory holds at most one row group per part (the parts' writer sizes them:
    `part_row_groups`)."""
    cursors = [_Cursor(part, 0, pa.table({})) for part in parts]
    for cursor in cursors:
        cursor.refill()
    cursors = [c for c in cursors if c.rows.num_rows]
    while cursors:
        unread = [c for c in cursors if c.more]
        frontier = min((c.key(c.rows.num_rows - 1, keys) for c in unread), default=None)
        pieces = []
        for cursor in cursors:
            n = cursor.rows.num_rows if frontier is None else cursor.count_up_to(frontier, keys)
            if n:
                pieces.append(cursor.rows.slice(0, n))
                cursor.rows = cursor.rows.slice(n)
            cursor.refill()
        if pieces:
            writer.write(sort_by_keys(pa.concat_tables(pieces), keys))
        cursors = [c for c in cursors if c.rows.num_rows]


def part_row_groups(parts: int) -> int:
    """Rows per row group of each of `parts` sorted parts a merge reads at once: their sum
    stays within MERGE_ROWS_IN_MEMORY (at least 1,024 rows a group)."""
    return max(1024, MERGE_ROWS_IN_MEMORY // max(1, parts))
