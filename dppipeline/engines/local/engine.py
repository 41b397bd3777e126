"""The local engine: in-process, on one machine.

Polars reads and validates a batch of files at a time (multi-threaded); each query's task
filters and derives its keys with Polars expressions, keeps of the batch only the rows
bounding may keep (`pre_bound`), and numpy bounds and aggregates what all batches kept with
sorts and bincounts (see `bounding.py`); the DP release is `core.mechanisms`, as on every engine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import polars as pl

from dppipeline.core.tasks import (
    AggregationTask,
    read_schema,
)
from dppipeline.engines.base import EngineRun, ReleaseJob, release_to_datasets
from dppipeline.engines.kernel.polars_read import (
    ValidatedInput,
    file_names,
    read_validated,
    validate_frame,
)
from dppipeline.engines.kernel.polars_tasks import TaskBounder
from dppipeline.engines.kernel.sampling import (
    SamplingKeys,
)
from dppipeline.inputs.contract import RejectedRow, RejectSummary, check_rejected_fraction
from dppipeline.inputs.files import DailyPartition
from dppipeline.inputs.quarantine import write_rejected
from dppipeline.spec.schema import Schema

# Files read at a time: enough for Polars to read them in parallel, few enough that a batch
# of the benchmark's daily files (25,000 rows each) stays small next to the kept rows.
BATCH_FILES = max(64, 16 * (os.cpu_count() or 1))
# Kept rows held per task before they are thinned together (`pre_bound` of their union).
COMPACT_ROWS = 4_000_000


@dataclass
class EngineResult:
    """Exact bounded aggregates per task (never published) and the reject counts."""

    aggregates: dict[str, pd.DataFrame]
    rejects: RejectSummary


def compute_aggregates(
    tasks: Sequence[AggregationTask],
    days: list[DailyPartition],
    *,
    schema: Schema,
    fmt: str,
    unit: str,
    max_rejected_fraction: float,
    quarantine: Path,
    salt: bytes,
) -> EngineResult:
    """Read + validate (`schema`: the columns the tasks read, `read_schema`) a batch of files
    at a time, then `aggregate_validated`."""
    return aggregate_validated(
        tasks,
        validated_batches(days, fmt, schema),
        unit=unit,
        max_rejected_fraction=max_rejected_fraction,
        quarantine=quarantine,
        salt=salt,
    )


def validated_batches(
    days: list[DailyPartition], fmt: str, schema: Schema
) -> Iterator[ValidatedInput]:
    """The input files read and validated a batch at a time (`_batches`)."""
    names = file_names(days)
    return (read_validated(batch, fmt, schema, names) for batch in _batches(days))


def aggregate_validated(
    tasks: Sequence[AggregationTask],
    batches: Iterable[ValidatedInput],
    *,
    unit: str,
    max_rejected_fraction: float,
    quarantine: Path,
    salt: bytes,
) -> EngineResult:
    """Per task and validated batch (files, or the caller's in-memory rows): filter, keys,
    clip and `pre_bound` (the rows bounding may keep); rejected rows to the quarantine; then
    per task: bound and aggregate per partition. Memory grows with the pairs (times Linf) and
    one batch of rows, not with every row of the input."""
    bounder = TaskBounder(tasks, unit, SamplingKeys.from_salt(salt), compact_rows=COMPACT_ROWS)
    rejected: list[pl.DataFrame] = []
    rows_read = 0
    first: RejectedRow | None = None
    for validated in batches:
        rows_read += validated.summary.rows_read
        first = first or validated.summary.first
        if validated.rejected.height:
            rejected.append(validated.rejected)
        bounder.add(validated.rows)
        del validated
    summary = RejectSummary(rows_read, sum(r.height for r in rejected), first)
    if summary.rows_rejected:
        path = write_rejected(pl.concat(rejected).to_arrow(), quarantine)
        summary = RejectSummary(summary.rows_read, summary.rows_rejected, summary.first, path)
    check_rejected_fraction(summary, max_rejected_fraction)
    aggregates = {task.name: bounder.aggregates(task) for task in tasks}
    return EngineResult(aggregates=aggregates, rejects=summary)


def _batches(days: list[DailyPartition]) -> Iterator[list[DailyPartition]]:
    """Files in batches of about BATCH_FILES (whole days; a day's files stay together), in
    input order, so the first rejected row is the first of the input."""
    batch: list[DailyPartition] = []
    files = 0
    for day in days:
        batch.append(day)
        files += len(day.files)
        if files >= BATCH_FILES:
            yield batch
            batch, files = [], 0
    if batch:
        yield batch


class LocalEngine:
    """In-process engine: one machine, multi-threaded where Polars and numpy are."""

    name = "local"
    writes_to_stores = False  # the runner uploads what it staged locally

    def prepare(self) -> None:
        """Nothing to start: the local engine runs in this process."""

    def file_systems(self) -> None:
        """pyarrow's clients."""
        return None

    def run(self, job: ReleaseJob, staging: Path) -> EngineRun:
        spec = job.spec
        schema = read_schema(spec, job.tasks.tasks)
        batches = (
            [validate_frame(job.rows, schema)]  # the Python API's in-memory rows
            if isinstance(job.rows, pl.DataFrame)
            else validated_batches(job.days, spec.input.format, schema)
        )
        result = aggregate_validated(
            job.tasks.tasks,
            batches,
            unit=spec.privacy_unit,
            max_rejected_fraction=spec.input.max_rejected_fraction,
            quarantine=job.quarantine,
            salt=job.salt,
        )
        released = release_to_datasets(result.aggregates, job, staging)
        return EngineRun(rejects=result.rejects, released_partitions=released)
