"""The filter language: parsing, errors, canonical text, and the Polars and Spark compilers
checked row by row against the plain-Python evaluator."""

from __future__ import annotations

import ast
import datetime as dt
import inspect
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import REPO

import dppipeline.spec.filters as filters_module
from dppipeline.engines.kernel.polars_filter import to_polars
from dppipeline.engines.spark.types import to_spark_ddl
from dppipeline.errors import SpecError
from dppipeline.spec.filter_parser import parse_filter
from dppipeline.spec.filters import (
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
    any_of,
    columns,
    compile_filter,
    evaluate_row,
    membership_form,
    to_text,
)
from dppipeline.spec.schema import Field, Schema, transactions_schema

TX = transactions_schema()
# The transactions columns plus one string column, so that string literals are covered too.
SCHEMA = Schema(
    name="transactions_with_channel",
    description="",
    fields=(*TX.fields, Field("CHANNEL", "string", nullable=True, description="")),
)
WHERE = "queries.small_tx.filter"


def parse(text: str) -> FilterExpr:
    return parse_filter(text, SCHEMA, WHERE)


def at(hour: int = 0, day: int = 1, minute: int = 0, second: int = 0) -> dt.datetime:
    return dt.datetime(2026, 1, day, hour, minute, second)


AMOUNT_GE_25 = Compare("TX_AMOUNT", ">=", 25.0)
TERMINAL_1 = Compare("TERMINAL_ID", "=", 1)
WEB = Compare("CHANNEL", "=", "web")

# --- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("TX_AMOUNT >= 25", AMOUNT_GE_25),
        ("TX_AMOUNT>=25.0", AMOUNT_GE_25),
        ("TERMINAL_ID = 1", TERMINAL_1),
        ("TERMINAL_ID == 1", TERMINAL_1),
        ("TERMINAL_ID = 1.0", TERMINAL_1),
        ("TERMINAL_ID <> -7", Compare("TERMINAL_ID", "!=", -7)),
        ("TERMINAL_ID != -7", Compare("TERMINAL_ID", "!=", -7)),
        ("TX_AMOUNT < -0.5", Compare("TX_AMOUNT", "<", -0.5)),
        ("TX_AMOUNT > 0.1", Compare("TX_AMOUNT", ">", 0.1)),
        # An int64 column against a decimal: the same test against an integer.
        ("TERMINAL_ID < 10.5", Compare("TERMINAL_ID", "<=", 10)),
        ("TERMINAL_ID <= 10.5", Compare("TERMINAL_ID", "<=", 10)),
        ("TERMINAL_ID > 10.5", Compare("TERMINAL_ID", ">=", 11)),
        ("TERMINAL_ID >= -2.5", Compare("TERMINAL_ID", ">=", -2)),
        ("TERMINAL_ID < 10.0", Compare("TERMINAL_ID", "<", 10)),
        (f"TRANSACTION_ID <= {INT64_MAX}", Compare("TRANSACTION_ID", "<=", INT64_MAX)),
        (f"TRANSACTION_ID >= {INT64_MIN}", Compare("TRANSACTION_ID", ">=", INT64_MIN)),
        ("CHANNEL = 'web'", WEB),
        ('CHANNEL = "web"', WEB),
        ("CHANNEL = 'o''hare'", Compare("CHANNEL", "=", "o'hare")),
        ('CHANNEL = "o\'hare"', Compare("CHANNEL", "=", "o'hare")),
        ('CHANNEL = "say ""hi"""', Compare("CHANNEL", "=", 'say "hi"')),
        ("CHANNEL = ''", Compare("CHANNEL", "=", "")),
        ("CHANNEL < 'and or not'", Compare("CHANNEL", "<", "and or not")),
        ("TX_DATETIME >= '2026-01-02'", Compare("TX_DATETIME", ">=", at(day=2))),
        ("TX_DATETIME < '2026-01-02 13:45:10'", Compare("TX_DATETIME", "<", at(13, 2, 45, 10))),
        ("TERMINAL_ID in (3, 1, 2, 3)", InSet("TERMINAL_ID", (1, 2, 3), negated=False)),
        ("TERMINAL_ID in [1,2]", InSet("TERMINAL_ID", (1, 2), negated=False)),
        ("TERMINAL_ID in (7)", InSet("TERMINAL_ID", (7,), negated=False)),
        ("CHANNEL not in ('a', \"b\")", InSet("CHANNEL", ("a", "b"), negated=True)),
        ("TX_AMOUNT in (50.5, 25)", InSet("TX_AMOUNT", (25.0, 50.5), negated=False)),
        (
            "TX_DATETIME in ('2026-01-02', '2026-01-01 12:00:00')",
            InSet("TX_DATETIME", (at(12), at(day=2)), negated=False),
        ),
        ("TERMINAL_ID in 1..100", InRange("TERMINAL_ID", 1, 100, negated=False)),
        ("TERMINAL_ID in 7..7", InRange("TERMINAL_ID", 7, 7, negated=False)),
        ("TERMINAL_ID not in -5..-1", InRange("TERMINAL_ID", -5, -1, negated=True)),
        ("TX_AMOUNT between 25 and 50", InRange("TX_AMOUNT", 25.0, 50.0, negated=False)),
        ("TX_AMOUNT not between 2.5 and 2.5", InRange("TX_AMOUNT", 2.5, 2.5, negated=True)),
        ("TERMINAL_ID between 1.0 and 3", InRange("TERMINAL_ID", 1, 3, negated=False)),
        ("CHANNEL between 'a' and 'm'", InRange("CHANNEL", "a", "m", negated=False)),
        (
            "TX_DATETIME between '2026-01-01' and '2026-01-02 12:30:00'",
            InRange("TX_DATETIME", at(), at(12, 2, 30), negated=False),
        ),
    ],
)
def test_parses_each_construct(text, expected):
    assert parse(text) == expected


A, B, C = "TERMINAL_ID = 1", "TX_AMOUNT >= 25", "CHANNEL = 'web'"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"{A} or {B} and {C}", Or((TERMINAL_1, And((AMOUNT_GE_25, WEB))))),
        (f"{A} and {B} or {C}", Or((And((TERMINAL_1, AMOUNT_GE_25)), WEB))),
        (f"({A} or {B}) and {C}", And((Or((TERMINAL_1, AMOUNT_GE_25)), WEB))),
        (f"{A} and ({B} or {C})", And((TERMINAL_1, Or((AMOUNT_GE_25, WEB))))),
        (f"not {A} and {B}", And((Not(TERMINAL_1), AMOUNT_GE_25))),
        (f"not ({A} and {B})", Not(And((TERMINAL_1, AMOUNT_GE_25)))),
        (f"not {A} or not {B}", Or((Not(TERMINAL_1), Not(AMOUNT_GE_25)))),
        (f"not not {A}", Not(Not(TERMINAL_1))),
        (f"{A} and ({B} and {C})", And((TERMINAL_1, AMOUNT_GE_25, WEB))),  # flattened
        (f"(({A}) or (({B} or {C})))", Or((TERMINAL_1, AMOUNT_GE_25, WEB))),
        (
            "TX_AMOUNT between 1 and 2 and TERMINAL_ID = 1",  # `and` of between, then logical
            And((InRange("TX_AMOUNT", 1.0, 2.0, negated=False), TERMINAL_1)),
        ),
    ],
)
def test_precedence_and_parentheses(text, expected):
    assert parse(text) == expected


def test_keywords_are_case_insensitive():
    lower = "not TERMINAL_ID in (1, 2) and TX_AMOUNT between 1 and 2 or TERMINAL_ID not in 1..5"
    mixed = "NOT TERMINAL_ID IN (1, 2) AnD TX_AMOUNT BETWEEN 1 And 2 Or TERMINAL_ID NoT In 1..5"
    assert parse(mixed) == parse(lower)
    assert isinstance(parse(lower), Or)


def test_column_names_are_case_sensitive():
    with pytest.raises(SpecError) as error:
        parse("terminal_id = 1")
    assert "unknown column 'terminal_id' at position 1" in error.value.rule
    assert "did you mean 'TERMINAL_ID'" in error.value.rule


def test_ast_is_immutable_and_hashable():
    expr = parse("TERMINAL_ID in (2, 1) and TX_AMOUNT > 3")
    with pytest.raises(AttributeError):
        expr.items = ()  # type: ignore[misc]
    assert parse("( TERMINAL_ID = 1 )") == TERMINAL_1
    assert {expr, parse("TERMINAL_ID IN [1,2,2] AND TX_AMOUNT > 3.0")} == {expr}


def test_and_or_need_two_items():
    with pytest.raises(ValueError, match="at least two"):
        And((TERMINAL_1,))
    with pytest.raises(ValueError, match="at least two"):
        Or(())


# --- canonical text --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("TX_AMOUNT>=25", "TX_AMOUNT >= 25.0"),
        ("TERMINAL_ID <> 3", "TERMINAL_ID != 3"),
        ("TERMINAL_ID in [3,1, 2]", "TERMINAL_ID in (1, 2, 3)"),
        ("TERMINAL_ID NOT IN 1..100", "TERMINAL_ID not between 1 and 100"),
        ('CHANNEL = "o\'hare"', "CHANNEL = 'o''hare'"),
        ("TX_DATETIME < '2026-01-02'", "TX_DATETIME < '2026-01-02 00:00:00'"),
        (f"NOT {A} AND ({B} OR {C})", f"not ({A}) and (TX_AMOUNT >= 25.0 or {C})"),
        (f"{A} and {B} or {C}", f"{A} and TX_AMOUNT >= 25.0 or {C}"),
        ("TX_AMOUNT < 0.0000001", "TX_AMOUNT < 0.0000001"),
        ("TX_AMOUNT < 100000000000000000000", "TX_AMOUNT < 100000000000000000000.0"),
    ],
)
def test_to_text_is_canonical_and_round_trips(text, canonical):
    expr = parse(text)
    assert to_text(expr) == canonical
    assert parse(to_text(expr)) == expr


def _value(field: Field) -> st.SearchStrategy:
    if field.type == "int64":
        return st.integers(INT64_MIN, INT64_MAX)
    if field.type == "float64":
        return st.floats(allow_nan=False, allow_infinity=False)
    if field.type == "string":
        return st.text(max_size=8)
    return st.datetimes(dt.datetime(1000, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59)).map(
        lambda d: d.replace(microsecond=0)
    )


def _predicate(field: Field) -> st.SearchStrategy:
    value = _value(field)
    ops = st.sampled_from(["=", "!=", "<", "<=", ">", ">="])
    return st.one_of(
        st.builds(Compare, st.just(field.name), ops, value),
        st.builds(
            InSet,
            st.just(field.name),
            st.lists(value, min_size=1, max_size=4).map(tuple),
            st.booleans(),
        ),
        st.builds(
            lambda pair, negated: InRange(field.name, *sorted(pair), negated=negated),
            st.lists(value, min_size=2, max_size=2),
            st.booleans(),
        ),
    )


EXPRESSIONS = st.recursive(
    st.one_of([_predicate(f) for f in SCHEMA.fields]),
    lambda children: st.one_of(
        st.lists(children, min_size=2, max_size=3).map(lambda xs: And(tuple(xs))),
        st.lists(children, min_size=2, max_size=3).map(lambda xs: Or(tuple(xs))),
        children.map(Not),
    ),
    max_leaves=10,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EXPRESSIONS)
def test_any_ast_round_trips_through_text(expr):
    text = to_text(expr)
    assert parse(text) == expr
    assert to_text(parse(text)) == text


FRAGMENTS = [
    "TX_AMOUNT",
    "TERMINAL_ID",
    "TX_DATETIME",
    "CHANNEL",
    "NOPE",
    "and",
    "OR",
    "not",
    "in",
    "between",
    "(",
    ")",
    "[",
    "]",
    ",",
    "..",
    "=",
    "==",
    "!=",
    "<>",
    "<",
    "<=",
    ">",
    ">=",
    "1",
    "-2",
    "2.5",
    "1..5",
    "e5",
    "$",
    "'",
    '"y',
    "'x'",
    "'2026-01-02'",
    "'2026-13-01'",
    "\n",
]


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.lists(st.sampled_from(FRAGMENTS), max_size=10).map(" ".join),
        st.lists(st.sampled_from(FRAGMENTS), max_size=10).map("".join),
        st.text(max_size=30),
    )
)
def test_any_text_parses_or_fails_with_a_one_line_positioned_error(text):
    try:
        expr = parse(text)
    except SpecError as error:
        assert error.field == WHERE
        assert "at position " in error.rule
        assert "\n" not in error.rule
    else:
        assert parse(to_text(expr)) == expr


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "position", "words"),
    [
        ("TX_AMOUNTS > 5", 1, "unknown column 'TX_AMOUNTS'"),
        ("TX_AMOUNT > 5 or FOO = 1", 18, "(known: TRANSACTION_ID, TX_DATETIME, CUSTOMER_ID"),
        ("CHANNEL = 'web", 11, "unterminated string"),
        ("CHANNEL = \"web'", 11, "unterminated string"),
        ("TX_AMOUNT >=", 13, "expected a value after '>=' at position 13, found end of filter"),
        ("TX_AMOUNT >= and TERMINAL_ID = 1", 14, "expected a value after '>=' at position 14"),
        ("TX_AMOUNT => 5", 11, "unexpected '=>'"),
        ("TX_AMOUNT is 5", 1, "IS in the condition at position 1 is not allowed"),
        ("TX_AMOUNT ~ 5", 11, "unexpected '~'"),
        ("TX_AMOUNT not = 5", 11, "unexpected 'not'"),
        ("TX_AMOUNT = 'abc'", 13, "TX_AMOUNT is float64: expected a number"),
        ("TERMINAL_ID in ('a', 'b')", 17, "expected a number"),
        ("CHANNEL = 5", 11, "CHANNEL is string: expected a quoted string"),
        ("TERMINAL_ID = 2.5", 15, "'=' needs an integer"),
        ("TERMINAL_ID in (1, 2.5)", 20, "'in' needs an integer"),
        ("TERMINAL_ID between 1 and 2.5", 27, "'between' needs an integer"),
        ("TERMINAL_ID in 5..1", 16, "empty range"),
        ("TX_AMOUNT between 50 and 25", 19, "low 50.0 is greater than high 25.0"),
        ("TERMINAL_ID in 1.5..3", 16, "expected an integer range bound"),
        ("TERMINAL_ID in 1..3.5", 19, "expected an integer range bound"),
        ("TX_AMOUNT in 1..3", 14, "'in low..high' needs an int64 column"),
        ("TERMINAL_ID in 1", 17, "expected '..' after '1'"),
        ("TERMINAL_ID in 'x'", 16, "expected '(', '[' or an integer range"),
        ("TERMINAL_ID in (1, 2", 21, "unbalanced parenthesis: expected ')'"),
        ("TERMINAL_ID in [1, 2)", 21, "expected ',' or ']'"),
        ("TERMINAL_ID in ()", 1, "an 'in' list needs at least one value"),
        ("TX_AMOUNT between 1 or 2", 21, "expected 'and' after the low bound"),
        ("TX_AMOUNT > 5 TERMINAL_ID = 1", 27, "unexpected '='"),
        ("TX_AMOUNT > 5 and", 18, "expected a condition after 'and' at position 18, found end"),
        ("", 1, "empty filter"),
        ("   ", 4, "empty filter"),
        ("(TX_AMOUNT > 5", 15, "unbalanced parenthesis: expected ')'"),
        ("((TX_AMOUNT > 5) or TERMINAL_ID = 1", 36, "unbalanced parenthesis: expected ')'"),
        ("TX_AMOUNT > 5)", 14, "unbalanced parenthesis: ')' at position 14 closes nothing"),
        ("and = 1", 7, "expected a column name"),
        # the allow-list: sqlglot parses these, the filter grammar refuses them
        ("abs(TX_AMOUNT) > 1", 1, "function ABS() in the condition at position 1 is not"),
        ("TX_AMOUNT + 1 > 2", 1, "operator ADD in the condition at position 1 is not"),
        ("cast(TX_AMOUNT as int) > 1", 6, "function CAST() in the condition at position 6"),
        ("TX_AMOUNT > (select max(TX_AMOUNT) from t)", 21, "SUBQUERY in the condition"),
        ("TERMINAL_ID in (select 1)", 24, "expected '(', '[' or an integer range"),
        ("TX_AMOUNT is null", 1, "IS in the condition at position 1 is not allowed"),
        ("TX_AMOUNT > ?", 1, "PLACEHOLDER in the condition"),
        ("TX_AMOUNT > @limit", 1, "PARAMETER in the condition"),
        ("TERMINAL_ID = CUSTOMER_ID", 15, "found column 'CUSTOMER_ID'"),
        ("t.TX_AMOUNT > 1", 1, "expected a column name at position 1, found 't.TX_AMOUNT'"),
        ("`TX_AMOUNT` > 1", 1, "expected a column name at position 1"),
        ("TX_AMOUNT > 1; TERMINAL_ID = 2", 14, "a filter is one condition: ';' at position 14"),
        ("TX_AMOUNT > 1 -- and TERMINAL_ID < 9", 15, "filters hold no comments"),
        ("TX_AMOUNT > 1 /* x */", 15, "filters hold no comments"),
        ("TX_AMOUNT > 1 || TX_AMOUNT < 0", 15, "write 'or' or 'and'"),
        ("TX_AMOUNT like", 15, "LIKE is not allowed in a filter (the parser stopped at position"),
        ("TX_AMOUNT > 1 xor", 18, "XOR is not allowed in a filter (the parser stopped at position"),
        ("not " * 70 + "TX_AMOUNT > 1", 81, "nested deeper than 20"),
        ("not (" * 40 + "TX_AMOUNT > 1" + ")" * 40, 51, "nested deeper than 20"),
        ("TX_AMOUNT > " + "- " * 21 + "1", 53, "nested deeper than 20"),
        ("TX_AMOUNT > " + "{" * 21 + "1" + "}" * 21, 33, "nested deeper than 20"),
        # a tree as deep as the text is long, quoted from the text (sqlglot's generator would
        # recurse once per level)
        ("TX_AMOUNT > " + "x." * 20_000 + "y", 13, "operator DOT in the condition"),
        ("TX_AMOUNT > " + "1::int" * 10_000, 13, "function CAST() in the condition"),
        ("t." * 20_000 + "TX_AMOUNT > 1", 1, "operator DOT in the condition at position 1"),
        # an int64 literal's magnitude is checked before it becomes a (million-digit) int
        ("TERMINAL_ID = 1e999999999", 15, "number 1e999999999 at position 15 is out of the int64"),
        ("TERMINAL_ID < -1.5e999999999", 16, "is out of the int64 range"),
        ("TERMINAL_ID in 1..1" + "0" * 5000, 19, "is out of the int64 range"),
        ("TX_DATETIME >= 'yesterday'", 16, "expected a quoted date 'YYYY-MM-DD'"),
        ("TX_DATETIME >= '2026-02-30'", 16, "found string '2026-02-30'"),
        ("TX_DATETIME >= '2026-1-2'", 16, "expected a quoted date"),
        ("TX_DATETIME >= '2026-01-02T10:00:00'", 16, "expected a quoted date"),
        ("TX_DATETIME >= 20260102", 16, "expected a quoted date"),
        ("TERMINAL_ID = 9223372036854775808", 15, "out of the int64 range"),
        ("TX_AMOUNT > " + "9" * 400 + ".0", 13, "too large for float64"),
        ("(" * 100 + "TX_AMOUNT > 1" + ")" * 100, 21, "nested deeper than 20"),
        ("(" * 10_000 + "TX_AMOUNT > 1" + ")" * 10_000, 21, "nested deeper than 20"),
        ("TERMINAL_ID in " + "[" * 10_000, 36, "nested deeper than 20"),
    ],
)
def test_errors_name_position_and_rule(text, position, words):
    with pytest.raises(SpecError) as error:
        parse(text)
    assert error.value.field == WHERE
    assert f"at position {position}" in error.value.rule
    assert words in error.value.rule
    assert "\n" not in error.value.rule
    assert str(error.value).startswith(f"{WHERE}: ")


def test_error_uses_the_callers_location():
    with pytest.raises(SpecError) as error:
        parse_filter("X = 1", TX, "queries.other.filter")
    assert error.value.field == "queries.other.filter"
    assert error.value.rule.startswith("unknown column 'X' at position 1 (known: TRANSACTION_ID")


@pytest.mark.parametrize("name", ["filters.py", "filter_parser.py"])
def test_filters_module_is_engine_neutral_and_never_evaluates_text(name):
    tree = ast.parse((Path(filters_module.__file__).parent / name).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported, "no imports found: the check would pass vacuously"
    assert not imported & {"pyspark", "apache_beam", "polars", "pandas", "ast"}
    calls = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert "isinstance" in calls
    assert not calls & {"eval", "exec", "compile", "__import__"}


# --- columns and any_of ----------------------------------------------------------------------


def test_columns():
    assert columns(parse("TERMINAL_ID = 1")) == {"TERMINAL_ID"}
    expr = parse("not (TERMINAL_ID in 1..3 or CHANNEL = 'x') and TX_AMOUNT between 1 and 2")
    assert columns(expr) == {"TERMINAL_ID", "CHANNEL", "TX_AMOUNT"}


def test_any_of():
    a, b, c = TERMINAL_1, AMOUNT_GE_25, WEB
    assert any_of([a]) == a
    assert any_of([a, b]) == Or((a, b))
    assert any_of([a, a, b, a]) == Or((a, b))
    assert any_of([Or((a, b)), c]) == Or((a, b, c))
    assert any_of([a, None]) is None
    assert any_of([None]) is None
    with pytest.raises(ValueError, match="at least one"):
        any_of([])


# --- evaluation: the oracle and the engines --------------------------------------------------

N_ROWS = 3000
POLARS_SCHEMA = {
    "TRANSACTION_ID": pl.Int64,
    "TX_DATETIME": pl.Datetime("us"),
    "CUSTOMER_ID": pl.Int64,
    "TERMINAL_ID": pl.Int64,
    "TX_AMOUNT": pl.Float64,
    "CHANNEL": pl.String,
}

EQUIVALENCE_FILTERS = [
    "TERMINAL_ID in 1..40",
    "TERMINAL_ID not in 10..90",
    "TERMINAL_ID < 10.5 or TERMINAL_ID > 110.5",
    "TX_AMOUNT >= 25 and TX_AMOUNT < 50",
    "TX_AMOUNT between 25 and 50",
    "TX_AMOUNT not between 10.5 and 140",
    "TX_AMOUNT = 25",
    "TX_AMOUNT in (25, 50, 75.25)",
    "CUSTOMER_ID in (1, 5, 7, 11, 42, 199)",
    "CUSTOMER_ID not in [1, 2, 3] and TERMINAL_ID <> 3 and TERMINAL_ID != 4",
    "TRANSACTION_ID between 100 and 2500 and not not TX_AMOUNT <= 75.25",
    "TX_DATETIME >= '2026-01-02' and TX_DATETIME < '2026-01-03'",
    "TX_DATETIME between '2026-01-01 06:00:00' and '2026-01-01 18:00:00'",
    "TX_DATETIME = '2026-01-02'",
    "TX_DATETIME in ('2026-01-02', '2026-01-03 00:00:00', '2026-01-01 06:00:00')",
    "TX_DATETIME <= '2026-01-01 12:00:00' OR TX_DATETIME > '2026-01-03 12:00:00'",
    "TX_DATETIME not between '2026-01-02' and '2026-01-04'",
    "not (TERMINAL_ID in 1..60 or TX_AMOUNT > 100) and CUSTOMER_ID != 7",
    "CHANNEL = 'web' or CHANNEL = 'o''hare'",
    "CHANNEL not in ('atm', 'pos') and CHANNEL >= 'o'",
    "(TERMINAL_ID in (1, 2, 3) or CHANNEL between 'a' and 'p') and TX_AMOUNT > 100.5",
]


@pytest.fixture(scope="module")
def transactions() -> pl.DataFrame:
    """Random transactions over three days, with values placed on the filters' boundaries."""
    rng = np.random.default_rng(20260101)
    start = np.datetime64("2026-01-01T00:00:00", "us")
    offsets = rng.integers(0, 3 * 86_400_000_000, N_ROWS)
    offsets[rng.choice(N_ROWS, 60, replace=False)] //= 3_600_000_000  # some on the hour
    offsets[::61] = 86_400_000_000  # exactly 2026-01-02 00:00:00
    offsets[::67] = 6 * 3_600_000_000  # exactly 2026-01-01 06:00:00
    amounts = np.round(rng.uniform(0, 150, N_ROWS), 2)
    amounts[::53] = 25.0
    amounts[::59] = 50.0
    amounts[::71] = 75.25
    frame = pl.DataFrame(
        {
            "TRANSACTION_ID": np.arange(N_ROWS, dtype=np.int64),
            "TX_DATETIME": start + offsets.astype("timedelta64[us]"),
            "CUSTOMER_ID": rng.integers(0, 200, N_ROWS),
            "TERMINAL_ID": rng.integers(0, 120, N_ROWS),
            "TX_AMOUNT": amounts,
            "CHANNEL": rng.choice(["web", "pos", "atm", "o'hare", "mail"], N_ROWS),
        },
        schema=POLARS_SCHEMA,
    )
    assert frame.columns == SCHEMA.names
    return frame


def oracle(expr: FilterExpr, rows: list[dict]) -> list[bool]:
    return [evaluate_row(expr, row) for row in rows]


def test_oracle_on_hand_picked_rows():
    row = {"TERMINAL_ID": 5, "TX_AMOUNT": 25.0, "TX_DATETIME": at(day=2), "CHANNEL": "web"}
    assert evaluate_row(parse("TERMINAL_ID in 5..5 and TX_AMOUNT between 25 and 25"), row)
    assert not evaluate_row(parse("TERMINAL_ID not in 5..5 or TX_AMOUNT < 25"), row)
    assert evaluate_row(parse("TX_DATETIME = '2026-01-02' and CHANNEL in ('web')"), row)
    assert not evaluate_row(parse("TX_DATETIME > '2026-01-02' or not CHANNEL = 'web'"), row)
    assert evaluate_row(parse("TERMINAL_ID < 5.5 and TERMINAL_ID > 4.5"), row)


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("TX_AMOUNT > 1", False),  # null compares to unknown
        ("not TX_AMOUNT > 1", False),  # not unknown is unknown
        ("TX_AMOUNT > 1 or TERMINAL_ID = 1", True),  # unknown or true is true
        ("TX_AMOUNT > 1 and TERMINAL_ID = 1", False),
        ("not (TX_AMOUNT > 1 and TERMINAL_ID = 2)", True),  # not (unknown and false)
        ("TX_AMOUNT not in (1, 2) or CHANNEL not between 'a' and 'b'", False),
    ],
)
def test_nulls_follow_sql_logic(text, kept):
    row = {"TERMINAL_ID": 1, "TX_AMOUNT": None, "CHANNEL": None}
    assert evaluate_row(parse(text), row) is kept


NULL_ROWS = {
    "TRANSACTION_ID": [0, 1, 2, 3],
    "TX_DATETIME": [at(), None, at(day=2), None],
    "CUSTOMER_ID": [1, 2, 3, 4],
    "TERMINAL_ID": [1, None, 3, None],
    "TX_AMOUNT": [None, 5.0, 30.0, None],
    "CHANNEL": ["web", None, None, "pos"],
}
NULL_FILTERS = [
    "TX_AMOUNT > 1",
    "not TX_AMOUNT > 1",
    "TX_AMOUNT > 1 or TERMINAL_ID = 1",
    "not (TX_AMOUNT > 10 and TERMINAL_ID in 1..2)",
    "TERMINAL_ID not in (1, 2) or CHANNEL not between 'a' and 'q'",
    "not (TX_DATETIME >= '2026-01-02' or CHANNEL = 'web')",
]


def _polars_kept(frame: pl.DataFrame, expr: FilterExpr) -> list[bool]:
    kept = set(frame.filter(to_polars(expr))["TRANSACTION_ID"].to_list())
    return [i in kept for i in frame["TRANSACTION_ID"].to_list()]


def test_polars_equals_oracle(transactions):
    rows = transactions.to_dicts()
    masks = []
    for text in EQUIVALENCE_FILTERS:
        expr = parse(text)
        expected = oracle(expr, rows)
        assert 0 < sum(expected) < N_ROWS, f"{text!r} keeps all rows or none: a weak test"
        assert _polars_kept(transactions, expr) == expected, text
        masks.append(expected)
    union = any_of([parse(t) for t in EQUIVALENCE_FILTERS[:4]])
    expected_union = [any(m) for m in zip(*masks[:4], strict=True)]
    assert oracle(union, rows) == expected_union
    assert _polars_kept(transactions, union) == expected_union


def test_polars_equals_oracle_with_nulls():
    frame = pl.DataFrame(NULL_ROWS, schema=POLARS_SCHEMA)
    rows = frame.to_dicts()
    for text in NULL_FILTERS:
        expr = parse(text)
        assert _polars_kept(frame, expr) == oracle(expr, rows), text


@pytest.mark.usefixtures("spark")
@pytest.mark.parametrize("time_zone", ["UTC", "America/New_York", "Asia/Kolkata"])
def test_spark_equals_oracle(spark, transactions, time_zone):
    """timestamp_ntz literals must not move with the session time zone."""
    from dppipeline.engines.spark.filter import to_spark

    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", time_zone)
    try:
        frame = spark.createDataFrame(transactions.to_pandas(), schema=to_spark_ddl(SCHEMA))
        assert frame.schema["TX_DATETIME"].dataType.simpleString() == "timestamp_ntz"
        exprs = [parse(t) for t in EQUIVALENCE_FILTERS]
        result = (
            frame.select(
                "TRANSACTION_ID", *[to_spark(e).alias(f"f{i}") for i, e in enumerate(exprs)]
            )
            .toPandas()
            .sort_values("TRANSACTION_ID", ignore_index=True)
        )
        kept = frame.where(to_spark(exprs[11])).select("TRANSACTION_ID").toPandas()
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)
    assert result["TRANSACTION_ID"].tolist() == list(range(N_ROWS))
    rows = transactions.to_dicts()
    for i, (text, expr) in enumerate(zip(EQUIVALENCE_FILTERS, exprs, strict=True)):
        assert result[f"f{i}"].tolist() == oracle(expr, rows), f"{text!r} in {time_zone}"
    expected_ids = [r["TRANSACTION_ID"] for r in rows if evaluate_row(exprs[11], r)]
    assert sorted(kept["TRANSACTION_ID"].tolist()) == expected_ids


@pytest.mark.usefixtures("spark")
def test_spark_equals_oracle_with_nulls(spark):
    from dppipeline.engines.spark.filter import to_spark

    pdf = pd.DataFrame(
        {
            "TRANSACTION_ID": pd.array(NULL_ROWS["TRANSACTION_ID"], dtype="Int64"),
            "TX_DATETIME": pd.to_datetime(NULL_ROWS["TX_DATETIME"]).as_unit("us"),
            "CUSTOMER_ID": pd.array(NULL_ROWS["CUSTOMER_ID"], dtype="Int64"),
            "TERMINAL_ID": pd.array(NULL_ROWS["TERMINAL_ID"], dtype="Int64"),
            "TX_AMOUNT": pd.array(NULL_ROWS["TX_AMOUNT"], dtype="Float64"),
            "CHANNEL": pd.array(NULL_ROWS["CHANNEL"], dtype="string"),
        }
    )
    frame = spark.createDataFrame(pdf, schema=to_spark_ddl(SCHEMA).replace(" NOT NULL", ""))
    rows = [{k: v[i] for k, v in NULL_ROWS.items()} for i in range(4)]
    for text in NULL_FILTERS:
        expr = parse(text)
        kept = {r.TRANSACTION_ID for r in frame.where(to_spark(expr)).collect()}
        assert [r["TRANSACTION_ID"] in kept for r in rows] == oracle(expr, rows), text


# --- size limits, set membership and balanced trees ----------------------------------------


def or_chain(n: int, template: str = "TERMINAL_ID = {i}") -> str:
    return " or ".join(template.format(i=i) for i in range(n))


@pytest.mark.parametrize(
    ("text", "position", "words"),
    [
        pytest.param(
            "TX_AMOUNT > 1 and " + " " * MAX_FILTER_CHARS,
            f"{MAX_FILTER_CHARS + 1:,}",
            f"at most {MAX_FILTER_CHARS:,}",
            id="text",
        ),
        pytest.param(
            or_chain(MAX_FILTER_TERMS + 1, "TX_AMOUNT < {i}"),
            f"{len(or_chain(MAX_FILTER_TERMS, 'TX_AMOUNT < {i}')) + 5:,}",
            f"more than {MAX_FILTER_TERMS:,} conditions",
            id="conditions",
        ),
        pytest.param(
            "TERMINAL_ID in (" + ", ".join(str(i) for i in range(MAX_IN_VALUES + 1)) + ")",
            f"{len('TERMINAL_ID in (') + len(', '.join(map(str, range(MAX_IN_VALUES)))) + 3:,}",
            f"more than {MAX_IN_VALUES:,} values",
            id="in-values",
        ),
    ],
)
def test_size_limits_are_one_line_errors_at_parse_time(text, position, words):
    with pytest.raises(SpecError) as error:
        parse(text)
    assert error.value.field == WHERE
    assert f"at position {position})" in error.value.rule
    assert words in error.value.rule
    assert "\n" not in error.value.rule
    assert len(str(error.value)) < 300


def test_filters_at_the_limits_parse():
    assert isinstance(parse(or_chain(MAX_FILTER_TERMS, "TX_AMOUNT < {i}")), Or)
    many = parse("TERMINAL_ID in (" + ", ".join(map(str, range(MAX_IN_VALUES))) + ")")
    assert isinstance(many, InSet) and len(many.values) == MAX_IN_VALUES


def _called_from_depth(frames: int, call):
    """`call()` with the stack already `frames` deep, as from deep inside a caller."""
    if len(inspect.stack(0)) >= frames:
        return call()
    return _called_from_depth(frames, call)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "(" * MAX_DEPTH + "TX_AMOUNT > 1" + ")" * MAX_DEPTH,
            Compare("TX_AMOUNT", ">", 1.0),
        ),
        (
            "(" * (MAX_DEPTH - 1) + "TX_AMOUNT > -1" + ")" * (MAX_DEPTH - 1),
            Compare("TX_AMOUNT", ">", -1.0),
        ),
        ("not " * MAX_DEPTH + "TX_AMOUNT > 1", Compare("TX_AMOUNT", ">", 1.0)),
        (
            "not (" * (MAX_DEPTH // 2) + "TX_AMOUNT > 1" + ")" * (MAX_DEPTH // 2),
            Compare("TX_AMOUNT", ">", 1.0),
        ),
        (
            "(" * (MAX_DEPTH - 1) + "TERMINAL_ID in (1)" + ")" * (MAX_DEPTH - 1),
            InSet("TERMINAL_ID", (1,)),
        ),
    ],
)
def test_nesting_at_max_depth_parses_from_deep_in_a_caller(text, expected):
    """MAX_DEPTH is a promise: the deepest filter allowed parses with Python's default stack
    of 1,000 frames even when the caller already uses 400 of them."""
    assert sys.getrecursionlimit() == 1000
    parsed = _called_from_depth(400, lambda: parse(text))
    if text.startswith("not "):
        for _ in range(MAX_DEPTH if "(" not in text else MAX_DEPTH // 2):
            assert isinstance(parsed, Not)
            parsed = parsed.item
    assert parsed == expected


def test_nesting_the_count_misses_is_a_one_line_error_not_a_crash():
    """Nesting _check_nesting does not count (operators the grammar refuses anyway) exhausts
    sqlglot's recursion: a one-line error all the same."""
    with pytest.raises(SpecError) as error:
        parse("TX_AMOUNT > " + "interval " * 5_000 + "1")
    assert "nested too deeply for the SQL parser" in error.value.rule
    assert "\n" not in error.value.rule


def test_a_long_identifier_is_quoted_as_an_excerpt():
    with pytest.raises(SpecError) as error:
        parse("X" * 90_000 + " = 1")
    assert "unknown column 'XXXXXXXXXX" in error.value.rule
    assert "(90,000 characters)" in error.value.rule
    assert len(error.value.rule) < 300


@pytest.mark.parametrize(
    ("text", "form"),
    [
        ("TERMINAL_ID = 3 or TERMINAL_ID = 1", "TERMINAL_ID in (1, 3)"),
        (
            "TERMINAL_ID = 3 or TX_AMOUNT > 5 or TERMINAL_ID in (1, 2) or CHANNEL = 'a'",
            "TERMINAL_ID in (1, 2, 3) or CHANNEL = 'a' or TX_AMOUNT > 5.0",
        ),
        (
            "CHANNEL != 'a' and CHANNEL not in ('b', 'c') and TX_AMOUNT > 1",
            "CHANNEL not in ('a', 'b', 'c') and TX_AMOUNT > 1.0",
        ),
        # not merged: `=` in an `and`, `!=` in an `or`, `not in` in an `or`
        ("TERMINAL_ID = 1 and TERMINAL_ID = 2", "TERMINAL_ID = 1 and TERMINAL_ID = 2"),
        ("TERMINAL_ID != 1 or TERMINAL_ID != 2", "TERMINAL_ID != 1 or TERMINAL_ID != 2"),
        (
            "TERMINAL_ID not in (1) or TERMINAL_ID = 2",
            "TERMINAL_ID = 2 or TERMINAL_ID not in (1)",
        ),
        # nested: each `or` and `and` on its own
        (
            "TX_AMOUNT > 1 and (TERMINAL_ID = 1 or TERMINAL_ID = 2) and not "
            "(CHANNEL = 'x' or CHANNEL = 'y')",
            "TX_AMOUNT > 1.0 and TERMINAL_ID in (1, 2) and not (CHANNEL in ('x', 'y'))",
        ),
    ],
)
def test_membership_form_merges_equality_chains_into_sets(text, form):
    assert to_text(membership_form(parse(text))) == form


VALUES_WITH_NULLS = {
    "TRANSACTION_ID": st.one_of(st.none(), st.integers(-3, 3)),
    "TX_DATETIME": st.one_of(st.none(), st.sampled_from([at(), at(12), at(day=2)])),
    "CUSTOMER_ID": st.one_of(st.none(), st.integers(-3, 3)),
    "TERMINAL_ID": st.one_of(st.none(), st.integers(-3, 3)),
    "TX_AMOUNT": st.one_of(st.none(), st.sampled_from([-0.0, 0.0, 1.5, 25.0, -7.0])),
    "CHANNEL": st.one_of(st.none(), st.sampled_from(["", "a", "web"])),
}
SMALL_VALUES = {
    "int64": st.integers(-3, 3),
    "float64": st.sampled_from([0.0, -0.0, 1.5, 25.0]),
    "string": st.sampled_from(["", "a", "web"]),
    "timestamp[us]": st.sampled_from([at(), at(12), at(day=2)]),
}


def _equality(field: Field) -> st.SearchStrategy:
    value = SMALL_VALUES[field.type]
    return st.one_of(
        st.builds(Compare, st.just(field.name), st.sampled_from(["=", "!=", "<"]), value),
        st.builds(
            InSet,
            st.just(field.name),
            st.lists(value, min_size=1, max_size=3).map(tuple),
            st.booleans(),
        ),
    )


CHAINS = st.recursive(
    st.one_of([_equality(f) for f in SCHEMA.fields]),
    lambda children: st.one_of(
        st.lists(children, min_size=2, max_size=6).map(lambda xs: And(tuple(xs))),
        st.lists(children, min_size=2, max_size=6).map(lambda xs: Or(tuple(xs))),
        children.map(Not),
    ),
    max_leaves=20,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(CHAINS, st.lists(st.fixed_dictionaries(VALUES_WITH_NULLS), min_size=1, max_size=8))
def test_membership_form_keeps_every_rows_outcome(expr, rows):
    """Same verdict (true, false or unknown) on every row, nulls included; and the form
    is a filter like any other: its text parses back to it."""
    form = membership_form(expr)
    for row in rows:
        assert filters_module._evaluate(form, row) == filters_module._evaluate(expr, row)
    assert parse(to_text(form)) == form


LARGE_FILTERS = {  # each keeps some rows, not all (odd terminals, for instance)
    "or-of-equalities": " or ".join(f"TERMINAL_ID = {2 * i - 499}" for i in range(500)),
    "in-10000": "TERMINAL_ID in (" + ", ".join(map(str, range(-10001, 9998, 2))) + ")",
    "or-of-comparisons": " or ".join(f"TX_AMOUNT < {i - 400}.5" for i in range(500)),
    "or-of-ranges": or_chain(MAX_FILTER_TERMS, "TX_AMOUNT between {i}.25 and {i}.75"),
    "and-of-ors": " and ".join(
        f"(TX_AMOUNT > {i % 150} or TERMINAL_ID != {i} or CUSTOMER_ID = {i})"
        for i in range(MAX_FILTER_TERMS // 3)
    ),
    "or-of-timestamps": " or ".join(
        f"TX_DATETIME = '2026-01-0{day} {hour:02d}:00:00'"
        for day in (1, 2, 3)
        for hour in range(24)
    ),
    "not-in-floats": " and ".join(f"TX_AMOUNT != {i}.0" for i in range(150)),
}


@pytest.mark.slow
def test_large_filters_on_polars_equal_the_oracle(transactions):
    rows = transactions.to_dicts()
    for name, text in LARGE_FILTERS.items():
        expr = parse(text)
        expected = oracle(expr, rows)
        assert 0 < sum(expected) < N_ROWS or name == "or-of-timestamps", name
        assert _polars_kept(transactions, expr) == expected, name


def test_an_equality_chain_is_one_is_in_on_polars():
    compiled = str(to_polars(parse(LARGE_FILTERS["or-of-equalities"])))
    assert compiled.count("is_in") == 1
    assert "|" not in compiled


class _Depth(int):
    """A compiled expression that is only its nesting depth."""

    def __or__(self, other):
        return _Depth(max(self, other) + 1)

    __and__ = __or__

    def __invert__(self):
        return _Depth(self + 1)


class _DepthBuilder:
    def column(self, name):
        return _Depth(0)

    def literal(self, value):
        return _Depth(0)

    def is_in(self, name, values):
        return _Depth(1)

    def between(self, column, low, high):
        return _Depth(1)


def test_and_or_compile_as_balanced_trees():
    """A 500-term `or` of ranges nests 1 + log2(500) levels deep, not 500; so does an
    `and` (and no Python recursion grows with the length either)."""
    for joiner in (" or ", " and "):
        text = joiner.join(f"TX_AMOUNT between {i} and {i}.5" for i in range(500))
        assert compile_filter(parse(text), _DepthBuilder()) == 1 + math.ceil(math.log2(500))


@pytest.mark.usefixtures("spark")
def test_large_filters_on_spark_equal_polars_and_the_oracle(spark, transactions):
    """No StackOverflowError (an `or` of 500 terms overflowed Spark's stack), the same rows
    as Polars and the oracle, and an equality chain planned as one InSet, on every
    literal type's SQL text (int, float, timestamp here; strings below)."""
    from dppipeline.engines.spark.filter import to_spark

    frame = spark.createDataFrame(transactions.to_pandas(), schema=to_spark_ddl(SCHEMA))
    # Not all: Janino compiles the code of 500 ranges (1,000 comparisons) for 10 s or more.
    names = ["or-of-equalities", "in-10000", "or-of-comparisons", "or-of-timestamps"]
    exprs = {name: parse(LARGE_FILTERS[name]) for name in [*names, "not-in-floats"]}
    result = (
        frame.select(
            "TRANSACTION_ID",
            *[to_spark(e).alias(name.replace("-", "_")) for name, e in exprs.items()],
        )
        .toPandas()
        .sort_values("TRANSACTION_ID", ignore_index=True)
    )
    rows = transactions.to_dicts()
    for name, expr in exprs.items():
        expected = oracle(expr, rows)
        assert result[name.replace("-", "_")].tolist() == expected, name
        assert _polars_kept(transactions, expr) == expected, name
    scan = spark.range(10).withColumnRenamed("id", "TERMINAL_ID")  # not folded at planning
    plan = scan.where(to_spark(exprs["or-of-equalities"]))._jdf.queryExecution()
    assert "TERMINAL_ID#" in plan.optimizedPlan().toString()
    assert " INSET " in plan.optimizedPlan().toString()
    assert " OR " not in plan.optimizedPlan().toString()


ODD_STRINGS = ["o'hare", "a\\b", 'say "hi"', "é", "", "tab\there", "\\'", "日本"]


@pytest.mark.usefixtures("spark")
@pytest.mark.parametrize("escaped", ["false", "true"])
def test_spark_string_literals_mean_the_same_whatever_the_parser_setting(spark, escaped):
    """Strings reach Spark as hex UTF-8 bytes: a quote, a backslash or any character is
    matched exactly, with spark.sql.parser.escapedStringLiterals on or off."""
    from dppipeline.engines.spark.filter import to_spark

    previous = spark.conf.get("spark.sql.parser.escapedStringLiterals")
    spark.conf.set("spark.sql.parser.escapedStringLiterals", escaped)
    try:
        frame = spark.createDataFrame([(s,) for s in [*ODD_STRINGS, "other"]], "CHANNEL string")
        for value in ODD_STRINGS:
            quoted = "'" + value.replace("'", "''") + "'"
            for text in (f"CHANNEL = {quoted}", f"CHANNEL in ({quoted}, 'zz')"):
                kept = [r.CHANNEL for r in frame.where(to_spark(parse(text))).collect()]
                assert kept == [value], (text, kept)
    finally:
        spark.conf.set("spark.sql.parser.escapedStringLiterals", previous)


def test_every_filter_of_the_readme_and_the_configs_still_works(transactions):
    """The filters of the README and docs/ and each config's, parsed against the config's own
    input schema; those over the transactions schema also kept alike by Polars and the oracle."""
    from dppipeline.spec.model import load_spec

    repo = REPO
    pages = [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]
    texts = [(page, TX) for page in pages] + [
        (path, load_spec(path).source_schema)
        for path in sorted((repo / "jobs" / "configs").glob("*.yaml"))
    ]
    found = [
        (match.group(1), schema)
        for path, schema in texts
        for match in re.finditer(r'filter: "([^"]+)"', path.read_text())
    ]
    assert len(found) >= 5
    rows = transactions.to_dicts()
    for text, schema in found:
        expr = parse_filter(text, schema)
        assert parse_filter(to_text(expr), schema) == expr
        if schema.names == TX.names:
            assert _polars_kept(transactions, expr) == oracle(expr, rows), text


def test_sql_numbers_and_quotes_as_sqlglot_reads_them():
    """Parsed by sqlglot: a number may carry an exponent; both quotes delimit strings, a
    doubled quote stands for itself and a backslash for a backslash."""
    assert parse("TX_AMOUNT > 1e5") == Compare("TX_AMOUNT", ">", 100000.0)
    assert parse("TERMINAL_ID = 2e3") == Compare("TERMINAL_ID", "=", 2000)
    assert parse("CHANNEL = 'o''hare'") == parse('CHANNEL = "o\'hare"')
    assert parse("CHANNEL = 'a\\b'") == Compare("CHANNEL", "=", "a\\b")
    assert parse("TERMINAL_ID not in [1, 2]") == InSet("TERMINAL_ID", (1, 2), negated=True)
    # `in A..B` is rewritten on tokens: inside a string it stays text
    assert parse("CHANNEL = 'TERMINAL_ID in 1..3'") == Compare(
        "CHANNEL", "=", "TERMINAL_ID in 1..3"
    )
    assert parse("CHANNEL in (\"in 1..3\", 'x in -1..2')") == InSet(
        "CHANNEL", ("in 1..3", "x in -1..2")
    )
