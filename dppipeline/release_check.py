"""Is a published release what it claims to be? The check a scheduler runs before announcing it.

A release passes when its manifest is there, its dataset's schema is the one
`schemas/terminal_stats.json` defines for the manifest's key and metrics (names, types, order),
and the ledger records its run as committed (the budget was charged for exactly this release).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.dataset as pads

from dppipeline.core.manifest import MANIFEST_NAME
from dppipeline.core.release import release_arrow_schema
from dppipeline.errors import InputError
from dppipeline.ledger import Ledger


def check_release(release: str | Path, ledger: str | None) -> str:
    """One line describing the valid release; raises InputError naming what is wrong."""
    release = Path(release)
    manifest_path = release / MANIFEST_NAME
    if not manifest_path.is_file():
        raise InputError(f"{release}: no {MANIFEST_NAME}: not a published release")
    manifest = json.loads(manifest_path.read_text())
    dataset = release / manifest["dataset"]
    if not dataset.is_dir():
        raise InputError(f"{release}: dataset folder {manifest['dataset']} is missing")
    expected = release_arrow_schema(manifest["partition_key"], list(manifest["metrics"]))
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
    if rows != manifest["released_partitions"]:
        raise InputError(
            f"{dataset}: {rows} rows, the manifest says {manifest['released_partitions']}"
        )
    run_id = manifest["run_id"]
    if ledger is not None:
        book = Ledger(ledger)
        try:
            states = [row.state for row in book.rows() if row.run_id == run_id]
        finally:
            book.close()
        if states != ["committed"]:
            state = states[0] if states else "not recorded"
            raise InputError(f"{release}: run {run_id} is {state} in the ledger, not committed")
    return f"{release}: valid release of run {run_id}, {rows:,} partitions, ledger committed"
