"""Row filters for job-spec queries: SQL `WHERE` conditions, parsed here and nowhere else.

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
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar, Protocol, TypeVar, cast

from sqlglot import expressions as exp
from sqlglot.dialects.mysql import MySQL
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokenizer_core import Token, TokenType

from dppipeline.errors import SpecError, excerpt
from dppipeline.spec.schema import Field, Schema

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


# --- parsing: sqlglot's tokenizer and parser, then an allow-list walk ----------------------


class _FilterSQL(MySQL):
    """The SQL dialect of filters: MySQL's, where '...' and "..." are both strings and [...] is
    a list as in the filters users already write, with a doubled quote standing for itself and
    a backslash for a backslash (no C escapes)."""

    class Tokenizer(MySQL.Tokenizer):
        STRING_ESCAPES: ClassVar[list[str]] = ["'", '"']


_DIALECT = _FilterSQL()
_BINARY: dict[type[exp.Expr], str] = {
    exp.EQ: "=",
    exp.NEQ: "!=",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.GT: ">",
    exp.GTE: ">=",
}
_ALLOWED = (
    "comparisons of a column with a value (=, !=, <>, <, <=, >, >=), in (...), in low..high, "
    "between, and, or, not, parentheses"
)
_SQLGLOT_CLASS = re.compile(r"<class 'sqlglot\.expressions\.[\w.]*?(\w+)'>")
_AFTER = {"EQ": "'='", "NEQ": "'!='", "LT": "'<'", "LTE": "'<='", "GT": "'>'", "GTE": "'>='"}
_AFTER |= {"And": "'and'", "Or": "'or'", "Not": "'not'", "In": "'in'"}


def parse_filter(text: str, schema: Schema, where: str = "filter") -> FilterExpr:
    """The validated AST of `text`; SpecError(where, rule) naming the position otherwise."""
    if len(text) > MAX_FILTER_CHARS:
        raise SpecError(
            where,
            f"filter of {len(text):,} characters: at most {MAX_FILTER_CHARS:,} "
            f"(at position {MAX_FILTER_CHARS + 1:,}); long key lists belong in a key file "
            "(partition_selection.public_partitions)",
        )
    tokens = _tokens(text, where)
    if not tokens:
        raise SpecError(where, f"empty filter: expected a condition at position {len(text) + 1}")
    _check_nesting(tokens, where)
    tokens, ranges = _range_sugar(tokens, text, where)
    try:
        trees = _DIALECT.parser().parse(tokens, text)
    except ParseError as exc:
        raise SpecError(where, _syntax_error(exc, text)) from None
    except RecursionError:  # what _check_nesting does not count (`interval interval ...`)
        raise SpecError(
            where,
            f"filter nested too deeply for the SQL parser (at most {MAX_DEPTH} levels of "
            "brackets, 'not' and signs; no other nesting is allowed)",
        ) from None
    if len(trees) != 1 or trees[0] is None:
        at = next((t.start + 1 for t in tokens if t.token_type == TokenType.SEMICOLON), 1)
        raise SpecError(where, f"a filter is one condition: ';' at position {at} ends it")
    return _Walk(schema, where, text, ranges).condition(trees[0])


def _tokens(text: str, where: str) -> list[Token]:
    """sqlglot's tokens of the filter; an unterminated string or a comment is an error."""
    try:
        tokens: list[Token] = _DIALECT.tokenize(text)
    except TokenError:
        raise SpecError(where, _tokenizing_error(text)) from None
    for token in tokens:
        if token.token_type in (TokenType.DPIPE, TokenType.DAMP):
            raise SpecError(
                where,
                f"unexpected {excerpt(token.text)} at position {token.start + 1}: write 'or' "
                "or 'and'",
            )
    if any(token.comments for token in tokens):
        strings = [(t.start, t.end) for t in tokens if t.token_type == TokenType.STRING]
        at = min(
            m.start()
            for m in re.finditer(r"--|/\*|#", text)
            if not any(a <= m.start() <= b for a, b in strings)
        )
        raise SpecError(
            where,
            f"a comment at position {at + 1}: filters hold no comments (what a reviewer "
            "reads must be all that is applied)",
        )
    return tokens


def _tokenizing_error(text: str) -> str:
    """Where sqlglot's tokenizer stopped: the one case it meets in a filter is a string that
    never closes (a doubled quote inside a string stands for itself)."""
    i = 0
    while i < len(text):
        if text[i] in "'\"":
            quote, start = text[i], i
            i += 1
            while True:
                end = text.find(quote, i)
                if end < 0:
                    return f"unterminated string starting at position {start + 1}: missing {quote}"
                if text.startswith(quote * 2, end):
                    i = end + 2
                    continue
                i = end + 1
                break
        else:
            i += 1
    return f"unexpected character at position {len(text)} (cannot split it into SQL tokens)"


_OPENING = (TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.L_BRACE)
_CLOSING = (TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.R_BRACE)
_VALUE_END = (TokenType.NUMBER, TokenType.STRING, TokenType.VAR, *_CLOSING)
_SIGNS = (TokenType.DASH, TokenType.PLUS)


def _check_nesting(tokens: list[Token], where: str) -> None:
    """Brackets, prefix `not`s and signs nested at most MAX_DEPTH deep, counted on the tokens
    before sqlglot's parser runs: it recurses once per level (about 25 frames for a
    parenthesis, 13 for a `not`), so a deeper filter would exhaust Python's stack."""
    held: list[tuple[int, int]] = []  # the `not`s and signs open around each open bracket
    nots = signs = 0  # prefix `not`s and signs open at the current bracket level
    previous: TokenType | None = None
    for token in tokens:
        kind = token.token_type
        if kind in _OPENING:
            held.append((nots, signs))
            nots = signs = 0
        elif kind in _CLOSING:
            nots, signs = held.pop() if held else (0, 0)
        elif kind == TokenType.NOT and previous in (
            None, TokenType.AND, TokenType.OR, TokenType.NOT, *_OPENING,
        ):  # fmt: skip
            nots += 1
        elif kind in (TokenType.AND, TokenType.OR):
            nots = 0
        elif kind in _SIGNS and previous not in _VALUE_END:
            signs += 1
        if kind in _VALUE_END:
            signs = 0  # a value ends the signs before it (`-(-1)`: after the `)`)
        depth = len(held) + sum(n + s for n, s in held) + nots + signs
        if depth > MAX_DEPTH:
            raise SpecError(
                where, f"filter nested deeper than {MAX_DEPTH} levels at position {token.start + 1}"
            )
        previous = kind


def _range_sugar(tokens: list[Token], text: str, where: str) -> tuple[list[Token], set[int]]:
    """`COL in A..B` as `COL between A and B` (A, B integers), token by token so positions
    stay those of the text; returns the 1-based positions of the rewritten low bounds."""
    out: list[Token] = []
    ranges: set[int] = set()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if token.token_type != TokenType.IN or nxt is None or nxt.token_type not in (
            TokenType.NUMBER, TokenType.DASH,
        ):  # fmt: skip
            out.append(token)
            i += 1
            continue
        match = _RANGE.match(text, nxt.start)
        if match is None:
            number = re.match(r"-?\s*[\d.]*", text[nxt.start :])
            seen = number.group().rstrip(".") if number else ""
            raise SpecError(
                where,
                f"expected '..' after {excerpt(seen)} at position {nxt.start + len(seen) + 1}",
            )
        for bound in ("low", "high"):
            if "." in match.group(bound):
                raise SpecError(
                    where,
                    f"expected an integer range bound at position {match.start(bound) + 1}, "
                    f"found number {excerpt(match.group(bound))}",
                )
        out.append(
            Token(TokenType.BETWEEN, "between", token.line, token.col, token.start, token.end)
        )
        out += _number_tokens(match, "low", token)
        dots = match.end("low")
        out.append(Token(TokenType.AND, "and", token.line, token.col, dots, dots + 1))
        out += _number_tokens(match, "high", token)
        ranges.add(match.start("low") + 1)
        while i < len(tokens) and tokens[i].start < match.end():
            i += 1
    return out, ranges


# `A..B` after `in`: each bound a number (integers are checked after the match)
_RANGE = re.compile(r"(?P<low>-?\s*\d+(?:\.\d+)?)\s*\.\.\s*(?P<high>-?\s*\d+(?:\.\d+)?)")


def _number_tokens(match: re.Match[str], bound: str, like: Token) -> list[Token]:
    """The tokens of one range bound, at its place in the text."""
    text, start = match.group(bound), match.start(bound)
    tokens = []
    if text.startswith("-"):
        tokens.append(Token(TokenType.DASH, "-", like.line, like.col, start, start))
        digits = text[1:].lstrip()
        start += len(text) - len(digits)
        text = digits
    tokens.append(Token(TokenType.NUMBER, text, like.line, like.col, start, start + len(text) - 1))
    return tokens


def _syntax_error(exc: ParseError, text: str) -> str:
    """sqlglot's first parse error in the product's words, at its position in the text."""
    error = exc.errors[0] if exc.errors else {}
    highlight = str(error.get("highlight") or "")
    line, col = int(error.get("line") or 1), int(error.get("col") or 1)
    line_start = sum(len(part) + 1 for part in text.split("\n")[: line - 1])
    position = max(1, line_start + col - len(highlight) + 1)
    at_end = position - 1 + len(highlight) >= len(text.rstrip())
    description = str(error.get("description") or exc)
    found = f", found {excerpt(highlight)}" if highlight else ""
    end = f"at position {len(text) + 1}, found end of filter"
    if required := re.match(r"Required keyword: '(\w+)' missing for (.*)", description):
        node = _SQLGLOT_CLASS.sub(r"\1", required.group(2))
        if required.group(1) == "this" and node in _AFTER:
            return f"expected a column name before {_AFTER[node]} at position {position}{found}"
        if node == "Between":
            where = end if at_end else f"at position {position}{found}"
            return f"expected 'and' after the low bound of 'between' {where}"
        wanted = "a condition" if node in ("And", "Or", "Not") else "a value"
        where = end if at_end else f"at position {position}"
        if node not in _AFTER:  # LIKE, XOR, ...: named as the walk names them
            return (
                f"{node.upper()} is not allowed in a filter (the parser stopped {where}; "
                f"allowed: {_ALLOWED})"
            )
        return f"expected {wanted} after {_AFTER[node]} {where}"
    if description.startswith("Expecting )"):
        where = end if at_end else f"at position {position}{found}"
        return f"unbalanced parenthesis: expected ')' {where}"
    if description.startswith("Expecting ]"):
        return f"expected ',' or ']' at position {position} to continue the list{found}"
    if highlight == ")":
        return f"unbalanced parenthesis: ')' at position {position} closes nothing"
    return f"unexpected {excerpt(highlight) if highlight else 'text'} at position {position}"


class _Walk:
    """sqlglot's tree to the filter AST, accepting only the node types of the grammar and
    checking columns and literal types against the schema."""

    def __init__(self, schema: Schema, where: str, text: str, ranges: set[int]):
        self.schema, self.where, self.text, self.ranges = schema, where, text, ranges
        self.terms = 0  # conditions so far

    def error(self, rule: str) -> SpecError:
        return SpecError(self.where, rule)

    def condition(self, node: exp.Expr) -> FilterExpr:
        if isinstance(node, exp.Paren):
            return self.condition(node.this)
        if isinstance(node, exp.And | exp.Or):
            kind = And if isinstance(node, exp.And) else Or
            items = [self.condition(n) for n in node.flatten()]
            return kind(tuple(items))
        if isinstance(node, exp.Not):
            inner = node.this
            if isinstance(inner, exp.In | exp.Between):  # `col not in`, `col not between`
                return self.predicate(inner, negated=True)
            return Not(self.condition(inner))
        return self.predicate(node, negated=False)

    def predicate(self, node: exp.Expr, negated: bool) -> FilterExpr:
        op = _BINARY.get(type(node))
        if op is None and not isinstance(node, exp.In | exp.Between):
            raise self.not_allowed(node)
        column = node.this
        self.terms += 1
        if self.terms > MAX_FILTER_TERMS:
            raise self.error(
                f"more than {MAX_FILTER_TERMS:,} conditions (at position {self.position(node):,}); "
                "list values with 'in (...)' or use a key file"
            )
        field = self.column(column)
        if isinstance(node, exp.In):
            return self.in_list(node, field, negated)
        if isinstance(node, exp.Between):
            return self.between(node, field, negated)
        assert op is not None
        return self.compare(op, field, node.expression)

    def not_allowed(self, node: exp.Expr) -> SpecError:
        """A node outside the grammar: named by its kind, never by the user's text."""
        if isinstance(node, exp.Column | exp.Literal):
            return self.error(
                f"expected a condition at position {self.position(node)}, found "
                f"{excerpt(self.source(node))} (allowed: {_ALLOWED})"
            )
        kind = node.key.upper()
        if isinstance(node, exp.Func):
            kind = f"function {kind}()"
        elif isinstance(node, exp.Binary):
            kind = f"operator {kind}"
        return self.error(
            f"{kind} in the condition at position {self.position(node)} is not allowed in a "
            f"filter (allowed: {_ALLOWED})"
        )

    def position(self, node: exp.Expr | None) -> int:
        """1-based position of the first token of `node` sqlglot kept."""
        starts = [
            n.meta["start"] for n in (node.walk() if node is not None else ()) if "start" in n.meta
        ]
        return min(starts) + 1 if starts else 1

    def source(self, node: exp.Expr | None) -> str:
        """The filter's own text of `node`, from the first to the last token sqlglot kept.
        Never `node.sql()`: sqlglot's generator recurses once per level of the tree, and a
        tree such as `a.b.c...` or `1::int::int...` is as deep as the text is long."""
        spans = [
            (n.meta["start"], n.meta["end"])
            for n in (node.walk() if node is not None else ())
            if "start" in n.meta
        ]
        if not spans:
            return node.key.upper() if node is not None else ""
        return self.text[min(s for s, _ in spans) : max(e for _, e in spans) + 1]

    def column(self, node: exp.Expr) -> Field:
        if isinstance(node, exp.Func | exp.Binary | exp.Cast | exp.Subquery):
            raise self.not_allowed(node)  # functions, arithmetic, casts, subqueries
        if not isinstance(node, exp.Column) or node.table or node.this.quoted:
            raise self.error(
                f"expected a column name at position {self.position(node)}, found "
                f"{excerpt(self.source(node)) if node is not None else 'nothing'}"
            )
        name = node.name
        try:
            field = self.schema.field(name)
        except KeyError:
            known = ", ".join(self.schema.names)
            same = [n for n in self.schema.names if n.lower() == name.lower()]
            hint = f", did you mean {same[0]!r}? (names are case-sensitive)" if same else ""
            raise self.error(
                f"unknown column {excerpt(name)} at position {self.position(node)}{hint} "
                f"(known: {known})"
            ) from None
        if field.type not in _LITERALS:
            raise self.error(
                f"column {field.name!r} at position {self.position(node)} has type {field.type}, "
                "which filters do not support"
            )
        return field

    def compare(self, op: str, field: Field, node: exp.Expr) -> Compare:
        context = {"=": "=", "!=": "!="}.get(op, op)
        if field.type == "int64" and op in ("<", "<=", ">", ">="):
            op, bound = _int_bound(op, self.int64_magnitude(self.number(field, node), node))
            return Compare(field.name, op, self.int64(bound, node))
        return Compare(field.name, op, self.literal(field, node, context))

    def in_list(self, node: exp.In, field: Field, negated: bool) -> InSet:
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            raise self.error(
                f"expected '(', '[' or an integer range low..high after 'in' at position "
                f"{self.position(node.args.get('field') or node.args.get('query') or node)}"
            )
        values = node.expressions
        if not values:
            raise self.error(
                f"an 'in' list needs at least one value (the condition at position "
                f"{self.position(node)})"
            )
        if len(values) > MAX_IN_VALUES:
            raise self.error(
                f"an 'in' list of more than {MAX_IN_VALUES:,} values (at position "
                f"{self.position(values[MAX_IN_VALUES]):,}); use a key file "
                "(partition_selection.public_partitions)"
            )
        return InSet(field.name, tuple(self.literal(field, v, "in") for v in values), negated)

    def between(self, node: exp.Between, field: Field, negated: bool) -> InRange:
        low_node, high_node = node.args["low"], node.args["high"]
        sugar = self.position(low_node) in self.ranges
        if sugar and field.type != "int64":
            raise self.error(
                f"'in low..high' needs an int64 column, {field.name} is {field.type} "
                f"(use 'between') at position {self.position(low_node)}"
            )
        low = self.literal(field, low_node, "between")
        high = self.literal(field, high_node, "between")
        if low > high:  # type: ignore[operator]  # same column, so same type
            raise self.error(
                f"empty range at position {self.position(low_node)}: low {_value_text(low)} "
                f"is greater than high {_value_text(high)}"
            )
        return InRange(field.name, low, high, negated)

    # literals

    def literal(self, field: Field, node: exp.Expr, context: str) -> Value:
        """The node as a value of the column's type (for `=`, `in`, `between`)."""
        return _LITERALS[field.type](self, field, node, context)

    def token_text(self, node: exp.Expr) -> tuple[str, str]:
        """(kind, text) of a literal node: ('number', '-2.5'), ('string', 'abc') or
        ('other', its text) for anything the grammar has no value for."""
        if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal):
            kind, text = self.token_text(node.this)
            return (kind, f"-{text}") if kind == "number" else ("other", self.source(node))
        if isinstance(node, exp.Literal):
            return ("string", node.this) if node.is_string else ("number", node.this)
        return "other", self.source(node)

    def describe(self, node: exp.Expr) -> str:
        kind, text = self.token_text(node)
        if kind == "string":
            return f"string {excerpt(text)}"
        if kind == "number":
            return f"number {text if len(text) <= 40 else excerpt(text)}"
        return excerpt(text)

    def value(self, node: exp.Expr) -> tuple[str, str]:
        kind, text = self.token_text(node)
        if kind == "other":
            if isinstance(node, exp.Column):
                raise self.error(
                    f"expected a value at position {self.position(node)}, found column "
                    f"{excerpt(node.name)} (filters compare a column with a value)"
                )
            raise self.not_allowed(node)
        return kind, text

    def number(self, field: Field, node: exp.Expr) -> Decimal:
        kind, text = self.value(node)
        if kind != "number":
            raise self.type_error(field, node, "a number")
        try:
            return Decimal(text)
        except InvalidOperation:
            raise self.type_error(field, node, "a number") from None

    def int64_magnitude(self, value: Decimal, node: exp.Expr) -> Decimal:
        """`value` if it may be an int64, before anything turns it into an `int`: `1e999999`
        is a short text but a million-digit integer, which takes Python minutes to build."""
        if value.is_finite() and value.adjusted() >= 19:  # |value| >= 10**19 > INT64_MAX
            raise self.error(
                f"{self.describe(node)} at position {self.position(node)} is out of the int64 range"
            )
        return value

    def int64(self, value: int, node: exp.Expr) -> int:
        if not INT64_MIN <= value <= INT64_MAX:
            raise self.error(
                f"{self.describe(node)} at position {self.position(node)} is out of the int64 range"
            )
        return value

    def int_literal(self, field: Field, node: exp.Expr, context: str) -> int:
        value = self.int64_magnitude(self.number(field, node), node)
        if not value.is_finite() or value != value.to_integral_value():
            raise self.error(
                f"{field.name} is int64: '{context}' needs an integer at position "
                f"{self.position(node)}, found {self.describe(node)}"
            )
        return self.int64(int(value), node)

    def float_literal(self, field: Field, node: exp.Expr, context: str) -> float:
        del context
        value = float(self.number(field, node))
        if not math.isfinite(value):
            raise self.error(f"number at position {self.position(node)} is too large for float64")
        return value

    def string_literal(self, field: Field, node: exp.Expr, context: str) -> str:
        del context
        kind, text = self.value(node)
        if kind != "string":
            raise self.type_error(field, node, "a quoted string")
        return text

    def datetime_literal(self, field: Field, node: exp.Expr, context: str) -> dt.datetime:
        del context
        wanted = "a quoted date 'YYYY-MM-DD' or 'YYYY-MM-DD HH:MM:SS'"
        kind, text = self.value(node)
        if kind != "string":
            raise self.type_error(field, node, wanted)
        for pattern, fmt in _DATETIME_FORMATS.items():
            if pattern.fullmatch(text):
                try:
                    return dt.datetime.strptime(text, fmt)
                except ValueError:
                    break
        raise self.type_error(field, node, wanted)

    def type_error(self, field: Field, node: exp.Expr, wanted: str) -> SpecError:
        return self.error(
            f"{field.name} is {field.type}: expected {wanted} at position "
            f"{self.position(node)}, found {self.describe(node)}"
        )


def _int_bound(op: str, bound: Decimal) -> tuple[str, int]:
    """An int64 column against a decimal, as the same test against an integer:
    `x < 10.5` is `x <= 10`, `x > 10.5` is `x >= 11`."""
    if bound == bound.to_integral_value():
        return op, int(bound)
    if op in ("<", "<="):
        return "<=", math.floor(bound)
    return ">=", math.ceil(bound)


_LITERALS: dict[str, Callable[[_Walk, Field, exp.Expr, str], Value]] = {
    "int64": _Walk.int_literal,
    "float64": _Walk.float_literal,
    "string": _Walk.string_literal,
    "timestamp[us]": _Walk.datetime_literal,
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
