"""Filters' text to their AST (`dppipeline.spec.filters`, whose docstring gives the grammar):
sqlglot's tokenizer and parser, then an allow-list walk. A module of its own so that sqlglot
(0.2 s of start-up) is imported only by a job that has a filter."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import ClassVar

from sqlglot import expressions as exp
from sqlglot.dialects.mysql import MySQL
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokenizer_core import Token, TokenType

from dppipeline.errors import SpecError, excerpt
from dppipeline.spec.filters import (
    _DATETIME_FORMATS,
    INT64_MAX,
    INT64_MIN,
    MAX_DEPTH,
    MAX_FILTER_CHARS,
    MAX_FILTER_TERMS,
    MAX_IN_VALUES,
    And,
    Compare,
    FilterExpr,
    InRange,
    InSet,
    Not,
    Or,
    Value,
    _value_text,
)
from dppipeline.spec.schema import Field, Schema

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
