"""The local engine: in-process, for tests, demos and data that fits in memory.

Polars reads and validates (multi-threaded), numpy bounds and aggregates with sorts and
bincounts (see `bounding.py`); the DP release is `core.release`, as on every engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl

from dppipeline.engines.base import EngineRun, ReleaseJob, release_to_dataset
from dppipeline.engines.bounding import (
    aggregate_per_partition,
    aggregates_frame,
    dense_codes,
    sample_contributions,
)
from dppipeline.engines.local_read import read_validated
from dppipeline.io import DailyPartition
from dppipeline.schemas import transactions_schema
from dppipeline.spec import JobSpec
from dppipeline.validation import RejectSummary, check_rejected_fraction


@dataclass
class EngineResult:
    """Exact bounded aggregates per partition (never published) and the reject counts."""

    aggregates: pd.DataFrame
    rejects: RejectSummary


def write_quarantine(rejected: pl.DataFrame, folder: Path) -> Path:
    """Rejected rows, as text with file, row and reason, in a folder outside the release."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rejected.parquet"
    rejected.write_parquet(path)
    return path


def clip_values(rows: pl.DataFrame, spec: JobSpec) -> np.ndarray | None:
    if not spec.needs_value_bounds:
        return None
    low, high = spec.bounds.min_value, spec.bounds.max_value
    return rows.get_column(spec.value).clip(low, high).to_numpy().astype(np.float64, copy=False)


def compute_aggregates(
    spec: JobSpec,
    days: list[DailyPartition],
    public_keys: pd.DataFrame | None,
    quarantine: Path,
    seed: int | None = None,
) -> EngineResult:
    """Read + validate -> filter public keys -> clip -> bound -> aggregate per partition."""
    validated = read_validated(days, spec.input.format, transactions_schema(), spec.value)
    summary = validated.summary
    if summary.rows_rejected:
        path = write_quarantine(validated.rejected, quarantine)
        summary = RejectSummary(summary.rows_read, summary.rows_rejected, summary.first, path)
    check_rejected_fraction(summary, spec.input.max_rejected_fraction)
    rows = validated.rows
    key = spec.partition_key
    key_codes, key_values = dense_codes(rows.get_column(key).to_numpy())
    values = clip_values(rows, spec)
    privacy_codes, _ = dense_codes(rows.get_column(spec.privacy_unit).to_numpy())
    if public_keys is not None:
        # Before bounding, so no privacy unit spends its L0 on partitions never released.
        listed = pd.Index(key_values).isin(public_keys[key].to_numpy())[key_codes]
        key_codes, privacy_codes = key_codes[listed], privacy_codes[listed]
        values = None if values is None else values[listed]
    n_keys = max(len(key_values), 1)
    sample = sample_contributions(
        privacy_codes,
        key_codes,
        n_keys=n_keys,
        max_partitions_contributed=spec.bounds.max_partitions_contributed,
        max_contributions_per_partition=spec.bounds.max_contributions_per_partition,
        rng=np.random.default_rng(seed),
    )
    bounded = aggregate_per_partition(sample, key_codes, values, n_keys)
    aggregates = aggregates_frame(bounded, key, key_values)
    aggregates[key] = aggregates[key].astype(transactions_schema().field(key).type)
    return EngineResult(aggregates=aggregates, rejects=summary)


class LocalEngine:
    """In-process engine: one machine, multi-threaded where Polars and numpy are."""

    name = "local"

    def prepare(self) -> None:
        """Nothing to start: the local engine runs in this process."""

    def run(self, job: ReleaseJob, dataset_dir: Path) -> EngineRun:
        result = compute_aggregates(job.spec, job.days, job.public_keys, job.quarantine, job.seed)
        released = release_to_dataset(result.aggregates, job, dataset_dir)
        return EngineRun(rejects=result.rejects, released_partitions=released)
