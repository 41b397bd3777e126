"""Filters (`dppipeline.filters`) as Spark Column expressions, for the Spark engine.

TX_DATETIME is `timestamp_ntz` (wall-clock time, no zone). A Python datetime literal would
become a zoned `timestamp` read in the session time zone, and comparing it with a
`timestamp_ntz` column would shift it by the zone's offset; datetime literals are therefore
written as text and cast to `timestamp_ntz`, which no time zone setting affects.

Set membership (`in`, and the `or` chains `membership_form` merges) is one SQL `IN` list, built
in one call to the JVM (`isin` makes one call per value: seconds for 10,000), which Spark's
optimiser turns into an `InSet` hash lookup above 10 values. Strings keep `isin`: how a SQL
string literal is escaped depends on a session setting (`spark.sql.parser.escapedStringLiterals`).
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import Column
from pyspark.sql import functions as F

from dppipeline.filters import FilterExpr, Value, compile_filter

_SPARK_TIMESTAMP = "%Y-%m-%d %H:%M:%S.%f"


class _SparkBuilder:
    def column(self, name: str) -> Column:
        return F.col(name)

    def literal(self, value: Value) -> Column:
        if isinstance(value, dt.datetime):
            return F.lit(value.strftime(_SPARK_TIMESTAMP)).cast("timestamp_ntz")
        if isinstance(value, float):
            return F.lit(value).cast("double")
        if isinstance(value, int):
            return F.lit(value).cast("bigint")
        return F.lit(value)

    def is_in(self, name: str, values: tuple[Value, ...]) -> Column:
        if any(isinstance(v, str) for v in values):
            return F.col(name).isin(*[self.literal(v) for v in values])
        quoted = "`" + name.replace("`", "``") + "`"
        return F.expr(f"{quoted} IN ({', '.join(_sql_literal(v) for v in values)})")

    def between(self, column: Column, low: Value, high: Value) -> Column:
        return column.between(self.literal(low), self.literal(high))


def _sql_literal(value: Value) -> str:
    """An int, float or datetime as Spark SQL text that no session setting reinterprets."""
    if isinstance(value, dt.datetime):
        return f"CAST('{value.strftime(_SPARK_TIMESTAMP)}' AS TIMESTAMP_NTZ)"
    if isinstance(value, float):
        return f"CAST('{value!r}' AS DOUBLE)"  # repr: shortest text that reads back exactly
    if isinstance(value, int):
        return f"CAST({value} AS BIGINT)"
    raise TypeError(f"no SQL literal for {type(value).__name__}")


def to_spark(expr: FilterExpr) -> Column:
    """A boolean Column that is true for the rows `expr` keeps."""
    return compile_filter(expr, _SparkBuilder())
