"""Is a published release what it claims to be? The check a scheduler runs before announcing it.

A release passes when its manifest is there (on a store: in the run its `RELEASE.json` pointer
names, with every file the pointer lists), each query's dataset has the schema
`schemas/terminal_stats.json` defines for that query's keys and metrics (names, types, order)
and the row count the manifest states,
and the ledger records its run as committed (the budget was charged for exactly this release).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads

from dppipeline.core.manifest import QueryEntry
from dppipeline.core.mechanisms import release_arrow_schema
from dppipeline.core.tasks import KeyColumn
from dppipeline.errors import InputError
from dppipeline.ledger import Ledger
from dppipeline.lifecycle.manifests import read_manifest
from dppipeline.spec.partition_keys import TIME_BUCKETS
from dppipeline.storage import Location, StorageError
from dppipeline.storage.releases import POINTER_NAME, release_folder, release_pointer


def check_release(release: str | Path, ledger: str | None) -> str:
    """One line describing the valid release; raises InputError naming what is wrong."""
    shown = Location.of(release).display()
    manifest = read_manifest(release)
    folder = release_folder(release)
    rows = 0
    try:
        _check_pointer(release, folder, manifest.run_id)
        for name, query in manifest.queries.items():
            rows += _check_dataset(folder, name, query, manifest.count_noise == "discrete")
    except StorageError as exc:
        raise InputError(f"cannot read {exc}") from None
    run_id = manifest.run_id
    if ledger is not None:
        book = Ledger(ledger)
        try:
            row = book.row(run_id)
        finally:
            book.close()
        if row is None or row.state != "committed":
            state = row.state if row is not None else "not recorded"
            raise InputError(
                f"{shown}: run {run_id} is {state} in ledger {book.location}, not committed"
            )
    ledger_state = ", ledger committed" if ledger is not None else ""
    return (
        f"{shown}: valid release of run {run_id}, {len(manifest.queries)} "
        f"dataset(s), {rows:,} partitions{ledger_state}"
    )


def _check_pointer(release: str | Path, folder: Location, run_id: str) -> None:
    """On a store: the pointer names the manifest's run, and every file it lists is there."""
    pointer = release_pointer(release)
    if pointer is None:
        return
    shown = Location.of(release).display()
    if pointer["run_id"] != run_id:
        raise InputError(f"{shown}: {POINTER_NAME} names run {pointer['run_id']}, its manifest "
                         f"run {run_id}")  # fmt: skip
    for name in pointer.get("files", []):
        if not folder.join(name).is_file():
            raise InputError(f"{shown}: {name}, listed in {POINTER_NAME}, is missing")


def _check_dataset(release: Location, name: str, query: QueryEntry, integer_counts: bool) -> int:
    """One query's dataset: present, the schema its keys and metrics imply, row count."""
    where = release.join(query.dataset)
    dataset = where.display()
    if not where.is_dir():
        raise InputError(
            f"{release.display()}: dataset folder {query.dataset} of query {name} is missing"
        )
    fs, path = where.filesystem()
    if query.key_types is not None:
        keys = [(name, pa.type_for_alias(kind)) for name, kind in query.key_types.items()]
    else:  # a manifest from before key types: int64 columns and day/week/month
        keys = [
            (k.name, k.arrow_type)
            for k in (KeyColumn(e, e if e in TIME_BUCKETS else None) for e in query.partition_by)
        ]
    intervals = any(m.confidence_interval is not None for m in query.metrics.values())
    expected = release_arrow_schema(
        keys,
        list(query.metrics),
        intervals,
        integer_counts=integer_counts,
    )
    found = pads.dataset(path, format="parquet", filesystem=fs).schema
    for column in expected:
        if column.name not in found.names:
            raise InputError(f"{dataset}: column {column.name} is missing")
        if found.field(column.name).type != column.type:
            raise InputError(
                f"{dataset}: column {column.name} has type {found.field(column.name).type}, "
                f"schemas/terminal_stats.json says {column.type}"
            )
    if found.names != expected.names:
        raise InputError(f"{dataset}: columns {found.names}, expected {expected.names}")
    rows = pads.dataset(path, format="parquet", filesystem=fs).count_rows()
    if rows != query.released_partitions:
        raise InputError(f"{dataset}: {rows} rows, the manifest says {query.released_partitions}")
    return rows
