"""DP SQL compiles to its YAML twin's spec: every example, and every option to its field.

Each example in jobs/sql/*.sql must give the spec its YAML twin gives (the same validated
fields, the same canonical hash, hence the same release key and ledger entry). The option
table checks each OPTIONS name against the spec field it sets, one by one, so that an option
wired to the wrong field fails here by name.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import REPO

from dppipeline.api.sql import load_sql
from dppipeline.dpsql.compile import compile_sql
from dppipeline.dpsql.errors import SqlError
from dppipeline.spec.hashing import canonical_spec
from dppipeline.spec.model import load_spec

SQL = REPO / "jobs" / "sql"
# (query file, its YAML twin)
EXAMPLES = [
    (SQL / "terminal_stats.sql", REPO / "jobs" / "configs" / "terminal_stats.yaml"),
    (SQL / "large_amounts.sql", SQL / "large_amounts.yaml"),
    (SQL / "daily_amounts.sql", SQL / "daily_amounts.yaml"),
    (SQL / "median_amount.sql", SQL / "median_amount.yaml"),
    (SQL / "book_analyses.sql", SQL / "book_analyses.yaml"),
]


def test_every_example_has_a_twin():
    assert sorted(SQL.glob("*.sql")) == sorted(sql for sql, _ in EXAMPLES)


@pytest.mark.parametrize(("sql", "yaml"), EXAMPLES, ids=lambda p: Path(p).stem)
def test_example_compiles_to_its_yaml_twin(sql: Path, yaml: Path):
    compiled, twin = load_sql(sql), load_spec(yaml)
    assert compiled.to_dict() == twin.to_dict()
    assert compiled.is_shorthand == twin.is_shorthand
    assert canonical_spec(compiled) == canonical_spec(twin)
    assert compiled.spec_hash() == twin.spec_hash()


BASE = (
    "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS ({epsilon}privacy_unit_column = CUSTOMER_ID, "
    "max_groups_contributed = 3, max_contributions_per_partition = 4{extra}) TERMINAL_ID, "
    "COUNT(*), SUM(TX_AMOUNT, contribution_bounds_per_row => (0, 100)) FROM transactions "
    "GROUP BY TERMINAL_ID"
)


def _spec_field(spec, path: str):
    value = spec.to_dict()
    for part in path.split("."):
        value = value[part]
    return value


# option as written -> (spec field, value); every option of the dialect, each on its own.
OPTION_FIELDS = [
    ("epsilon = 0.5", "budget.epsilon", 0.5),
    ("delta = 1e-7", "budget.delta", 1e-7),
    ("noise = 'gaussian'", "noise", "gaussian"),
    ("noise_kind = gaussian", "noise", "gaussian"),
    ("accounting = 'zcdp'", "accounting", "zcdp"),
    ("count_noise = 'continuous'", "count_noise", "continuous"),
    ("confidence_intervals = TRUE", "confidence_intervals", True),
    ("linf_bounding = 'sample'", "bounds.linf_bounding", "sample"),
    ("public_partitions = '5..9'", "partition_selection.public_partitions", "5..9"),
    ("min_privacy_units_per_group = 7", "partition_selection.pre_threshold", 7),
    (
        "partition_selection = 'laplace_thresholding'",
        "partition_selection.strategy",
        "laplace_thresholding",
    ),
    ("name = 'per_terminal'", "name", "per_terminal"),
]


@pytest.mark.parametrize(("option", "path", "value"), OPTION_FIELDS, ids=str)
def test_each_option_sets_its_field(option: str, path: str, value):
    epsilon = "" if option.startswith("epsilon") else "epsilon = 2, "
    spec = compile_sql(BASE.format(epsilon=epsilon, extra=f", {option}"))
    assert _spec_field(spec, path) == value


def test_bounds_and_privacy_unit_options():
    spec = compile_sql(BASE.format(epsilon="epsilon = 2, ", extra=""))
    bounds = spec.queries[0].bounds
    assert (bounds.max_partitions_contributed, bounds.max_contributions_per_partition) == (3, 4)
    assert (bounds.min_value, bounds.max_value) == (0.0, 100.0)
    assert spec.privacy_unit == "CUSTOMER_ID"
    rows = compile_sql(
        BASE.format(epsilon="epsilon = 2, ", extra="").replace(
            "max_groups_contributed = 3, max_contributions_per_partition = 4",
            "max_rows_contributed = 9",
        )
    )
    assert rows.queries[0].bounds.max_contributions == 9


def test_per_group_bounds_of_sum_are_a_units_total():
    """SUM's contribution_bounds_per_group (lo, hi) is a unit's total in a group: Linf rows of
    [lo / Linf, hi / Linf]; AVG's is the values' range."""
    query = BASE.format(epsilon="epsilon = 2, ", extra="").replace(
        "contribution_bounds_per_row => (0, 100)", "contribution_bounds_per_group => (0, 100)"
    )
    bounds = compile_sql(query).queries[0].bounds
    assert (bounds.min_value, bounds.max_value) == (0.0, 25.0)
    mean = compile_sql(query.replace("SUM(", "AVG(")).queries[0].bounds
    assert (mean.min_value, mean.max_value) == (0.0, 100.0)


@pytest.mark.parametrize(
    ("call", "metric"),
    [
        ("COUNT(*)", "count"),
        ("COUNT(TX_AMOUNT)", "count"),
        ("COUNT(DISTINCT CUSTOMER_ID)", "privacy_id_count"),
        ("COUNT(DISTINCT TRANSACTION_ID)", "count_distinct(TRANSACTION_ID)"),
        ("SUM(TX_AMOUNT, contribution_bounds_per_row => (0, 9))", "sum"),
        ("AVG(TX_AMOUNT, contribution_bounds_per_row => (0, 9))", "mean"),
        ("VARIANCE(TX_AMOUNT, contribution_bounds_per_row => (0, 9))", "variance"),
        ("VAR_POP(TX_AMOUNT, contribution_bounds_per_row => (0, 9))", "variance"),
        ("STDDEV(TX_AMOUNT, contribution_bounds_per_row => (0, 9))", "stddev"),
        (
            "PERCENTILE_CONT(TX_AMOUNT, 0.9, contribution_bounds_per_row => (0, 9))",
            "percentile(90)",
        ),
        ("MAX(TX_AMOUNT, contribution_bounds_per_row => (0, 9))", "max"),
        ("MIN(TX_AMOUNT, contribution_bounds_per_row => (0, 9))", "min"),
    ],
)
def test_each_aggregate_is_its_metric(call: str, metric: str):
    query = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, privacy_unit_column = "
        f"CUSTOMER_ID, max_groups_contributed = 2, max_contributions_per_partition = 2) {call} "
        "FROM transactions"
    )
    assert compile_sql(query).queries[0].metrics == (metric,)


@pytest.mark.parametrize(
    ("key", "entry"),
    [
        ("TERMINAL_ID", "TERMINAL_ID"),
        ("DATE_TRUNC(TX_DATETIME, DAY)", "day"),
        ("TIMESTAMP_TRUNC(TX_DATETIME, HOUR)", "hour"),
        ("DATE_TRUNC(TX_DATETIME, ISOWEEK)", "week"),
        ("DATE_TRUNC(TX_DATETIME, WEEK(MONDAY))", "week"),
        ("DATE_TRUNC(TX_DATETIME, MONTH)", "month"),
        ("DATE_TRUNC(TX_DATETIME, YEAR)", "year"),
        ("RANGE_BUCKET(TX_AMOUNT, [0, 10.5, 100])", "bucket(TX_AMOUNT, 0, 10.5, 100)"),
    ],
)
def test_each_key_form_is_its_partition_key(key: str, entry: str):
    query = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, privacy_unit_column = "
        f"CUSTOMER_ID, max_groups_contributed = 2, max_contributions_per_partition = 2) {key}, "
        f"COUNT(*) FROM transactions GROUP BY {key}"
    )
    assert compile_sql(query).queries[0].partition_by == (entry,)


def test_where_is_the_filter_as_written_on_one_line():
    query = BASE.format(epsilon="epsilon = 2, ", extra="").replace(
        "GROUP BY", "WHERE TX_AMOUNT >= 25\n  AND TERMINAL_ID IN (1, 2,3)  -- note\nGROUP BY"
    )
    assert compile_sql(query).filter == "TX_AMOUNT >= 25 AND TERMINAL_ID IN (1, 2,3)"


def test_several_selects_are_one_job_with_one_budget():
    first = BASE.format(epsilon="epsilon = 2, ", extra=", name = 'a'")
    second = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (name = 'b', budget_weight = 3, "
        "max_groups_contributed = 1) COUNT(DISTINCT CUSTOMER_ID) FROM transactions"
    )
    spec = compile_sql(f"{first};\n{second};", name="two")
    assert spec.name == "two" and not spec.is_shorthand
    assert [q.name for q in spec.queries] == ["a", "b"]
    assert spec.budget.epsilon == 2.0 and spec.query("b").budget_weight == 3.0
    assert spec.query("b").partition_by == ()


def test_a_spec_error_points_at_the_sql_that_set_the_field():
    query = BASE.format(epsilon="epsilon = 2, ", extra="").replace("epsilon = 2", "epsilon = -1")
    with pytest.raises(SqlError) as caught:
        compile_sql(query, source="q.sql")
    error = caught.value
    assert (error.line, error.column) == (1, query.index("-1") + 1)
    assert error.construct == "option epsilon"
    assert str(error).startswith(f"q.sql:1:{query.index('-1') + 1}: option epsilon: ")


def test_every_sql_block_of_the_reference_page_compiles():
    """The dialect page's queries (BigQuery's examples rewritten) are queries it takes."""
    page = (REPO / "docs" / "reference" / "sql.md").read_text()
    blocks = re.findall(r"```sql\n(.*?)```", page, flags=re.S)
    assert len(blocks) >= 6
    for block in blocks:
        spec = compile_sql(block, base=REPO / "jobs" / "sql")
        assert spec.queries


@pytest.mark.parametrize(("sql", "yaml"), EXAMPLES, ids=lambda p: Path(p).stem)
def test_explain_prints_what_plan_prints_for_the_twin(sql: Path, yaml: Path, capsys):
    from dppipeline.cli.main import main

    assert main(["sql", "--file", str(sql), "--explain"]) == 0
    explained = capsys.readouterr().out
    assert main(["plan", "--config", str(yaml)]) == 0
    planned = capsys.readouterr().out
    assert explained == planned
    assert "total spent by the job" in explained


def test_the_query_text_is_remembered_for_the_manifest_and_not_hashed():
    """Two texts that say the same (a comment, other spacing) are one release key and one
    spec; each keeps its own text, which the manifest records as `query`."""
    from dppipeline.dpsql.compile import compile_sql

    plain = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, privacy_unit_column = "
        "CUSTOMER_ID, max_groups_contributed = 2, max_contributions_per_partition = 3, "
        "public_partitions = '0..9')\n"
        "  TERMINAL_ID, COUNT(*) FROM transactions GROUP BY TERMINAL_ID"
    )
    commented = "-- per terminal\n" + plain.replace("  TERMINAL_ID", "TERMINAL_ID  ")
    first, second = compile_sql(plain), compile_sql(commented)
    assert first.spec_hash() == second.spec_hash()
    assert first.to_dict() == second.to_dict()
    assert "query" not in first.to_dict()
    assert (first.query_text, second.query_text) == (plain, commented)


@pytest.mark.parametrize(
    ("low", "high", "linf"), [(0, 300, 3), (-100, 300, 3), (0, 100, 3), (-50, 7, 2)]
)
def test_sum_bounds_per_group_are_the_plans_sensitivity(low, high, linf):
    """SUM(..., contribution_bounds_per_group => (lo, hi)) clips rows to [lo/Linf, hi/Linf]:
    the plan's sum mechanism must then have Linf sensitivity max(|lo|, |hi|) (a unit's
    total in a group) and L0 the option's, as BigQuery's per-group bound says (float64
    division: equal up to rounding)."""
    from dppipeline.dpsql.compile import compile_sql
    from dppipeline.lifecycle.runner import make_plan

    spec = compile_sql(
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, privacy_unit_column = "
        f"CUSTOMER_ID, max_groups_contributed = 2, max_contributions_per_partition = {linf}, "
        "public_partitions = '0..9')\n"
        f"  TERMINAL_ID, SUM(TX_AMOUNT, contribution_bounds_per_group => ({low}, {high}))\n"
        "FROM transactions GROUP BY TERMINAL_ID"
    )
    (query,) = make_plan(spec).queries
    (mechanism,) = [m for m in query.own_mechanisms() if m.name == "sum"]
    assert mechanism.linf_sensitivity == pytest.approx(max(abs(low), abs(high)), rel=1e-12)
    assert mechanism.l0_sensitivity == 2
