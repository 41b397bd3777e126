"""The local engine: in-process, for tests, demos and data that fits in memory.

Polars reads and validates (multi-threaded) once; each query's task filters and derives its
keys with Polars expressions, and numpy bounds and aggregates with sorts and bincounts (see
`bounding.py`); the DP release is `core.release`, as on every engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dppipeline.core.tasks import (
    AggregationTask,
    read_schema,
)
from dppipeline.engines.base import EngineRun, ReleaseJob, release_to_datasets
from dppipeline.engines.shared.polars_read import read_validated
from dppipeline.engines.shared.polars_tasks import aggregate_task
from dppipeline.engines.shared.sampling import (
    SamplingKeys,
)
from dppipeline.inputs.contract import RejectSummary, check_rejected_fraction
from dppipeline.inputs.files import DailyPartition
from dppipeline.inputs.quarantine import write_rejected
from dppipeline.spec.schema import Schema


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
    """Read + validate once (`schema`: the columns the tasks read, `read_schema`) -> per
    task: filter, keys, clip, bound, aggregate per partition."""
    validated = read_validated(days, fmt, schema)
    summary = validated.summary
    if summary.rows_rejected:
        path = write_rejected(validated.rejected.to_arrow(), quarantine)
        summary = RejectSummary(summary.rows_read, summary.rows_rejected, summary.first, path)
    check_rejected_fraction(summary, max_rejected_fraction)
    keys = SamplingKeys.from_salt(salt)
    aggregates = {task.name: aggregate_task(validated.rows, task, unit, keys) for task in tasks}
    return EngineResult(aggregates=aggregates, rejects=summary)


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
        result = compute_aggregates(
            job.tasks.tasks,
            job.days,
            schema=read_schema(spec, job.tasks.tasks),
            fmt=spec.input.format,
            unit=spec.privacy_unit,
            max_rejected_fraction=spec.input.max_rejected_fraction,
            quarantine=job.quarantine,
            salt=job.salt,
        )
        released = release_to_datasets(result.aggregates, job, staging)
        return EngineRun(rejects=result.rejects, released_partitions=released)
