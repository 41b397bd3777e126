"""Row filters for job-spec queries: a small expression language, parsed here and nowhere else.

`TERMINAL_ID in 1..100 and TX_AMOUNT >= 25` is tokenized and parsed by hand (no `eval`, no
Python parser), so a spec can only ever express comparisons of schema columns with literals.
Columns and literal types are checked against the schema while parsing: an error names the
1-based character position and the rule, and a parsed filter is known to be valid. The result is
an immutable, engine-neutral AST; `engines/polars_filter.py` and `engines/spark_filter.py`
compile it, and `evaluate_row` is the plain-Python reference the compilers are tested against.

Size is bounded where the text is parsed (MAX_FILTER_CHARS, MAX_FILTER_TERMS, MAX_IN_VALUES),
and compiling never builds a chain whose depth grows with the filter: `membership_form` merges
`or`s of equalities on one column (and `and`s of `!=`) into one set membership, which Polars
runs as `is_in` and Spark as one `IN` (an `InSet`, a hash lookup, once optimised); what `and`
and `or` remain are compiled as balanced trees (depth log2 of their length). A chain of 500
`or`s overflowed Spark's stack; 2,000 took Polars 12 s and 1.3 GB (now 0.02 s).

Grammar (keywords are case-insensitive, column names are not):

    filter    = or_expr END
    or_expr   = and_expr { "or" and_expr }
    and_expr  = not_expr { "and" not_expr }
    not_expr  = "not" not_expr | "(" or_expr ")" | predicate
    predicate = COLUMN ( cmp_op value
                       | [ "not" ] "in" ( "(" values ")" | "[" values "]" | INT ".." INT )
                       | [ "not" ] "between" value "and" value )
    cmp_op    = "=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">="
    values    = value { "," value }
    value     = NUMBER | STRING        (NUMBER: -?digits[.digits]; STRING: '...' or "...",
                                        a quote doubled inside stands for itself)
"""

from __future__ import annotations

import datetime as dt
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol, TypeVar

from dppipeline.errors import SpecError, excerpt
from dppipeline.spec.schema import Field, Schema

E = TypeVar("E")  # an engine's expression type

Value = int | float | str | dt.datetime

OPS = ("=", "!=", "<", "<=", ">", ">=")
_OP_ALIASES = {"==": "=", "<>": "!="}
KEYWORDS = frozenset({"and", "or", "not", "in", "between"})
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_DEPTH = 64  # nesting of parentheses and `not`: bounds the parser's recursion
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
        flat.extend(item.items if isinstance(item, kind) else (item,))
    if len(flat) < 2:
        raise ValueError(f"{kind.__name__} needs at least two items, got {len(flat)}")
    return tuple(flat)


# --- tokens --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    kind: str  # "name", "number", "string", "op", "punct", "end"
    text: str  # the source text (for strings: the decoded value)
    pos: int  # 1-based position of the first character

    def describe(self) -> str:
        """The token as an error message shows it: short, escaped, on one line."""
        if self.kind == "end":
            return "end of filter"
        if self.kind == "string":
            return f"string {excerpt(self.text)}"
        if self.kind == "number":
            return f"number {self.text if len(self.text) <= 40 else excerpt(self.text)}"
        return excerpt(self.text)

    def is_keyword(self, word: str) -> bool:
        return self.kind == "name" and self.text.lower() == word


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = ("==", "!=", "<>", "<=", ">=", "..", "=", "<", ">")
_PUNCT = "()[],"


def _tokenize(text: str, where: str) -> list[_Token]:
    tokens: list[_Token] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char.isspace():
            i += 1
        elif char in "'\"":
            value, end = _read_string(text, i, where)
            tokens.append(_Token("string", value, i + 1))
            i = end
        elif match := _NUMBER.match(text, i):
            tokens.append(_Token("number", match.group(), i + 1))
            i = match.end()
        elif match := _NAME.match(text, i):
            tokens.append(_Token("name", match.group(), i + 1))
            i = match.end()
        elif op := next((o for o in _OPERATORS if text.startswith(o, i)), None):
            tokens.append(_Token("op" if op != ".." else "punct", op, i + 1))
            i += len(op)
        elif char in _PUNCT:
            tokens.append(_Token("punct", char, i + 1))
            i += 1
        else:
            raise SpecError(where, f"unexpected character {char!r} at position {i + 1}")
    tokens.append(_Token("end", "", len(text) + 1))
    return tokens


def _read_string(text: str, start: int, where: str) -> tuple[str, int]:
    """The value of the literal opening at `start` (0-based) and the index after it."""
    quote, i, parts = text[start], start + 1, []
    while True:
        end = text.find(quote, i)
        if end < 0:
            raise SpecError(
                where, f"unterminated string starting at position {start + 1}: missing {quote}"
            )
        parts.append(text[i:end])
        if text.startswith(quote * 2, end):
            parts.append(quote)
            i = end + 2
        else:
            return "".join(parts), end + 1


# --- the parser ----------------------------------------------------------------------------


def parse_filter(text: str, schema: Schema, where: str = "filter") -> FilterExpr:
    """The validated AST of `text`; SpecError(where, rule) naming the position otherwise."""
    if len(text) > MAX_FILTER_CHARS:
        raise SpecError(
            where,
            f"filter of {len(text):,} characters: at most {MAX_FILTER_CHARS:,} "
            f"(at position {MAX_FILTER_CHARS + 1:,}); long key lists belong in a key file "
            "(partition_selection.public_partitions)",
        )
    return _Parser(_tokenize(text, where), schema, where).parse()


class _Parser:
    """Recursive descent over the token list, one method per grammar rule."""

    def __init__(self, tokens: list[_Token], schema: Schema, where: str):
        self.tokens, self.schema, self.where = tokens, schema, where
        self.index = 0
        self.depth = 0
        self.terms = 0  # conditions parsed so far

    # helpers

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def advance(self) -> _Token:
        token = self.tokens[self.index]
        self.index = min(self.index + 1, len(self.tokens) - 1)
        return token

    def error(self, rule: str) -> SpecError:
        return SpecError(self.where, rule)

    def expected(self, what: str, token: _Token | None = None) -> SpecError:
        token = token or self.peek()
        return self.error(f"expected {what} at position {token.pos}, found {token.describe()}")

    def accept_keyword(self, word: str) -> bool:
        if self.peek().is_keyword(word):
            self.advance()
            return True
        return False

    def accept_punct(self, text: str) -> bool:
        if self.peek().kind == "punct" and self.peek().text == text:
            self.advance()
            return True
        return False

    # grammar rules

    def parse(self) -> FilterExpr:
        if self.peek().kind == "end":
            raise self.error(
                f"empty filter: expected a condition at position {self.peek().pos}, "
                "found end of filter"
            )
        expr = self.or_expr()
        token = self.peek()
        if token.kind == "punct" and token.text == ")":
            raise self.error(f"unbalanced parenthesis: ')' at position {token.pos} closes nothing")
        if token.kind != "end":
            raise self.expected("'and', 'or' or the end of the filter")
        return expr

    def or_expr(self) -> FilterExpr:
        items = [self.and_expr()]
        while self.accept_keyword("or"):
            items.append(self.and_expr())
        return items[0] if len(items) == 1 else Or(tuple(items))

    def and_expr(self) -> FilterExpr:
        items = [self.not_expr()]
        while self.accept_keyword("and"):
            items.append(self.not_expr())
        return items[0] if len(items) == 1 else And(tuple(items))

    def not_expr(self) -> FilterExpr:
        token = self.peek()
        if self.depth >= MAX_DEPTH:
            raise self.error(
                f"filter nested deeper than {MAX_DEPTH} levels at position {token.pos}"
            )
        self.depth += 1
        try:
            if self.accept_keyword("not"):
                return Not(self.not_expr())
            if self.accept_punct("("):
                expr = self.or_expr()
                if not self.accept_punct(")"):
                    closing = self.peek()
                    raise self.error(
                        f"unbalanced parenthesis: expected ')' at position {closing.pos} to close "
                        f"the '(' at position {token.pos}, found {closing.describe()}"
                    )
                return expr
            return self.predicate()
        finally:
            self.depth -= 1

    def predicate(self) -> FilterExpr:
        token = self.advance()
        if token.kind != "name" or token.text.lower() in KEYWORDS:
            raise self.expected("a column name", token)
        self.terms += 1
        if self.terms > MAX_FILTER_TERMS:
            raise self.error(
                f"more than {MAX_FILTER_TERMS:,} conditions (at position {token.pos:,}); "
                "list values with 'in (...)' or use a key file"
            )
        field = self.column(token)
        negated = self.accept_keyword("not")
        if self.accept_keyword("in"):
            return self.in_list_or_range(field, negated)
        if self.accept_keyword("between"):
            return self.between(field, negated)
        if negated:
            raise self.expected("'in' or 'between' after 'not'")
        if self.peek().kind == "op":
            return self.compare(field)
        raise self.expected(
            f"an operator (=, !=, <, <=, >, >=, in, not in, between) after column {token.text!r}"
        )

    def column(self, token: _Token) -> Field:
        try:
            field = self.schema.field(token.text)
        except KeyError:
            known = ", ".join(self.schema.names)
            same = [n for n in self.schema.names if n.lower() == token.text.lower()]
            hint = f", did you mean {same[0]!r}? (names are case-sensitive)" if same else ""
            raise self.error(
                f"unknown column {excerpt(token.text)} at position {token.pos}{hint} "
                f"(known: {known})"
            ) from None
        if field.type not in _LITERALS:
            raise self.error(
                f"column {field.name!r} at position {token.pos} has type {field.type}, "
                f"which filters do not support"
            )
        return field

    def compare(self, field: Field) -> Compare:
        op_token = self.advance()
        op = _OP_ALIASES.get(op_token.text, op_token.text)  # the tokenizer knows no others
        token = self.value_token(f"after '{op_token.text}'")
        if field.type == "int64" and op in ("<", "<=", ">", ">="):
            op, value = _int_bound(op, self.number(field, token))
            return Compare(field.name, op, self.int64(value, token))
        return Compare(field.name, op, self.literal(field, token, op_token.text))

    def in_list_or_range(self, field: Field, negated: bool) -> InSet | InRange:
        token = self.peek()
        if token.kind == "number":
            return self.int_range(field, negated)
        closing = {"(": ")", "[": "]"}.get(token.text) if token.kind == "punct" else None
        if closing is None:
            raise self.expected("'(', '[' or an integer range low..high after 'in'")
        self.advance()
        values = [self.literal(field, self.value_token(f"after '{token.text}'"), "in")]
        while not self.accept_punct(closing):
            if not self.accept_punct(","):
                found = self.peek()
                raise self.error(
                    f"expected ',' or '{closing}' at position {found.pos} to continue the list "
                    f"opened at position {token.pos}, found {found.describe()}"
                )
            value_token = self.value_token("after ','")
            if len(values) == MAX_IN_VALUES:
                raise self.error(
                    f"an 'in' list of more than {MAX_IN_VALUES:,} values (at position "
                    f"{value_token.pos:,}); use a key file (partition_selection.public_partitions)"
                )
            values.append(self.literal(field, value_token, "in"))
        return InSet(field.name, tuple(values), negated)

    def int_range(self, field: Field, negated: bool) -> InRange:
        low_token = self.advance()
        if field.type != "int64":
            raise self.error(
                f"'in low..high' needs an int64 column, {field.name} is {field.type} "
                f"(use 'between') at position {low_token.pos}"
            )
        if not (self.peek().kind == "punct" and self.peek().text == ".."):
            raise self.expected(f"'..' after {low_token.text}")
        self.advance()
        high_token = self.value_token("after '..'")
        low, high = (self.range_bound(field, t) for t in (low_token, high_token))
        return self.checked_range(field, low, high, negated, low_token)

    def range_bound(self, field: Field, token: _Token) -> int:
        if token.kind != "number" or "." in token.text:
            raise self.expected("an integer range bound", token)
        return self.int64(int(token.text), token)

    def between(self, field: Field, negated: bool) -> InRange:
        low_token = self.value_token("after 'between'")
        low = self.literal(field, low_token, "between")
        if not self.accept_keyword("and"):
            raise self.expected("'and' after the low bound of 'between'")
        high = self.literal(field, self.value_token("after 'and'"), "between")
        return self.checked_range(field, low, high, negated, low_token)

    def checked_range(
        self, field: Field, low: Value, high: Value, negated: bool, token: _Token
    ) -> InRange:
        if low > high:  # same column, so same type
            raise self.error(
                f"empty range at position {token.pos}: low {_value_text(low)} is greater "
                f"than high {_value_text(high)}"
            )
        return InRange(field.name, low, high, negated)

    # literals

    def value_token(self, context: str) -> _Token:
        token = self.advance()
        if token.kind not in ("number", "string"):
            raise self.expected(f"a value {context}", token)
        return token

    def literal(self, field: Field, token: _Token, context: str) -> Value:
        """The token as a value of the column's type (for `=`, `in`, `between`)."""
        return _LITERALS[field.type](self, field, token, context)

    def number(self, field: Field, token: _Token) -> Decimal:
        if token.kind != "number":
            raise self.type_error(field, token, "a number")
        return Decimal(token.text)

    def int64(self, value: int, token: _Token) -> int:
        if not INT64_MIN <= value <= INT64_MAX:
            raise self.error(
                f"{token.describe()} at position {token.pos} is out of the int64 range"
            )
        return value

    def int_literal(self, field: Field, token: _Token, context: str) -> int:
        value = self.number(field, token)
        if value != value.to_integral_value():
            raise self.error(
                f"{field.name} is int64: '{context}' needs an integer at position {token.pos}, "
                f"found {token.describe()}"
            )
        return self.int64(int(value), token)

    def float_literal(self, field: Field, token: _Token, context: str) -> float:
        del context
        value = float(self.number(field, token))
        if not math.isfinite(value):
            raise self.error(f"number at position {token.pos} is too large for float64")
        return value

    def string_literal(self, field: Field, token: _Token, context: str) -> str:
        del context
        if token.kind != "string":
            raise self.type_error(field, token, "a quoted string")
        return token.text

    def datetime_literal(self, field: Field, token: _Token, context: str) -> dt.datetime:
        del context
        wanted = "a quoted date 'YYYY-MM-DD' or 'YYYY-MM-DD HH:MM:SS'"
        if token.kind != "string":
            raise self.type_error(field, token, wanted)
        for pattern, fmt in _DATETIME_FORMATS.items():
            if pattern.fullmatch(token.text):
                try:
                    return dt.datetime.strptime(token.text, fmt)
                except ValueError:
                    break
        raise self.type_error(field, token, wanted)

    def type_error(self, field: Field, token: _Token, wanted: str) -> SpecError:
        return self.error(
            f"{field.name} is {field.type}: expected {wanted} at position {token.pos}, "
            f"found {token.describe()}"
        )


def _int_bound(op: str, bound: Decimal) -> tuple[str, int]:
    """An int64 column against a decimal, as the same test against an integer:
    `x < 10.5` is `x <= 10`, `x > 10.5` is `x >= 11`."""
    if bound == bound.to_integral_value():
        return op, int(bound)
    if op in ("<", "<="):
        return "<=", math.floor(bound)
    return ">=", math.ceil(bound)


_LITERALS: dict[str, Callable[[_Parser, Field, _Token, str], Value]] = {
    "int64": _Parser.int_literal,
    "float64": _Parser.float_literal,
    "string": _Parser.string_literal,
    "timestamp[us]": _Parser.datetime_literal,
}


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
    unique = list(dict.fromkeys(filters))
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
            return _balanced(operator.and_, [_compile(i, builder) for i in items])
        case Or(items):
            return _balanced(operator.or_, [_compile(i, builder) for i in items])
        case Not(item):
            return ~_compile(item, builder)
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
    sets: dict[str, list[FilterExpr]] = {}
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


def _evaluate(expr: FilterExpr, row: Mapping[str, object]) -> bool | None:
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
