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

from dppipeline.core.budget import BudgetPlan
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


class Engine(Protocol):
    name: str

    def prepare(self) -> None:
        """Starts slow resources (a JVM, a runner) before planning; reads no data."""
        ...

    def run(self, job: ReleaseJob, dataset_dir: Path) -> EngineRun:
        """Reads, validates, bounds, aggregates and releases into `dataset_dir` (a new folder
        inside the runner's staging area); raises DPPipelineError on bad input."""
        ...
