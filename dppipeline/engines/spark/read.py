"""Spark reading and validation: the input contract compiled to Spark columns (`spark_rules`).

Only the selected days' files are handed to Spark, each as a path, never a pattern: Hadoop's
glob characters are escaped, so `in[1]` is never read as its sibling `in1`.

- Parquet: the driver reads every file's footer with pyarrow (a missing column or a type that
  cannot hold the schema's fails here, naming the file, before any job) and hands Spark an
  explicit schema; files whose footers differ are read as separate groups and unioned.
  Nanosecond timestamps (pandas' default) are read as their integer and converted.
- CSV: one file per task; the executor reads the file's bytes and splits them with the shared
  tokenizer (`csv_records`), so Spark sees the same records, fields and line numbers as the
  local and Beam engines (Spark's own CSV reader differs on quotes, blank lines, ragged
  records and bytes that are not UTF-8). A file that cannot be split becomes one `_error` row,
  which fails the run with its message.

Every row keeps `_source_file` (the path as the runner listed it) and `_row` (Parquet: its
1-based index in the file; CSV: the line it starts on): the quarantine's positions and the
row's identity for sampling. No Python runs per row.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import reduce
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from dppipeline.engines.spark.hadoop_fs import no_connector
from dppipeline.engines.spark.rules import BAD, DAY, flag_rows, parsed_name, reason
from dppipeline.engines.spark.types import spark_type
from dppipeline.errors import InputError
from dppipeline.inputs.contract import Rule, Source, column_sources, columns_from_path, rules_for
from dppipeline.inputs.csv_records import FIELDS, HEADER_FIELDS, ROW, check_header, read_csv_records
from dppipeline.inputs.files import DailyPartition, first_line, parquet_footer
from dppipeline.spec.schema import Schema
from dppipeline.storage import Location

SOURCE = "_source_file"
REASON = "_reason"
ERROR = "_error"
_GLOB_CHARACTERS = re.compile(r"([\\*?\[\]{}])")
_EPOCH = "TIMESTAMP_NTZ'1970-01-01 00:00:00'"
_NANOS_AS_LONG = "spark.sql.legacy.parquet.nanosAsLong"
FOOTER_THREADS = 4


@dataclass(frozen=True)
class SparkInput:
    """Every record checked (parsed columns, `_source_file`, `_row`, `_bad`, `_error`) and
    the bad ones as the quarantine keeps them (`_source_file`, `_row`, `_reason`, text)."""

    validated: DataFrame
    rejected: DataFrame


@dataclass(frozen=True)
class _Group:
    frame: DataFrame  # the job's columns as read, `_source_file`, `_row`, `_day` (CSV: more)
    sources: Mapping[str, Source]
    rules: tuple[Rule, ...]


def hadoop_path(path: Path | str | Location) -> str:
    """A file as a Hadoop path that matches only itself (glob characters escaped): a local
    file as `file:/...`; a URI as written, for the cluster's Hadoop FileSystem of its scheme
    (`s3a://` with hadoop-aws, `gs://` with the GCS connector, `hdfs://`)."""
    where = Location.of(path)
    if not where.is_local:
        return _GLOB_CHARACTERS.sub(r"\\\1", where.uri)
    return "file:" + _GLOB_CHARACTERS.sub(r"\\\1", str(where.path))


def _file_key(path: Path | str | Location) -> str:
    """How `_decoded(_metadata.file_path)` names a file Spark read."""
    where = Location.of(path)
    return where.path.as_posix() if where.is_local else where.uri


def read_validated(
    spark: SparkSession, days: list[DailyPartition], fmt: str, schema: Schema
) -> SparkInput:
    """The selected files read and checked against the contract (lazily: nothing runs yet)."""
    groups = (
        _csv_groups(spark, days, schema) if fmt == "csv" else _parquet_groups(spark, days, schema)
    )
    return _checked(groups, schema)


MEMORY_SOURCE = "DataFrame"  # how rejected rows and errors name a caller's DataFrame


def read_frame(frame: DataFrame, schema: Schema, source: str = MEMORY_SOURCE) -> SparkInput:
    """A caller's DataFrame (the Python API) checked by the same contract as a Parquet file:
    its column types stand for the footer's (a missing column, or a type that cannot hold the
    schema's, is an InputError naming it). `_row` is `monotonically_increasing_id() + 1`, the
    row's identity for sampling: unique, and stable while the DataFrame's partitioning is."""
    from pyspark.sql.pandas.types import to_arrow_type  # noqa: PLC0415

    present = set(frame.columns)
    # A timestamp column's zone only names the type here (the contract checks kinds, not zones).
    arrow = pa.schema(
        [
            pa.field(f.name, to_arrow_type(f.dataType, timezone="UTC"))
            for f in frame.schema
            if f.name in present
        ]
    )
    sources = column_sources(source, arrow, schema)
    rows = frame.select(
        *[F.col(f"`{name}`") for name in schema.names],
        F.lit(source).alias(SOURCE),
        (F.monotonically_increasing_id() + 1).alias(ROW),
        F.lit(None).cast("date").alias(DAY),
    )
    return _checked([_Group(rows, sources, rules_for(schema, sources, csv=False))], schema)


def _checked(groups: Sequence[_Group], schema: Schema) -> SparkInput:
    """Every group's rows flagged by its rules, unioned (see `SparkInput`)."""
    validated, rejected = [], []
    for group in groups:
        flagged = flag_rows(group.frame, schema, group.sources, group.rules)
        error = F.col(ERROR) if ERROR in group.frame.columns else F.lit(None).cast("string")
        validated.append(
            flagged.select(
                *[F.col(parsed_name(n)).alias(n) for n in schema.names],
                SOURCE,
                ROW,
                BAD,
                error.alias(ERROR),
            )
        )
        rejected.append(
            flagged.where(F.col(BAD) & error.isNull()).select(
                SOURCE,
                ROW,
                reason(group.rules, group.sources).alias(REASON),
                *[F.col(n).cast("string").alias(n) for n in schema.names],
            )
        )
    union = lambda frames: reduce(DataFrame.unionByName, frames)  # noqa: E731
    return SparkInput(validated=union(validated), rejected=union(rejected))


def valid_rows(validated: DataFrame, schema: Schema) -> DataFrame:
    """The rows that passed: the job's columns in their schema types, `_source_file`, `_row`."""
    return validated.where(~F.col(BAD)).select(*schema.names, SOURCE, ROW)


def observed_counts() -> list[Column]:
    """What the run reports of its input (an Observation on `validated`): rows read and
    rejected, and the first file error (rows read excludes a file's error row)."""
    read = F.col(ERROR).isNull()
    return [
        F.count_if(read).alias("rows"),
        F.count_if(read & F.col(BAD)).alias("rejected"),
        F.min_by(F.col(ERROR), F.when(~read, F.col(SOURCE))).alias("error"),
    ]


# --------------------------------------------------------------------------------------------
# Parquet


def _parquet_groups(
    spark: SparkSession, days: list[DailyPartition], schema: Schema
) -> list[_Group]:
    """Files grouped by how their footers store the job's columns; one Spark read each."""
    by_layout: dict[tuple[str, ...], list[tuple[Path, dt.date | None]]] = {}
    footers: dict[tuple[str, ...], tuple[pa.Schema, dict[str, Source]]] = {}
    listed = [(path, day.day) for day in days for path in day.files]
    # Local footers are read on a few threads (pyarrow reads without the GIL): 4,000 daily
    # files took seconds one after another. In the files' order, so the first bad file is
    # named. Hadoop's client is called on this thread only: from a pool thread, pyarrow's
    # libhdfs fails with "Unable to load libjvm" (tests/system/test_object_store.py).
    paths = [path for path, _ in listed]
    local = all(Location.of(path).is_local for path in paths)
    with ThreadPoolExecutor(FOOTER_THREADS if local else 1) as pool:
        read_footers = pool.map(parquet_footer, paths) if local else map(parquet_footer, paths)
        for (path, day), footer in zip(listed, read_footers, strict=True):
            sources = column_sources(str(path), footer, schema)
            from_path = columns_from_path(str(path), footer.names, schema)
            layout = tuple(
                _PATH if name in from_path else str(footer.field(name).type)
                for name in schema.names
            )
            by_layout.setdefault(layout, []).append((path, day))
            footers[layout] = (footer, sources)
    return [
        _parquet_group(spark, files, schema, *footers[layout])
        for layout, files in by_layout.items()
    ]


def footer_ddl(names: Sequence[str], footer: pa.Schema) -> str:
    """The explicit read schema for columns as a footer stores them: what Spark would infer,
    except that zone-less timestamps are always `timestamp_ntz` (whatever
    `spark.sql.parquet.inferTimestampNTZ.enabled` says) and nanosecond timestamps, which Spark
    cannot read as timestamps, are read as their integer (`bigint`)."""
    parts = []
    for name in names:
        arrow = footer.field(name).type
        is_nanos = pa.types.is_timestamp(arrow) and arrow.unit == "ns"
        parts.append(f"`{name}` {'bigint' if is_nanos else spark_type(arrow)}")
    return ", ".join(parts)


def _parquet_group(
    spark: SparkSession,
    files: list[tuple[Path, dt.date | None]],
    schema: Schema,
    footer: pa.Schema,
    sources: dict[str, Source],
) -> _Group:
    in_path = [n for n in schema.names if n not in footer.names]  # Hive-style folder values
    columns = []
    nanos = False
    for name in schema.names:
        if name in in_path:
            columns.append(F.col(name))  # from the file table (`_with_file_columns`)
            continue
        arrow, quoted = footer.field(name).type, f"`{name}`"
        if pa.types.is_timestamp(arrow) and arrow.unit == "ns":
            # Nanoseconds since the epoch (UTC for a zoned column, wall clock otherwise) as
            # UTC wall-clock microseconds.
            nanos = True
            columns.append(F.expr(f"timestampadd(MICROSECOND, {quoted} div 1000, {_EPOCH})"))
            sources = {**sources, name: Source.TIMESTAMP}
        else:
            columns.append(F.col(quoted))
    in_file = [n for n in schema.names if n not in in_path]
    reader = spark.read.schema(footer_ddl(in_file, footer))
    paths = [hadoop_path(path) for path, _ in files]
    previous = spark.conf.get(_NANOS_AS_LONG, None)
    try:
        if nanos:  # needed while the read is planned only; the user's setting comes back
            spark.conf.set(_NANOS_AS_LONG, "true")
        frame = reader.parquet(*paths)
    except Exception as exc:  # AnalysisException and friends: name the input
        raise InputError(f"cannot read parquet input: {_reason(exc)}") from None
    finally:
        if nanos and previous is None:
            spark.conf.unset(_NANOS_AS_LONG)
        elif nanos:
            spark.conf.set(_NANOS_AS_LONG, previous)
    frame = _with_file_columns(spark, frame, files, footer=footer, schema=schema)
    frame = frame.select(
        *[column.alias(name) for column, name in zip(columns, schema.names, strict=True)],
        SOURCE,
        ROW,
        DAY,
    )
    return _Group(frame, sources, rules_for(schema, sources, csv=False))


_FILE_URI, _KNOWN_SOURCE, _KNOWN_DAY = "_file_uri", "_known_source", "_known_day"
_FILE_KEY, _DECODED_KEY = "_file_key", "_decoded_key"
_PLAIN_PATH = re.compile(r"[A-Za-z0-9/._=-]+")


def _with_file_columns(
    spark: SparkSession,
    frame: DataFrame,
    files: list[tuple[Path, dt.date | None]],
    *,
    footer: pa.Schema,
    schema: Schema,
) -> DataFrame:
    """`frame` with its row number (`_row`, from 1), and each row's file as the runner listed
    it (`_source_file`), its day and its Hive-style folder values, from a broadcast table of
    the files keyed by how Spark names a file it read (`_metadata.file_path`): one hash
    lookup per row. Decoding that name on every row and looking it up in literal maps, which
    Spark scans per row, took a third of the engine's time at 5M rows (docs/explanation/engines.md).
    Should Spark name a file otherwise than `_spark_file_uri` predicts, the row falls back
    to its name decoded, looked up in the same table by the runner's path: no row is lost.
    The fallback is a second broadcast join whose key is null (no lookup, no decoding) where
    the first one found the file; its cost on the driver does not grow with the files (the
    literal maps it replaced took a py4j call per file and value: minutes at 4,000 files)."""
    in_path = [n for n in schema.names if n not in footer.names]
    folder_values = [columns_from_path(str(path), footer.names, schema) for path, _ in files]
    table = pd.DataFrame(
        {
            _FILE_URI: pd.Series([_spark_file_uri(spark, p) for p, _ in files], dtype=object),
            _FILE_KEY: pd.Series([_file_key(p) for p, _ in files], dtype=object),
            _KNOWN_SOURCE: pd.Series([str(p) for p, _ in files], dtype=object),
            _KNOWN_DAY: pd.Series([day for _, day in files], dtype=object),
        }
    )
    for name in in_path:
        table[f"_known_{name}"] = [values[name] for values in folder_values]
    ddl = ", ".join(
        [f"{_FILE_URI} string, {_FILE_KEY} string, {_KNOWN_SOURCE} string, {_KNOWN_DAY} date"]
        + [f"`_known_{name}` string" for name in in_path]
    )
    known = spark.createDataFrame(table, ddl)
    known_column = {SOURCE: _KNOWN_SOURCE, DAY: _KNOWN_DAY} | {n: f"_known_{n}" for n in in_path}
    by_uri = known.drop(_FILE_KEY)
    # The slow path's table: the same files keyed by their decoded names, values renamed.
    by_key = known.select(
        F.col(_FILE_KEY).alias(_DECODED_KEY),
        *[F.col(known_column[c]).alias(f"_decoded{known_column[c]}") for c in known_column],
    )
    read = frame.select(
        "*",
        F.col("_metadata.file_path").alias(_FILE_URI),
        (F.col("_metadata.row_index") + 1).alias(ROW),
    )
    joined = read.join(F.broadcast(by_uri), on=_FILE_URI, how="left")
    # Decoded only where the lookup by Spark's name found nothing (null key elsewhere).
    missed = F.when(F.col(_KNOWN_SOURCE).isNull(), _decoded(F.col(_FILE_URI)))
    joined = joined.join(F.broadcast(by_key), on=missed == F.col(_DECODED_KEY), how="left")
    return joined.select(
        *frame.columns,
        ROW,
        *[
            F.coalesce(F.col(known_column[c]), F.col(f"_decoded{known_column[c]}")).alias(c)
            for c in known_column
        ],
    )


def _spark_file_uri(spark: SparkSession, path: Path | str | Location) -> str:
    """How `_metadata.file_path` names a file read from `hadoop_path(path)`: Hadoop's
    `Path.toUri()` text (percent-encoded; a local file as `file:/...`)."""
    where = Location.of(path)
    text = where.uri if not where.is_local else f"file:{where.path.as_posix()}"
    if _PLAIN_PATH.fullmatch(text.split(":", 1)[1]):
        return text  # nothing to encode
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    return str(jvm.org.apache.hadoop.fs.Path(text).toUri().toString())


def _reason(exc: BaseException) -> str:
    """Why Spark could not open the input; a scheme the cluster has no FileSystem for says
    which jars it needs."""
    text = first_line(exc)
    for message in [text, *_java_messages(exc)]:
        if "No FileSystem for scheme" in message or "UnsupportedFileSystem" in message:
            return no_connector(message.rsplit("scheme", 1)[-1].strip(' "'))
    return text


def _decoded(uri: Column) -> Column:
    """`file:/a%20b/c` (how Spark names a file it read) -> `/a b/c`."""
    path = F.regexp_replace(uri, r"^file:/*", "/")
    return F.url_decode(F.regexp_replace(path, r"\+", "%2B"))


# --------------------------------------------------------------------------------------------
# CSV


_PATH = "path"  # a Parquet group's column that comes from the files' folders
_FILE = "_file"  # a CSV record's file, as its index in the listed files
FILES_PER_TASK_TARGET = 4  # CSV tasks per core: whole files each, a few per task


def _csv_groups(spark: SparkSession, days: list[DailyPartition], schema: Schema) -> list[_Group]:
    listed = [(str(path), day.day) for day in days for path in day.files]
    remote = next((path for path, _ in listed if not Location.of(path).is_local), None)
    if remote is not None:  # the CSV tasks open files with Python on the executors
        raise InputError(
            f"{Location.of(remote).display()}: the Spark engine reads CSV input from local or "
            "mounted paths only; on a store use Parquet input, or the local or Beam engine"
        )
    for path, _ in listed:  # the driver reads only the headers, to fail before any job
        check_header(path, schema)
    arrow_schema = csv_arrow_schema(schema)
    tasks = min(len(listed), spark.sparkContext.defaultParallelism * FILES_PER_TASK_TARGET)
    indexed = [(i, path) for i, (path, _) in enumerate(listed)]
    files = spark.createDataFrame(
        spark.sparkContext.parallelize(indexed, tasks), "index int, path string"
    )
    records = files.mapInArrow(
        lambda batches: _tokenize(batches, schema, arrow_schema), _spark_ddl(arrow_schema)
    )
    # The file's path and day travel as its index, not as text on every row.
    paths = F.array(*[F.lit(path) for path, _ in listed])
    days_ = F.array(*[F.lit(day) for _, day in listed])
    position = F.col(_FILE) + 1
    frame = records.select(
        *[c for c in records.columns if c != _FILE],
        F.element_at(paths, position).alias(SOURCE),
        F.element_at(days_, position).alias(DAY),
    )
    sources = dict.fromkeys(schema.names, Source.TEXT)
    return [_Group(frame, sources, rules_for(schema, sources, csv=True))]


def csv_arrow_schema(schema: Schema) -> pa.Schema:
    """What the executors hand back per CSV record (or one `_error` row per unreadable file)."""
    return pa.schema(
        [pa.field(name, pa.string()) for name in schema.names]
        + [
            pa.field(_FILE, pa.int32()),
            pa.field(ROW, pa.int64()),
            pa.field(FIELDS, pa.int32()),
            pa.field(HEADER_FIELDS, pa.int32()),
            pa.field(ERROR, pa.string()),
        ]
    )


def _spark_ddl(arrow_schema: pa.Schema) -> str:
    types = {pa.string(): "string", pa.int64(): "bigint", pa.int32(): "int"}
    return ", ".join(f"`{f.name}` {types[f.type]}" for f in arrow_schema)


def _tokenize(
    batches: Iterator[pa.RecordBatch], schema: Schema, arrow_schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """(index, path) rows -> each file's records (runs on the executors)."""
    for batch in batches:
        indexes, paths = batch.column("index").to_pylist(), batch.column("path").to_pylist()
        for index, path in zip(indexes, paths, strict=True):
            yield from _file_records(index, path, schema, arrow_schema)


def _file_records(
    index: int, path: str, schema: Schema, arrow_schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    import polars as pl  # noqa: PLC0415 (executors import it when they run this)

    try:
        with open(path, "rb") as handle:
            data = handle.read()
        records = read_csv_records(data, path, schema)
    except OSError as exc:
        message = f"cannot read {path}: {exc.strerror or type(exc).__name__}"
        yield _error_batch(index, message, arrow_schema)
        return
    except InputError as exc:
        yield _error_batch(index, str(exc), arrow_schema)
        return
    table = records.with_columns(
        pl.lit(index, pl.Int32).alias(_FILE), pl.lit(None, pl.String).alias(ERROR)
    ).to_arrow()
    yield from table.select(arrow_schema.names).cast(arrow_schema).to_batches()


def _error_batch(index: int, message: str, arrow_schema: pa.Schema) -> pa.RecordBatch:
    values = {name: [None] for name in arrow_schema.names} | {_FILE: [index], ERROR: [message]}
    return pa.RecordBatch.from_pydict(values, schema=arrow_schema)


# --------------------------------------------------------------------------------------------
# Errors


def read_failure(exc: BaseException, files: Sequence[Path]) -> InputError | None:
    """A Spark job's failure to read an input file, as a one-line InputError naming the file
    (None when the failure is not a read failure: a bug, reported as one)."""
    messages = _java_messages(exc)
    if not any("FAILED_READ_FILE" in m or "FileNotFoundException" in m for m in messages):
        return None
    text = " ".join(messages)
    decoded = _decode_uris(text)
    named = next((p for p in files if _file_key(p) in decoded), None)
    where = str(named) if named is not None else "an input file"
    if any("FileNotFoundException" in m or "FILE_NOT_EXIST" in m for m in messages):
        return InputError(f"{where}: disappeared while the run read it")
    return InputError(f"{where}: cannot read as parquet (corrupt or truncated file)")


def undecodable_parquet(
    exc: BaseException, files: Sequence[Path | Location], schema: Schema
) -> InputError | None:
    """After a Spark task failed without naming a file: the first input file whose pages of
    the job's columns pyarrow cannot decode, named as the local and Beam engines name it
    (None when every file decodes, or the failure is not a task's: a bug, reported as one).

    Spark's vectorized reader decodes dictionary ids lazily, after the read that would name
    the file, so a page whose ids point past its dictionary fails a task with a bare
    ArrayIndexOutOfBoundsException. The files are read again only then, never on success."""
    messages = _java_messages(exc)
    if not any("Job aborted due to stage failure" in m for m in messages) or any(
        "PythonException" in m for m in messages
    ):
        return None
    for path in files:
        where = Location.of(path)
        try:
            columns = [name for name in schema.names if name in parquet_footer(where).names]
            if where.is_local:
                parquet = pq.ParquetFile(where.path)
            else:
                fs, inner = where.filesystem()
                parquet = pq.ParquetFile(inner, filesystem=fs)
            for _ in parquet.iter_batches(columns=columns):
                pass
        except InputError as error:  # its footer, now unreadable
            return error
        except (OSError, pa.ArrowException) as error:
            return InputError(f"{where.display()}: cannot read as parquet: {first_line(error)}")
    return None


def _java_messages(exc: BaseException) -> list[str]:
    """The Java exception chain behind a pyspark error: class and message, first line each."""
    found: list[str] = []
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    while java is not None and len(found) < 20:
        try:
            found.append(f"{java.getClass().getName()}: {java.getMessage()}".splitlines()[0])
            java = java.getCause()
        except Exception:  # a py4j proxy that cannot answer: stop there
            break
    if not found:
        found.append(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return found


def _decode_uris(text: str) -> str:
    from urllib.parse import unquote  # noqa: PLC0415

    return re.sub(r"file:/+", "/", unquote(text))
