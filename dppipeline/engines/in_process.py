"""The engines' rows in this process, for the features that study a job's input (analysis:
`tune`, `evaluate`) rather than release it.

Read, validated, filtered, keyed and bounded by the kernel every engine runs (the same rules,
the same sampling priority), so what analysis measures is what a run would have aggregated.
Nothing here draws noise, touches the ledger or writes a release. Analysis imports this public
surface, never `engines/kernel/` itself (the import contract "Commands and analysis import no
engine internals"), so the kernel may change its internals freely.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import polars as pl

from dppipeline.core.tasks import AggregationTask, read_schema
from dppipeline.engines.kernel.polars_filter import to_polars
from dppipeline.engines.kernel.polars_read import read_validated
from dppipeline.engines.kernel.polars_tasks import aggregate_task, key_expr, task_rows
from dppipeline.engines.kernel.sampling import SamplingKeys, new_salt
from dppipeline.inputs.files import DailyPartition
from dppipeline.spec.model import JobSpec

__all__ = ["bounded_aggregates", "filtered_rows", "key_columns", "task_rows", "validated_rows"]


def validated_rows(
    spec: JobSpec, days: Sequence[DailyPartition], tasks: Sequence[AggregationTask]
) -> pl.DataFrame:
    """The valid rows of `days` with the columns `tasks` read, validated by the input contract
    as every engine validates them (rejected rows dropped, not returned)."""
    return read_validated(list(days), spec.input.format, read_schema(spec, tasks)).rows


def filtered_rows(rows: pl.DataFrame, task: AggregationTask) -> pl.DataFrame:
    """The rows the task's filter keeps (all of them without a filter)."""
    return rows if task.filter is None else rows.filter(to_polars(task.filter))


def key_columns(task: AggregationTask) -> list[pl.Expr]:
    """The task's partition key columns as expressions over input rows (time buckets and
    value bins derived), each named after its key."""
    return [key_expr(k) for k in task.keys]


def bounded_aggregates(
    rows: pl.DataFrame, task: AggregationTask, unit: str, *, seed: int = 0
) -> pd.DataFrame:
    """One sample of the task's exact aggregates per partition after contribution bounding
    and clipping, with no noise: what the noise is added to. Sampling priorities from the
    salt of `seed` (a fixed sample, not a run's secret one)."""
    return aggregate_task(rows, task, unit, SamplingKeys.from_salt(new_salt(seed)))
