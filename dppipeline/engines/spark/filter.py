"""Filters (`dppipeline.spec.filters`) as Spark Column expressions, for the Spark engine.

A filter is written as one Spark SQL expression and handed to the JVM in one call (`F.expr`):
building it from Column objects costs a Py4J round trip per column, literal, cast and
operator (seconds for a long filter, docs/explanation/engines.md). The text is built by the
engine-neutral `compile_filter` (set membership for equality chains, balanced `and`/`or`), so its
nesting grows with the log of its length; Spark's optimiser turns an `IN` list of more than 10
values into an `InSet` hash lookup.

Every literal is written so that no session setting can reinterpret it:
- TX_DATETIME is `timestamp_ntz` (wall-clock time, no zone): a datetime is text cast to
  `TIMESTAMP_NTZ`, which no time zone setting moves (a zoned `timestamp` literal would be read
  in the session time zone and shifted by its offset);
- a string is its UTF-8 bytes in hex cast to STRING: how a quoted SQL string is unescaped
  depends on `spark.sql.parser.escapedStringLiterals`;
- numbers are cast from their exact text (`repr` of a float reads back to the same float).
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import Column
from pyspark.sql import functions as F

from dppipeline.spec.filters import FilterExpr, Value, compile_filter


class _Sql:
    """A SQL expression under construction; operators give the combined, parenthesised text."""

    def __init__(self, text: str):
        self.text = text

    def _binary(self, op: str, other: _Sql) -> _Sql:
        return _Sql(f"({self.text} {op} {other.text})")

    def __and__(self, other: _Sql) -> _Sql:
        return self._binary("AND", other)

    def __or__(self, other: _Sql) -> _Sql:
        return self._binary("OR", other)

    def __invert__(self) -> _Sql:
        return _Sql(f"(NOT {self.text})")

    def __eq__(self, other: object) -> _Sql:  # type: ignore[override]
        assert isinstance(other, _Sql)
        return self._binary("=", other)

    def __ne__(self, other: object) -> _Sql:  # type: ignore[override]
        assert isinstance(other, _Sql)
        return self._binary("<>", other)

    def __lt__(self, other: _Sql) -> _Sql:
        return self._binary("<", other)

    def __le__(self, other: _Sql) -> _Sql:
        return self._binary("<=", other)

    def __gt__(self, other: _Sql) -> _Sql:
        return self._binary(">", other)

    def __ge__(self, other: _Sql) -> _Sql:
        return self._binary(">=", other)

    __hash__ = None  # type: ignore[assignment]


class _SqlBuilder:
    def column(self, name: str) -> _Sql:
        return _Sql("`" + name.replace("`", "``") + "`")

    def literal(self, value: Value) -> _Sql:
        return _Sql(sql_literal(value))

    def is_in(self, name: str, values: tuple[Value, ...]) -> _Sql:
        listed = ", ".join(sql_literal(v) for v in values)
        return _Sql(f"({self.column(name).text} IN ({listed}))")

    def between(self, column: _Sql, low: Value, high: Value) -> _Sql:
        return _Sql(f"({column.text} BETWEEN {sql_literal(low)} AND {sql_literal(high)})")


def sql_literal(value: Value) -> str:
    """A filter literal as Spark SQL text of the column's type (see the module docstring)."""
    if isinstance(value, dt.datetime):
        text = value.isoformat(sep=" ", timespec="microseconds")  # years < 1000 zero-padded
        return f"CAST('{text}' AS TIMESTAMP_NTZ)"
    if isinstance(value, str):
        return f"CAST(X'{value.encode().hex()}' AS STRING)"
    if isinstance(value, float):
        return f"CAST('{value!r}' AS DOUBLE)"
    if isinstance(value, int):
        return f"CAST({value} AS BIGINT)"
    raise TypeError(f"no SQL literal for {type(value).__name__}")


def to_spark_sql(expr: FilterExpr) -> str:
    """The filter as one Spark SQL boolean expression."""
    return compile_filter(expr, _SqlBuilder()).text


def to_spark(expr: FilterExpr) -> Column:
    """A boolean Column that is true for the rows `expr` keeps."""
    return F.expr(to_spark_sql(expr))
