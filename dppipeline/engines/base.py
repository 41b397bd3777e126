"""The seam between the runner and an engine.

The runner plans the budget, checks the target, discovers input and publishes atomically; an
engine turns that into a released dataset written under the staging folder it is handed.
Every engine calls the same `core.release` on exact, bounded per-partition aggregates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pandas as pd
import pyarrow.parquet as pq

from dppipeline.core.budget import BudgetPlan
from dppipeline.core.release import (
    add_empty_public_partitions,
    release_partitions,
    to_release_table,
)
from dppipeline.io import DailyPartition
from dppipeline.spec import JobSpec
from dppipeline.validation import RejectSummary


@dataclass(frozen=True)
class ReleaseJob:
    """Everything an engine needs; the plan was computed before any data was read."""

    spec: JobSpec
    plan: BudgetPlan
    days: list[DailyPartition]
    public_keys: pd.DataFrame | None
    quarantine: Path
    seed: int | None = None
    progress: Callable[[str], None] = field(default=lambda _: None)


@dataclass(frozen=True)
class EngineRun:
    """What an engine reports back: operator-only counts and the released row count."""

    rejects: RejectSummary
    released_partitions: int


def release_to_dataset(exact: pd.DataFrame, job: ReleaseJob, dataset_dir: Path) -> int:
    """Exact aggregates on this machine -> public partitions aligned, released by the core,
    written as one Parquet file; returns the released row count."""
    key = job.spec.partition_key
    if job.public_keys is not None:
        exact = add_empty_public_partitions(exact, [key], job.public_keys)
    released = release_partitions(exact, [key], job.plan)
    table = to_release_table(released, key, job.spec.metrics)
    dataset_dir.mkdir(parents=True)
    pq.write_table(table, dataset_dir / "part-00000.parquet")
    return table.num_rows


class Engine(Protocol):
    name: str

    def prepare(self) -> None:
        """Starts slow resources (a JVM, a runner) before planning; reads no data."""
        ...

    def run(self, job: ReleaseJob, dataset_dir: Path) -> EngineRun:
        """Reads, validates, bounds, aggregates and releases into `dataset_dir` (a new folder
        inside the runner's staging area); raises DPPipelineError on bad input."""
        ...
