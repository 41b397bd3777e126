"""A job's queries as work for an engine: what to aggregate, and how results become a release.

Each query becomes one `AggregationTask` (filter, partition keys, clipping, bounds, which
aggregates). A group of private queries that share one partition selection needs bounded
privacy-unit counts per key over the rows of any member: when the members read the same rows
with the same L0 bound, the first member's own counts serve; otherwise the group gets a
selection task of its own. Engines only ever compute exact aggregates per task; `core.release`
turns them into the release.

Partition keys are input columns or time buckets of TX_DATETIME: `day` and `week` (its Monday)
as dates, `month` as `YYYY-MM` text. Engines hand back key columns in one canonical pandas
form (int64, str, `datetime.date`), so results of every engine align and compare.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import pyarrow as pa

from dppipeline.core.budget import JobPlan
from dppipeline.core.extremes import EXTREME_METRICS
from dppipeline.core.release import (
    release_public,
    release_selection_group,
)
from dppipeline.errors import InputError, UsageError
from dppipeline.inputs.files import (
    DailyPartition,
    key_lines,
    parse_int64_key,
    read_public_partitions,
)
from dppipeline.spec.filters import FilterExpr, any_of, columns, parse_filter, to_text
from dppipeline.spec.model import (
    _RANGE,
    INPUT_RANGE,
    TIME_BUCKETS,
    VARIANCE_METRICS,
    JobSpec,
    QuerySpec,
    is_file_source,
    percentile_of,
)
from dppipeline.spec.schema import Schema, transactions_schema

TIME_COLUMN = "TX_DATETIME"
GLOBAL_KEY = "_global"  # the constant key engines group a global total by
_MONTH = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")


@dataclass(frozen=True)
class KeyColumn:
    """One partition key column: an input column, or a time bucket of TX_DATETIME."""

    name: str
    bucket: str | None = None  # None | day | week | month

    @property
    def source(self) -> str:
        return TIME_COLUMN if self.bucket else self.name

    @property
    def kind(self) -> str:
        """int64 | string | date | month: the key's type in every engine."""
        if self.bucket in ("day", "week"):
            return "date"
        if self.bucket == "month":
            return "month"
        return transactions_schema().field(self.name).type

    @property
    def arrow_type(self) -> pa.DataType:
        return {"date": pa.date32(), "month": pa.string(), "string": pa.string()}.get(
            self.kind, pa.int64()
        )


@dataclass(frozen=True, eq=False)
class AggregationTask:
    """Exact bounded aggregates one engine pass computes: per key, privacy_id_count, count,
    sum (and sum of squares, kept values) of the rows passing `filter`, after clipping to
    `clip` and bounding each privacy unit to L0 partitions and Linf rows per partition, or,
    with `max_contributions` K, to K rows in all (then L0 = Linf = K, which K rows imply)."""

    name: str
    filter: FilterExpr | None
    keys: tuple[KeyColumn, ...]
    value: str
    clip: tuple[float, float] | None
    max_partitions_contributed: int
    max_contributions_per_partition: int
    sum_squares: bool = False
    values: bool = False
    public_keys: pd.DataFrame | None = None  # drop unlisted keys before bounding
    max_contributions: int | None = None

    @property
    def key_names(self) -> list[str]:
        return [k.name for k in self.keys]


@dataclass(frozen=True, eq=False)
class JobTasks:
    """The engine's work and how its results map onto the release."""

    tasks: tuple[AggregationTask, ...]
    selection_sources: dict[str, str]  # selection group -> task giving its privacy_id_count
    public_keys: dict[str, pd.DataFrame | None]  # public query -> its key set

    def task(self, name: str) -> AggregationTask:
        return next(t for t in self.tasks if t.name == name)


def input_schema(unit: str, tasks: Sequence[AggregationTask]) -> Schema:
    """The input columns a job reads, and so the only ones every engine validates: the
    privacy unit, each task's key sources, the values it aggregates and its filter's columns.
    A column the job does not name is never read (Parquet is columnar: in the benchmark's
    files the two columns the terminal job never uses hold 62% of the bytes), and a bad value
    in one cannot take a row out of the release."""
    names = {unit}
    for task in tasks:
        names.update(key.source for key in task.keys)
        if task.clip is not None:
            names.add(task.value)
        if task.filter is not None:
            names.update(columns(task.filter))
    return transactions_schema().subset(names)


def key_columns(query: QuerySpec) -> tuple[KeyColumn, ...]:
    """The query's partition keys, checked against the input schema."""
    schema = transactions_schema()
    keys = []
    for name in query.partition_by:
        if name in TIME_BUCKETS:
            keys.append(KeyColumn(name, bucket=name))
            continue
        if name not in schema.names:
            raise UsageError(
                f"queries.{query.name}.partition_by: {name!r} is neither an input column "
                f"({', '.join(schema.names)}) nor a time bucket ({', '.join(TIME_BUCKETS)})"
            )
        if schema.field(name).type not in ("int64", "string"):
            raise UsageError(
                f"queries.{query.name}.partition_by: column {name} has type "
                f"{schema.field(name).type}; keys must be int64 or string (time: day, week, "
                "month)"
            )
        keys.append(KeyColumn(name))
    return tuple(keys)


def check_query_columns(spec: JobSpec) -> None:
    """Every query's columns exist in the input schema with a type that fits their role."""
    schema = transactions_schema()
    for query in spec.queries:
        where = spec.query_path(query)
        if spec.privacy_unit in query.partition_by:
            raise UsageError(f"{where}partition_by: must not include the privacy unit")
        key_columns(query)
        if query.value not in schema.names:
            raise UsageError(
                f"{where}value: column {query.value!r} is not in schemas/transactions.json "
                f"({', '.join(schema.names)})"
            )
        if schema.field(query.value).type not in ("int64", "float64"):
            raise UsageError(
                f"{where}value: column {query.value} has type "
                f"{schema.field(query.value).type}, needs int64 or float64"
            )


def task_for(query: QuerySpec) -> AggregationTask:
    keys = key_columns(query)
    bounds = query.bounds
    total = bounds.max_contributions
    metrics = query.metrics
    return AggregationTask(
        name=query.name,
        filter=_parsed_filter(query),
        keys=keys,
        value=query.value,
        clip=_clip(query),
        max_partitions_contributed=(
            (bounds.max_partitions_contributed if total is None else total) if keys else 1
        ),
        max_contributions_per_partition=(
            bounds.max_contributions_per_partition if total is None else total
        ),
        max_contributions=total,
        sum_squares=any(m in VARIANCE_METRICS for m in metrics),
        values=any(percentile_of(m) is not None or m in EXTREME_METRICS for m in metrics),
    )


def _parsed_filter(query: QuerySpec) -> FilterExpr | None:
    if query.filter is None:
        return None
    return parse_filter(query.filter, transactions_schema(), where=f"queries.{query.name}.filter")


def plan_tasks(spec: JobSpec, plan: JobPlan, days: Sequence[DailyPartition]) -> JobTasks:
    """One task per query, plus one per selection group its members cannot share."""
    queries = {q.name: q for q in spec.queries}
    tasks: dict[str, AggregationTask] = {}
    public: dict[str, pd.DataFrame | None] = {}
    for query in spec.queries:
        task = task_for(query)
        if query.is_public:
            keys = public_key_set(query, task.keys, days) if task.keys else None
            public[query.name] = keys
            task = replace(task, public_keys=keys)
        tasks[query.name] = task
    sources: dict[str, str] = {}
    for group in plan.selections:
        members = [tasks[name] for name in group.queries]
        l0 = group.mechanism.l0_sensitivity
        filters = {None if t.filter is None else to_text(t.filter) for t in members}
        if len(filters) == 1 and all(t.max_partitions_contributed == l0 for t in members):
            sources[group.name] = members[0].name
            continue
        name = f"_selection_{len(sources)}"
        sources[group.name] = name
        tasks[name] = AggregationTask(
            name=name,
            filter=any_of([t.filter for t in members]),
            keys=members[0].keys,
            value=queries[group.queries[0]].value,
            clip=None,
            max_partitions_contributed=l0,
            max_contributions_per_partition=1,
        )
    return JobTasks(tuple(tasks.values()), sources, public)


def release_job(
    plan: JobPlan, job: JobTasks, exact: Mapping[str, pd.DataFrame]
) -> dict[str, pd.DataFrame]:
    """Exact aggregates per task -> released rows per query (selection, then noise).
    Works on any subset of partitions (all tasks' rows for the same keys), so engines may
    call it per shard."""
    released: dict[str, pd.DataFrame] = {}
    for query in plan.queries:
        if query.selection_group is None:
            released[query.name] = release_public(
                exact[query.name],
                job.task(query.name).key_names,
                query.plan,
                job.public_keys.get(query.name),
            )
    for group in plan.selections:
        members = {name: exact[name] for name in group.queries}
        released.update(
            release_selection_group(
                plan, group.name, exact[job.selection_sources[group.name]], members
            )
        )
    return released


# ---------------------------------------------------------------------------------------------
# Public key sets


def public_key_set(
    query: QuerySpec, keys: Sequence[KeyColumn], days: Sequence[DailyPartition]
) -> pd.DataFrame:
    """The query's public keys in canonical form: a file, a range, or per column a file,
    range, list or `input_range`, multiplied out."""
    where = f"queries.{query.name}.partition_selection.public_partitions"
    sources = query.partition_selection.public_partitions
    by_name = {k.name: k for k in keys}
    if isinstance(sources, str) and is_file_source(sources) and len(keys) > 1:
        return _key_file(Path(sources), keys)
    if isinstance(sources, str):
        sources = {keys[0].name: sources}
    assert isinstance(sources, dict)
    columns = [_column_keys(where, by_name[name], source, days) for name, source in sources.items()]
    frame = pd.DataFrame(list(itertools.product(*columns)), columns=list(sources)).drop_duplicates(
        ignore_index=True
    )
    return frame[[k.name for k in keys]]


def _clip(query: QuerySpec) -> tuple[float, float] | None:
    """[min_value, max_value] when the query aggregates its value (the spec requires both)."""
    if not query.needs_value_bounds:
        return None
    low, high = query.bounds.min_value, query.bounds.max_value
    assert low is not None and high is not None  # checked when the spec was built
    return (low, high)


def _column_keys(
    where: str, key: KeyColumn, source: object, days: Sequence[DailyPartition]
) -> list[object]:
    if isinstance(source, list | tuple):
        return [_parse_key(f"{where}.{key.name}", key, v) for v in source]
    assert isinstance(source, str)
    if source == INPUT_RANGE:
        if key.bucket is None:
            raise UsageError(f"{where}.{key.name}: {INPUT_RANGE} is for day, week and month")
        return sorted({bucket_of(key.bucket, d.day) for d in days}, key=str)  # ISO text order
    match = _RANGE.match(source)
    if match:
        if key.kind != "int64":
            raise UsageError(f"{where}.{key.name}: a range A..B needs an int64 column")
        return list(range(int(match.group(1)), int(match.group(2)) + 1))
    if key.bucket is not None:
        frame = read_public_partitions(source, key.name, "string")
        return [_parse_key(f"{source}", key, v) for v in frame[key.name]]
    values: list[object] = read_public_partitions(source, key.name, key.kind)[key.name].tolist()
    return values


def _key_file(path: Path, keys: Sequence[KeyColumn]) -> pd.DataFrame:
    """A CSV whose header names every key column; one key per line."""
    rows = [
        [
            _parse_key(f"public partitions {path} line {n}", key, text)
            for key, text in zip(keys, texts, strict=True)
        ]
        for n, texts in key_lines(path, [k.name for k in keys])
    ]
    return pd.DataFrame(rows, columns=[k.name for k in keys]).drop_duplicates(ignore_index=True)


def _parse_key(where: str, key: KeyColumn, value: object) -> object:
    """A key in its canonical form; a bad one names where it is, never its text."""
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    text = "" if missing else str(value).strip()
    if key.kind == "int64":
        if isinstance(value, float) and value.is_integer():
            text = str(int(value))
        return parse_int64_key(text, where, key.name)
    try:
        if key.kind == "date":
            day = dt.date.fromisoformat(text)
            if key.bucket == "week" and day.weekday() != 0:
                raise InputError(
                    f"{where}: a week key that is not a Monday (weeks start on Monday)"
                )
            return day
        if key.kind == "month" and not _MONTH.match(text):
            raise ValueError
    except ValueError:
        raise InputError(f"{where}: not a valid {key.name} key") from None
    return text


def bucket_of(bucket: str, day: dt.date) -> object:
    """A day's time bucket in canonical form."""
    if bucket == "day":
        return day
    if bucket == "week":
        return day - dt.timedelta(days=day.weekday())
    return f"{day.year:04d}-{day.month:02d}"


def canonical_keys(frame: pd.DataFrame, keys: Sequence[KeyColumn]) -> pd.DataFrame:
    """Key columns as int64, str or `datetime.date` objects, whatever the engine gave."""
    for key in keys:
        column = frame[key.name]
        if key.kind == "int64":
            frame[key.name] = column.astype("int64")
        elif key.kind == "date":
            if pd.api.types.is_datetime64_any_dtype(column):
                frame[key.name] = column.dt.date.astype(object)
        else:
            frame[key.name] = column.astype(object)
    return frame
