"""Row filters for job-spec queries: SQL `WHERE` conditions, parsed by `filter_parser` only.

`TERMINAL_ID in 1..100 and TX_AMOUNT >= 25` is tokenized and parsed by sqlglot (a well-kept SQL
parser; no `eval`, no Python parser), then walked against an allow-list: only comparisons of
a schema column with a literal, `in` lists, `between`, `and`/`or`/`not` and parentheses become
a filter; functions, arithmetic, casts, subqueries, `is`, parameters, several statements and
comments are refused with the rule and a 1-based position. Columns and literal types are
checked against the schema during the walk, so a parsed filter is known to be valid. The result
is an immutable, engine-neutral AST; `engines/kernel/polars_filter.py` and
`engines/spark/filter.py` compile it, and `evaluate_row` is the plain-Python reference the
compilers are tested against.

Size is bounded before sqlglot runs (MAX_FILTER_CHARS, nesting MAX_DEPTH: its parser recurses
about 25 frames per parenthesis) and during the walk (MAX_FILTER_TERMS, MAX_IN_VALUES). The
walk quotes the filter's own text in errors, never sqlglot's regenerated SQL (whose generator
recurses once per level of a tree as deep as the text is long), and checks an int64 literal's
magnitude before it builds an `int` (`1e999999` is a million digits).
Compiling never builds a chain whose depth grows with the filter: `membership_form` merges
`or`s of equalities on one column (and `and`s of `!=`) into one set membership, which Polars
runs as `is_in` and Spark as one `IN`, and what `and` and `or` remain are compiled as balanced
trees (docs/explanation/engines.md has the measurements).

Accepted (keywords case-insensitive, column names case-sensitive):

    condition = condition ("and" | "or") condition | "not" condition | "(" condition ")"
              | COLUMN ("=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">=") value
              | COLUMN ["not"] "in" ("(" values ")" | "[" values "]" | INT ".." INT)
              | COLUMN ["not"] "between" value "and" value
    value     = NUMBER (optionally signed, with an exponent) | '...' | "..."
                (a doubled quote inside a string stands for itself; a backslash is itself)

`in A..B` is sugar for `between A and B` on an int64 column, rewritten token by token.
"""

from __future__ import annotations

import datetime as dt
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol, TypeVar, cast

E = TypeVar("E")  # an engine's expression type

Value = int | float | str | dt.datetime

OPS = ("=", "!=", "<", "<=", ">", ">=")
_OP_ALIASES = {"==": "=", "<>": "!="}
KEYWORDS = frozenset({"and", "or", "not", "in", "between"})
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Nesting of brackets, prefix `not`s and signs. sqlglot's parser takes up to 26 Python frames
# a level: 20 levels are about 550 of the default 1,000, leaving the rest to the callers.
MAX_DEPTH = 20
MAX_FILTER_CHARS = 100_000  # characters of filter text
# Conditions (comparisons, `in`, `between`) in one filter. Spark re-chains a filter's `and`s
# one after the other whatever tree it is given: 1,500 overflowed its stack, 1,000 took 30 s
# to plan; 500 of any shape run in seconds.
MAX_FILTER_TERMS = 500
MAX_IN_VALUES = 10_000  # values in one `in (...)` list; longer key lists belong in key files
_DATETIME_FORMATS = {
    re.compile(r"\d{4}-\d{2}-\d{2}"): "%Y-%m-%d",
    re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}"): "%Y-%m-%d %H:%M:%S",
}
_TEXT_DATETIME = "%Y-%m-%d %H:%M:%S"


# --- the AST -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Compare:
    """`column op value`; op is one of OPS."""

    column: str
    op: str
    value: Value


@dataclass(frozen=True)
class InSet:
    """`column [not] in (v1, v2, ...)`; values are kept sorted and unique (canonical)."""

    column: str
    values: tuple[Value, ...]
    negated: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(sorted(set(self.values))))


@dataclass(frozen=True)
class InRange:
    """`low <= column <= high` (`column in low..high`, `column between low and high`)."""

    column: str
    low: Value
    high: Value
    negated: bool = False


@dataclass(frozen=True)
class And:
    items: tuple[FilterExpr, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "items", _flatten(And, self.items))


@dataclass(frozen=True)
class Or:
    items: tuple[FilterExpr, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "items", _flatten(Or, self.items))


@dataclass(frozen=True)
class Not:
    item: FilterExpr


FilterExpr = Compare | InSet | InRange | And | Or | Not


def _flatten(kind: type, items: Sequence[FilterExpr]) -> tuple[FilterExpr, ...]:
    """`(a and b) and c` is `a and b and c`: one canonical shape for equal filters."""
    flat: list[FilterExpr] = []
    for item in items:
        flat.extend(
            item.items if isinstance(item, And | Or) and isinstance(item, kind) else (item,)
        )
    if len(flat) < 2:
        raise ValueError(f"{kind.__name__} needs at least two items, got {len(flat)}")
    return tuple(flat)


# --- parsing: `filter_parser.parse_filter` (sqlglot, 0.2 s of start-up, imported only by a
# job that has a filter) -------------------------------------------------------------------


# --- text, columns, combination ------------------------------------------------------------


def to_text(expr: FilterExpr) -> str:
    """Canonical text of a filter: re-parses to an equal AST (for manifests and hashing)."""
    match expr:
        case Compare(column, op, value):
            return f"{column} {op} {_value_text(value)}"
        case InSet(column, values, negated):
            listed = ", ".join(_value_text(v) for v in values)
            return f"{column}{' not' if negated else ''} in ({listed})"
        case InRange(column, low, high, negated):
            keyword = "not between" if negated else "between"
            return f"{column} {keyword} {_value_text(low)} and {_value_text(high)}"
        case And(items):
            return " and ".join(
                f"({to_text(i)})" if isinstance(i, Or) else to_text(i) for i in items
            )
        case Or(items):
            return " or ".join(to_text(i) for i in items)
        case Not(item):
            return f"not ({to_text(item)})"
    raise TypeError(f"not a filter expression: {expr!r}")


def _value_text(value: Value) -> str:
    if isinstance(value, dt.datetime):
        return _quote(value.strftime(_TEXT_DATETIME))
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, float):
        text = format(Decimal(repr(value)), "f")  # never an exponent: the grammar has none
        return text if "." in text else f"{text}.0"
    return str(value)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def columns(expr: FilterExpr) -> frozenset[str]:
    """The columns a filter reads."""
    match expr:
        case Compare(column) | InSet(column) | InRange(column):
            return frozenset({column})
        case And(items) | Or(items):
            return frozenset().union(*(columns(i) for i in items))
        case Not(item):
            return columns(item)
    raise TypeError(f"not a filter expression: {expr!r}")


def any_of(filters: Sequence[FilterExpr | None]) -> FilterExpr | None:
    """Rows any of the filters keeps: their OR; None (all rows) when any filter is None."""
    if not filters:
        raise ValueError("any_of needs at least one filter")
    if any(f is None for f in filters):
        return None
    unique = [f for f in dict.fromkeys(filters) if f is not None]
    return unique[0] if len(unique) == 1 else Or(tuple(unique))


# --- compiling to an engine's expressions ---------------------------------------------------

COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


class ExpressionBuilder(Protocol[E]):
    """What an engine provides to compile filters: its column, literal, membership (of the
    named column in a set of values) and range expressions. `&`, `|`, `~` and the comparison
    operators of its expressions do the rest."""

    def column(self, name: str) -> E: ...

    def literal(self, value: Value) -> E: ...

    def is_in(self, name: str, values: tuple[Value, ...]) -> E: ...

    def between(self, column: E, low: Value, high: Value) -> E: ...


def compile_filter(expr: FilterExpr, builder: ExpressionBuilder[E]) -> E:
    """The filter as one boolean expression of the builder's engine (Polars, Spark): in its
    `membership_form`, with `and`/`or` as balanced trees, so the expression's depth grows
    with the log of the filter's length, never with the length."""
    return _compile(membership_form(expr), builder)


def _compile(expr: FilterExpr, builder: ExpressionBuilder[E]) -> E:
    return cast(E, _compile_any(expr, builder))


def _compile_any(expr: FilterExpr, builder: ExpressionBuilder[Any]) -> Any:
    """`_compile` on the engine's expressions as they are: their operators are the engine's."""
    match expr:
        case Compare(column, op, value):
            return COMPARE[op](builder.column(column), builder.literal(value))
        case InSet(column, values, negated):
            test = builder.is_in(column, values)
            return ~test if negated else test
        case InRange(column, low, high, negated):
            test = builder.between(builder.column(column), low, high)
            return ~test if negated else test
        case And(items):
            return _balanced(operator.and_, [_compile_any(i, builder) for i in items])
        case Or(items):
            return _balanced(operator.or_, [_compile_any(i, builder) for i in items])
        case Not(item):
            return ~_compile_any(item, builder)
    raise TypeError(f"not a filter expression: {expr!r}")


def _balanced(combine: Callable[[E, E], E], exprs: Sequence[E]) -> E:
    """`a op b op c op d` as `(a op b) op (c op d)`: same result (and, or are associative,
    also under SQL's null logic), depth log2(n) instead of n."""
    if len(exprs) == 1:
        return exprs[0]
    middle = len(exprs) // 2
    return combine(_balanced(combine, exprs[:middle]), _balanced(combine, exprs[middle:]))


def membership_form(expr: FilterExpr) -> FilterExpr:
    """The same filter with set membership where it has chains of equality tests.

    Within one `or`, every `column = v` and `column in (...)` on one column becomes a single
    `column in (...)`; within one `and`, every `column != v` and `column not in (...)` a single
    `column not in (...)`. Both keep SQL's null logic (a null cell gives unknown either way)
    and float equality (-0.0 = 0.0 in Polars, Spark and Python alike). Other items keep
    their order after the merged sets.
    """
    match expr:
        case And(items):
            return _merge_sets(And, [membership_form(i) for i in items], negated=True)
        case Or(items):
            return _merge_sets(Or, [membership_form(i) for i in items], negated=False)
        case Not(item):
            return Not(membership_form(item))
    return expr


def _merge_sets(kind: type[And] | type[Or], items: list[FilterExpr], negated: bool) -> FilterExpr:
    equal = "!=" if negated else "="
    sets: dict[str, list[Compare | InSet]] = {}
    rest: list[FilterExpr] = []
    for item in items:
        match item:
            case Compare(column, op, _) if op == equal:
                sets.setdefault(column, []).append(item)
            case InSet(column, _, is_negated) if is_negated == negated:
                sets.setdefault(column, []).append(item)
            case _:
                rest.append(item)
    merged: list[FilterExpr] = []
    for column, members in sets.items():
        if len(members) == 1:
            merged.append(members[0])
            continue
        values: list[Value] = []
        for member in members:
            values.extend(member.values if isinstance(member, InSet) else (member.value,))
        merged.append(InSet(column, tuple(values), negated))
    out = merged + rest
    return out[0] if len(out) == 1 else kind(tuple(out))


# --- the reference evaluator ---------------------------------------------------------------


def evaluate_row(expr: FilterExpr, row: Mapping[str, object]) -> bool:
    """Whether a filter keeps one row, in plain Python: the oracle for the engine compilers.

    Nulls follow SQL (and Polars, and Spark): a comparison with null is unknown, `not` of
    unknown is unknown, and a row is kept only when the filter is true.
    """
    return _evaluate(expr, row) is True


def _evaluate(expr: FilterExpr, row: Mapping[str, Any]) -> bool | None:
    match expr:
        case Compare(column, op, value):
            cell = row[column]
            return None if cell is None else bool(COMPARE[op](cell, value))
        case InSet(column, values, negated):
            cell = row[column]
            return None if cell is None else bool(cell in values) != negated
        case InRange(column, low, high, negated):
            cell = row[column]
            return None if cell is None else bool(low <= cell <= high) != negated
        case And(items):
            results = [_evaluate(i, row) for i in items]
            return False if False in results else (None if None in results else True)
        case Or(items):
            results = [_evaluate(i, row) for i in items]
            return True if True in results else (None if None in results else False)
        case Not(item):
            result = _evaluate(item, row)
            return None if result is None else not result
    raise TypeError(f"not a filter expression: {expr!r}")
