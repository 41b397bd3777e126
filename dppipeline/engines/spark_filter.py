"""Filters (`dppipeline.filters`) as Spark Column expressions, for the Spark engine.

TX_DATETIME is `timestamp_ntz` (wall-clock time, no zone). A Python datetime literal would
become a zoned `timestamp` read in the session time zone, and comparing it with a
`timestamp_ntz` column would shift it by the zone's offset; datetime literals are therefore
written as text and cast to `timestamp_ntz`, which no time zone setting affects.
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

    def is_in(self, column: Column, values: tuple[Value, ...]) -> Column:
        return column.isin(*[self.literal(v) for v in values])

    def between(self, column: Column, low: Value, high: Value) -> Column:
        return column.between(self.literal(low), self.literal(high))


def to_spark(expr: FilterExpr) -> Column:
    """A boolean Column that is true for the rows `expr` keeps."""
    return compile_filter(expr, _SparkBuilder())
