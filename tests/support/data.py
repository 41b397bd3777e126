"""Data builders: the small generated input the fixtures share, releases of it, and the
truth they must equal; hand-made transactions written as the daily layout."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from dppipeline.spec.model import JobSpec

SMALL = {"customers": 200, "terminals": 50, "days": 3, "tx_per_day": 500, "seed": 11}
START = dt.date(2026, 1, 1)
DAYS = [START + dt.timedelta(days=d) for d in range(SMALL["days"])]


def release_small(
    inputs: dict[str, Path],
    out: Path,
    engine,
    fmt: str = "parquet",
    ledger: str | None = None,
    **overrides,
):
    """One release of `inputs` into `out/release` with loose bounds and public terminals
    0..59 (50 with data, 10 empty), recorded in `ledger` if given; returns (released rows
    sorted by key, manifest)."""
    from dppipeline.lifecycle.runner import run_job
    from dppipeline.spec.model import build_spec

    out.mkdir(parents=True, exist_ok=True)
    keys = out / "keys.csv"
    keys.write_text("TERMINAL_ID\n" + "\n".join(str(k) for k in range(60)) + "\n")
    base = {
        "input.path": str(inputs[fmt]),
        "input.format": fmt,
        "output": str(out / "release"),
        "metrics": ["count", "sum", "mean", "privacy_id_count"],
        "bounds.max_partitions_contributed": 50,
        "bounds.max_contributions_per_partition": 100,
        "bounds.min_value": 0.0,
        "bounds.max_value": 150.0,
        "partition_selection.public_partitions": str(keys),
    }
    base.update(overrides)
    result = run_job(build_spec({}, base), engine, echo=lambda _: None, ledger=ledger)
    released = pd.read_parquet(result.output / "terminal_stats")
    manifest = result.manifest.model_dump(mode="json", exclude_unset=True)  # as written
    return released.sort_values("TERMINAL_ID", ignore_index=True), manifest


def terminal_truth(rows, min_value: float, max_value: float) -> pd.DataFrame:
    """Exact count, sum (of values clipped to [min_value, max_value]) and distinct customers
    per TERMINAL_ID of a Polars frame of rows: the truth loose bounds must give."""
    import polars as pl

    clipped = rows.with_columns(pl.col("TX_AMOUNT").clip(min_value, max_value))
    return (
        clipped.group_by("TERMINAL_ID")
        .agg(
            pl.len().cast(pl.Float64).alias("count"),
            pl.col("TX_AMOUNT").sum().alias("sum"),
            pl.col("CUSTOMER_ID").n_unique().cast(pl.Float64).alias("privacy_id_count"),
        )
        .sort("TERMINAL_ID")
        .to_pandas()
    )


def check_count_noise_as_planned(release) -> None:
    """Released minus exact count over 60 public partitions (50 with data, 10 empty), 3
    draws at epsilon 1: the variance ratio to the manifest's std^2 is within
    Z * sqrt((kurtosis - 1) / n), kurtosis 6 (Laplace), failure rate 1e-6. Coarse, but it
    fails with no noise or noise 2x too large. `release(name, **overrides)` runs one release."""
    import math

    import numpy as np
    from scipy.stats import norm

    exact, _ = release("exact", **{"budget.epsilon": 1e7})
    draws, manifest = [], None
    for i in range(3):
        noisy, manifest = release(f"noisy{i}", **{"metrics": ["count"], "budget.epsilon": 1.0})
        draws.append(noisy["count"].to_numpy() - exact["count"].to_numpy())
    noise = np.concatenate(draws)
    sigma = manifest["queries"]["terminal_stats"]["metrics"]["count"]["noise_stddev"]
    ratio = np.mean(noise**2) / sigma**2
    assert abs(ratio - 1) <= float(norm.isf(0.5e-6)) * math.sqrt(5 / len(noise)), ratio


def with_ids_and_times(rows: pd.DataFrame, rng, start, days: int) -> pd.DataFrame:
    """`rows` (unit, terminal, amount) with TRANSACTION_ID 0..n-1 and a TX_DATETIME drawn
    uniformly over `days` days from `start` (microseconds, as the schema stores it)."""
    n = len(rows)
    rows = rows.reset_index(drop=True)
    rows.insert(0, "TRANSACTION_ID", np.arange(n, dtype=np.int64))
    moments = start + pd.to_timedelta(rng.integers(0, days * 86400, n), "s")
    rows.insert(1, "TX_DATETIME", moments.astype("datetime64[us]"))
    return rows


def write_daily_parquet(rows: pd.DataFrame, root: Path) -> Path:
    """Hand-made transactions (the transactions schema's columns, `TX_DATETIME` as datetime)
    written as `root/date=YYYY-MM-DD/part-0.parquet`, one folder per day; returns `root`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dppipeline.spec.schema import transactions_schema

    schema = transactions_schema().to_arrow()
    moments = rows["TX_DATETIME"].astype("datetime64[us]")
    for day, part in rows.assign(TX_DATETIME=moments).groupby(moments.dt.date):
        folder = root / f"date={day.isoformat()}"
        folder.mkdir(parents=True)
        table = pa.Table.from_pandas(part[schema.names], schema=schema, preserve_index=False)
        pq.write_table(table, folder / "part-0.parquet")
    return root


def job_spec(input_dir: Path, output: Path, keys: Path, **extra) -> JobSpec:
    """A one-query job over `input_dir` with tight bounds and the public keys in `keys`."""
    from dppipeline.spec.model import build_spec

    overrides = {
        "input.path": str(input_dir),
        "output": str(output),
        "bounds.min_value": 0.0,
        "bounds.max_value": 100.0,
        "bounds.max_partitions_contributed": 1,
        "bounds.max_contributions_per_partition": 1,
        "partition_selection.public_partitions": str(keys),
    }
    overrides.update(extra)
    return build_spec({}, overrides)


def quiet(_line: str) -> None:
    """An `echo` that prints nothing."""
    return None


def with_one_bad_row(small_inputs, folder: Path) -> Path:
    """A copy of the CSV input with one unparseable amount (line 6 of the first day)."""
    shutil.copytree(small_inputs["csv"], folder)
    path = sorted(folder.glob("*.csv"))[0]
    lines = path.read_text().splitlines()
    fields = lines[5].split(",")
    fields[4] = "abc"
    lines[5] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")
    return path
