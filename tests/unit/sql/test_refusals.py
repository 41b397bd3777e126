"""Malformed and unsupported DP SQL: one stderr line at line:column naming the construct,
exit 2, nothing read, nothing charged.

Each case runs `dppipeline sql QUERY --input <real data> --ledger <sqlite file>` in-process
(`cli.main.main`), so that a query wrongly accepted would read the data and write a ledger
row; the control case shows that a valid query through the same harness does. The expected
position is where `anchor` (its `nth` occurrence) starts in the query text.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import REPO
from support.cli import one_error_line

from dppipeline.cli.main import main

OPTIONS = (
    "OPTIONS (epsilon = 1, privacy_unit_column = CUSTOMER_ID,\n"
    "         max_groups_contributed = 2, max_contributions_per_partition = 3)"
)
HEAD = f"SELECT WITH DIFFERENTIAL_PRIVACY\n  {OPTIONS}\n"
BOUNDED_SUM = "SUM(TX_AMOUNT, contribution_bounds_per_row => (0, 100))"


def dp(
    items: str = "TERMINAL_ID, COUNT(*)",
    tail: str = "GROUP BY TERMINAL_ID",
    options: str = OPTIONS,
    table: str = "transactions",
) -> str:
    """A DP query of these parts: SELECT WITH DIFFERENTIAL_PRIVACY, OPTIONS, items, FROM."""
    return f"SELECT WITH DIFFERENTIAL_PRIVACY\n  {options}\n  {items}\nFROM {table}\n{tail}"


@dataclass(frozen=True)
class Case:
    id: str
    query: str
    anchor: str  # the text the error points at
    construct: str  # what the line must name
    nth: int = 1  # which occurrence of anchor

    @property
    def position(self) -> tuple[int, int]:
        at = -1
        for _ in range(self.nth):
            at = self.query.index(self.anchor, at + 1)
        line = self.query.count("\n", 0, at) + 1
        return line, at - (self.query.rfind("\n", 0, at) + 1) + 1


def opts(text: str) -> str:
    return f"OPTIONS ({text})"


CASES = [
    # --- clauses and statements the spec cannot express
    Case("having", dp(tail="GROUP BY TERMINAL_ID\nHAVING COUNT(*) > 5"), "HAVING", "HAVING"),
    Case("order-by", dp(tail="GROUP BY TERMINAL_ID ORDER BY TERMINAL_ID"), "ORDER BY", "ORDER BY"),
    Case("limit", dp(tail="GROUP BY TERMINAL_ID\nLIMIT 10"), "LIMIT", "LIMIT"),
    Case("qualify", dp(tail="GROUP BY TERMINAL_ID QUALIFY TRUE"), "QUALIFY", "QUALIFY"),
    Case("union", dp() + "\nUNION ALL " + dp(), "UNION", "UNION"),
    Case("subquery-from", dp(table="(SELECT * FROM transactions)"), "(SELECT", "subquery"),
    Case(
        "subquery-where",
        dp(tail="WHERE TERMINAL_ID IN (SELECT TERMINAL_ID FROM t)\nGROUP BY TERMINAL_ID"),
        "SELECT TERMINAL_ID",
        "subquery",
    ),
    Case("subquery-item", dp(items="(SELECT 1), COUNT(*)"), "(SELECT", "subquery"),
    Case(
        "window",
        dp(items=f"TERMINAL_ID, {BOUNDED_SUM} OVER (PARTITION BY TERMINAL_ID)"),
        "SUM(",
        "window function SUM",
    ),
    Case(
        "window-fn",
        dp(items="TERMINAL_ID, ROW_NUMBER() OVER (ORDER BY TX_AMOUNT)"),
        "ROW_NUMBER",
        "window function",
    ),
    Case(
        "not-dp",
        "SELECT TERMINAL_ID, COUNT(*)\nFROM transactions\nGROUP BY TERMINAL_ID",
        "TERMINAL_ID",
        "SELECT without WITH DIFFERENTIAL_PRIVACY",
    ),
    Case("insert", "INSERT INTO t VALUES (1)", "INSERT", "'INSERT'"),
    Case("cte", "WITH t AS (SELECT 1)\n" + dp(), "WITH", "'WITH'"),
    Case(
        "distinct", "SELECT DISTINCT TERMINAL_ID FROM transactions", "DISTINCT", "SELECT DISTINCT"
    ),
    Case("star", dp(items="*"), "*", "SELECT *"),
    Case("empty", "  \n -- nothing\n", "", "query"),
    Case("unterminated", dp(tail="WHERE TX_AMOUNT > 'abc\nGROUP BY TERMINAL_ID"), "'abc", "text"),
    # --- joins other than a key table
    Case(
        "join-table",
        dp(tail="JOIN customers USING (CUSTOMER_ID)\nGROUP BY TERMINAL_ID"),
        "JOIN",
        "JOIN",
    ),
    Case(
        "left-join",
        dp(tail="LEFT JOIN `keys.csv` USING (TERMINAL_ID)\nGROUP BY TERMINAL_ID"),
        "LEFT JOIN",
        "LEFT JOIN",
    ),
    Case(
        "right-join-table",
        dp(tail="RIGHT JOIN customers USING (TERMINAL_ID)\nGROUP BY TERMINAL_ID"),
        "customers",
        "JOIN 'customers'",
    ),
    Case(
        "join-on",
        dp(tail="RIGHT JOIN `keys.csv` ON a = b\nGROUP BY TERMINAL_ID"),
        "ON a",
        "JOIN without USING",
    ),
    Case("comma-join", dp(table="transactions, customers"), ", customers", "a comma join"),
    Case(
        "join-ungrouped",
        dp(tail="RIGHT JOIN `keys.csv` USING (CUSTOMER_ID)\nGROUP BY TERMINAL_ID"),
        "CUSTOMER_ID)",
        "USING ('CUSTOMER_ID')",
    ),
    Case(
        "keys-twice",
        dp(
            options=opts(
                "epsilon = 1, privacy_unit_column = CUSTOMER_ID, "
                "max_groups_contributed = 2, max_contributions_per_partition = 3, "
                "public_partitions = '1..9'"
            ),
            tail="RIGHT JOIN `keys.csv` USING (TERMINAL_ID)\nGROUP BY TERMINAL_ID",
        ),
        "`keys.csv`",
        "JOIN",
    ),
    # --- OPTIONS
    Case(
        "no-privacy-unit",
        dp(options=opts("epsilon = 1, max_groups_contributed = 2")),
        "OPTIONS",
        "OPTIONS without privacy_unit_column",
    ),
    Case(
        "no-epsilon",
        dp(options=opts("privacy_unit_column = CUSTOMER_ID")),
        "OPTIONS",
        "OPTIONS without epsilon",
    ),
    Case(
        "no-options",
        "SELECT WITH DIFFERENTIAL_PRIVACY COUNT(*) FROM transactions",
        "COUNT",
        "OPTIONS without epsilon",
    ),
    Case(
        "unknown-option",
        dp(
            options=opts(
                "epsilon = 1, privacy_unit_column = CUSTOMER_ID, "
                "max_groups_contributed = 2, max_contributions_per_partition = 3, group_selection_"
                "strategy = PUBLIC_GROUPS"
            )
        ),
        "group_selection_strategy",
        "option 'group_selection_strategy'",
    ),
    Case(
        "option-twice",
        dp(options=opts("epsilon = 1, epsilon = 2, privacy_unit_column = CUSTOMER_ID")),
        "epsilon",
        "option 'epsilon'",
        nth=2,
    ),
    Case(
        "negative-epsilon",
        dp(options=OPTIONS.replace("epsilon = 1", "epsilon = -1")),
        "-1",
        "option epsilon",
    ),
    Case(
        "delta-too-big",
        dp(options=OPTIONS.replace("epsilon = 1", "epsilon = 1, delta = 0.5")),
        "0.5",
        "option delta",
    ),
    Case(
        "l0-zero",
        dp(options=OPTIONS.replace("contributed = 2", "contributed = 0")),
        "0,",
        "option max_groups_contributed",
    ),
    Case(
        "l0-missing",
        dp(
            options=opts(
                "epsilon = 1, privacy_unit_column = CUSTOMER_ID, "
                "max_contributions_per_partition = 3"
            )
        ),
        "OPTIONS",
        "option max_groups_contributed",
    ),
    Case(
        "unit-not-a-column",
        dp(options=OPTIONS.replace("= CUSTOMER_ID", "= NOPE")),
        "NOPE",
        "option privacy_unit_column",
    ),
    Case(
        "noise-unknown",
        dp(options=OPTIONS.replace("epsilon = 1", "epsilon = 1, noise = 'uniform'")),
        "'uniform'",
        "option noise",
    ),
    Case(
        "options-disagree",
        dp() + ";\n" + dp(options=OPTIONS.replace("epsilon = 1", "epsilon = 2")),
        "2, privacy",
        "option epsilon",
    ),
    Case(
        "weight-alone",
        dp(options=OPTIONS.replace("epsilon = 1", "epsilon = 1, budget_weight = 2")),
        "2,",
        "option budget_weight",
    ),
    Case(
        "option-null",
        dp(options=OPTIONS.replace("epsilon = 1", "epsilon = NULL")),
        "NULL",
        "option 'epsilon'",
    ),
    # --- aggregates
    Case(
        "sum-unbounded",
        dp(items="TERMINAL_ID,\n  SUM(TX_AMOUNT)"),
        "SUM",
        "SUM without contribution_bounds_per_group",
    ),
    Case(
        "avg-unbounded",
        dp(items="TERMINAL_ID, COUNT(*), AVG(TX_AMOUNT) AS mean"),
        "AVG",
        "AVG without contribution_bounds_per_group",
    ),
    Case(
        "count-bounded",
        dp(items="TERMINAL_ID, COUNT(*, contribution_bounds_per_group => (0, 5))"),
        "contribution_bounds_per_group",
        "COUNT with",
    ),
    Case(
        "unknown-argument",
        dp(items="TERMINAL_ID, SUM(TX_AMOUNT, bounds => (0, 1))"),
        "bounds",
        "argument 'bounds'",
    ),
    Case(
        "sum-distinct",
        dp(items="TERMINAL_ID, SUM(DISTINCT TX_AMOUNT)"),
        "DISTINCT",
        "SUM(DISTINCT ...)",
    ),
    Case(
        "expression-arg",
        dp(items="TERMINAL_ID, SUM(TX_AMOUNT * 2, contribution_bounds_per_row => (0, 1))"),
        "*",
        "'*'",
    ),
    Case("arithmetic", dp(items="TERMINAL_ID, COUNT(*) + 1"), "+", "'+'"),
    Case(
        "unknown-function",
        dp(items="TERMINAL_ID, APPROX_COUNT_DISTINCT(CUSTOMER_ID)"),
        "APPROX",
        "function 'APPROX_COUNT_DISTINCT'",
    ),
    Case("alias", dp(items="TERMINAL_ID, COUNT(*) AS n_rows"), "n_rows", "alias 'n_rows'"),
    Case("no-aggregate", dp(items="TERMINAL_ID"), "SELECT", "SELECT without an aggregate"),
    Case(
        "percentile-range",
        dp(
            items="TERMINAL_ID, PERCENTILE_CONT(TX_AMOUNT, 50, contribution"
            "_bounds_per_row => (0, 1))"
        ),
        "50",
        "PERCENTILE_CONT",
    ),
    Case(
        "count-unknown-column",
        dp(items="TERMINAL_ID, COUNT(DISTINCT NOPE)"),
        "NOPE",
        "COUNT('NOPE')",
    ),
    Case(
        "two-values",
        dp(
            items=f"TERMINAL_ID, {BOUNDED_SUM},\n  AVG(CUSTOMER_ID, contribution"
            "_bounds_per_row => (0, 100))"
        ),
        "CUSTOMER_ID, contribution",
        "AVG('CUSTOMER_ID')",
    ),
    Case(
        "two-ranges",
        dp(
            items=f"TERMINAL_ID, {BOUNDED_SUM},\n  AVG(TX_AMOUNT, contribution"
            "_bounds_per_row => (0, 50))"
        ),
        "contribution_bounds_per_row",
        "contribution_bounds_per_row",
        nth=2,
    ),
    Case(
        "bounds-reversed",
        dp(items="TERMINAL_ID, SUM(TX_AMOUNT, contribution_bounds_per_row => (300, 0))"),
        "contribution_bounds_per_row",
        "contribution bounds",
    ),
    Case(
        "sum-group-no-linf",
        dp(
            options=opts(
                "epsilon = 1, privacy_unit_column = CUSTOMER_ID, max_rows_contributed = 5"
            ),
            items="TERMINAL_ID, SUM(TX_AMOUNT, contribution_bounds_per_group => (0, 500))",
        ),
        "contribution_bounds_per_group",
        "SUM with contribution_bounds_per_group",
    ),
    # --- keys
    Case("ungrouped-key", dp(tail=""), "TERMINAL_ID,", "'TERMINAL_ID'"),
    Case("unselected-key", dp(items="COUNT(*)"), "TERMINAL_ID", "GROUP BY 'TERMINAL_ID'"),
    Case("group-by-position", dp(tail="GROUP BY 1"), "1", "GROUP BY position", nth=2),
    Case("rollup", dp(tail="GROUP BY ROLLUP (TERMINAL_ID)"), "ROLLUP", "ROLLUP"),
    Case(
        "trunc-not-time",
        dp(items="DATE_TRUNC(TX_AMOUNT, DAY) AS day, COUNT(*)", tail="GROUP BY day"),
        "DATE_TRUNC",
        "DATE_TRUNC('TX_AMOUNT', ...)",
    ),
    Case(
        "trunc-week",
        dp(items="DATE_TRUNC(TX_DATETIME, WEEK) AS week, COUNT(*)", tail="GROUP BY week"),
        "DATE_TRUNC",
        "DATE_TRUNC(..., 'WEEK')",
    ),
    Case(
        "group-by-unit",
        dp(items="CUSTOMER_ID, COUNT(*)", tail="GROUP BY CUSTOMER_ID"),
        "CUSTOMER_ID",
        "GROUP BY",
        nth=3,
    ),
    Case(
        "float-key",
        dp(items="TX_AMOUNT, COUNT(*)", tail="GROUP BY TX_AMOUNT"),
        "TX_AMOUNT",
        "GROUP BY",
        nth=2,
    ),
    Case("unknown-table", dp(table="customers"), "customers", "FROM 'customers'"),
    # --- audit (#36): ways around the guarantee
    Case(
        "group-by-unit-quoted",
        dp(items="`CUSTOMER_ID`, COUNT(*)", tail="GROUP BY `CUSTOMER_ID`"),
        "`CUSTOMER_ID`",
        "GROUP BY",
        nth=2,
    ),
    Case(
        "group-by-unit-bucket",
        dp(
            items="RANGE_BUCKET(CUSTOMER_ID, [0, 10, 20]) AS CUSTOMER_ID_bucket, COUNT(*)",
            tail="GROUP BY CUSTOMER_ID_bucket",
        ),
        "CUSTOMER_ID_bucket",
        "GROUP BY",
        nth=2,
    ),
    Case(
        "group-by-key-aliased-as-unit",
        dp(items="TERMINAL_ID AS CUSTOMER_ID, COUNT(*)", tail="GROUP BY CUSTOMER_ID"),
        "CUSTOMER_ID",
        "alias 'CUSTOMER_ID'",
        nth=2,
    ),
    Case(
        "where-quoted-unknown-column",
        dp(tail="WHERE `NOPE` = 1\nGROUP BY TERMINAL_ID"),
        "`NOPE`",
        "WHERE",
    ),
    Case(
        "input-range-on-a-column",
        dp(tail="RIGHT JOIN input_range USING (TERMINAL_ID)\nGROUP BY TERMINAL_ID"),
        "input_range",
        "JOIN input_range",
    ),
    Case(
        "input-range-option-on-a-column",
        dp(options=OPTIONS.replace("= 3)", "= 3, public_partitions = 'input_range')")),
        "'input_range'",
        "option public_partitions",
    ),
    Case(
        "option-twice-case",
        dp(options=OPTIONS.replace("epsilon = 1", "epsilon = 1, EPSILON = 1e9")),
        "EPSILON",
        "option 'epsilon'",
    ),
    Case(
        "option-twice-quoted",
        dp(options=OPTIONS.replace("epsilon = 1", "epsilon = 1, `epsilon` = 1e9")),
        "`epsilon`",
        "option 'epsilon'",
    ),
    Case(
        "unit-differs-between-selects",
        dp() + ";\n" + dp(options=OPTIONS.replace("= CUSTOMER_ID", "= TERMINAL_ID")),
        "TERMINAL_ID,\n",
        "option privacy_unit_column",
    ),
    Case(
        "epsilon-overflows",
        dp(options=OPTIONS.replace("epsilon = 1", "epsilon = 1e400")),
        "1e400",
        "option epsilon",
    ),
    Case(
        "epsilon-nan-name",
        dp(options=OPTIONS.replace("epsilon = 1", "epsilon = nan")),
        "nan",
        "option epsilon",
    ),
    Case(
        "delta-nan-string",
        dp(options=OPTIONS.replace("epsilon = 1", "epsilon = 1, delta = 'NaN'")),
        "'NaN'",
        "option delta",
    ),
    Case(
        "epsilon-true",
        dp(options=OPTIONS.replace("epsilon = 1", "epsilon = TRUE")),
        "TRUE",
        "option epsilon",
    ),
    Case(
        "l0-huge",
        dp(options=OPTIONS.replace("contributed = 2", "contributed = 99999999999999999999")),
        "99999999999999999999",
        "option max_groups_contributed",
    ),
    Case(
        "linf-negative",
        dp(options=OPTIONS.replace("partition = 3", "partition = -3")),
        "-3",
        "option max_contributions_per_partition",
    ),
    Case(
        "bounds-infinite",
        dp(items="TERMINAL_ID, SUM(TX_AMOUNT, contribution_bounds_per_row => (0, 1e400))"),
        "contribution_bounds_per_row",
        "contribution bounds",
    ),
    Case(
        "bounds-huge",
        dp(items="TERMINAL_ID, SUM(TX_AMOUNT, contribution_bounds_per_row => (-1e300, 0))"),
        "contribution_bounds_per_row",
        "contribution bounds",
    ),
    Case(
        "sum-group-bounds-with-l1",
        dp(
            options=OPTIONS.replace("= 3)", "= 3, max_rows_contributed = 4)"),
            items="TERMINAL_ID, SUM(TX_AMOUNT, contribution_bounds_per_group => (0, 300))",
        ),
        "4)",
        "option max_rows_contributed",
    ),
    Case(
        "pre-threshold-negative",
        dp(options=OPTIONS.replace("= 3)", "= 3, min_privacy_units_per_group = -5)")),
        "-5",
        "option min_privacy_units_per_group",
    ),
    Case(
        "key-range-huge",
        dp(
            tail="RIGHT JOIN UNNEST(GENERATE_ARRAY(0, 1000000000000)) USING (TERMINAL_ID)\n"
            "GROUP BY TERMINAL_ID"
        ),
        "UNNEST",
        "option public_partitions",
    ),
    Case(
        "statement-after-a-comment",
        dp(tail="GROUP BY TERMINAL_ID -- the end\n; DELETE FROM transactions"),
        "DELETE",
        "'DELETE'",
    ),
    Case(
        "statement-after-a-string",
        dp(tail="WHERE TX_AMOUNT > 'x;' ; DROP TABLE transactions\nGROUP BY TERMINAL_ID"),
        "DROP",
        "'DROP'",
    ),
    # --- WHERE (the spec's filter grammar, positions inside the clause)
    Case(
        "where-unknown-column",
        dp(tail="WHERE TX_AMOUNT > 5 AND NOPE = 1\nGROUP BY TERMINAL_ID"),
        "NOPE",
        "WHERE",
    ),
    Case(
        "where-function",
        dp(tail="WHERE\n  ABS(TX_AMOUNT) > 5\nGROUP BY TERMINAL_ID"),
        "ABS",
        "WHERE",
    ),
]


def test_the_table_is_large_and_each_case_is_named_once():
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.fixture
def harness(small_inputs, tmp_path):
    """(argv builder, ledger file): `sql QUERY` on real data with a SQLite ledger."""
    ledger = tmp_path / "ledger.sqlite"

    def argv(query: str) -> list[str]:
        return [
            "sql",
            query,
            "--input",
            str(small_inputs["parquet"]),
            "--output",
            str(tmp_path / "out"),
            "--ledger",
            f"sqlite:///{ledger}",
        ]

    return argv, ledger


def ledger_rows(ledger: Path) -> int:
    """Rows in every table of the ledger file (0 when it does not exist)."""
    if not ledger.exists():
        return 0
    with sqlite3.connect(ledger) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return sum(db.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in tables)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_refused_with_one_line_at_its_position(case: Case, harness, capsys):
    argv, ledger = harness
    code = main(argv(case.query))
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    line, column = case.position
    assert lines[0].startswith(f"dppipeline sql: error: query:{line}:{column}: "), lines[0]
    assert f":{column}: {case.construct}" in lines[0], lines[0]
    assert "Traceback" not in err and out == ""
    assert ledger_rows(ledger) == 0


def test_a_valid_query_through_the_same_harness_reads_and_charges(harness, capsys):
    """The control: the harness would see a charge (so `ledger_rows == 0` above can fail)."""
    argv, ledger = harness
    query = dp(
        items=f"TERMINAL_ID, COUNT(*), {BOUNDED_SUM}",
        tail="RIGHT JOIN UNNEST(GENERATE_ARRAY(0, 59)) USING (TERMINAL_ID)\nGROUP BY TERMINAL_ID",
    )
    assert main(argv(query)) == 0, capsys.readouterr().err
    assert ledger_rows(ledger) > 0


def test_the_console_script_refuses_a_query_the_same_way(tmp_path):
    """The installed `dppipeline` script, in a process of its own: one line, exit 2."""
    import subprocess

    script = Path(sys.executable).with_name("dppipeline")
    query = tmp_path / "query.sql"
    query.write_text(dp(items="TERMINAL_ID,\n  SUM(TX_AMOUNT)"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("DPPIPELINE_DEBUG", None)
    result = subprocess.run(
        [str(script), "sql", "--file", str(query), "--explain"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    line = one_error_line(result)
    assert line.startswith(f"dppipeline sql: error: {query}:5:3: SUM without "), line


def test_mangled_examples_are_refused_as_usage_errors_never_as_bugs():
    """Tokens of the examples deleted, inserted or replaced at random (a fixed seed): every
    text compiles or is refused as a usage error (exit 2), never another exception (a bug,
    exit 70, whose line would name no position)."""
    import random

    from dppipeline.dpsql.compile import compile_sql
    from dppipeline.errors import UsageError

    examples = [p.read_text() for p in sorted((REPO / "jobs" / "sql").glob("*.sql"))]
    words = [
        *"(),;=>*'`\"-+.[]",
        "SELECT",
        "WITH",
        "OPTIONS",
        "FROM",
        "JOIN",
        "RIGHT",
        "USING",
        "GROUP BY",
        "WHERE",
        "COUNT",
        "SUM",
        "DISTINCT",
        "OVER",
        "UNNEST",
        "=>",
        "AS",
        "1",
        "-1",
        "1e400",
        "0.5",
        "input_range",
        "DIFFERENTIAL_PRIVACY",
        "\n",
    ]
    rng = random.Random(36)
    refused = 0
    for _ in range(400):
        tokens = rng.choice(examples).split(" ")
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(tokens))
            roll = rng.random()
            if roll < 0.4 and len(tokens) > 1:
                del tokens[at]
            elif roll < 0.8:
                tokens.insert(at, rng.choice(words))
            else:
                tokens[at] = rng.choice(words)
        try:
            compile_sql(" ".join(tokens), base=REPO / "jobs" / "sql")
        except UsageError:
            refused += 1
    assert refused > 200  # most mangled texts are refused (so the loop tested refusals)


@pytest.mark.parametrize("where", ["a file of the input", "the input folder"])
def test_a_key_table_that_is_the_input_is_refused(where, small_inputs, tmp_path, capsys):
    """Public keys must be public: the input's own file as a key table would release the
    data's key set (a terminal only one customer uses, too). Refused at the JOIN, before any
    read or charge (`--input` names the data, so the key table is compared with it)."""
    data = small_inputs["csv"]
    table = sorted(data.glob("*.csv"))[0] if where == "a file of the input" else data
    ledger = tmp_path / "ledger.sqlite"
    query = dp(tail=f"RIGHT JOIN `{table}` USING (TERMINAL_ID)\nGROUP BY TERMINAL_ID")
    argv = ["sql", query, "--input", str(data), "--format", "csv"]
    argv += ["--output", str(tmp_path / "out"), "--ledger", f"sqlite:///{ledger}"]
    code = main(argv)
    out, err = capsys.readouterr()
    at = query.index("`")
    line, column = query.count("\n", 0, at) + 1, at - query.rfind("\n", 0, at)
    assert code == 2, err
    assert err.count("\n") == 1 and out == "", err
    assert err.startswith(f"dppipeline sql: error: query:{line}:{column}: "), err
    assert "must be public, not the input" in err
    assert ledger_rows(ledger) == 0
