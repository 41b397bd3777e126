"""The input contract: what a valid row is, written once as data and compiled per engine.

A row is rejected for the first rule it breaks, in the order `rules_for` lists them: a CSV
record whose field count is not its header's, then per column the job reads (schema order):
null (or blank text), not UTF-8, outside its type's text grammar, a time zone, out of range,
not a whole number, not finite, not on its daily partition's day. Which rules apply depends on
the column's schema type and on the physical type it arrives as (`Source`): text (every CSV
column), integers, floats or timestamps. `engines/polars_rules.py` (local and Beam) and
`engines/spark_rules.py` compile the same `Rule` values, with the same reason texts, so every
engine rejects the same rows for the same reasons.

Reasons name the column and the rule, never the value: they end up in error messages and
logs; the quarantine keeps the raw row for the operator. Rejected rows are counted and
written to the quarantine (`dppipeline.inputs.quarantine`); above `max_rejected_fraction` the run
fails and names the first bad file and row.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pyarrow as pa

from dppipeline.errors import InputError
from dppipeline.spec.schema import Schema

# --------------------------------------------------------------------------------------------
# Text grammars. ASCII classes only ([0-9], not \d) and \A...\z anchors (Java's `$` also
# matches before a final line break): Rust's regex (Polars) and Java's (Spark) agree on them.
# Blanks (space, tab) around a value are ignored; a blank value is null.

# Columns every engine adds while it checks rows: the daily partition of a row, and whether
# the row breaks a rule.
DAY = "_day"
BAD = "_bad"


def parsed_name(column: str) -> str:
    """The working column that holds `column`'s parsed value while rules are checked."""
    return f"_parsed_{column}"


BLANKS = " \t"
INT_TEXT = r"\A[ \t]*[+-]?[0-9]+[ \t]*\z"
FLOAT_TEXT = r"\A[ \t]*[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?[ \t]*\z"
NON_FINITE_TEXT = r"\A[ \t]*[+-]?(?i:nan|inf|infinity)[ \t]*\z"
# The accepted timestamps: `YYYY-MM-DD HH:MM:SS` or `YYYY-MM-DDTHH:MM:SS`, optionally with 1 to
# 6 fractional digits; UTC, without a zone. Years 1000-9999 (the range every engine parses
# alike), hours 00-23, no leap second.
TIMESTAMP_TEXT = (
    r"\A[ \t]*[1-9][0-9]{3}-[0-9]{2}-[0-9]{2}[ T]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
    r"(\.[0-9]{1,6})?[ \t]*\z"
)
TIMESTAMP_FORMATS = ("YYYY-MM-DD HH:MM:SS[.ffffff]", "YYYY-MM-DDTHH:MM:SS[.ffffff]")
# A timestamp followed by a zone: Z, +01, +01:00, +0100, or a name (UTC, CET, Europe/Paris).
ZONED_TIMESTAMP_TEXT = (
    r"\A[ \t]*[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?[ \t]*"
    r"([zZ]|[+-][0-9]{2}(:?[0-9]{2})?|[A-Za-z][A-Za-z_/+-]*)[ \t]*\z"
)
INT64_MIN, INT64_END = -(2**63), 2**63  # a float id must lie in [INT64_MIN, INT64_END)
REPLACEMENT_CHARACTER = "\ufffd"  # what a reader decodes non-UTF-8 bytes to


class Source(StrEnum):
    """The physical type a column arrives as, which decides how it is parsed and checked."""

    TEXT = "text"  # every CSV column; Parquet strings
    INTEGER = "integer"  # Parquet int8..int64, uint8..uint64
    FLOAT = "float"  # Parquet float, double
    TIMESTAMP = "timestamp"  # Parquet timestamp without a zone: read as UTC
    ZONED_TIMESTAMP = "zoned_timestamp"  # Parquet timestamp with a zone: converted to UTC


class Check(StrEnum):
    """What a rule tests; each engine compiles each check to one boolean expression."""

    FIELDS = "fields"  # CSV record: its number of fields is not its header's
    NULL = "null"  # null, or text that is empty once blanks are stripped
    UTF8 = "utf8"  # text holding U+FFFD: bytes that were not UTF-8
    ZONE = "zone"  # timestamp text with a time zone
    NON_FINITE_TEXT = "non_finite_text"  # nan, inf, infinity spelled as text
    PATTERN = "pattern"  # text outside the type's grammar
    RANGE = "range"  # in the grammar but not a value: int64 overflow, a date like 02-30
    WHOLE = "whole"  # a float id with a fraction (or not finite)
    FINITE = "finite"  # a float that is NaN or infinite
    DAY = "day"  # a timestamp whose UTC date is not its daily partition's day


@dataclass(frozen=True)
class Rule:
    """One check on one column (`None`: the whole record), and the reason a row breaking it
    is rejected with."""

    check: Check
    column: str | None
    reason: str
    pattern: str | None = None  # the regular expression a text check matches


# Per (schema type, source): the checks, in reporting order. A pair not listed cannot be
# read as that schema type (e.g. a timestamp stored as an integer): the file is refused.
_CHECKS: dict[tuple[str, Source], tuple[Check, ...]] = {
    ("int64", Source.TEXT): (Check.NULL, Check.UTF8, Check.PATTERN, Check.RANGE),
    ("int64", Source.INTEGER): (Check.NULL, Check.RANGE),
    ("int64", Source.FLOAT): (Check.NULL, Check.WHOLE, Check.RANGE),
    ("float64", Source.TEXT): (
        Check.NULL,
        Check.UTF8,
        Check.NON_FINITE_TEXT,
        Check.PATTERN,
        Check.FINITE,
    ),
    ("float64", Source.INTEGER): (Check.NULL,),
    ("float64", Source.FLOAT): (Check.NULL, Check.FINITE),
    ("timestamp[us]", Source.TEXT): (
        Check.NULL,
        Check.UTF8,
        Check.ZONE,
        Check.PATTERN,
        Check.RANGE,
        Check.DAY,
    ),
    ("timestamp[us]", Source.TIMESTAMP): (Check.NULL, Check.DAY),
    ("timestamp[us]", Source.ZONED_TIMESTAMP): (Check.NULL, Check.DAY),
    ("string", Source.TEXT): (Check.NULL, Check.UTF8),
}

_PATTERNS = {"int64": INT_TEXT, "float64": FLOAT_TEXT, "timestamp[us]": TIMESTAMP_TEXT}
_PATTERN_REASON = {
    "int64": "is not a valid int64 (digits with an optional sign)",
    "float64": "is not a valid float64 (a decimal number)",
    "timestamp[us]": "is not a valid timestamp (" + " or ".join(TIMESTAMP_FORMATS) + ")",
}
_RANGE_REASON = {"int64": "is outside the int64 range", "timestamp[us]": "is not a valid date"}
FIELDS_REASON = "wrong number of fields (not the header's)"


def _reason(check: Check, column: str, type_: str) -> str:
    text = {
        Check.NULL: "is null",
        Check.UTF8: "is not valid UTF-8",
        Check.ZONE: "has a time zone (give UTC time without one)",
        Check.NON_FINITE_TEXT: "is not finite",
        Check.FINITE: "is not finite",
        Check.WHOLE: "is not a whole number",
        Check.DAY: "is not on its daily partition's day (UTC)",
    }.get(check)
    if check is Check.PATTERN:
        text = _PATTERN_REASON[type_]
    elif check is Check.RANGE:
        text = _RANGE_REASON[type_]
    assert text is not None, check
    return f"{column} {text}"


def source_of(arrow_type: pa.DataType) -> Source | None:
    """How a Parquet column's Arrow type is read; None for a type no rule reads."""
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return Source.TEXT
    if pa.types.is_integer(arrow_type):
        return Source.INTEGER
    if pa.types.is_floating(arrow_type):
        return Source.FLOAT
    if pa.types.is_timestamp(arrow_type):
        return Source.ZONED_TIMESTAMP if arrow_type.tz else Source.TIMESTAMP
    return None


_PATH_VALUE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def path_values(path: str, names: Sequence[str]) -> dict[str, str]:
    """The Hive-style `NAME=VALUE` folders of a file's path whose NAME is one of `names`
    (schema columns), URL-decoded as Hive, Spark and pyarrow write them. A file that lacks
    such a column takes it from its path, as text checked by the column's rules."""
    from urllib.parse import unquote  # noqa: PLC0415

    found: dict[str, str] = {}
    for part in str(path).replace("\\", "/").split("/")[:-1]:
        match = _PATH_VALUE.match(part)
        if match and match.group(1) in names:
            found[match.group(1)] = unquote(match.group(2))
    return found


def columns_from_path(file: str, present: Sequence[str], schema: Schema) -> dict[str, str]:
    """The schema columns a file does not hold (`present`: the ones it does) that its path
    gives values for."""
    values = path_values(file, schema.names)
    return {name: value for name, value in values.items() if name not in present}


def column_sources(file: str, arrow_schema: pa.Schema, schema: Schema) -> dict[str, Source]:
    """Each schema column's source in one Parquet file (a column only in its path: text); a
    missing column or a type that cannot hold the schema type is an error naming the file
    and the column."""
    sources: dict[str, Source] = {}
    from_path = columns_from_path(file, arrow_schema.names, schema)
    for field in schema.fields:
        if field.name in from_path:
            sources[field.name] = Source.TEXT
            continue
        if field.name not in arrow_schema.names:
            raise missing_column(file, field.name, schema)
        arrow_type = arrow_schema.field(field.name).type
        source = source_of(arrow_type)
        if source is None or (field.type, source) not in _CHECKS:
            raise InputError(
                f"{file}: column {field.name} is stored as {arrow_type}, which cannot be read "
                f"as {field.type} (schemas/{schema.name}.json)"
            )
        sources[field.name] = source
    return sources


def missing_column(file: str, column: str, schema: Schema) -> InputError:
    return InputError(f"{file}: missing column {column} (required by schemas/{schema.name}.json)")


def rules_for(schema: Schema, sources: Mapping[str, Source], *, csv: bool) -> tuple[Rule, ...]:
    """The rules a file's rows are checked against, in reporting order: the job's columns
    (`schema`, already narrowed to what the job reads) as they arrive (`sources`). The
    partition-day rule applies to the schema's event-time column."""
    rules = [Rule(Check.FIELDS, None, FIELDS_REASON)] if csv else []
    for field in schema.fields:
        for check in _CHECKS[(field.type, sources[field.name])]:
            if check is Check.NULL and field.nullable:
                continue
            if check is Check.DAY and field.role != "event_time":
                continue
            pattern = {
                Check.PATTERN: _PATTERNS.get(field.type),
                Check.ZONE: ZONED_TIMESTAMP_TEXT,
                Check.NON_FINITE_TEXT: NON_FINITE_TEXT,
            }.get(check)
            reason = _reason(check, field.name, field.type)
            rules.append(Rule(check, field.name, reason, pattern))
    return tuple(rules)


# --------------------------------------------------------------------------------------------
# Reject counts and the run's reject policy

# Per-row position wording: CSV rows by physical line (header = line 1), Parquet rows by
# 1-based index.
ROW_WORD = {"csv": "line", "parquet": "row"}


@dataclass(frozen=True)
class RejectedRow:
    """Where the first rejected row is, and why."""

    file: str
    row: int | None
    reason: str
    fmt: str

    def describe(self) -> str:
        where = "" if self.row is None else f" {ROW_WORD.get(self.fmt, 'row')} {self.row}"
        return f"{self.file}{where}: {self.reason}"


@dataclass(frozen=True)
class RejectSummary:
    """Counts for the operator's log and the run check; never published in a release."""

    rows_read: int
    rows_rejected: int
    first: RejectedRow | None
    quarantine: Path | None = None

    @property
    def fraction(self) -> float:
        return self.rows_rejected / self.rows_read if self.rows_read else 0.0


def check_rejected_fraction(summary: RejectSummary, max_fraction: float) -> None:
    """Fails the run when too many rows were rejected, naming the first bad one."""
    if summary.rows_read == 0:
        raise InputError("the selected input partitions hold no rows")
    if summary.rows_rejected and summary.fraction > max_fraction:
        assert summary.first is not None
        where = f"; rejected rows in {summary.quarantine}" if summary.quarantine else ""
        raise InputError(
            f"rejected {summary.rows_rejected:,} of {summary.rows_read:,} rows "
            f"({summary.fraction:.4%}), above max_rejected_fraction {max_fraction:g}; "
            f"first: {summary.first.describe()}{where}"
        )
