"""A query's task on Polars rows: filter, keys (time buckets), clipping, contribution
bounding and exact per-partition aggregates. The local engine runs it on all rows at once;
Beam on each batch; `evaluate` and `tune` on in-memory data."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import polars as pl

from dppipeline.core.tasks import (
    AggregationTask,
    KeyColumn,
    canonical_keys,
)
from dppipeline.engines.kernel.bounding import (
    BoundedAggregates,
    ContributionSample,
    aggregate_per_partition,
    aggregates_table,
    bottom_k_codes,
    dense_codes,
    sample_contributions,
)
from dppipeline.engines.kernel.polars_filter import to_polars
from dppipeline.engines.kernel.polars_read import ROW, SOURCE
from dppipeline.engines.kernel.sampling import (
    SamplingKeys,
    pair_priorities,
    partition_seeds,
    row_priorities,
    unit_kind_of,
)

_CODE = "_key_code"
PRIORITY = "_priority"  # a row's Linf priority, once `pre_bound` computed it
DENSE_GROUPS = 1 << 26  # group codes below this are bincounted as they are


def key_expr(key: KeyColumn) -> pl.Expr:
    """A partition key column as a Polars expression: the column itself, a time bucket of
    the time column (UTC wall-clock; weeks start Monday), or a numeric bucket's label."""
    if key.edges:
        return bucket_expr(pl.col(key.input_column), key).alias(key.name)
    if key.bucket is None:
        return pl.col(key.name)
    moment = pl.col(key.input_column)
    if key.bucket == "day":
        return moment.dt.date().alias(key.name)
    if key.bucket == "week":
        return moment.dt.truncate("1w").dt.date().alias(key.name)
    pattern = {"hour": "%Y-%m-%dT%H", "month": "%Y-%m", "year": "%Y"}[key.bucket]
    return moment.dt.strftime(pattern).alias(key.name)


def bucket_expr(value: pl.Expr, key: KeyColumn) -> pl.Expr:
    """The label of the bucket `value` falls in: the last edge at or below it (rows below the
    first edge never get here: the task's filter drops them)."""
    labels = key.labels
    expr = pl.lit(labels[0])
    for edge, label in zip(key.edges[1:], labels[1:], strict=True):
        expr = pl.when(value >= edge).then(pl.lit(label)).otherwise(expr)
    return expr


# Time buckets labelled by text: rows are grouped by the truncated moment and only the pairs'
# keys are formatted (strftime per row cost 0.4 s per query in a 1.6M-row batch).
_TRUNCATE = {"hour": "1h", "month": "1mo", "year": "1y"}
_LABEL = {"hour": "%Y-%m-%dT%H", "month": "%Y-%m", "year": "%Y"}


def scaled_partials(
    rows: pl.DataFrame, task: AggregationTask, unit: str, public: pl.DataFrame | None
) -> pl.LazyFrame:
    """`pair_partials` of `task_rows` as one lazy query from the batch's rows to the pairs:
    filter, keys, clip, group by (unit, keys), then the public-key semi-join on the pairs
    (the same pairs as joining the rows first: a pair's rows share its keys). Text time
    buckets are grouped by the truncated moment and labelled per pair. Polars runs the
    queries of several tasks together (`TaskBounder.add`)."""
    frame = rows.lazy()
    if task.filter is not None:
        frame = frame.filter(to_polars(task.filter))
    value = pl.lit(0.0) if task.clip is None else pl.col(task.value).clip(*task.clip)
    deferred = [
        k
        for k in task.keys
        if k.bucket in _TRUNCATE and isinstance(rows.schema.get(k.input_column), pl.Datetime)
    ]
    keys = [
        pl.col(k.input_column).dt.truncate(_TRUNCATE[k.bucket]).alias(k.name)
        if k in deferred
        else key_expr(k)
        for k in task.keys
    ]
    deviation = (value.cast(pl.Float64) - task.midpoint).alias("_deviation")
    frame = frame.select(pl.col(unit), *keys, deviation)
    sums = [pl.len().cast(pl.Int64).alias(ROWS), pl.col("_deviation").sum().alias(DEVIATIONS)]
    if task.sum_squares:
        sums.append((pl.col("_deviation") ** 2).sum().alias(SQUARES))
    frame = frame.group_by([unit, *task.key_names]).agg(sums)
    if deferred:
        frame = frame.with_columns(
            pl.col(k.name).dt.strftime(_LABEL[k.bucket])  # type: ignore[index]
            for k in deferred
        )
    if task.public_keys is not None:
        if public is None:
            public = pl.from_pandas(task.public_keys, include_index=False)
        frame = frame.join(public.lazy(), on=task.key_names, how="semi")
    return frame


def shares_pairs(task: AggregationTask, source: AggregationTask) -> bool:
    """Whether `task`'s pair partials are a projection of `source`'s: both scaled, the same
    rows (filter), pairs (keys, public keys) and clipped values (value column and bounds), the
    squares where `task` needs them; or `task` reads no value (then only the rows per pair).
    L0 and Linf may differ: they bound the pairs afterwards (`bound_and_aggregate`)."""
    if not (task.scaled and source.scaled) or (task.filter, task.keys) != (
        source.filter,
        source.keys,
    ):
        return False
    if (task.public_keys is None) != (source.public_keys is None):
        return False
    if task.public_keys is not None and not task.public_keys.equals(source.public_keys):
        return False
    if task.clip is None:
        return True
    return (task.value, task.clip) == (source.value, source.clip) and (
        source.sum_squares or not task.sum_squares
    )


def shared_pairs(partials: pl.DataFrame, task: AggregationTask, unit: str) -> pl.DataFrame:
    """`task`'s pair partials from another task's (`shares_pairs`): the same columns as its
    own query gives; without a value, deviations from 0 of the value 0 (exactly 0.0)."""
    columns = [pl.col(unit), *(pl.col(k) for k in task.key_names), pl.col(ROWS)]
    if task.clip is None:
        zero = pl.lit(0.0, pl.Float64)
        columns.append(zero.alias(DEVIATIONS))
        if task.sum_squares:
            columns.append(zero.alias(SQUARES))
    else:
        columns.append(pl.col(DEVIATIONS))
        if task.sum_squares:
            columns.append(pl.col(SQUARES))
    return partials.select(columns)


def task_rows(
    rows: pl.DataFrame, task: AggregationTask, unit: str, public: pl.DataFrame | None = None
) -> pl.DataFrame:
    """The task's rows: filtered, with its key columns derived, unlisted keys dropped (before
    bounding, so no unit spends its L0 on a partition that is never released) and the value
    clipped, as (unit, keys..., `_value`, `_distinct_i` for the task's i-th count_distinct
    column, and the row identity `_source_file`, `_row`, or the priority it gave, where the
    rows have it). `public`:
    the task's public keys, already converted to Polars (callers that run this per batch
    convert them once)."""
    if task.filter is not None:
        rows = rows.filter(to_polars(task.filter))
    value = pl.lit(0.0) if task.clip is None else pl.col(task.value).clip(*task.clip)
    identity = [c for c in (SOURCE, ROW, PRIORITY) if c in rows.columns]
    frame = rows.select(
        pl.col(unit),
        *[key_expr(k) for k in task.keys],
        value.cast(pl.Float64).alias("_value"),
        *[pl.col(c).alias(distinct_name(i)) for i, c in enumerate(task.distinct)],
        *identity,
    )
    if task.public_keys is not None:
        if public is None:
            public = pl.from_pandas(task.public_keys, include_index=False)
        frame = frame.join(public, on=task.key_names, how="semi")
    return frame


def distinct_name(i: int) -> str:
    """The task row column holding the i-th count_distinct column's values."""
    return f"_distinct_{i}"


def distinct_arrays(frame: pl.DataFrame, task: AggregationTask) -> list[tuple[str, np.ndarray]]:
    """(column, its value in every row) of the task's count_distinct columns; a column with
    nulls goes through Python objects (None), so large integers are never rounded to floats."""
    out = []
    for i, column in enumerate(task.distinct):
        series = frame.get_column(distinct_name(i))
        values = (
            series.to_numpy() if series.null_count() == 0 else np.asarray(series.to_list(), object)
        )
        out.append((column, values))
    return out


def key_codes_of(frame: pl.DataFrame, keys: Sequence[KeyColumn]) -> tuple[np.ndarray, pd.DataFrame]:
    """(dense code per row, key values per code as canonical pandas columns)."""
    if not keys:
        return np.zeros(frame.height, dtype=np.int64), pd.DataFrame(index=range(1))
    if len(keys) == 1 and keys[0].kind == "int64":
        codes, values = dense_codes(frame.get_column(keys[0].name).to_numpy())
        return codes, pd.DataFrame({keys[0].name: values})
    names = [k.name for k in keys]
    columns = [frame.get_column(name) for name in names]
    if any(c.null_count() for c in columns):  # nulls: Polars ranks the struct (slower)
        coded = frame.select(names).with_columns(
            (pl.struct(names).rank("dense") - 1).cast(pl.Int64).alias(_CODE)
        )
        values = coded.unique(_CODE).sort(_CODE).drop(_CODE).to_pandas()
        return coded.get_column(_CODE).to_numpy(), canonical_keys(values, keys)
    # Each column coded on its own (no sort for integers and dates), the codes combined
    # into one integer per row, then compacted: 2.6x faster than ranking a struct of
    # (terminal, day) at 5M rows.
    per_column = [_column_codes(c) for c in columns]
    sizes = [len(uniques) for _, uniques in per_column]
    if float(np.prod(sizes, dtype=np.float64)) >= 2.0**62:  # the combined code would overflow
        combined = pd.factorize(pd.MultiIndex.from_arrays([codes for codes, _ in per_column]))[
            0
        ].astype(np.int64)
    else:
        combined = np.zeros(frame.height, dtype=np.int64)
        for (codes, _), size in zip(per_column, sizes, strict=True):
            combined = combined * size + codes
    codes, first = _compact(combined)
    values = pd.DataFrame(
        {
            name: uniques.gather(c[first]).to_pandas()
            for name, (c, uniques) in zip(names, per_column, strict=True)
        }
    )
    return codes, canonical_keys(values, keys)


def _column_codes(column: pl.Series) -> tuple[np.ndarray, pl.Series]:
    """(code per row, value per code) of one key column without nulls: integers and dates by
    offset, anything else by rank."""
    if column.dtype.is_integer() or column.dtype.is_temporal():
        codes, first = _compact(column.to_physical().cast(pl.Int64).to_numpy())
        return codes, column.gather(first)
    return (column.rank("dense") - 1).cast(pl.Int64).to_numpy(), column.unique().sort()


def _compact(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes 0..m-1 for the m distinct values, the first position of each code's value);
    by offset when the values span a compact range, else by hashing."""
    if len(values) == 0:
        return values.astype(np.int64), np.zeros(0, dtype=np.int64)
    low, high = int(values.min()), int(values.max())
    if high - low < max(4 * len(values), 1 << 16):
        offsets = values - low
        present = np.bincount(offsets) > 0
        codes = (np.cumsum(present) - 1)[offsets]
    else:
        codes = pd.factorize(values)[0].astype(np.int64)
    first = np.empty(int(codes.max()) + 1, dtype=np.int64)
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)  # the first write wins last
    return codes, first


def row_priority(frame: pl.DataFrame, keys: SamplingKeys) -> np.ndarray:
    """Each row's Linf priority from its identity (or as `pre_bound` carried it); rows built
    in memory without one are identified by their position."""
    if PRIORITY in frame.columns:
        return frame.get_column(PRIORITY).to_numpy()
    if SOURCE in frame.columns:
        source = frame.get_column(SOURCE)
        files = list(source.dtype.categories) if isinstance(source.dtype, pl.Enum) else None
        if files is None:  # plain text: one code per distinct file
            codes, names = pd.factorize(source.to_numpy())
            files, file_codes = [str(n) for n in names], codes
        else:
            file_codes = source.to_physical().to_numpy()
        rows = frame.get_column(ROW).to_numpy()
    else:
        files, file_codes, rows = [""], np.zeros(frame.height, np.int64), np.arange(frame.height)
    return row_priorities(keys, files, file_codes, rows)


def aggregate_task(
    rows: pl.DataFrame, task: AggregationTask, unit: str, keys: SamplingKeys
) -> pd.DataFrame:
    """One task's exact bounded aggregates per partition, sampled with the run's keys."""
    return aggregate_task_rows(task_rows(rows, task, unit), task, unit, keys)


def pre_bound(
    frame: pl.DataFrame, task: AggregationTask, unit: str, keys: SamplingKeys
) -> pl.DataFrame:
    """The rows of a batch of `task_rows` that bounding may still keep: per (unit, partition)
    pair its Linf rows of lowest priority (per unit its K rows under `max_contributions`).
    Keeping the lowest k of each batch, then the lowest k of what the batches kept, keeps
    exactly the lowest k of all rows (priority, then value, is a total order on rows that
    are not interchangeable), so a run that reads batch by batch holds about pairs x Linf
    rows, not every row, and releases what a run holding every row releases. Every pair
    keeps a row, so L0 sampling sees every pair."""
    if task.scaled:  # every row of a pair counts: its rows add up to one partial per batch
        return pair_partials(frame, task, unit)
    priority = row_priority(frame, keys)
    if PRIORITY not in frame.columns:  # computed once per row, kept with the rows it keeps
        frame = frame.with_columns(pl.Series(PRIORITY, priority))
    if frame.height == 0:
        return frame
    privacy_codes, _ = dense_codes(frame.get_column(unit).to_numpy())
    values = None if task.clip is None else frame.get_column("_value").to_numpy()
    if task.max_contributions is not None:
        group, k = privacy_codes, task.max_contributions
    else:
        key_codes, key_values = key_codes_of(frame, task.keys)
        group = privacy_codes * max(len(key_values), 1) + key_codes
        k = task.max_contributions_per_partition
    if group.max() >= DENSE_GROUPS:  # sparse codes: renumbered (the bincount would be large)
        group = pd.factorize(group)[0].astype(np.int64)
    kept = bottom_k_codes(group, priority, k, values)
    return frame if len(kept) == frame.height else frame[kept]


# A scaled pair's partial: its rows, and its values' sums of deviations from the bounds'
# midpoint and of their squares (`pair_partials`).
ROWS, DEVIATIONS, SQUARES = "_rows", "_deviations", "_squares"


def pair_partials(frame: pl.DataFrame, task: AggregationTask, unit: str) -> pl.DataFrame:
    """Scaled Linf bounding: task rows (or partials of earlier batches) -> one row per
    (unit, partition) pair with its rows, and its clipped values' sums of (x - mid) and, for
    the variance, of (x - mid)^2. Scaling needs no more, so memory follows the pairs."""
    if ROWS in frame.columns:
        rows, deviations = pl.col(ROWS).sum(), pl.col(DEVIATIONS).sum()
        squares = pl.col(SQUARES).sum() if SQUARES in frame.columns else None
    else:
        deviation = pl.col("_value") - task.midpoint
        rows, deviations, squares = pl.len(), deviation.sum(), (deviation**2).sum()
    sums = [rows.cast(pl.Int64).alias(ROWS), deviations.alias(DEVIATIONS)]
    if task.sum_squares and squares is not None:
        sums.append(squares.alias(SQUARES))
    return frame.group_by([unit, *task.key_names]).agg(sums)


def aggregate_task_rows(
    frame: pl.DataFrame, task: AggregationTask, unit: str, keys: SamplingKeys
) -> pd.DataFrame:
    """`aggregate_task` on rows `task_rows` already made (or `pre_bound` already thinned)."""
    key_codes, key_values = key_codes_of(frame, task.keys)
    privacy_codes, unit_values = dense_codes(frame.get_column(unit).to_numpy())
    partials = ROWS in frame.columns  # scaled pairs, already summed per batch
    values = None if task.clip is None or partials else frame.get_column("_value").to_numpy()
    bounded = bound_and_aggregate(
        task,
        keys,
        privacy_codes=privacy_codes,
        unit_values=unit_values,
        unit_kind=unit_kind_of(unit_values),
        key_codes=key_codes,
        key_values=key_values,
        # Scaled Linf bounding samples no rows: no row priorities to compute.
        row_priority=np.zeros(frame.height) if task.scaled else row_priority(frame, keys),
        values=values,
        distinct=distinct_arrays(frame, task),
        row_counts=frame.get_column(ROWS).to_numpy() if partials else None,
        deviations=(
            (
                frame.get_column(DEVIATIONS).to_numpy(),
                frame.get_column(SQUARES).to_numpy() if SQUARES in frame.columns else None,
            )
            if partials
            else None
        ),
    )
    return aggregates_table(bounded, key_values)


class TaskBounder:
    """Several tasks' bounding over rows that arrive a batch at a time: per batch, each task's
    `task_rows` thinned by `pre_bound`; what the batches kept is thinned together once it
    exceeds `compact_rows` (and twice what the last thinning left); `aggregates` bounds and
    aggregates the rest. Memory grows with the pairs (times Linf) and one batch, not with the
    rows. The local engine runs it over the input's files; Spark over each partition of rows
    shuffled by unit (a unit's rows all in one partition)."""

    def __init__(
        self,
        tasks: Sequence[AggregationTask],
        unit: str,
        keys: SamplingKeys,
        *,
        compact_rows: int,
    ) -> None:
        self.tasks, self.unit, self.keys, self.compact_rows = tasks, unit, keys, compact_rows
        self.public = {
            t.name: None if t.public_keys is None else pl.from_pandas(t.public_keys) for t in tasks
        }
        self.kept: dict[str, list[pl.DataFrame]] = {t.name: [] for t in tasks}
        self.compacted = dict.fromkeys(self.kept, 0)  # rows held after the last thinning
        # Scaled task -> the earlier scaled task whose pair partials it reads (`shares_pairs`).
        self.source: dict[str, str] = {}
        scaled = [t for t in tasks if t.scaled]
        for i, task in enumerate(scaled):
            source = next((s for s in scaled[:i] if shares_pairs(task, s)), None)
            if source is not None:
                self.source[task.name] = self.source.get(source.name, source.name)

    def add(self, rows: pl.DataFrame) -> None:
        # Scaled tasks: one lazy query each from the rows to their pairs, run together.
        # A task whose pairs another task's query gives reads them (`shares_pairs`).
        scaled = [t for t in self.tasks if t.scaled and t.name not in self.source]
        partials = pl.collect_all(
            [scaled_partials(rows, t, self.unit, self.public[t.name]) for t in scaled]
        )
        batch = dict(zip([t.name for t in scaled], partials, strict=True))
        for task in self.tasks:
            kept = self.kept[task.name]
            if task.name in self.source:
                kept.append(shared_pairs(batch[self.source[task.name]], task, self.unit))
            elif task.scaled:
                kept.append(batch[task.name])
            else:
                frame = task_rows(rows, task, self.unit, self.public[task.name])
                kept.append(pre_bound(frame, task, self.unit, self.keys))
            # A batch rarely holds more than Linf rows of a pair: what the batches kept is
            # thinned together once it is large.
            if sum(f.height for f in kept) > max(self.compact_rows, 2 * self.compacted[task.name]):
                self.kept[task.name] = [pre_bound(pl.concat(kept), task, self.unit, self.keys)]
                self.compacted[task.name] = self.kept[task.name][0].height

    def aggregates(self, task: AggregationTask) -> pd.DataFrame:
        """The task's exact bounded aggregates per partition, of every row `add` was given
        (at least one batch, possibly empty)."""
        frame = pl.concat(self.kept[task.name])
        return aggregate_task_rows(frame, task, self.unit, self.keys)


def bound_and_aggregate(
    task: AggregationTask,
    keys: SamplingKeys,
    *,
    privacy_codes: np.ndarray,
    unit_values: np.ndarray,
    unit_kind: str,
    key_codes: np.ndarray,
    key_values: pd.DataFrame,
    row_priority: np.ndarray,
    values: np.ndarray | None,
    on_sample: Callable[[ContributionSample], None] | None = None,
    distinct: Sequence[tuple[str, np.ndarray]] = (),
    row_counts: np.ndarray | None = None,
    deviations: tuple[np.ndarray, np.ndarray | None] | None = None,
) -> BoundedAggregates:
    """Linf and L0 sampling with the run's keys, then exact sums per partition: the one
    bounding step of the local engine and of Beam's unit shards. `key_values`: the canonical
    keys of codes 0..n-1 (the L0 priority hashes them); `on_sample` sees the sample (Beam's
    debug statistic); `distinct`: (column, value of each row) of its count_distinct columns;
    `row_counts`, `deviations`: for scaled bounding over `pair_partials`, the rows each entry
    stands for and its sums of (x - mid) and (x - mid)^2."""
    n_keys = max(len(key_values), 1)
    seeds = partition_seeds(keys, key_values, [k.kind for k in task.keys])
    sample = sample_contributions(
        privacy_codes,
        key_codes,
        n_keys=n_keys,
        max_partitions_contributed=task.max_partitions_contributed,
        max_contributions_per_partition=task.max_contributions_per_partition,
        row_priority=row_priority,
        pair_priority=lambda units, codes: pair_priorities(
            seeds[codes], unit_values[units], unit_kind
        ),
        values=values,
        max_contributions=task.max_contributions,
        scaled=task.scaled,
        row_counts=row_counts,
    )
    if on_sample is not None:
        on_sample(sample)
    return aggregate_per_partition(
        sample,
        key_codes,
        values,
        n_keys,
        sum_squares=task.sum_squares,
        keep_values=task.values,
        distinct=distinct,
        centre=task.midpoint,
        deviations=deviations,
    )
