"""Filters (`dppipeline.spec.filters`) as Polars expressions, for the local and Beam engines.

Literals get the schema's Polars types (Int64, Float64, String, Datetime("us")), so every test
compares like with like; nulls follow Kleene logic, as in `filters.evaluate_row`.
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from dppipeline.spec.filters import FilterExpr, Value, compile_filter


def _dtype(value: Value) -> pl.DataType:
    if isinstance(value, dt.datetime):
        return pl.Datetime("us")
    if isinstance(value, str):
        return pl.String()
    if isinstance(value, float):
        return pl.Float64()
    return pl.Int64()


class _PolarsBuilder:
    def column(self, name: str) -> pl.Expr:
        return pl.col(name)

    def literal(self, value: Value) -> pl.Expr:
        return pl.lit(value, dtype=_dtype(value))

    def is_in(self, name: str, values: tuple[Value, ...]) -> pl.Expr:
        return pl.col(name).is_in(pl.lit(pl.Series(values, dtype=_dtype(values[0]))).implode())

    def between(self, column: pl.Expr, low: Value, high: Value) -> pl.Expr:
        return column.is_between(self.literal(low), self.literal(high), closed="both")


def to_polars(expr: FilterExpr) -> pl.Expr:
    """A boolean Polars expression that is true for the rows `expr` keeps."""
    return compile_filter(expr, _PolarsBuilder())
