"""Is a published release what it claims to be? The check a scheduler runs before announcing it.

A release passes when its manifest is there, each query's dataset has the schema
`schemas/terminal_stats.json` defines for that query's keys and metrics (names, types, order)
and the row count the manifest states,
and the ledger records its run as committed (the budget was charged for exactly this release).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as pads

from dppipeline.core.manifest import QueryEntry, read_manifest
from dppipeline.core.release import release_arrow_schema
from dppipeline.core.tasks import KeyColumn
from dppipeline.errors import InputError
from dppipeline.ledger import Ledger
from dppipeline.spec.model import TIME_BUCKETS


def check_release(release: str | Path, ledger: str | None) -> str:
    """One line describing the valid release; raises InputError naming what is wrong."""
    release = Path(release)
    manifest = read_manifest(release)
    rows = 0
    for name, query in manifest.queries.items():
        rows += _check_dataset(release, name, query, manifest.count_noise == "discrete")
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
                f"{release}: run {run_id} is {state} in ledger {book.location}, not committed"
            )
    ledger_state = ", ledger committed" if ledger is not None else ""
    return (
        f"{release}: valid release of run {run_id}, {len(manifest.queries)} "
        f"dataset(s), {rows:,} partitions{ledger_state}"
    )


def _check_dataset(release: Path, name: str, query: QueryEntry, integer_counts: bool) -> int:
    """One query's dataset: present, the schema its keys and metrics imply, row count."""
    dataset = release / query.dataset
    if not dataset.is_dir():
        raise InputError(f"{release}: dataset folder {query.dataset} of query {name} is missing")
    keys = [KeyColumn(k, k if k in TIME_BUCKETS else None) for k in query.partition_by]
    intervals = any(m.confidence_interval is not None for m in query.metrics.values())
    expected = release_arrow_schema(
        [(k.name, k.arrow_type) for k in keys],
        list(query.metrics),
        intervals,
        integer_counts=integer_counts,
    )
    found = pads.dataset(dataset, format="parquet").schema
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
    rows = pads.dataset(dataset, format="parquet").count_rows()
    if rows != query.released_partitions:
        raise InputError(f"{dataset}: {rows} rows, the manifest says {query.released_partitions}")
    return rows
