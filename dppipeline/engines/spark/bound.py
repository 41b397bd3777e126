"""Contribution bounding on Spark: rows -> each privacy unit's bounded (unit, partition) pairs.

No Python runs per row. Each row gets its Linf sampling priority in the JVM, xxhash64 of a
per-run secret, its file and its row number (`engines.kernel.sampling`; the secrets reach Spark
as a one-row broadcast table, never as a literal a plan or the UI would show). Linf: Spark's
bottom-k aggregate (`min_by` with k) keeps each (privacy unit, partition) pair's Linf values of
lowest (priority, value); L0: `row_number()` over each unit's pairs ordered by xxhash64(secret,
key, unit). Both are deterministic given the salt, so a retried task or a recomputed stage
keeps the same rows; and bottom-k composes (the lowest k of the lowest k's of the parts are
the lowest k), so where the rows are split does not change what is kept.

What travels: for a job of one query, the bottom-k aggregate runs partially before its
exchange, so the shuffle carries at most Linf entries per pair and input task, then the pair
aggregates by unit (for L0) and by key. For a job of several queries, the rows are shuffled
once by unit for all of them (`shuffled_by_unit`) and bounded where they lie: in one pass
for most queries (`unit_partitions.py`), here for count_distinct ones.
With `max_contributions` K, one step instead: `row_number()` over each unit's rows ordered by
(priority, value) keeps its K lowest; the pairs they fall in are then at most K per unit, with
nothing to rank (measurements: docs/explanation/engines.md).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from dppipeline.core.mechanisms import (
    CENTRED_SQUARES,
)
from dppipeline.core.tasks import (
    GLOBAL_KEY,
    AggregationTask,
    KeyColumn,
)
from dppipeline.engines.kernel.sampling import SamplingKeys
from dppipeline.engines.spark import read as spark_read
from dppipeline.engines.spark.filter import to_spark

VALUE = "_value"
PRIORITY = "_priority"
LINF_SECRET, L0_SECRET = "_linf_secret", "_l0_secret"
MIN_BY_MAX_K = 100_000  # the largest k Spark's min_by takes
INSET_MAX_KEYS = 10_000


def key_column(key: KeyColumn) -> Column:
    """A partition key as a Spark column: the column itself, a time bucket (weeks start
    Monday), or a numeric bucket's label. The time column is `timestamp_ntz` in UTC, and
    every bucket is computed from its fields alone (`date_trunc` and `date_format` would go
    through the session time zone)."""
    if key.edges:
        value = F.col(key.input_column)
        labels = key.labels
        label = F.lit(labels[0])
        for edge, text in zip(key.edges[1:], labels[1:], strict=True):
            label = F.when(value >= F.lit(edge), F.lit(text)).otherwise(label)
        return label.alias(key.name)
    if key.bucket is None:
        return F.col(key.name)
    moment = F.col(key.input_column)
    day = F.to_date(moment)
    if key.bucket == "day":
        return day.alias(key.name)
    if key.bucket == "week":
        return F.date_sub(day, F.weekday(day)).alias(key.name)
    # ISO text from zero-padded fields: `format_string` (Java's String.format on every row)
    # took about 4 s per month-keyed query at 5M rows. The rows here are on days of the
    # input's period (years 1 to 9999), where padding to 4 digits is exact.
    parts = [_padded(F.year(day), 4)]
    if key.bucket in ("month", "hour"):
        parts += [F.lit("-"), _padded(F.month(day), 2)]
    if key.bucket == "hour":
        parts += [F.lit("-"), _padded(F.dayofmonth(day), 2), F.lit("T"), _padded(F.hour(moment), 2)]
    return F.concat(*parts).alias(key.name)


def _padded(number: Column, digits: int) -> Column:
    return F.lpad(number.cast("string"), digits, "0")


def group_keys(task: AggregationTask) -> list[str]:
    """Columns to group by: the task's keys, or one constant key for a global total."""
    return task.key_names or [GLOBAL_KEY]


def distinct_name(i: int) -> str:
    """The column carrying the task's i-th count_distinct column through bounding."""
    return f"_distinct_{i}"


def task_rows(
    rows: DataFrame, task: AggregationTask, unit: str, identity: tuple[str, ...] = ()
) -> DataFrame:
    """(unit, keys..., clipped value, count_distinct columns, row identity) of the rows the
    task's filter keeps; the identity is the file and row, or the priority they gave."""
    if task.filter is not None:
        rows = rows.where(to_spark(task.filter))
    keys = [key_column(k) for k in task.keys] or [F.lit(0).alias(GLOBAL_KEY)]
    if task.clip is None:
        value = F.lit(0.0)
    else:
        low, high = task.clip
        value = F.least(F.greatest(F.col(task.value).cast("double"), F.lit(low)), F.lit(high))
    distinct = [F.col(c).alias(distinct_name(i)) for i, c in enumerate(task.distinct)]
    identity = identity or (spark_read.SOURCE, spark_read.ROW)
    return rows.select(unit, *keys, value.alias(VALUE), *distinct, *identity)


def sql_literal(value: object) -> str | None:
    """A key as Spark SQL literal text (int or date), or None for any other type. Text keys
    are never written as SQL: Spark would substitute `${...}` in them and its unescaping
    depends on session settings; they take the semi-join, which passes values."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return f"DATE'{value.isoformat()}'"
    return None


def keep_public(rows: DataFrame, keys: list[str], public_keys: pd.DataFrame) -> DataFrame:
    """Rows whose key is listed: for one int or date key column with up to INSET_MAX_KEYS
    keys an IN-set filter written as SQL text (one call to the JVM, where `isin` makes one per
    key: several times slower, docs/explanation/engines.md), else a broadcast semi-join."""
    if len(keys) == 1 and len(public_keys) <= INSET_MAX_KEYS:
        literals = [sql_literal(v) for v in public_keys[keys[0]].tolist()]
        if literals and None not in literals:
            quoted = keys[0].replace("`", "``")
            return rows.where(F.expr(f"`{quoted}` IN ({', '.join(literals)})"))
    listed = rows.sparkSession.createDataFrame(public_keys[keys])
    return rows.join(F.broadcast(listed), on=keys, how="left_semi")


def sampling_secrets(spark: SparkSession, salt: bytes) -> DataFrame:
    """The run's two sampling secrets (`engines.sampling`) as a one-row DataFrame: data, not
    literals, which every Spark plan, `explain` and the SQL tab of the UI would print."""
    keys = SamplingKeys.from_salt(salt)
    # From pandas: a LocalRelation in the JVM (a list of tuples would be a Python RDD, which
    # starts Python workers to produce one row).
    secrets = pd.DataFrame({LINF_SECRET: [keys.linf], L0_SECRET: [keys.l0]}, dtype="int64")
    return spark.createDataFrame(secrets)


def with_secret(frame: DataFrame, secrets: DataFrame, name: str) -> DataFrame:
    """`frame` with one secret as a column (a broadcast cross join with the one-row table)."""
    return frame.crossJoin(F.broadcast(secrets.select(name)))


def _field(name: str) -> Callable[[Column], Column]:
    """`e -> e[name]` for `F.transform` (which reads a lambda's arity: no default arguments)."""
    return lambda e: e[name]


def _not_null(x: Column) -> Column:
    return x.isNotNull()


def with_priority(rows: DataFrame, secrets: DataFrame) -> DataFrame:
    """`rows` with each row's Linf priority, one long computed where the row was read:
    xxhash64(secret, file, row), in place of the file and row (file names never travel)."""
    identity = (spark_read.SOURCE, spark_read.ROW)
    rest = [c for c in rows.columns if c not in identity]
    priority = F.xxhash64(LINF_SECRET, *identity).alias(PRIORITY)
    return with_secret(rows, secrets, LINF_SECRET).select(*rest, priority)


def shuffled_by_unit(rows: DataFrame, unit: str, salt: bytes) -> DataFrame:
    """The valid rows of a job of several queries, with their priorities, in one shuffle by
    privacy unit that every query's bounding reads: Spark knows the rows are partitioned by
    unit, so no query exchanges its rows again (only its pair aggregates, by key)."""
    return with_priority(rows, sampling_secrets(rows.sparkSession, salt)).repartition(unit)


def bounded_pairs(
    rows: DataFrame, task: AggregationTask, unit: str, salt: bytes, *, by_unit: bool = False
) -> DataFrame:
    """Typed input rows -> one row per kept (privacy unit, partition) pair with its count,
    sum, ...: at most Linf rows per pair and L0 pairs per unit, those of lowest priority.
    `by_unit`: the rows come from `shuffled_by_unit` (priorities carried, partitioned by
    unit) rather than from the reader."""
    keys = group_keys(task)
    secrets = sampling_secrets(rows.sparkSession, salt)
    rows = task_rows(rows, task, unit, (PRIORITY,) if by_unit else ())
    if task.public_keys is not None:
        # Before L0 bounding, so no privacy unit spends its L0 on partitions never released;
        # for one query, before any exchange, so rows of unlisted partitions never travel.
        rows = keep_public(rows, keys, task.public_keys)
    if not by_unit and not task.scaled:  # scaled Linf bounding ranks no rows
        rows = with_priority(rows, secrets)
        if task.max_contributions is not None:
            # A unit's total rows are ranked together: one shuffle of the rows by unit.
            rows = rows.repartition(unit)
        # Otherwise no explicit shuffle: Spark's bottom-k aggregate below runs partially
        # before its exchange (each task keeps a pair's Linf lowest entries), so what
        # travels grows with the (unit, partition) pairs, not the rows.
    if task.max_contributions is not None:
        # Total rows per unit: the K of lowest (priority, value), whatever their partitions.
        per_unit_rows = Window.partitionBy(unit).orderBy(PRIORITY, VALUE)
        rows = (
            rows.withColumn("_rank", F.row_number().over(per_unit_rows))
            .where(F.col("_rank") <= task.max_contributions)
            .drop("_rank")
        )
    pairs = scaled_pairs(rows, task, unit) if task.scaled else sampled_pairs(rows, task, unit)
    # L0: per privacy unit, the pairs of lowest xxhash64(secret, key..., unit) (a global total
    # has one pair per unit: nothing to rank).
    if not task.keys or task.max_contributions is not None:
        return pairs
    rank = F.xxhash64(L0_SECRET, *task.key_names, unit)
    per_unit = Window.partitionBy(unit).orderBy(rank, *task.key_names)
    return (
        with_secret(pairs, secrets, L0_SECRET)
        .withColumn("_rank", F.row_number().over(per_unit))
        .where(F.col("_rank") <= task.max_partitions_contributed)
        .drop("_rank", L0_SECRET)
    )


def scaled_pairs(rows: DataFrame, task: AggregationTask, unit: str) -> DataFrame:
    """Linf by scaling (`bounds.linf_bounding: scale`): per (privacy unit, partition) pair of
    c rows, n = min(c, Linf) and its clipped sums times min(1, Linf / c), which add at most
    what Linf of its rows could (docs/explanation/bounding.md). Hash aggregates only, partial before
    their exchange, as in a plain groupBy. The rows are summed as deviations from the bounds'
    midpoint m (see `bounding._aggregate_scaled_pairs`: no rounding error that grows with c)."""
    linf = task.max_contributions_per_partition
    m = F.lit(task.midpoint)
    deviation = F.col(VALUE) - m
    sums = [F.sum(deviation).alias("_d")]
    if task.sum_squares:
        sums.append(F.sum(deviation * deviation).alias("_q"))
    scale = F.least(F.lit(1.0), F.lit(float(linf)) / F.col("_rows"))
    kept = F.least(F.col("_rows"), F.lit(linf))
    scaled = [kept.alias("count"), (F.col("_d") * scale + m * kept).alias("sum")]
    if task.sum_squares:
        scaled.append((F.col("_q") * scale).alias(CENTRED_SQUARES))
    keys = group_keys(task)
    return (
        rows.groupBy(unit, *keys)
        .agg(F.count(F.lit(1)).alias("_rows"), *sums)
        .select(unit, *keys, *scaled)
    )


def sampled_pairs(rows: DataFrame, task: AggregationTask, unit: str) -> DataFrame:
    """Linf by sampling: per (privacy unit, partition) pair, the aggregates of its Linf rows
    of lowest (priority, value)."""
    keys = group_keys(task)
    distinct = [distinct_name(i) for i in range(len(task.distinct))]
    # Linf: per pair, Spark's bottom-k aggregate (`min_by` with k) keeps the values of the Linf
    # lowest (priority, value) entries, in that order: the same values and the same
    # floating-point sums whatever order the rows arrive in.
    # With count_distinct columns the kept entries are structs (value, distinct columns...) of
    # the same rows, split into arrays below.
    linf = task.max_contributions_per_partition
    order = F.struct(PRIORITY, VALUE, *distinct)
    entry = F.struct(VALUE, *distinct) if distinct else F.col(VALUE)
    if linf <= MIN_BY_MAX_K:
        kept = F.min_by(entry, order, linf)
    else:  # beyond min_by's limit: every entry collected, sorted, cut
        kept = F.transform(
            F.slice(F.array_sort(F.collect_list(order)), 1, linf),
            (lambda e: F.struct(*[e[c].alias(c) for c in (VALUE, *distinct)]))
            if distinct
            else (lambda e: e[VALUE]),
        )
    values = F.col("_values")
    entries = values
    if distinct:
        values = F.transform(entries, lambda e: e[VALUE])
    pair_aggregates = [
        F.size(values).alias("count"),
        F.aggregate(values, F.lit(0.0), lambda total, x: total + x).alias("sum"),
    ]
    # count_distinct: each pair's distinct non-null values (merged per partition later).
    pair_aggregates += [
        F.array_distinct(F.filter(F.transform(entries, _field(c)), _not_null)).alias(c)
        for c in distinct
    ]
    if task.sum_squares:  # deviations from the bounds' midpoint (core.mechanisms: no cancellation)
        m = F.lit(task.midpoint)
        pair_aggregates.append(
            F.aggregate(values, F.lit(0.0), lambda total, x: total + (x - m) * (x - m)).alias(
                CENTRED_SQUARES
            )
        )
    if task.values:
        pair_aggregates.append(values.alias("_values"))
    # (privacy unit, key) -> count, sum, ...
    return (
        rows.groupBy(unit, *keys).agg(kept.alias("_values")).select(unit, *keys, *pair_aggregates)
    )
