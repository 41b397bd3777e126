"""Filters (`dppipeline.filters`) as Polars expressions, for the local and Beam engines.

Literals get the schema's Polars types (Int64, Float64, String, Datetime("us")), so every test
compares like with like; nulls follow Kleene logic, as in `filters.evaluate_row`.
"""

from __future__ import annotations

import datetime as dt
import operator
from functools import reduce

import polars as pl

from dppipeline.filters import And, Compare, FilterExpr, InRange, InSet, Not, Or, Value

_OPS = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def to_polars(expr: FilterExpr) -> pl.Expr:
    """A boolean Polars expression that is true for the rows `expr` keeps."""
    match expr:
        case Compare(column, op, value):
            return _compare(pl.col(column), op, _lit(value))
        case InSet(column, values, negated):
            listed = pl.lit(pl.Series(values, dtype=_dtype(values[0]))).implode()
            test = pl.col(column).is_in(listed)
            return ~test if negated else test
        case InRange(column, low, high, negated):
            test = pl.col(column).is_between(_lit(low), _lit(high), closed="both")
            return ~test if negated else test
        case And(items):
            return reduce(lambda a, b: a & b, (to_polars(i) for i in items))
        case Or(items):
            return reduce(lambda a, b: a | b, (to_polars(i) for i in items))
        case Not(item):
            return ~to_polars(item)
    raise TypeError(f"not a filter expression: {expr!r}")


def _compare(column: pl.Expr, op: str, value: pl.Expr) -> pl.Expr:
    return _OPS[op](column, value)


def _dtype(value: Value) -> pl.DataType:
    if isinstance(value, dt.datetime):
        return pl.Datetime("us")
    if isinstance(value, str):
        return pl.String()
    if isinstance(value, float):
        return pl.Float64()
    return pl.Int64()


def _lit(value: Value) -> pl.Expr:
    return pl.lit(value, dtype=_dtype(value))
