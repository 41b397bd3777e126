"""The input contract (`dppipeline.inputs.contract`) as Spark columns: each column parsed into its
schema type, and per rule a boolean that is true (never null) when a row breaks it. The same
`Rule` values as `polars_rules`, so Spark rejects the same rows with the same reasons.

Spark's own parsers are more lenient than the contract (`try_cast` reads '1d' as a double and
many timestamp forms), so text is matched against the contract's grammars before it counts as
parsed. Timestamps come out as `timestamp_ntz` in UTC whatever the session time zone: text and
zone-less Parquet timestamps are wall-clock UTC already; zoned Parquet timestamps (read as
instants) go through their microseconds since the epoch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import reduce

from pyspark.sql import Column
from pyspark.sql import functions as F

from dppipeline.engines.spark.types import field_type
from dppipeline.inputs.contract import (
    BAD,
    BLANKS,
    DAY,
    INT64_END,
    INT64_MIN,
    REPLACEMENT_CHARACTER,
    Check,
    Rule,
    Source,
    parsed_name,
)
from dppipeline.inputs.csv_records import FIELDS, HEADER_FIELDS
from dppipeline.spec.schema import Field, Schema

_EPOCH = "1970-01-01 00:00:00"


def _text(column: str) -> Column:
    return F.trim(F.col(column), F.lit(BLANKS))


def parsed(field: Field, source: Source) -> Column:
    """The column in its schema type; null where it does not parse (its rules say why)."""
    raw, target = F.col(field.name), field_type(field)
    if field.type == "timestamp[us]":
        if source is Source.TEXT:
            return F.translate(_text(field.name), "T", " ").try_cast("timestamp_ntz")
        if source is Source.ZONED_TIMESTAMP:  # an instant: its UTC wall clock
            epoch = F.lit(_EPOCH).cast("timestamp_ntz")
            return F.timestamp_add("MICROSECOND", F.unix_micros(raw), epoch)
        return raw.cast("timestamp_ntz")
    if source is Source.TEXT:
        return _text(field.name).try_cast(target)
    if field.type == "int64" and source is Source.FLOAT:
        return F.when(~_not_whole(raw) & ~_out_of_range(raw), raw.cast(target))
    return raw.try_cast(target)


def _not_finite(value: Column) -> Column:
    return F.isnan(value) | (F.abs(value) == F.lit(float("inf")))


def _not_whole(value: Column) -> Column:
    return _not_finite(value) | (value != F.rint(value))


def _out_of_range(value: Column) -> Column:
    return ~((value >= F.lit(float(INT64_MIN))) & (value < F.lit(float(INT64_END))))


def _present(name: str, source: Source) -> Column:
    """Not null (text: not blank either; blank text counts as null)."""
    if source is Source.TEXT:
        return F.col(name).isNotNull() & (_text(name) != F.lit(""))
    return F.col(name).isNotNull()


def broken(rule: Rule, sources: Mapping[str, Source]) -> Column:
    """True where a row breaks the rule, false elsewhere (never null)."""
    if rule.check is Check.FIELDS:
        return F.coalesce(F.col(FIELDS) != F.col(HEADER_FIELDS), F.lit(False))
    assert rule.column is not None
    name, source = rule.column, sources[rule.column]
    raw, value, present = F.col(name), F.col(parsed_name(name)), _present(name, source)
    check = rule.check
    if check is Check.NULL:
        return ~present
    if check is Check.UTF8:
        condition = raw.contains(REPLACEMENT_CHARACTER)
    elif check in (Check.ZONE, Check.NON_FINITE_TEXT):
        condition = raw.rlike(rule.pattern)
    elif check is Check.PATTERN:
        condition = ~raw.rlike(rule.pattern)
    elif check is Check.WHOLE:
        condition = _not_whole(raw)
    elif check is Check.RANGE and source is Source.FLOAT:
        condition = _out_of_range(raw)
    elif check is Check.RANGE:
        condition = value.isNull()
    elif check is Check.FINITE:
        condition = _not_finite(value)
    elif check is Check.DAY:
        condition = F.to_date(value) != F.col(DAY)
    else:  # pragma: no cover - every Check is handled above
        raise AssertionError(check)
    return F.coalesce(present & condition, F.lit(False))


def flag_rows(frame, schema: Schema, sources: Mapping[str, Source], rules: Sequence[Rule]):
    """Adds each column parsed (`_parsed_<name>`) and `_bad`, true when any rule is broken;
    reasons are worked out for the bad rows only (`reason`)."""
    with_parsed = frame.select(
        "*", *[parsed(f, sources[f.name]).alias(parsed_name(f.name)) for f in schema.fields]
    )
    bad = reduce(lambda a, b: a | b, [broken(rule, sources) for rule in rules])
    return with_parsed.withColumn(BAD, bad)


def reason(rules: Sequence[Rule], sources: Mapping[str, Source]) -> Column:
    """The first rule a (bad) row breaks, as its reason text."""
    expr = F.when(broken(rules[0], sources), F.lit(rules[0].reason))
    for rule in rules[1:]:
        expr = expr.when(broken(rule, sources), F.lit(rule.reason))
    return expr
