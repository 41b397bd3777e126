"""A release's layout depends on public parameters only, on every engine.

The Spark engine releases a one-query job on the driver or, past
$DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS non-empty partitions, on the executors: a choice the
data make. Whichever path runs (and on the local and Beam engines), each dataset is one
`part-00000.parquet` (no `_SUCCESS`, `.crc` or other part), its rows sorted by the key
columns, written by the same pyarrow writer with the same schema, metadata and row-group rule.

Each case runs a job on an input whose partitions number N and on the same input plus one
customer at a new shop (N + 1): with the limit at N only the second releases on the
executors, with the limit at 0 both do. The two releases must have the same layout, and each
must follow the rule above. Shop names are text whose UTF-8 order differs from UTF-16's (what
Java's String compares), so every engine's key order is tested where they could disagree.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dppipeline.engines.kernel.release_file import PARQUET_OPTIONS, RELEASE_FILE, ROW_GROUP_ROWS
from dppipeline.lifecycle.runner import run_job
from dppipeline.logs import DEBUG_STATISTICS
from dppipeline.spec.model import build_spec

# UTF-8 (code point) order: "Z" < "a" < "shop-10" < "shop-9" < "é" < "ｚ" (U+FF5A) < "😀"
# (U+1F600); UTF-16 puts "😀" (a surrogate pair, 0xD83D...) before "ｚ".
SHOPS = ["shop-9", "😀", "a", "ｚ", "shop-10", "é", "Z", "ß", "Ab", "aB", "0", "😀a"]
NEW_SHOP = "m-new"  # only the added customer's
DAYS = ["2026-03-01", "2026-03-02"]
CUSTOMERS_PER_SHOP = 6
SCHEMA = [
    {"name": "customer", "type": "int64"},
    {"name": "shop", "type": "string"},
    {"name": "amount", "type": "float64"},
    {"name": "booked", "type": "timestamp[us]", "role": "event_time"},
]


def write_input(path: Path, with_new_shop: bool) -> Path:
    """Every shop has CUSTOMERS_PER_SHOP customers with two rows on each day; the neighbour
    adds one customer with one row at NEW_SHOP on the first day."""
    rows = [
        (shop_index * 100 + c, shop, 10.0 + c, f"{day} 1{c}:00:00")
        for shop_index, shop in enumerate(SHOPS)
        for c in range(CUSTOMERS_PER_SHOP)
        for day in DAYS
        for _ in range(2)
    ]
    if with_new_shop:
        rows.append((999_999, NEW_SHOP, 42.0, f"{DAYS[0]} 12:00:00"))
    path.parent.mkdir(parents=True)
    frame = pd.DataFrame(rows, columns=["customer", "shop", "amount", "booked"])
    frame.to_csv(path, index=False, encoding="utf-8")
    return path


# Each query: its spec, the partitions the base input fills (the neighbour's: one more), and
# the base release's rows (epsilon 1e6: every partition of the base input is released).
QUERIES = {
    "private": (
        {
            "name": "by_shop_day",
            "partition_by": ["shop", "day"],
            "metrics": ["count", "sum", "mean", "percentile(50)", "privacy_id_count"],
        },
        len(SHOPS) * len(DAYS),
        len(SHOPS) * len(DAYS),
    ),
    "public": (
        {
            "name": "by_shop",
            "partition_by": ["shop"],
            "metrics": ["count", "sum", "privacy_id_count"],
            "partition_selection": {"public_partitions": {"shop": [*SHOPS, NEW_SHOP]}},
        },
        len(SHOPS),
        len(SHOPS) + 1,
    ),
}


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def release(
    data: Path, out: Path, engine: str, query: dict, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, bool]:
    """One release of `query` over `data`; returns its folder and whether the Spark engine
    released on the executors (its --debug-statistics line says so)."""
    spec = build_spec(
        {
            "name": "layout",
            "privacy_unit": "customer",
            "value": "amount",
            "input": {
                "path": str(data), "schema": SCHEMA, "layout": "files", "format": "csv",
                "start_date": DAYS[0], "end_date": DAYS[-1],
            },
            "budget": {"epsilon": 1e6, "delta": 1e-6},
            "bounds": {"max_partitions_contributed": 100, "max_contributions_per_partition": 100,
                       "min_value": 0.0, "max_value": 100.0},
            "queries": [query],
            "output": str(out),
        }
    )  # fmt: skip
    monkeypatch.setenv(DEBUG_STATISTICS, "1")
    recorder = _Recorder()
    logger = logging.getLogger("dppipeline.engines.spark.engine")
    logger.addHandler(recorder)
    try:
        result = run_job(spec, engine, echo=lambda _: None, seed=7)
    finally:
        logger.removeHandler(recorder)
    on_executors = any("released on the executors" in line for line in recorder.lines)
    return result.output, on_executors


def layout(root: Path, keys: list[str]) -> dict:
    """Everything about a release but its values and row count: the files (relative names),
    and per Parquet file its Arrow schema with metadata, Parquet schema, file-level metadata
    (created_by, key-value, format) and compression; and whether its row groups and row
    order follow the rule (row groups of ROW_GROUP_ROWS, the last shorter; keys ascending)."""
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    datasets = {}
    for name in (f for f in files if f.endswith(".parquet")):
        parquet = pq.ParquetFile(root / name)
        meta = parquet.metadata
        groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        whole, rest = divmod(meta.num_rows, ROW_GROUP_ROWS)
        table = parquet.read()
        key_rows = [tuple(row.values()) for row in table.select(keys).to_pylist()]
        datasets[name] = {
            "arrow_schema": parquet.schema_arrow.to_string(show_schema_metadata=True),
            "arrow_schema_metadata": parquet.schema_arrow.metadata,
            "parquet_schema": str(parquet.schema).split("\n", 1)[1],  # not its object's address
            "created_by": meta.created_by,
            "key_value_metadata": meta.metadata,
            "format_version": meta.format_version,
            "compression": sorted(
                {meta.row_group(i).column(j).compression for i in range(len(groups))
                 for j in range(meta.num_columns)}
            ),
            "row_groups_follow_the_rule": groups == [ROW_GROUP_ROWS] * whole + [rest] * (rest > 0),
            "keys_ascending": key_rows == sorted(key_rows) and len(set(key_rows)) == len(key_rows),
            "sorted_as_pyarrow_sorts": table.equals(table.sort_by([(k, "ascending") for k in keys])),  # noqa: E501
        }  # fmt: skip
    return {"files": files, "datasets": datasets}


def check_the_rule(found: dict, query: str) -> None:
    """One file per dataset, beside the manifest; pyarrow's writer and the release's schema;
    rows in key order."""
    assert found["files"] == [f"{query}/{RELEASE_FILE}", "manifest.json"], found["files"]
    dataset = found["datasets"][f"{query}/{RELEASE_FILE}"]
    assert dataset["created_by"] == f"parquet-cpp-arrow version {pa.__version__}"
    assert set(dataset["key_value_metadata"]) == {b"ARROW:schema"}  # no pandas, no Spark
    assert dataset["arrow_schema_metadata"] is None
    assert dataset["format_version"] == PARQUET_OPTIONS["version"]
    assert dataset["compression"] == [PARQUET_OPTIONS["compression"].upper()]
    assert dataset["row_groups_follow_the_rule"]
    assert dataset["keys_ascending"] and dataset["sorted_as_pyarrow_sorts"]


def differences(a: dict, b: dict) -> list[str]:
    """What differs between two layouts, item by item (for the failure message)."""
    found = [f"files: {a['files']} != {b['files']}"] if a["files"] != b["files"] else []
    for name in sorted(set(a["datasets"]) & set(b["datasets"])):
        left, right = a["datasets"][name], b["datasets"][name]
        found += [f"{name} {k}: {left[k]!r} != {right[k]!r}" for k in left if left[k] != right[k]]
    return found


CASES = [
    pytest.param("local", None, id="local"),
    pytest.param("beam", None, id="beam"),
    pytest.param("spark", "N", id="spark-only-the-neighbour-on-the-executors"),
    pytest.param("spark", "0", id="spark-both-on-the-executors"),
]


@pytest.mark.parametrize("selection", ["private", "public"])
@pytest.mark.parametrize(("engine", "limit"), CASES)
def test_a_neighbour_changes_no_byte_of_the_layout(
    tmp_path, monkeypatch, request, engine, limit, selection
):
    query, partitions, released = QUERIES[selection]
    if engine == "spark":
        request.getfixturevalue("spark")
        value = str(partitions) if limit == "N" else limit
        monkeypatch.setenv("DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS", value)
    found, paths = [], []
    for name, with_new_shop in (("base", False), ("neighbour", True)):
        data = write_input(tmp_path / name / "in" / "rows.csv", with_new_shop)
        output, on_executors = release(data, tmp_path / name / "out", engine, query, monkeypatch)
        paths.append(on_executors)
        found.append(layout(output, query["partition_by"]))
        check_the_rule(found[-1], query["name"])
    if engine == "spark":  # the case is the one it says
        assert paths == ([False, True] if limit == "N" else [True, True])
    assert found[0] == found[1], differences(*found)
    base = tmp_path / "base" / "out" / query["name"] / RELEASE_FILE
    assert pq.read_metadata(base).num_rows == released  # the order checks saw every row


# ---------------------------------------------------------------------------------------------
# The writer and the merge, alone


def test_row_groups_follow_the_row_count_not_the_chunks(tmp_path, monkeypatch):
    """Chunks of any sizes give row groups of exactly ROW_GROUP_ROWS (the last shorter): the
    same file structure whether an engine hands the rows at once or task by task."""
    from dppipeline.engines.kernel import release_file

    monkeypatch.setattr(release_file, "ROW_GROUP_ROWS", 4)
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.float64())])
    layouts = []
    for sizes in ([17], [3, 5, 2, 7], [1] * 17):
        path = tmp_path / f"{len(sizes)}.parquet"
        start = 0
        with release_file.ReleaseWriter(path, schema) as writer:
            for size in sizes:
                ids = list(range(start, start + size))
                writer.write(pa.table({"k": ids, "v": [i / 2 for i in ids]}))
                start += size
        meta = pq.read_metadata(path)
        layouts.append([meta.row_group(i).num_rows for i in range(meta.num_row_groups)])
        assert pq.read_table(path).column("k").to_pylist() == list(range(17))
    assert layouts == [[4, 4, 4, 4, 1]] * 3


def test_merging_sorted_parts_gives_the_rows_sorted(tmp_path):
    """Parts of unique (text, int) keys, each sorted and read a few rows at a time, interleaved
    as hash shards interleave them: the merge writes every row once, in key order."""
    import numpy as np

    from dppipeline.engines.kernel.release_file import (
        ReleaseWriter,
        SortedPart,
        merge_sorted_parts,
        sort_by_keys,
    )

    rng = np.random.default_rng(4)  # test data, not noise
    names = [*SHOPS, NEW_SHOP]
    rows = pa.table(
        {
            "shop": [names[i % len(names)] for i in range(600)],
            "n": [int(i // len(names)) for i in range(600)],
            "v": rng.normal(size=600),
        }
    )
    shard = rng.integers(0, 7, 600)
    keys = ["shop", "n"]
    parts = []
    for s in range(8):  # shard 7 is empty
        part = sort_by_keys(rows.filter(pa.array(shard == s)), keys)
        groups = [part.slice(i, 5) for i in range(0, part.num_rows, 5)]  # 5 rows a group
        parts.append(SortedPart(read=groups.__getitem__, row_groups=len(groups)))
    with ReleaseWriter(tmp_path / "merged.parquet", rows.schema) as writer:
        merge_sorted_parts(parts, keys, writer)
    merged = pq.read_table(tmp_path / "merged.parquet")
    assert writer.rows == 600
    assert merged.equals(sort_by_keys(rows, keys))
