"""Every DP SQL example releases what its YAML twin releases, on every engine.

Exact tier: the shared small input, epsilon 1e12 and continuous count noise (as the exact
tests: no discrete noise fits 1e12), the same contribution-sampling seed for both runs. The
SQL run and its twin's run, each with its own ledger, must release the same keys, the same
values up to both draws of the noise the manifest states (20 standard deviations of one
draw: two Laplace draws differ by more with probability below 1e-6 per value), and the same
manifest apart from what names the run (its id, time, ledger and output folder). Run against
the twin's ledger, the SQL job is the twin's release (same ledger key): returned as
published, nothing charged again.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support import REPO
from support.engines import engine_named

from dppipeline.api.sql import load_sql
from dppipeline.dpsql.compile import compile_sql
from dppipeline.lifecycle.runner import run_job
from dppipeline.spec.loader import load_raw
from dppipeline.spec.model import build_spec

SQL = REPO / "jobs" / "sql"
EXAMPLES = {
    "terminal_stats": REPO / "jobs" / "configs" / "terminal_stats.yaml",
    "large_amounts": SQL / "large_amounts.yaml",
    "daily_amounts": SQL / "daily_amounts.yaml",
    "median_amount": SQL / "median_amount.yaml",
    "book_analyses": SQL / "book_analyses.yaml",
}
EXACT = {"budget.epsilon": 1e12, "count_noise": "continuous"}
SIGMAS = 20  # per value, two draws: P(|L1 - L2| > 20 sd) < 1e-6 for Laplace
RUN_FIELDS = {"run_id", "created_at", "ledger"}  # what names the run, not the release
PLACES = {"output"}  # spec fields that name where the run wrote
TEXT = "query"  # the SQL manifest records its query text (not hashed); the twin has none


def _run(spec, engine, ledger: Path):
    result = run_job(spec, engine, echo=lambda _: None, ledger=f"sqlite:///{ledger}", seed=7)
    folder = Path(str(result.output))
    rows = {q: pd.read_parquet(folder / q) for q in result.manifest.queries}
    return result, rows


def _twin_specs(name: str, small_inputs, out: Path):
    overrides = {**EXACT, "input.path": str(small_inputs["parquet"])}
    sql_text = (SQL / f"{name}.sql").read_text()
    sql = compile_sql(sql_text, name=name, base=SQL,
                      overrides={**overrides, "output": str(out / "sql")})  # fmt: skip
    yaml = build_spec(
        load_raw(EXAMPLES[name]), {**overrides, "output": str(out / "yaml")}, source=name
    )
    return sql, yaml


def _manifest(result) -> dict:
    data = result.manifest.model_dump(mode="json", exclude_unset=True)
    for name in RUN_FIELDS | {TEXT}:
        data.pop(name, None)
    for name in PLACES:
        data["spec"].pop(name, None)
    return data


def _assert_same_rows(query: str, got: pd.DataFrame, want: pd.DataFrame, manifest) -> None:
    entry = manifest.queries[query]
    keys = [c for c in want.columns if c not in {m.column for m in entry.metrics.values()}]
    assert list(got.columns) == list(want.columns)
    got = got.sort_values(keys, ignore_index=True)
    want = want.sort_values(keys, ignore_index=True)
    pd.testing.assert_frame_equal(got[keys], want[keys])
    for metric in entry.metrics.values():
        std = metric.noise_stddev or 0.0
        bound = metric.noise_stddev_bound
        if bound is not None:  # a mean or variance: its bound at one row, the worst case
            std = max(std, bound["stddev_times_n_for_large_n"], *bound["stddev"])
        tolerance = SIGMAS * std + 1e-9 * float(np.abs(want[metric.column]).max() or 1.0)
        difference = np.abs(got[metric.column].to_numpy() - want[metric.column].to_numpy())
        assert difference.max(initial=0.0) <= tolerance, (query, metric.column)


@pytest.mark.parametrize(
    "engine_name",
    ["local", pytest.param("spark", marks=pytest.mark.slow),
     pytest.param("beam", marks=pytest.mark.slow)],
)  # fmt: skip
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_sql_releases_its_yaml_twins_rows(name: str, engine_name: str, small_inputs, tmp_path,
                                          request):  # fmt: skip
    engine = engine_named(engine_name, request)
    sql, yaml = _twin_specs(name, small_inputs, tmp_path)
    assert sql.spec_hash() == yaml.spec_hash()
    yaml_result, yaml_rows = _run(yaml, engine, tmp_path / "yaml.sqlite")
    sql_result, sql_rows = _run(sql, engine, tmp_path / "sql.sqlite")
    assert sorted(sql_rows) == sorted(yaml_rows)
    for query, rows in yaml_rows.items():
        assert len(rows) > 0
        _assert_same_rows(query, sql_rows[query], rows, yaml_result.manifest)
    assert sql_result.manifest.query == (SQL / f"{name}.sql").read_text()
    assert yaml_result.manifest.query is None
    assert _manifest(sql_result) == _manifest(yaml_result)
    # The same ledger key: against the twin's ledger, the SQL job is its published release.
    elsewhere = sql.model_copy(update={"output": str(tmp_path / "again")})
    again, _ = _run(elsewhere, engine, tmp_path / "yaml.sqlite")
    assert again.run_id == yaml_result.run_id
    with sqlite3.connect(tmp_path / "yaml.sqlite") as db:
        runs = [r[0] for r in db.execute("SELECT run_id FROM releases")]
    assert runs == [yaml_result.run_id]  # charged once, by the twin


def test_the_api_releases_the_twins_rows(small_inputs, tmp_path):
    """`dppipeline.sql(query, frame)` releases what `dppipeline.release(twin, frame)` does."""
    import polars as pl

    import dppipeline

    frame = pl.read_parquet(Path(small_inputs["parquet"]) / "**" / "*.parquet")
    query = (SQL / "terminal_stats.sql").read_text()
    spec = load_sql(SQL / "terminal_stats.sql")
    assert spec.spec_hash() == build_spec(load_raw(EXAMPLES["terminal_stats"])).spec_hash()
    common = {"ledger": False, "seed": 7}
    exact = {"epsilon = 10": "epsilon = 1e12, count_noise = 'continuous'"}
    for old, new in exact.items():
        query = query.replace(old, new)
    query = query.replace("`../../schemas/", f"`{REPO / 'schemas'}/")
    released = dppipeline.sql(query, frame, name="terminal_stats", **common)
    twin = build_spec(load_raw(EXAMPLES["terminal_stats"]), {
        "budget.epsilon": 1e12, "count_noise": "continuous"})  # fmt: skip
    expected = dppipeline.release(twin, frame, **common)
    assert released.manifest.spec_hash == expected.manifest.spec_hash
    assert released.manifest.query == query and expected.manifest.query is None
    _assert_same_rows(
        "terminal_stats",
        released["terminal_stats"].to_pandas(),
        expected["terminal_stats"].to_pandas(),
        expected.manifest,
    )
