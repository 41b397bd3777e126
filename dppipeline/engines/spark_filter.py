"""Filters (`dppipeline.filters`) as Spark Column expressions, for the Spark engine.

TX_DATETIME is `timestamp_ntz` (wall-clock time, no zone). A Python datetime literal would
become a zoned `timestamp` read in the session time zone, and comparing it with a
`timestamp_ntz` column would shift it by the zone's offset; datetime literals are therefore
written as text and cast to `timestamp_ntz`, which no time zone setting affects.
"""

from __future__ import annotations

import datetime as dt
import operator
from functools import reduce

from pyspark.sql import Column
from pyspark.sql import functions as F

from dppipeline.filters import And, Compare, FilterExpr, InRange, InSet, Not, Or, Value

_SPARK_TIMESTAMP = "%Y-%m-%d %H:%M:%S.%f"

_OPS = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def to_spark(expr: FilterExpr) -> Column:
    """A boolean Column that is true for the rows `expr` keeps."""
    match expr:
        case Compare(column, op, value):
            return _compare(F.col(column), op, _lit(value))
        case InSet(column, values, negated):
            test = F.col(column).isin(*[_lit(v) for v in values])
            return ~test if negated else test
        case InRange(column, low, high, negated):
            test = F.col(column).between(_lit(low), _lit(high))
            return ~test if negated else test
        case And(items):
            return reduce(lambda a, b: a & b, (to_spark(i) for i in items))
        case Or(items):
            return reduce(lambda a, b: a | b, (to_spark(i) for i in items))
        case Not(item):
            return ~to_spark(item)
    raise TypeError(f"not a filter expression: {expr!r}")


def _compare(column: Column, op: str, value: Column) -> Column:
    return _OPS[op](column, value)


def _lit(value: Value) -> Column:
    if isinstance(value, dt.datetime):
        return F.lit(value.strftime(_SPARK_TIMESTAMP)).cast("timestamp_ntz")
    if isinstance(value, float):
        return F.lit(value).cast("double")
    if isinstance(value, int):
        return F.lit(value).cast("bigint")
    return F.lit(value)
