"""Spark reading and validation: the same rules as `local_read`, as DataFrame expressions.

Only the selected days' files are handed to Spark (the date range prunes before any read). Each
row gets its parsed columns and a `_bad` flag in one projection; reasons are computed for bad
rows only. No Python runs per row: everything here compiles to JVM code.
"""

from __future__ import annotations

from functools import reduce
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from dppipeline.engines.local_read import first_line
from dppipeline.errors import InputError
from dppipeline.io import DailyPartition
from dppipeline.schemas import Schema, spark_type_name

SOURCE = "_source_file"
ROW = "_row"
REASON = "_reason"
BAD = "_bad"
# Arrow types Spark reads as these (timestamps apart), for an explicit read schema.
_SPARK_TYPES = {
    "int8": "tinyint",
    "int16": "smallint",
    "int32": "int",
    "int64": "bigint",
    "float": "float",
    "double": "double",
    "bool": "boolean",
    "string": "string",
    "large_string": "string",
    "date32[day]": "date",
}


def _parsed(name: str) -> str:
    return f"_parsed_{name}"


def read_raw(
    spark: SparkSession, days: list[DailyPartition], fmt: str, schema: Schema
) -> DataFrame:
    """The selected files with the schema's columns (CSV: as text), plus file and row."""
    files = [str(path) for day in days for path in day.files]
    try:
        if fmt == "csv":
            frame = (
                spark.read.option("header", True)
                .option("inferSchema", False)
                .option("mode", "PERMISSIVE")
                .csv(files)
            )
            row = F.lit(None).cast("bigint")  # Spark keeps no line numbers for CSV
        else:
            ddl = parquet_ddl(spark, files[0], schema.names)
            reader = spark.read if ddl is None else spark.read.schema(ddl)
            frame = reader.parquet(*files)
            row = F.col("_metadata.row_index") + 1
    except Exception as exc:  # AnalysisException and friends: name the input
        raise InputError(f"cannot read {fmt} input: {first_line(exc)}") from None
    missing = [name for name in schema.names if name not in frame.columns]
    if missing:
        raise InputError(
            f"{files[0] if len(files) == 1 else 'input files'}: missing column {missing[0]} "
            f"(required by schemas/{schema.name}.json)"
        )
    return frame.select(*schema.names, F.col("_metadata.file_path").alias(SOURCE), row.alias(ROW))


def parquet_ddl(spark: SparkSession, path: str, names: list[str]) -> str | None:
    """The columns' Spark types as Spark infers them from one file's footer (which is all
    its inference reads, unless told to merge schemas), read here with pyarrow: Spark's own
    inference runs a job, half a second of a short run. None where unsure: Spark infers."""
    try:
        footer = pq.read_schema(path)
    except (OSError, pa.ArrowException):
        return None  # Spark's read reports it
    ntz = spark.conf.get("spark.sql.parquet.inferTimestampNTZ.enabled", "true") == "true"
    parts = []
    for name in names:
        if name not in footer.names:
            return None  # read_raw reports the missing column
        arrow = footer.field(name).type
        if pa.types.is_timestamp(arrow) and arrow.unit in ("ms", "us"):
            spark_type = "timestamp" if arrow.tz or not ntz else "timestamp_ntz"
        else:
            spark_type = _SPARK_TYPES.get(str(arrow))
        if spark_type is None:
            return None
        parts.append(f"`{name}` {spark_type}")
    return ", ".join(parts)


def _parse(frame: DataFrame, name: str, target: str) -> Column:
    """The column as its schema type: unchanged when it already is, else a lenient cast
    (null where the text does not parse)."""
    column = F.col(name)
    if frame.schema[name].dataType.simpleString() == target:
        return column
    if frame.schema[name].dataType.simpleString() == "string":
        column = F.trim(column)
    return column.try_cast(target)


def _rules(schema: Schema, value_column: str) -> list[tuple[Column, Column]]:
    """(condition breaking a rule, reason text), in reporting order, as in local_read."""
    rules: list[tuple[Column, Column]] = []
    for field in schema.fields:
        raw, parsed = F.col(field.name), F.col(_parsed(field.name))
        if not field.nullable:
            rules.append((raw.isNull(), F.lit(f"{field.name} is null")))
        rules.append(
            (
                raw.isNotNull() & parsed.isNull(),
                F.concat(
                    F.lit(f"{field.name} "),
                    F.substring(raw.cast("string"), 1, 40),
                    F.lit(f" is not a valid {field.type}"),
                ),
            )
        )
        if field.name == value_column:
            finite = ~F.isnan(parsed) & (F.abs(parsed) < float("inf"))
            rules.append((parsed.isNotNull() & ~finite, F.lit(f"{field.name} is not finite")))
    return rules


def validate(frame: DataFrame, schema: Schema, value_column: str) -> DataFrame:
    """Adds parsed columns and the `_bad` flag (true when any rule is broken)."""
    parsed = frame.select(
        "*",
        *[_parse(frame, f.name, spark_type_name(f)).alias(_parsed(f.name)) for f in schema.fields],
    )
    rules = _rules(schema, value_column)
    bad = reduce(lambda a, b: a | b, [condition for condition, _ in rules])
    return parsed.withColumn(BAD, F.coalesce(bad, F.lit(True)))


def reason(schema: Schema, value_column: str) -> Column:
    """First broken rule of a (bad) row, as text."""
    rules = _rules(schema, value_column)
    expr = F.when(rules[0][0], rules[0][1])
    for condition, text in rules[1:]:
        expr = expr.when(condition, text)
    return expr.otherwise(F.lit("invalid row"))


def valid_rows(validated: DataFrame, schema: Schema) -> DataFrame:
    """Rows that passed, with their schema types and their identity (sampling priorities):
    `_source_file` and `_row`, the Parquet row number or, for CSV (Spark keeps no line
    numbers), `monotonically_increasing_id()` of the scan, which a retried task recomputes
    the same."""
    return validated.where(~F.col(BAD)).select(
        *[F.col(_parsed(name)).alias(name) for name in schema.names],
        F.col(SOURCE),
        F.coalesce(F.col(ROW), F.monotonically_increasing_id()).alias(ROW),
    )


def rejected_rows(validated: DataFrame, schema: Schema, value_column: str) -> DataFrame:
    """Rejected rows as text, with file, row (Parquet) and reason: what quarantine keeps."""
    return validated.where(F.col(BAD)).select(
        F.col(SOURCE),
        F.col(ROW),
        reason(schema, value_column).alias(REASON),
        *[F.col(name).cast("string").alias(name) for name in schema.names],
    )


def local_path(uri: str) -> Path:
    """`file:/a/b` or `file:///a/b` as a local path (Spark reports input files as URIs)."""
    if uri.startswith("file:"):
        return Path("/" + uri[len("file:") :].lstrip("/"))
    return Path(uri)
