"""The seam between the runner and an engine.

The runner plans the budget, checks the target, discovers input and publishes atomically; an
engine turns that into a released dataset written under the staging folder it is handed.
Every engine calls the same `core.mechanisms` on exact, bounded per-partition aggregates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pandas as pd
import pyarrow as pa

from dppipeline.core.mechanisms import release_arrow_schema
from dppipeline.core.plan import JobPlan
from dppipeline.core.tasks import JobTasks, release_job
from dppipeline.engines.kernel.release_file import RELEASE_FILE, write_release_file
from dppipeline.engines.kernel.sampling import new_salt
from dppipeline.inputs.contract import RejectSummary
from dppipeline.inputs.files import DailyPartition
from dppipeline.spec.model import JobSpec
from dppipeline.storage import Location
from dppipeline.storage.location import Resolver


@dataclass(frozen=True)
class ReleaseJob:
    """Everything an engine needs; the plan was computed before any data was read."""

    spec: JobSpec
    plan: JobPlan
    tasks: JobTasks
    days: list[DailyPartition]
    quarantine: Path
    # The run's secret for sampling priorities (contribution bounding): never logged, never in
    # the manifest, not in this object's repr.
    salt: bytes = field(default_factory=new_salt, repr=False)
    progress: Callable[[str], None] = field(default=lambda _: None)
    # A quarantine on a store: the runner uploads `quarantine` there after the engine ran.
    quarantine_shipped_to: Location | None = None
    # In-memory input (the Python API) instead of `days`: a Polars frame (local engine), a
    # Spark DataFrame (Spark), a PCollection (Beam, whose run then only builds the graph).
    rows: object | None = field(default=None, repr=False)
    # The run's id in the ledger (names what a run keeps, e.g. a Beam transform's record).
    run_id: str = ""

    @staticmethod
    def sampling_salt(seed: int | None = None) -> bytes:
        """A fresh secret salt (`secrets.token_bytes`), or one derived from a test's seed."""
        return new_salt(seed)

    def key_types(self, query: str) -> list[tuple[str, pa.DataType]]:
        """A query's key columns and their release types."""
        return [(k.name, k.arrow_type) for k in self.tasks.task(query).keys]

    def metrics(self, query: str) -> tuple[str, ...]:
        return self.plan.query(query).plan.params.metrics

    def release_schema(self, query: str) -> pa.Schema:
        """The Arrow schema of a query's released dataset."""
        params = self.plan.query(query).plan.params
        return release_arrow_schema(
            self.key_types(query),
            params.metrics,
            params.confidence_intervals,
            integer_counts=params.count_noise == "discrete",
        )


@dataclass(frozen=True)
class EngineRun:
    """What an engine reports back: operator-only counts and the released rows per query
    (`rejects` None: a Beam transform whose rows are read when the caller's pipeline runs)."""

    rejects: RejectSummary | None
    released_partitions: dict[str, int]
    # In-memory runs whose release is not a staged file (Beam: a PCollection per query)
    datasets: Mapping[str, object] | None = None


def write_dataset(released: pd.DataFrame, job: ReleaseJob, query: str, dataset_dir: Path) -> int:
    """One query's released rows as its dataset's one file, sorted by key (`release_file`)."""
    schema = job.release_schema(query)
    table = pa.Table.from_pandas(released[schema.names], schema=schema, preserve_index=False)
    dataset_dir.mkdir(parents=True)
    keys = job.tasks.task(query).key_names
    return write_release_file(dataset_dir / RELEASE_FILE, table, schema, keys)


def release_to_datasets(
    exact: Mapping[str, pd.DataFrame], job: ReleaseJob, staging: Path
) -> dict[str, int]:
    """Exact aggregates per task on this machine -> released by the core -> one dataset per
    query under `staging/<query>/`; returns the released row count per query."""
    released = release_job(job.plan, job.tasks, exact)
    return {
        query.name: write_dataset(released[query.name], job, query.name, staging / query.name)
        for query in job.plan.queries
    }


class Engine(Protocol):
    name: str
    # True when the engine's workers write the release themselves through the file systems of
    # their ecosystem: for an output on a store, `run` then gets the run's folder there (a
    # URI, `OUT/_runs/<run_id>`) as its staging area instead of a local folder to upload.
    writes_to_stores: bool

    def prepare(self) -> None:
        """Starts slow resources (a JVM, a runner) before planning; reads no data."""
        ...

    def file_systems(self) -> Resolver | None:
        """How the run reaches remote locations (`dppipeline.storage.remote_filesystems`):
        None for pyarrow's clients; the Spark engine answers with Hadoop's FileSystem API."""
        ...

    def run(self, job: ReleaseJob, staging: Path | Location) -> EngineRun:
        """Reads, validates, bounds, aggregates and releases one dataset per query into
        `staging/<query>/` (the runner's staging area: a local folder, or a store's run
        folder when `writes_to_stores`); raises DPPipelineError on bad input."""
        ...
