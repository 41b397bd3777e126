"""A job's queries as work for an engine: what to aggregate, and how results become a release.

Each query becomes one `AggregationTask` (filter, partition keys, clipping, bounds, which
aggregates). A group of private queries that share one partition selection needs bounded
privacy-unit counts per key over the rows of any member: when the members read the same rows
with the same L0 bound, the first member's own counts serve; otherwise the group gets a
selection task of its own. Engines only ever compute exact aggregates per task; `core.mechanisms`
turns them into the release.

Partition keys are input columns, time buckets of the job's time column, or numeric columns cut
at public edges (`core`'s one key type per kind, in every engine): `day` and `week` (its Monday)
as dates; `hour` (`YYYY-MM-DDTHH`), `month` (`YYYY-MM`), `year` (`YYYY`) and buckets (`[25, 50)`)
as text. Engines hand back key columns in one canonical pandas form (int64, str,
`datetime.date`), so results of every engine align and compare.

Public key files reach this module as values the run read (`KeyFile`, read by
`lifecycle.public_keys`): core reads no file.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pandas as pd
import pyarrow as pa

from dppipeline.core.extremes import EXTREME_METRICS
from dppipeline.errors import InputError, UsageError
from dppipeline.spec.filters import (
    And,
    Compare,
    FilterExpr,
    any_of,
    columns,
    to_text,
)
from dppipeline.spec.metrics import VARIANCE_METRICS, distinct_columns, percentile_of
from dppipeline.spec.model import JobSpec, QuerySpec
from dppipeline.spec.partition_keys import (
    INPUT_RANGE,
    KEY_RANGE,
    TIME_BUCKETS,
    BucketKey,
    bucket_key,
    is_file_source,
)
from dppipeline.spec.schema import Schema

if TYPE_CHECKING:  # the workers that bound rows import no noise library
    from dppipeline.core.plan import JobPlan

_INT64_TEXT = re.compile(r"[+-]?[0-9]+")
GLOBAL_KEY = "_global"  # the constant key engines group a global total by
_TEXT_TIME = {  # time buckets released as ISO text, and the text each key must match
    "hour": re.compile(r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3])$"),
    "month": re.compile(r"^\d{4}-(0[1-9]|1[0-2])$"),
    "year": re.compile(r"^\d{4}$"),
}


class DatedPart(Protocol):
    """A part of the input the run found (`inputs.files.DailyPartition`): its day, if any."""

    @property
    def day(self) -> dt.date | None: ...


@dataclass(frozen=True)
class KeyFile:
    """A public key file as the run read it (`inputs.files.key_lines`): how errors name it,
    and per key its line number and the texts of the key columns it was read for."""

    where: str
    lines: tuple[tuple[int, tuple[str, ...]], ...]


# A public key file and the key columns read from it: (the spec's source text, columns).
KeyFileRequest = tuple[str, tuple[str, ...]]
KeyFiles = Mapping[KeyFileRequest, KeyFile]


@dataclass(frozen=True)
class KeyColumn:
    """One partition key column: an input column (`source`, of input type `column_type`), a
    time bucket of the time column (`bucket`), or a numeric column cut at `edges`."""

    name: str
    bucket: str | None = None  # None | hour | day | week | month | year
    source: str = ""  # the input column it derives from ("" for a plain key: `name`)
    column_type: str = "int64"  # a plain key's input type
    edges: tuple[float, ...] = ()  # a numeric bucket key's public edges

    @property
    def input_column(self) -> str:
        return self.source or self.name

    @property
    def kind(self) -> str:
        """int64 | string | date | hour | month | year | bucket: the key's type everywhere."""
        if self.bucket in ("day", "week"):
            return "date"
        if self.bucket is not None:
            return self.bucket
        if self.edges:
            return "bucket"
        return self.column_type

    @property
    def labels(self) -> list[str]:
        """A bucket key's keys, in edge order (every one is released)."""
        return BucketKey(self.input_column, self.edges).labels

    @property
    def arrow_type(self) -> pa.DataType:
        return {"date": pa.date32(), "int64": pa.int64()}.get(self.kind, pa.string())


def key_column(entry: str, schema: Schema) -> KeyColumn:
    """A `partition_by` entry (already checked against `schema` by the spec) as a key."""
    if entry in TIME_BUCKETS:
        assert schema.time_column is not None  # the spec refuses time keys without one
        return KeyColumn(entry, bucket=entry, source=schema.time_column)
    bucket = bucket_key(entry)
    if bucket is not None:
        return KeyColumn(bucket.name, source=bucket.column, edges=bucket.edges)
    return KeyColumn(entry, column_type=schema.field(entry).type)


@dataclass(frozen=True, eq=False)
class AggregationTask:
    """Exact bounded aggregates one engine pass computes: per key, privacy_id_count, count,
    sum (and sum of squares, kept values, the number of distinct values of each `distinct`
    column) of the rows passing `filter`, after clipping to
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
    distinct: tuple[str, ...] = ()  # count_distinct(COLUMN) columns, over the kept rows
    # Linf by sampling rows, or by scaling each pair's count and sums (`bounds.linf_bounding`)
    scaled: bool = False

    @property
    def key_names(self) -> list[str]:
        return [k.name for k in self.keys]

    @property
    def midpoint(self) -> float:
        """The clipping bounds' midpoint (0 without a value), from which scaled pairs sum
        their values' deviations."""
        return 0.0 if self.clip is None else (self.clip[0] + self.clip[1]) / 2


@dataclass(frozen=True, eq=False)
class JobTasks:
    """The engine's work and how its results map onto the release."""

    tasks: tuple[AggregationTask, ...]
    selection_sources: dict[str, str]  # selection group -> task giving its privacy_id_count
    public_keys: dict[str, pd.DataFrame | None]  # public query -> its key set

    def task(self, name: str) -> AggregationTask:
        return next(t for t in self.tasks if t.name == name)


def input_schema(source: Schema, unit: str, tasks: Sequence[AggregationTask]) -> Schema:
    """The input columns a job's queries name: the privacy unit, each task's key sources, the
    values it aggregates and its filter's columns (`read_schema` adds the time column with
    layout `daily`); every engine reads and validates only these.
    A column the job does not name is never read (Parquet is columnar: in the benchmark's
    files the two columns the terminal job never uses hold 62% of the bytes), and a bad value
    in one cannot take a row out of the release."""
    names = {unit}
    for task in tasks:
        names.update(key.input_column for key in task.keys)
        if task.clip is not None:
            names.add(task.value)
        if task.filter is not None:
            names.update(columns(task.filter))
        names.update(task.distinct)
    return source.subset(names)


def in_memory(spec: JobSpec) -> bool:
    """Rows handed over in memory (the Python API, which clears `input.path`): no file, no
    day of a file; read like layout `files`, filtered by the period if the spec states one."""
    return spec.input.path is None


def read_schema(spec: JobSpec, tasks: Sequence[AggregationTask]) -> Schema:
    """What engines read and validate for this job (`input_schema`). With layout `daily` the
    time column is read whatever the queries name: every row is checked against its file's
    day, or a row dated outside its day folder would be released in, and charged to, the
    wrong window. With layout `files` (and in-memory rows) no row is checked against a
    file's day: the period filter on the time column selects rows."""
    schema = input_schema(spec.source_schema, spec.privacy_unit, tasks)
    if spec.input.layout == "files" or in_memory(spec):
        return schema.without_event_time()
    time = spec.source_schema.time_column
    return schema if time is None else spec.source_schema.subset({*schema.names, time})


def job_task(spec: JobSpec, query: QuerySpec) -> AggregationTask:
    """`task_for` the job's schema, its rows limited to the job's period when the layout
    (`files`) does not select days by file."""
    task = task_for(query, spec.source_schema)
    period = period_filter(spec)
    if period is None:
        return task
    return replace(task, filter=period if task.filter is None else And((period, task.filter)))


def period_filter(spec: JobSpec) -> FilterExpr | None:
    """Layout `files` (and in-memory rows): start_date <= time column < end_date + 1 day (UTC)."""
    first, last = spec.input.start_date, spec.input.end_date
    time = spec.source_schema.time_column
    by_period = spec.input.layout == "files" or in_memory(spec)
    if not by_period or first is None or last is None or time is None:
        return None
    start = dt.datetime.combine(first, dt.time())
    end = dt.datetime.combine(last + dt.timedelta(days=1), dt.time())
    return And((Compare(time, ">=", start), Compare(time, "<", end)))


def key_columns(query: QuerySpec, schema: Schema) -> tuple[KeyColumn, ...]:
    """The query's partition keys (`schema`: the job's input schema, `spec.source_schema`)."""
    return tuple(key_column(entry, schema) for entry in query.partition_by)


def check_query_columns(spec: JobSpec) -> None:
    """Every query's columns exist in the input schema with a type that fits their role
    (the spec checked them when it was built; a spec copied with changes is checked again)."""
    spec._columns_exist()


def task_for(query: QuerySpec, schema: Schema) -> AggregationTask:
    """The query's engine task (`schema`: the job's input schema, `spec.source_schema`).
    Rows below a bucket key's first edge are in no partition: the filter drops them."""
    keys = key_columns(query, schema)
    bounds = query.bounds
    total = bounds.max_contributions
    l0, linf = query.pair_bounds if total is None else (total, total)
    metrics = query.metrics
    return AggregationTask(
        name=query.name,
        filter=_parsed_filter(query, schema, keys),
        keys=keys,
        value=query.value,
        clip=_clip(query),
        max_partitions_contributed=l0 if keys else 1,
        max_contributions_per_partition=linf,
        max_contributions=total,
        sum_squares=any(m in VARIANCE_METRICS for m in metrics),
        values=any(percentile_of(m) is not None or m in EXTREME_METRICS for m in metrics),
        distinct=distinct_columns(metrics),
        scaled=bounds.linf_bounding == "scale",
    )


def _parsed_filter(
    query: QuerySpec, schema: Schema, keys: Sequence[KeyColumn]
) -> FilterExpr | None:
    parts: list[FilterExpr] = [
        Compare(key.input_column, ">=", _edge_value(key, schema)) for key in keys if key.edges
    ]
    if query.filter is not None:
        from dppipeline.spec.filter_parser import parse_filter  # noqa: PLC0415 (sqlglot)

        parts.append(parse_filter(query.filter, schema, where=f"queries.{query.name}.filter"))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else And(tuple(parts))


def _edge_value(key: KeyColumn, schema: Schema) -> int | float:
    """A bucket's first edge as a literal of its column's type (an int64 column compares
    with the smallest integer at or above the edge)."""
    low = key.edges[0]
    return math.ceil(low) if schema.field(key.input_column).type == "int64" else low


def plan_tasks(
    spec: JobSpec,
    plan: JobPlan,
    days: Sequence[DatedPart],
    key_files: KeyFiles | None = None,
) -> JobTasks:
    """One task per query, plus one per selection group its members cannot share.
    `key_files`: the public key files the job names (`key_file_requests`), as the run read
    them."""
    queries = {q.name: q for q in spec.queries}
    tasks: dict[str, AggregationTask] = {}
    public: dict[str, pd.DataFrame | None] = {}
    covered = covered_days(spec, days)
    for query in spec.queries:
        task = job_task(spec, query)
        if query.is_public:
            keys = public_key_set(query, task.keys, covered, key_files) if task.keys else None
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
    from dppipeline.core.mechanisms import release_public, release_selection_group  # noqa: PLC0415

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


def key_file_requests(spec: JobSpec) -> list[KeyFileRequest]:
    """The public key files the job's queries name, each with the key columns read from it
    (the run reads them and hands them to `plan_tasks` and `public_key_set`)."""
    requests: dict[KeyFileRequest, None] = {}
    for query in spec.queries:
        if query.is_public and query.partition_by:
            listed = [k for k in key_columns(query, spec.source_schema) if not k.edges]
            requests.update(dict.fromkeys(_file_requests(query, listed)))
    return list(requests)


def _file_requests(query: QuerySpec, listed: Sequence[KeyColumn]) -> list[KeyFileRequest]:
    """The key files among a public query's sources (`listed`: its non-bucket keys)."""
    sources = query.partition_selection.public_partitions
    if sources is None or not listed:
        return []
    if isinstance(sources, str) and is_file_source(sources) and len(listed) > 1:
        return [(sources, tuple(k.name for k in listed))]
    if isinstance(sources, str):
        sources = {listed[0].name: sources}
    assert isinstance(sources, dict)  # as `public_key_set` reads them
    return [
        (source, (name,))
        for name, source in sources.items()
        if isinstance(source, str) and source != INPUT_RANGE and not KEY_RANGE.match(source)
    ]


def _given_file(key_files: KeyFiles | None, source: str, columns: Sequence[str]) -> KeyFile:
    found = (key_files or {}).get((source, tuple(columns)))
    if found is None:  # a caller that did not read what `key_file_requests` names
        raise UsageError(f"public partitions {source}: not read by the run")
    return found


def public_key_set(
    query: QuerySpec,
    keys: Sequence[KeyColumn],
    days: Sequence[dt.date],
    key_files: KeyFiles | None = None,
) -> pd.DataFrame:
    """The query's public keys in canonical form: a file, a range, or per column a file,
    range, list or `input_range` (the buckets of `days`, the days the input covers),
    multiplied out; bucket keys add every bucket. Files: as the run read them (`key_files`)."""
    where = f"queries.{query.name}.partition_selection.public_partitions"
    sources = query.partition_selection.public_partitions
    listed = [k for k in keys if not k.edges]
    by_name = {k.name: k for k in listed}
    if sources is None:  # bucket keys alone (or a global total): public by construction
        frame = pd.DataFrame(index=range(1))
    elif isinstance(sources, str) and is_file_source(sources) and len(listed) > 1:
        names = [k.name for k in listed]
        frame = _key_file(Path(sources), listed, _given_file(key_files, sources, names))
    else:
        if isinstance(sources, str):
            sources = {listed[0].name: sources}
        assert isinstance(sources, dict)
        columns = [
            _column_keys(where, by_name[name], source, days, key_files)
            for name, source in sources.items()
        ]
        frame = pd.DataFrame(list(itertools.product(*columns)), columns=list(sources))
    for key in keys:
        if key.edges:
            frame = frame.merge(pd.DataFrame({key.name: key.labels}), how="cross")
    return frame.drop_duplicates(ignore_index=True)[[k.name for k in keys]]


def _clip(query: QuerySpec) -> tuple[float, float] | None:
    """[min_value, max_value] when the query aggregates its value (the spec requires both)."""
    if not query.needs_value_bounds:
        return None
    low, high = query.bounds.min_value, query.bounds.max_value
    assert low is not None and high is not None  # checked when the spec was built
    return (low, high)


def _column_keys(
    where: str,
    key: KeyColumn,
    source: object,
    days: Sequence[dt.date],
    key_files: KeyFiles | None,
) -> list[object]:
    if isinstance(source, list | tuple):
        return [_parse_key(f"{where}.{key.name}", key, v) for v in source]
    assert isinstance(source, str)
    if source == INPUT_RANGE:
        if key.bucket is None:
            raise UsageError(
                f"{where}.{key.name}: {INPUT_RANGE} is for the time keys {', '.join(TIME_BUCKETS)}"
            )
        if not days:  # in-memory rows without a stated period: nothing to cover
            raise UsageError(
                f"{where}.{key.name}: {INPUT_RANGE} needs input.start_date and input.end_date "
                "for in-memory data (no daily partitions say which days it covers)"
            )
        buckets = {b for d in days for b in buckets_of(key.bucket, d)}
        return sorted(buckets, key=str)  # ISO text order
    match = KEY_RANGE.match(source)
    if match:
        if key.kind != "int64":
            raise UsageError(f"{where}.{key.name}: a range A..B needs an int64 column")
        return list(range(int(match.group(1)), int(match.group(2)) + 1))
    file = _given_file(key_files, source, [key.name])
    if key.bucket is not None:
        frame = public_partitions(file, key.name, "string")
        return [_parse_key(f"{source}", key, v) for v in frame[key.name]]
    values: list[object] = public_partitions(file, key.name, key.kind)[key.name].tolist()
    return values


def public_partitions(file: KeyFile, key_column: str, dtype: str) -> pd.DataFrame:
    """One column's public keys, parsed to its type; duplicates dropped; a bad key names its
    line (never its text: error messages quote no input value)."""
    keys: list[object] = []
    for number, (text,) in file.lines:
        if dtype == "int64":
            where = f"public partitions {file.where} line {number}"
            keys.append(parse_int64_key(text, where, key_column))
        else:
            keys.append(text)
    frame = pd.DataFrame({key_column: keys}).drop_duplicates(ignore_index=True)
    if dtype == "int64":
        frame[key_column] = frame[key_column].astype("int64")
    return frame


def parse_int64_key(text: str, where: str, key_column: str) -> int:
    """A public key as an int64: decimal digits with an optional sign, within range."""
    if not _INT64_TEXT.fullmatch(text):
        raise InputError(f"{where}: not a valid {key_column} key (an int64)")
    value = int(text)
    if not -(2**63) <= value < 2**63:
        raise InputError(f"{where}: {key_column} key outside the int64 range")
    return value


def _key_file(path: Path, keys: Sequence[KeyColumn], file: KeyFile) -> pd.DataFrame:
    """A CSV whose header names every key column; one key per line (`path`: as errors name
    it)."""
    rows = [
        [
            _parse_key(f"public partitions {path} line {n}", key, text)
            for key, text in zip(keys, texts, strict=True)
        ]
        for n, texts in file.lines
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
        if key.kind in _TEXT_TIME and not _TEXT_TIME[key.kind].match(text):
            raise ValueError
        if key.kind == "bucket" and text not in key.labels:
            raise ValueError
    except ValueError:
        raise InputError(f"{where}: not a valid {key.name} key") from None
    return text


def buckets_of(bucket: str, day: dt.date) -> list[object]:
    """A day's time buckets in canonical form (24 for `hour`, else one)."""
    if bucket == "hour":
        return [f"{day.isoformat()}T{hour:02d}" for hour in range(24)]
    if bucket == "day":
        return [day]
    if bucket == "week":
        return [day - dt.timedelta(days=day.weekday())]
    if bucket == "month":
        return [f"{day.year:04d}-{day.month:02d}"]
    return [f"{day.year:04d}"]


def covered_days(spec: JobSpec, parts: Sequence[DatedPart]) -> list[dt.date]:
    """The days the input covers: each daily partition's, or every day of a `files` layout's
    period ([start_date, end_date], which the spec requires); in-memory rows: the period the
    spec states, else none."""
    if spec.input.layout != "files" and not in_memory(spec):
        return [p.day for p in parts if p.day is not None]
    first, last = spec.input.start_date, spec.input.end_date
    if first is None or last is None:
        return []
    return [first + dt.timedelta(days=n) for n in range((last - first).days + 1)]


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
