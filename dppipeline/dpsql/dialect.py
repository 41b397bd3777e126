"""The DP SQL dialect read into plain values: statements, OPTIONS, select items, keys, joins.

sqlglot (30.x, BigQuery dialect) tokenizes the text and gives each token its offset, but its
parser fails on `SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(...)` and on `name => (lo, hi)`
arguments. So the statement is read here, over sqlglot's tokens, by a small recursive-descent
reader of exactly the grammar the job spec can express:

    SELECT WITH DIFFERENTIAL_PRIVACY [OPTIONS (name = value, ...)]
        item, ...                      -- keys and DP aggregates, each [AS alias]
    FROM table                         -- a shipped input schema's name
    [RIGHT [OUTER] JOIN keys USING (column)] ...   -- public partitions
    [WHERE condition]                  -- the spec's filter (parsed by spec/filter_parser.py)
    [GROUP BY key, ...]

Everything else is refused where it stands (`SqlError` at its line:column), never skipped:
what a reader does not understand must not be released. `compile.py` maps the values read
here to the spec.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sqlglot.dialects.bigquery import BigQuery
from sqlglot.errors import TokenError
from sqlglot.tokenizer_core import Token, TokenType

from dppipeline.dpsql.errors import SqlError
from dppipeline.errors import excerpt

AGGREGATES = (
    "COUNT",
    "SUM",
    "AVG",
    "VARIANCE",
    "VAR_POP",
    "STDDEV",
    "STDDEV_POP",
    "PERCENTILE_CONT",
    "MAX",
    "MIN",
)
BOUND_ARGUMENTS = ("contribution_bounds_per_group", "contribution_bounds_per_row")
TRUNC_FUNCTIONS = ("DATE_TRUNC", "TIMESTAMP_TRUNC", "DATETIME_TRUNC")
KEY_FORMS = (
    "a column, DATE_TRUNC/TIMESTAMP_TRUNC(time column, HOUR|DAY|ISOWEEK|MONTH|YEAR) or "
    "RANGE_BUCKET(column, [e0, e1, ...])"
)
SUPPORTED_ITEMS = f"select items are keys ({KEY_FORMS}) and the aggregates " + ", ".join(AGGREGATES)
_CLAUSES_REFUSED = {
    TokenType.HAVING: (
        "HAVING",
        "filters on noisy results; not supported (filter rows with WHERE)",
    ),
    TokenType.ORDER_BY: ("ORDER BY", "not supported (a release is a set of rows; sort after)"),
    TokenType.LIMIT: ("LIMIT", "would choose rows by their values; not supported"),
    TokenType.QUALIFY: ("QUALIFY", "not supported (window functions are not DP aggregates)"),
    TokenType.WINDOW: ("WINDOW", "not supported (window functions are not DP aggregates)"),
    TokenType.UNION: ("UNION", "not supported (write several SELECTs separated by ';': one job)"),
    TokenType.EXCEPT: ("EXCEPT", "not supported (one SELECT per query)"),
    TokenType.INTERSECT: ("INTERSECT", "not supported (one SELECT per query)"),
    TokenType.OFFSET: ("OFFSET", "not supported"),
}
_NAME_TOKENS = (TokenType.VAR, TokenType.IDENTIFIER)
_JOIN_WORDS = (
    TokenType.JOIN,
    TokenType.LEFT,
    TokenType.RIGHT,
    TokenType.INNER,
    TokenType.OUTER,
    TokenType.FULL,
    TokenType.CROSS,
    TokenType.NATURAL,
)
_STATEMENT_END = (TokenType.SEMICOLON,)
_MAX_TOKENS = 200_000  # a DP query is a few hundred tokens; long key lists belong in key files


@dataclass(frozen=True)
class Position:
    """Line and column (both from 1) of an offset into the query text."""

    line: int
    column: int

    @staticmethod
    def of(text: str, offset: int) -> Position:
        line = text.count("\n", 0, offset) + 1
        return Position(line, offset - (text.rfind("\n", 0, offset) + 1) + 1)


@dataclass(frozen=True)
class Located:
    """A value read from the text and where it starts."""

    value: Any
    at: int  # offset into the text


@dataclass(frozen=True)
class KeyExpr:
    """A partition key: `column`, a time truncation (`part`) or a bucket (`edges`)."""

    column: str
    at: int
    part: str | None = None  # HOUR, DAY, ISOWEEK, MONTH, YEAR (upper case)
    edges: tuple[float, ...] | None = None
    function: str | None = None  # DATE_TRUNC, ... or RANGE_BUCKET as written


@dataclass(frozen=True)
class Aggregate:
    """A DP aggregate call: `function` upper case, its column (None for COUNT(*)), DISTINCT,
    PERCENTILE_CONT's fraction and the contribution bounds argument."""

    function: str
    at: int
    column: str | None = None
    column_at: int = 0
    distinct: bool = False
    fraction: Located | None = None
    bounds: tuple[str, float, float, int] | None = None  # (argument, lo, hi, offset)


@dataclass(frozen=True)
class SelectItem:
    """One select item: a key or an aggregate, and its alias."""

    expr: KeyExpr | Aggregate
    alias: Located | None = None


@dataclass(frozen=True)
class KeyJoin:
    """`RIGHT [OUTER] JOIN <keys> USING (column)`: the public keys of one key column."""

    source: Any  # a file path, 'A..B', 'input_range' or a list of keys
    column: str
    at: int
    column_at: int


@dataclass
class DPSelect:
    """One `SELECT WITH DIFFERENTIAL_PRIVACY` statement, as read."""

    at: int
    options: dict[str, Located] = field(default_factory=dict)
    option_names_at: dict[str, int] = field(default_factory=dict)
    options_at: int = 0  # OPTIONS, or where it belongs (the first select item) when absent
    items: list[SelectItem] = field(default_factory=list)
    table: Located | None = None
    joins: list[KeyJoin] = field(default_factory=list)
    where: Located | None = None  # the filter's text, one line
    where_offsets: tuple[tuple[int, int], ...] = ()  # (offset in filter, offset in text)
    group_by: list[KeyExpr] = field(default_factory=list)


def read_statements(text: str) -> list[DPSelect]:
    """Every `;`-separated statement of `text`, read; SqlError (line:column) at the first
    construct the dialect does not have."""
    tokens = _tokenize(text)
    statements: list[list[Token]] = [[]]
    for token in tokens:
        if token.token_type in _STATEMENT_END:
            statements.append([])
        else:
            statements[-1].append(token)
    read = [_Reader(text, body).statement() for body in statements if body]
    if not read:
        raise _error(
            text,
            0,
            "query",
            "empty: expected SELECT WITH DIFFERENTIAL_PRIVACY ...",
        )
    return read


def _error(text: str, offset: int, construct: str, rule: str) -> SqlError:
    where = Position.of(text, offset)
    return SqlError(where.line, where.column, construct, rule)


def _tokenize(text: str) -> list[Token]:
    """sqlglot's BigQuery tokens; an unterminated string or comment is a SqlError at its
    start (sqlglot's own error names a line but quotes the text)."""
    if len(text) > 1_000_000:
        raise _error(
            text,
            1_000_000,
            "query",
            "longer than 1,000,000 characters; long key lists belong in a key file",
        )
    try:
        tokens: list[Token] = BigQuery().tokenize(text)
    except TokenError:
        raise _error(
            text, _unterminated(text), "text", "an unterminated string, quoted name or comment"
        ) from None
    if len(tokens) > _MAX_TOKENS:
        raise _error(
            text,
            tokens[_MAX_TOKENS].start,
            "query",
            f"more than {_MAX_TOKENS:,} tokens; long key lists belong in a key file",
        )
    return tokens


def _unterminated(text: str) -> int:
    """Offset of the quote or comment that never ends (a best effort, for the position)."""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "'\"`":
            end = text.find(ch, i + 1)
            if end < 0:
                return i
            i = end + 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                return i
            i = end + 2
        elif text.startswith("--", i) or ch == "#":
            end = text.find("\n", i)
            i = len(text) if end < 0 else end + 1
        else:
            i += 1
    return 0


def _word(token: Token | None) -> str:
    return "" if token is None else token.text.upper()


def _shown(token: Token) -> str:
    """How a message names a token: its text, quoted and cut (`errors.excerpt`)."""
    return excerpt(token.text, limit=30)


class _Reader:
    """A cursor over one statement's tokens."""

    def __init__(self, text: str, tokens: list[Token]):
        self.text = text
        self.tokens = tokens
        self.i = 0

    # --- cursor -------------------------------------------------------------------------------

    def peek(self, k: int = 0) -> Token | None:
        j = self.i + k
        return self.tokens[j] if j < len(self.tokens) else None

    def take(self) -> Token:
        token = self.peek()
        if token is None:
            raise self.fail_at_end("query", "ends too early")
        self.i += 1
        return token

    def fail(self, token: Token, construct: str, rule: str) -> SqlError:
        return _error(self.text, token.start, construct, rule)

    def fail_at_end(self, construct: str, rule: str) -> SqlError:
        last = self.tokens[-1]
        return _error(self.text, last.end + 1, construct, rule)

    def expect(self, kind: TokenType, what: str, context: str) -> Token:
        token = self.peek()
        if token is None:
            raise self.fail_at_end(context, f"expected {what}, the statement ends")
        if token.token_type != kind:
            raise self.fail(token, _shown(token), f"expected {what} in {context}")
        return self.take()

    def name(self, context: str) -> Token:
        """A column or other name: an identifier, or a word sqlglot knows as a keyword that
        BigQuery accepts as a name (`day`, `count`)."""
        token = self.peek()
        if token is None:
            raise self.fail_at_end(context, "expected a name, the statement ends")
        if token.token_type in _NAME_TOKENS or (
            token.text.isidentifier() and token.token_type not in _RESERVED
        ):
            return self.take()
        raise self.fail(token, _shown(token), f"expected a name in {context}")

    def kind(self, k: int = 0) -> TokenType | None:
        token = self.peek(k)
        return None if token is None else token.token_type

    def at_word(self, *words: str) -> bool:
        return _word(self.peek()) in words

    # --- statement ----------------------------------------------------------------------------

    def statement(self) -> DPSelect:
        first = self.take()
        if first.token_type != TokenType.SELECT:
            raise self.fail(
                first,
                _shown(first),
                "a statement must be SELECT WITH "
                "DIFFERENTIAL_PRIVACY ... (no other statements, no WITH clauses)",
            )
        select = DPSelect(at=first.start)
        token = self.peek()
        if token is not None and token.token_type == TokenType.DISTINCT:
            raise self.fail(
                token,
                "SELECT DISTINCT",
                "not supported: DISTINCT would release "
                "the data's values (use GROUP BY keys with public partitions)",
            )
        if not (
            token is not None
            and token.token_type == TokenType.WITH
            and _word(self.peek(1)) == "DIFFERENTIAL_PRIVACY"
        ):
            raise self.fail(
                token or first,
                "SELECT without WITH DIFFERENTIAL_PRIVACY",
                "would release exact values; write SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (...)",
            )
        self.i += 2
        if self.at_word("OPTIONS"):
            self.options(select)
        elif self.peek() is not None:
            select.options_at = self.tokens[self.i].start
        self.items(select)
        self.from_clause(select)
        self.where_clause(select)
        self.group_by(select)
        token = self.peek()
        if token is not None:
            self.refuse_clause(token)
        return select

    def refuse_clause(self, token: Token) -> None:
        refused = _CLAUSES_REFUSED.get(token.token_type)
        if refused is not None:
            raise self.fail(token, *refused)
        raise self.fail(
            token,
            _shown(token),
            "unexpected here; a DP query is SELECT WITH "
            "DIFFERENTIAL_PRIVACY ... FROM ... [WHERE ...] [GROUP BY ...]",
        )

    # --- OPTIONS ------------------------------------------------------------------------------

    def options(self, select: DPSelect) -> None:
        select.options_at = self.take().start
        self.expect(TokenType.L_PAREN, "'('", "OPTIONS")
        while True:
            name = self.name("OPTIONS")
            key = name.text.lower()
            if key in select.options:
                raise self.fail(name, f"option {excerpt(key)}", "given twice")
            self.expect(TokenType.EQ, "'='", f"option {excerpt(key)}")
            select.option_names_at[key] = name.start
            select.options[key] = self.option_value(key)
            token = self.take()
            if token.token_type == TokenType.R_PAREN:
                return
            if token.token_type != TokenType.COMMA:
                raise self.fail(token, _shown(token), "expected ',' or ')' in OPTIONS")

    def option_value(self, key: str) -> Located:
        token = self.peek()
        if token is None:
            raise self.fail_at_end(f"option {excerpt(key)}", "expected a value")
        if token.token_type in (TokenType.NUMBER, TokenType.DASH, TokenType.PLUS):
            value, at = self.number(f"option {excerpt(key)}")
            return Located(value, at)
        if token.token_type == TokenType.STRING:
            return Located(self.take().text, token.start)
        if token.token_type in (TokenType.TRUE, TokenType.FALSE):
            return Located(self.take().token_type == TokenType.TRUE, token.start)
        if token.token_type == TokenType.NULL:
            raise self.fail(token, f"option {excerpt(key)}", "NULL: leave the option out")
        if token.token_type in _NAME_TOKENS or token.text.isidentifier():
            return Located(self.take().text, token.start)
        raise self.fail(token, f"option {excerpt(key)}", "expected a number, a 'string' or a name")

    def number(self, context: str) -> tuple[int | float, int]:
        """A number literal with an optional sign: int when written as one."""
        token = self.take()
        start, sign = token.start, 1
        if token.token_type in (TokenType.DASH, TokenType.PLUS):
            sign = -1 if token.token_type == TokenType.DASH else 1
            token = self.take()
        if token.token_type != TokenType.NUMBER:
            raise self.fail(token, _shown(token), f"expected a number in {context}")
        try:
            value: int | float = (
                int(token.text) if re.fullmatch(r"\d+", token.text) else float(token.text)
            )
        except ValueError:
            raise self.fail(token, _shown(token), f"not a number in {context}") from None
        return sign * value, start

    # --- select list --------------------------------------------------------------------------

    def items(self, select: DPSelect) -> None:
        while True:
            token = self.peek()
            if token is None:
                raise self.fail_at_end("SELECT", "expected select items and FROM")
            if token.token_type == TokenType.FROM:
                raise self.fail(token, "FROM", "expected a select item before it")
            expr = self.item_expr()
            alias = self.alias()
            select.items.append(SelectItem(expr, alias))
            token = self.peek()
            if token is not None and token.token_type == TokenType.COMMA:
                self.take()
                continue
            if token is None:
                raise self.fail_at_end("SELECT", "expected FROM after the select items")
            if token.token_type == TokenType.FROM:
                return
            raise self.fail(
                token,
                _shown(token),
                f"unexpected in the select list; {SUPPORTED_ITEMS}, each [AS alias]",
            )

    def alias(self) -> Located | None:
        token = self.peek()
        if token is None:
            return None
        if token.token_type == TokenType.ALIAS:
            self.take()
            name = self.name("AS")
            return Located(name.text, name.start)
        if token.token_type in _NAME_TOKENS:
            self.take()
            return Located(token.text, token.start)
        return None

    def item_expr(self) -> KeyExpr | Aggregate:
        token = self.peek()
        assert token is not None
        if token.token_type == TokenType.STAR:
            raise self.fail(token, "SELECT *", "would release the rows; " + SUPPORTED_ITEMS)
        if token.token_type == TokenType.L_PAREN:
            if self.kind(1) == TokenType.SELECT:
                raise self.fail(
                    token, "subquery", "not supported: one SELECT reads the input table directly"
                )
            raise self.fail(token, "'('", "expressions are not supported; " + SUPPORTED_ITEMS)
        after = self.peek(1)
        calls = after is not None and after.token_type == TokenType.L_PAREN
        if calls and _word(token) in AGGREGATES:
            return self.aggregate()
        if calls or _word(token) in ("CASE", "CAST", "IF"):
            return self.key_function()
        if token.token_type in (TokenType.NUMBER, TokenType.STRING):
            raise self.fail(
                token, "a constant", "a select item is a key or an aggregate; " + SUPPORTED_ITEMS
            )
        name = self.name("the select list")
        return KeyExpr(name.text, name.start)

    def key_function(self) -> KeyExpr:
        token = self.take()
        function = token.text.upper()
        if function in TRUNC_FUNCTIONS:
            self.expect(TokenType.L_PAREN, "'('", function)
            column = self.name(function)
            self.expect(TokenType.COMMA, "','", function)
            part_token = self.name(function)
            part = part_token.text.upper()
            if part == "WEEK" and self.kind() == TokenType.L_PAREN:
                self.take()
                day = self.name("WEEK(...)")
                self.expect(TokenType.R_PAREN, "')'", "WEEK(...)")
                part = "ISOWEEK" if day.text.upper() == "MONDAY" else f"WEEK({day.text.upper()})"
            self.expect(TokenType.R_PAREN, "')'", function)
            return KeyExpr(column.text, token.start, part=part, function=function)
        if function == "RANGE_BUCKET":
            self.expect(TokenType.L_PAREN, "'('", function)
            column = self.name(function)
            self.expect(TokenType.COMMA, "','", function)
            self.expect(TokenType.L_BRACKET, "'[' (the bucket edges)", function)
            edges = [float(self.number("RANGE_BUCKET's edges")[0])]
            while self.kind() == TokenType.COMMA:
                self.take()
                edges.append(float(self.number("RANGE_BUCKET's edges")[0]))
            self.expect(TokenType.R_BRACKET, "']'", function)
            self.expect(TokenType.R_PAREN, "')'", function)
            return KeyExpr(column.text, token.start, edges=tuple(edges), function=function)
        if self.kind() == TokenType.L_PAREN and self._over_follows(self.i - 1):
            raise self.fail(
                token,
                f"window function {excerpt(function)}",
                "not supported: window functions are not DP aggregates",
            )
        raise self.fail(token, f"function {excerpt(function)}", "not supported; " + SUPPORTED_ITEMS)

    def _over_follows(self, name_at: int | None = None) -> bool:
        """Whether the call whose name is at `name_at` (the cursor) is followed by OVER."""
        depth, j = 0, (self.i if name_at is None else name_at) + 1
        while j < len(self.tokens):
            kind = self.tokens[j].token_type
            depth += kind == TokenType.L_PAREN
            depth -= kind == TokenType.R_PAREN
            j += 1
            if depth == 0:
                break
        return j < len(self.tokens) and self.tokens[j].token_type == TokenType.OVER

    def aggregate(self) -> Aggregate:
        if self._over_follows():
            token = self.peek()
            assert token is not None
            raise self.fail(
                token,
                f"window function {token.text.upper()}(...) OVER",
                "not supported: a DP aggregate groups by the GROUP BY keys",
            )
        token = self.take()
        function = token.text.upper()
        self.take()  # '('
        inner = self.peek()
        if inner is None:
            raise self.fail_at_end(function, "expected its arguments")
        distinct = inner.token_type == TokenType.DISTINCT
        if distinct:
            self.take()
            if function != "COUNT":
                raise self.fail(
                    inner, f"{function}(DISTINCT ...)", "not supported: only COUNT takes DISTINCT"
                )
        column: str | None = None
        first = self.peek()
        column_at = first.start if first is not None else token.start
        if first is not None and first.token_type == TokenType.STAR and not distinct:
            if function != "COUNT":
                raise self.fail(first, f"{function}(*)", "only COUNT takes *")
            self.take()
        else:
            column = self.name(f"{function}(...)").text
            nxt = self.peek()
            if nxt is not None and nxt.token_type not in (TokenType.COMMA, TokenType.R_PAREN):
                raise self.fail(
                    nxt,
                    _shown(nxt),
                    f"{function} aggregates a column; expressions are not supported",
                )
        fraction: Located | None = None
        bounds: tuple[str, float, float, int] | None = None
        while True:
            token_ = self.take()
            if token_.token_type == TokenType.R_PAREN:
                break
            if token_.token_type != TokenType.COMMA:
                raise self.fail(token_, _shown(token_), f"expected ',' or ')' in {function}")
            arg = self.peek()
            if arg is None:
                raise self.fail_at_end(function, "expected an argument")
            if (
                function == "PERCENTILE_CONT"
                and fraction is None
                and arg.token_type in (TokenType.NUMBER, TokenType.DASH)
            ):
                value, at = self.number("PERCENTILE_CONT")
                fraction = Located(value, at)
                continue
            if bounds is not None:
                raise self.fail(
                    arg, _shown(arg), f"{function} takes one contribution bounds argument"
                )
            bounds = self.bounds_argument(function)
        if function == "PERCENTILE_CONT" and fraction is None:
            raise self.fail(
                token,
                "PERCENTILE_CONT",
                "needs the percentile as its second argument, a number in [0, 1]",
            )
        return Aggregate(function, token.start, column, column_at, distinct, fraction, bounds)

    def bounds_argument(self, function: str) -> tuple[str, float, float, int]:
        name = self.name(function)
        key = name.text.lower()
        if key not in BOUND_ARGUMENTS:
            raise self.fail(
                name,
                f"argument {excerpt(name.text)}",
                f"{function} takes {' or '.join(BOUND_ARGUMENTS)} => (lo, hi)",
            )
        self.expect(TokenType.FARROW, "'=>'", key)
        self.expect(TokenType.L_PAREN, "'(' (lo, hi)", key)
        low, _ = self.number(key)
        self.expect(TokenType.COMMA, "','", key)
        high, _ = self.number(key)
        self.expect(TokenType.R_PAREN, "')'", key)
        return key, float(low), float(high), name.start

    # --- FROM, joins --------------------------------------------------------------------------

    def from_clause(self, select: DPSelect) -> None:
        self.take()  # FROM
        token = self.peek()
        if token is None:
            raise self.fail_at_end("FROM", "expected the input table")
        if token.token_type == TokenType.L_PAREN:
            raise self.fail(
                token,
                "subquery",
                "not supported: FROM names the input table "
                "(its schema: transactions, book_transactions, card_payments)",
            )
        if token.token_type == TokenType.UNNEST:
            raise self.fail(token, "UNNEST", "not supported in FROM: FROM names the input table")
        table = self.name("FROM")
        if self.kind() == TokenType.DOT:
            raise self.fail(
                self.take(),
                "a qualified table name",
                "not supported: FROM names "
                "the input schema (transactions, book_transactions, card_payments)",
            )
        select.table = Located(table.text, table.start)
        self.alias()
        while True:
            token = self.peek()
            if token is None:
                return
            if token.token_type == TokenType.COMMA:
                raise self.fail(
                    token,
                    "a comma join",
                    "not supported: only RIGHT OUTER JOIN with a key table (public partitions)",
                )
            if token.token_type not in _JOIN_WORDS:
                return
            select.joins.append(self.key_join())

    def key_join(self) -> KeyJoin:
        start = self.peek()
        assert start is not None
        words = []
        while self.kind() in _JOIN_WORDS:
            words.append(self.take().text.upper())
        kind = " ".join(words)
        if kind not in ("RIGHT JOIN", "RIGHT OUTER JOIN"):
            raise self.fail(
                start,
                kind,
                "not supported: only RIGHT OUTER JOIN with a key "
                "table (its keys are the public partitions: every one released, no "
                "other), as BigQuery's public groups",
            )
        source, source_at = self.key_table()
        self.alias()
        token = self.peek()
        if token is None or token.token_type != TokenType.USING:
            at = token or start
            raise self.fail(at, "JOIN without USING", "a key table joins USING (key column)")
        self.take()
        self.expect(TokenType.L_PAREN, "'('", "USING")
        column = self.name("USING")
        token = self.peek()
        if token is not None and token.token_type == TokenType.COMMA:
            raise self.fail(
                token, "USING (a, b)", "one key column per key table: join one key table per column"
            )
        self.expect(TokenType.R_PAREN, "')'", "USING")
        return KeyJoin(source, column.text, source_at, column.start)

    def key_table(self) -> tuple[Any, int]:
        """A key table: a file (`path` in backquotes or quotes), `input_range`, or
        UNNEST(GENERATE_ARRAY(a, b)) / UNNEST([k1, k2, ...])."""
        token = self.peek()
        if token is None:
            raise self.fail_at_end("JOIN", "expected a key table")
        if token.token_type == TokenType.L_PAREN:
            raise self.fail(
                token,
                "subquery",
                "not supported as a key table: name a key "
                "file in backquotes, input_range or UNNEST(...)",
            )
        if token.token_type == TokenType.UNNEST:
            self.take()
            self.expect(TokenType.L_PAREN, "'('", "UNNEST")
            source = self.unnest_keys()
            self.expect(TokenType.R_PAREN, "')'", "UNNEST")
            return source, token.start
        if token.token_type in (TokenType.STRING, TokenType.IDENTIFIER):
            text = self.take().text
            return text, token.start
        if token.text.lower() == "input_range":
            self.take()
            return "input_range", token.start
        raise self.fail(
            token,
            f"JOIN {_shown(token)}",
            "joins with tables are not supported; "
            "a key table is a key file in backquotes (`keys.csv`), input_range or "
            "UNNEST(GENERATE_ARRAY(a, b)) / UNNEST([k1, k2, ...])",
        )

    def unnest_keys(self) -> Any:
        token = self.peek()
        if token is not None and _word(token) == "GENERATE_ARRAY":
            self.take()
            self.expect(TokenType.L_PAREN, "'('", "GENERATE_ARRAY")
            low, _ = self.number("GENERATE_ARRAY")
            self.expect(TokenType.COMMA, "','", "GENERATE_ARRAY")
            high, _ = self.number("GENERATE_ARRAY")
            if not (isinstance(low, int) and isinstance(high, int)):
                raise self.fail(token, "GENERATE_ARRAY", "takes two integers (a key range)")
            self.expect(TokenType.R_PAREN, "')'", "GENERATE_ARRAY (a step is not supported)")
            return f"{low}..{high}"
        self.expect(TokenType.L_BRACKET, "'[' or GENERATE_ARRAY", "UNNEST")
        keys: list[Any] = []
        while True:
            item = self.peek()
            if item is not None and item.token_type == TokenType.STRING:
                keys.append(self.take().text)
            else:
                keys.append(self.number("UNNEST's keys")[0])
            closing = self.take()
            if closing.token_type == TokenType.R_BRACKET:
                return keys
            if closing.token_type != TokenType.COMMA:
                raise self.fail(closing, _shown(closing), "expected ',' or ']' in UNNEST")

    # --- WHERE, GROUP BY ----------------------------------------------------------------------

    def where_clause(self, select: DPSelect) -> None:
        token = self.peek()
        if token is None or token.token_type != TokenType.WHERE:
            return
        self.take()
        body: list[Token] = []
        while self.kind() is not None and self.kind() not in _AFTER_WHERE:
            body.append(self.take())
        if not body:
            raise self.fail(token, "WHERE", "expected a condition")
        for inner in body:
            if inner.token_type == TokenType.SELECT:
                raise self.fail(
                    inner,
                    "subquery",
                    "not supported in WHERE: a filter compares columns with values",
                )
        pieces: list[str] = []
        offsets: list[tuple[int, int]] = []
        length = 0
        for k, inner in enumerate(body):
            if k and inner.start > body[k - 1].end + 1:
                pieces.append(" ")
                length += 1
            piece = self.text[inner.start : inner.end + 1]
            offsets.append((length, inner.start))
            pieces.append(piece)
            length += len(piece)
        select.where = Located("".join(pieces), body[0].start)
        select.where_offsets = tuple(offsets)

    def group_by(self, select: DPSelect) -> None:
        token = self.peek()
        if token is None or token.token_type != TokenType.GROUP_BY:
            return
        self.take()
        while True:
            token = self.peek()
            if token is None:
                raise self.fail_at_end("GROUP BY", "expected a key")
            if token.token_type == TokenType.NUMBER:
                raise self.fail(
                    token,
                    "GROUP BY position",
                    "name the key instead of its position in the select list",
                )
            if _word(token) in ("ROLLUP", "CUBE", "GROUPING"):
                raise self.fail(token, token.text.upper(), "not supported: one set of keys")
            after = self.peek(1)
            if after is not None and after.token_type == TokenType.L_PAREN:
                select.group_by.append(self.key_function())
            else:
                name = self.name("GROUP BY")
                select.group_by.append(KeyExpr(name.text, name.start))
            token = self.peek()
            if token is None or token.token_type != TokenType.COMMA:
                return
            self.take()


_AFTER_WHERE = (
    TokenType.GROUP_BY,
    TokenType.HAVING,
    TokenType.ORDER_BY,
    TokenType.LIMIT,
    TokenType.QUALIFY,
    TokenType.WINDOW,
    TokenType.UNION,
    TokenType.EXCEPT,
    TokenType.INTERSECT,
)
# Keyword tokens never taken for a name (a clause's start, operators' words).
_RESERVED = {
    TokenType.SELECT,
    TokenType.FROM,
    TokenType.WHERE,
    TokenType.GROUP_BY,
    TokenType.HAVING,
    TokenType.ORDER_BY,
    TokenType.LIMIT,
    TokenType.JOIN,
    TokenType.ON,
    TokenType.USING,
    TokenType.AND,
    TokenType.OR,
    TokenType.NOT,
    TokenType.IN,
    TokenType.DISTINCT,
    TokenType.WITH,
    TokenType.UNION,
    TokenType.ALIAS,
    TokenType.NULL,
    TokenType.TRUE,
    TokenType.FALSE,
    TokenType.CASE,
    TokenType.OVER,
    TokenType.QUALIFY,
    TokenType.WINDOW,
    *_JOIN_WORDS,
}
