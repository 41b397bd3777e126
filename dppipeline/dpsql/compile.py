"""DP SQL to the job spec: the same data a YAML file gives, validated by the spec itself.

`compile_sql` reads the statements (`dialect.py`), maps each to a query of the spec's data
(the mapping below, docs/reference/sql.md), resolves relative paths against the query file's
folder as YAML paths are, and builds the JobSpec with the spec's own `build_spec`: one set of
rules, one canonical hash (the release key), whichever front end wrote the job. A spec error
is mapped back to the line:column of the SQL that set the field.

One SELECT keyed by one column compiles to the spec's shorthand (one query named after the
job), as a YAML file of one query is usually written; otherwise (several SELECTs, a global
total, time or bucket keys, several keys) to `queries`, each SELECT one query with its own
bounds, under the job's one budget.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from dppipeline.dpsql.dialect import (
    Aggregate,
    DPSelect,
    KeyExpr,
    Located,
    Position,
    read_statements,
)
from dppipeline.dpsql.errors import SqlError
from dppipeline.errors import SpecError, UsageError, excerpt
from dppipeline.spec.metrics import metric_column
from dppipeline.spec.model import JobSpec, build_spec
from dppipeline.spec.partition_keys import (
    INPUT_RANGE,
    TIME_BUCKETS,
    BucketKey,
    key_name,
)
from dppipeline.spec.paths import resolve_paths
from dppipeline.spec.schema import Schema, SchemaError, input_schema_from
from dppipeline.spec.vocabulary import SHIPPED_SCHEMAS

MAX_QUERY_BYTES = 1 << 20  # as a YAML job spec: key lists belong in key files


def read_query_file(path: Path, label: str) -> str:
    """A `.sql` file's text: at most MAX_QUERY_BYTES of UTF-8 (a BOM allowed); errors are
    UsageErrors starting with `label`. An unreadable file raises OSError, which each front
    end words its own way."""
    with path.open("rb") as file:
        data = file.read(MAX_QUERY_BYTES + 1)
    if len(data) > MAX_QUERY_BYTES:
        raise UsageError(f"{label}: more than {MAX_QUERY_BYTES:,} bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{label}: not UTF-8 text (byte {exc.start + 1:,})") from None


# OPTIONS of the job (one budget, one privacy unit, one noise): given in any SELECT, the
# same wherever given more than once.
JOB_OPTIONS = {
    "epsilon": "budget.epsilon",
    "delta": "budget.delta",
    "privacy_unit_column": "privacy_unit",
    "noise": "noise",
    "noise_kind": "noise",
    "accounting": "accounting",
    "count_noise": "count_noise",
    "confidence_intervals": "confidence_intervals",
}
# OPTIONS of one SELECT (its query): bounds, public partitions, selection, name, weight.
QUERY_OPTIONS = {
    "max_groups_contributed": "bounds.max_partitions_contributed",
    "max_contributions_per_partition": "bounds.max_contributions_per_partition",
    "max_rows_contributed": "bounds.max_contributions",
    "linf_bounding": "bounds.linf_bounding",
    "public_partitions": "partition_selection.public_partitions",
    "min_privacy_units_per_group": "partition_selection.pre_threshold",
    "partition_selection": "partition_selection.strategy",
    "budget_weight": "budget_weight",
    "name": "name",
}
OPTIONS = {**JOB_OPTIONS, **QUERY_OPTIONS}
# The spec field -> the SQL that sets it, for messages about a field the SQL did not set.
FIELD_OPTIONS = {
    "bounds.max_partitions_contributed": "max_groups_contributed",
    "bounds.max_contributions_per_partition": "max_contributions_per_partition",
    "bounds.max_contributions": "max_rows_contributed",
    "privacy_unit": "privacy_unit_column",
}
METRIC_OF = {
    "SUM": "sum",
    "AVG": "mean",
    "VARIANCE": "variance",
    "VAR_POP": "variance",
    "STDDEV": "stddev",
    "STDDEV_POP": "stddev",
    "MAX": "max",
    "MIN": "min",
}
TIME_PARTS = {"HOUR": "hour", "DAY": "day", "ISOWEEK": "week", "MONTH": "month", "YEAR": "year"}
BOUNDS_RULE = (
    "a value aggregate needs contribution_bounds_per_row => (lo, hi) (each row's value "
    "clipped to [lo, hi]) or contribution_bounds_per_group => (lo, hi) (for SUM: a privacy "
    "unit's total in a group; for the others: the values' range)"
)


@dataclass
class _Compiled:
    """The spec data of the SQL and where in the text each field was set."""

    raw: dict[str, Any]
    job_at: dict[str, int] = field(default_factory=dict)  # job field path -> offset
    query_at: dict[str, dict[str, int]] = field(default_factory=dict)  # query -> path -> offset
    filters: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    shorthand: bool = False
    first_at: int = 0


def compile_sql(
    text: str,
    *,
    name: str | None = None,
    base: str | Path | None = None,
    source: str = "query",
    overrides: Mapping[str, Any] | None = None,
) -> JobSpec:
    """The validated JobSpec of the DP SQL `text`, ready to plan and run.

    `name`: the job's name unless its one SELECT names it (option `name`; the CLI passes
    --name or the query file's stem);
    `base`: the folder relative paths (key files) are relative to, the query file's (default:
    the working folder); `source`: how errors name the text; `overrides`: dotted spec fields
    set outside the SQL (the CLI's --input, --output, ...), whose errors stay SpecErrors.
    Raises SqlError (line:column, the construct, the rule) for anything else refused."""
    try:
        compiled = _compile(text, name)
    except SqlError as exc:
        raise exc.with_source(source) from None
    raw = resolve_paths(compiled.raw, Path.cwd() if base is None else Path(base))
    try:
        spec = build_spec(raw, overrides)
        spec.require_contribution_bounds()
        _refuse_input_as_keys(spec, compiled.shorthand)
    except SpecError as exc:
        if overrides and exc.field in overrides:
            raise
        raise _located(exc, compiled, text, source) from None
    return spec.with_query_text(text)


def _refuse_input_as_keys(spec: JobSpec, shorthand: bool) -> None:
    """A key table must be public: a file in or equal to the input (`--input`) is the data's
    own key set, whose keys one unit alone can add (a leak public partitions exist to avoid)."""
    for query, _ in spec.input_key_files():
        field_path = "partition_selection.public_partitions"
        raise SpecError(
            field_path if shorthand else f"queries.{query.name}.{field_path}",
            "a key table must be public, not the input (or a file in its folder): "
            "its keys are the data's own; name a key file of public keys, "
            "UNNEST(GENERATE_ARRAY(a, b)) or UNNEST([k1, ...])",
        )


def compile_raw(text: str, name: str | None = None) -> dict[str, Any]:
    """The spec data (as a YAML file would give it, relative paths as written) of `text`."""
    return _compile(text, name).raw


# --- statements to spec data ----------------------------------------------------------------


def _compile(text: str, name: str | None) -> _Compiled:
    statements = read_statements(text)
    job, job_at = _job_options(text, statements)
    schema_name, schema, table_at = _input_schema(text, statements)
    unit = job["privacy_unit"]
    shorthand = len(statements) == 1 and _single_column_key(statements[0])
    compiled = _Compiled(raw={}, shorthand=shorthand, first_at=statements[0].at)
    single = len(statements) == 1
    own_name = statements[0].options.get("name")
    weight = statements[0].options.get("budget_weight")
    if single and weight is not None:
        raise _fail(
            text,
            weight.at,
            "option budget_weight",
            "shares the job's budget among several SELECTs; one SELECT has it all",
        )
    job_name = own_name.value if single and own_name is not None else name
    queries = []
    for index, select in enumerate(statements):
        own = select.options.get("name")
        if own is not None:
            query_name = own.value
        elif single:
            query_name = job_name or "terminal_stats"
        else:
            query_name = f"query_{index + 1}"
        query, at = _query(text, select, schema, unit)
        query["name"] = query_name
        queries.append(query)
        key = "" if shorthand else str(query_name)
        compiled.query_at[key] = at
        if select.where is not None:
            compiled.filters[key] = select.where_offsets
    raw: dict[str, Any] = {}
    if shorthand:
        query = queries[0]
        del query["name"]  # the job's: its one query is named after it
        keys = query.pop("partition_by")
        raw.update({"partition_key": keys[0], **query})
        compiled.job_at.update(compiled.query_at.pop(""))
        compiled.job_at["partition_key"] = compiled.job_at.get("partition_by", 0)
    else:
        raw["queries"] = queries
    if job_name is not None:
        raw["name"] = job_name
    for path, value in job.items():
        _put(raw, path, value)
    if schema_name != SHIPPED_SCHEMAS[0]:
        _put(raw, "input.schema", schema_name)
    compiled.job_at.update(job_at)
    compiled.job_at["input.schema"] = table_at
    compiled.job_at["input"] = table_at
    compiled.raw = raw
    return compiled


def _single_column_key(select: DPSelect) -> bool:
    """One GROUP BY key that is a plain column: the shorthand's partition_key."""
    if len(select.group_by) != 1:
        return False
    key = select.group_by[0]
    aliases = {
        item.alias.value.lower(): item.expr
        for item in select.items
        if item.alias is not None and isinstance(item.expr, KeyExpr)
    }
    key = aliases.get(key.column.lower(), key) if key.part is None and key.edges is None else key
    assert isinstance(key, KeyExpr)
    return key.part is None and key.edges is None and key.column not in TIME_BUCKETS


def _put(raw: dict[str, Any], path: str, value: Any) -> None:
    *sections, last = path.split(".")
    where = raw
    for section in sections:
        where = where.setdefault(section, {})
    where[last] = value


def _fail(text: str, offset: int, construct: str, rule: str) -> SqlError:
    where = Position.of(text, offset)
    return SqlError(where.line, where.column, construct, rule)


def _job_options(text: str, statements: list[DPSelect]) -> tuple[dict[str, Any], dict[str, int]]:
    """The job's options from every SELECT: each known, the same wherever repeated; epsilon
    and privacy_unit_column required (as BigQuery requires them)."""
    job: dict[str, Any] = {}
    job_at: dict[str, int] = {}
    for select in statements:
        for option, value in select.options.items():
            name_at = select.option_names_at[option]
            if option not in OPTIONS:
                raise _fail(
                    text,
                    name_at,
                    f"option {excerpt(option)}",
                    "unknown; options: " + ", ".join(sorted(OPTIONS)),
                )
            if option not in JOB_OPTIONS:
                continue
            path = JOB_OPTIONS[option]
            if path in job and job[path] != value.value:
                raise _fail(
                    text,
                    value.at,
                    f"option {option}",
                    "differs from its value in an "
                    "earlier SELECT: the SELECTs of one text are one job (one budget, "
                    "one privacy unit, one noise)",
                )
            if option == "noise_kind" and "noise" in select.options:
                raise _fail(
                    text, name_at, "option noise_kind", "give noise or noise_kind, not both"
                )
            job[path] = value.value
            job_at.setdefault(path, value.at)
    first = statements[0]
    for path, option in (("budget.epsilon", "epsilon"), ("privacy_unit", "privacy_unit_column")):
        if path not in job:
            at = first.options_at or first.at
            raise _fail(
                text,
                at,
                f"OPTIONS without {option}",
                (
                    "every DP query states its budget: OPTIONS (epsilon = ..., ...)"
                    if option == "epsilon"
                    else "the privacy unit (what is protected, e.g. CUSTOMER_ID) is required: "
                    "OPTIONS (privacy_unit_column = CUSTOMER_ID, ...)"
                ),
            )
    job_at["budget"] = job_at["budget.epsilon"]
    return job, job_at


def _input_schema(text: str, statements: list[DPSelect]) -> tuple[str, Schema, int]:
    """The input schema FROM names (a shipped schema, or a .json schema file), the same in
    every SELECT (one job reads one input)."""
    first = statements[0].table
    assert first is not None
    for select in statements[1:]:
        assert select.table is not None
        if select.table.value != first.value:
            raise _fail(
                text,
                select.table.at,
                f"FROM {excerpt(select.table.value)}",
                f"every SELECT of one job reads the same input ({excerpt(first.value)})",
            )
    table = str(first.value)
    if table not in SHIPPED_SCHEMAS and not table.endswith(".json"):
        raise _fail(
            text,
            first.at,
            f"FROM {excerpt(table)}",
            "names the input's schema: "
            f"{', '.join(SHIPPED_SCHEMAS)} or a `.json` schema file (the data is "
            "--input)",
        )
    try:
        schema = input_schema_from(table)
    except SchemaError as exc:
        raise _fail(text, first.at, f"FROM {excerpt(table)}", str(exc)) from None
    return table, schema, first.at


def _query(
    text: str, select: DPSelect, schema: Schema, unit: str
) -> tuple[dict[str, Any], dict[str, int]]:
    """One SELECT as a query's spec data, and where each of its fields was set."""
    query: dict[str, Any] = {}
    at: dict[str, int] = {"": select.at, "bounds": select.options_at or select.at}
    for option, given in select.options.items():
        path = QUERY_OPTIONS.get(option)
        if path is not None and option != "name":
            _put(query, path, given.value)
            at[path] = given.at
        elif option == "name":
            at["name"] = given.at
    metrics, value, value_range = _aggregates(text, select, schema, unit, query)
    query["metrics"] = metrics
    at["metrics"] = next(i.expr.at for i in select.items if isinstance(i.expr, Aggregate))
    if value is not None:
        query["value"] = value.value
        at["value"] = value.at
    if value_range is not None:
        low, high, range_at = value_range
        query.setdefault("bounds", {}).update({"min_value": low, "max_value": high})
        at["bounds.min_value"] = at["bounds.max_value"] = range_at
    keys, keys_at = _keys(text, select, schema)
    query["partition_by"] = keys
    at["partition_by"] = keys_at
    if select.where is not None:
        query["filter"] = select.where.value
        at["filter"] = select.where.at
    _public_keys(text, select, query, at)
    return query, at


def _aggregates(
    text: str, select: DPSelect, schema: Schema, unit: str, query: Mapping[str, Any]
) -> tuple[list[str], Located | None, tuple[float, float, int] | None]:
    """(metrics in select order, the value column, its [min_value, max_value] and where)."""
    metrics: list[str] = []
    value: Located | None = None
    value_range: tuple[float, float, int] | None = None
    linf = query.get("bounds", {}).get("max_contributions_per_partition")
    for item in select.items:
        agg = item.expr
        if not isinstance(agg, Aggregate):
            continue
        metric = _metric(text, agg, schema, unit)
        if metric in metrics:
            raise _fail(text, agg.at, agg.function, f"{metric} is asked for twice in one SELECT")
        column = metric_column(metric)
        if item.alias is not None and item.alias.value.lower() != column.lower():
            raise _fail(
                text,
                item.alias.at,
                f"alias {excerpt(item.alias.value)}",
                f"the release names this column {column}: write AS {column} or leave the alias out",
            )
        metrics.append(metric)
        if agg.function == "COUNT":
            continue
        assert agg.column is not None
        if value is not None and agg.column != value.value:
            raise _fail(
                text,
                agg.column_at,
                f"{agg.function}({excerpt(agg.column)})",
                "one "
                f"SELECT aggregates one value column ({excerpt(value.value)} above); "
                "write another SELECT for another column",
            )
        value = value or Located(agg.column, agg.column_at)
        if agg.bounds is None:
            raise _fail(
                text,
                agg.at,
                f"{agg.function} without contribution_bounds_per_group",
                BOUNDS_RULE + "; supported: SUM(col, contribution_bounds_per_row => (0, 200))",
            )
        argument, low, high, bounds_at = agg.bounds
        if argument == "contribution_bounds_per_group" and agg.function == "SUM":
            if not isinstance(linf, int) or isinstance(linf, bool) or linf < 1:
                raise _fail(
                    text,
                    bounds_at,
                    "SUM with contribution_bounds_per_group",
                    "a "
                    "unit's total per group is Linf rows of [lo/Linf, hi/Linf]: needs "
                    "OPTIONS max_contributions_per_partition (Linf), or use "
                    "contribution_bounds_per_row",
                )
            low, high = low / linf, high / linf
        if value_range is not None and (low, high) != value_range[:2]:
            raise _fail(
                text,
                bounds_at,
                argument,
                f"gives the values the range [{low:g}, "
                f"{high:g}], another aggregate of this SELECT [{value_range[0]:g}, "
                f"{value_range[1]:g}]: one SELECT clips its value to one range",
            )
        value_range = value_range or (low, high, bounds_at)
    if not metrics:
        raise _fail(
            text,
            select.at,
            "SELECT without an aggregate",
            "a DP query releases aggregates: COUNT(*), SUM(...), AVG(...), ...",
        )
    return metrics, value, value_range


def _metric(text: str, agg: Aggregate, schema: Schema, unit: str) -> str:
    """The spec's metric of one aggregate call."""
    function = agg.function
    if function == "COUNT":
        if agg.bounds is not None:
            raise _fail(
                text,
                agg.bounds[3],
                f"COUNT with {agg.bounds[0]}",
                "a count's "
                "contributions are bounded by OPTIONS max_contributions_per_partition "
                "(Linf) and max_groups_contributed (L0); bounds are for value "
                "aggregates",
            )
        if agg.column is None:
            return "count"
        if agg.column not in schema.names:
            raise _fail(
                text,
                agg.column_at,
                f"COUNT({excerpt(agg.column)})",
                f"not a column of {schema.name} ({', '.join(schema.names)})",
            )
        if agg.distinct:
            return "privacy_id_count" if agg.column == unit else f"count_distinct({agg.column})"
        if schema.field(agg.column).nullable:
            raise _fail(
                text,
                agg.column_at,
                f"COUNT({agg.column})",
                "of a nullable column: "
                "not supported (COUNT(*) counts rows; COUNT(col) of a non-null column "
                "is the same)",
            )
        return "count"
    if agg.column is not None and agg.column not in schema.names:
        raise _fail(
            text,
            agg.column_at,
            f"{function}({excerpt(agg.column)})",
            f"not a column of {schema.name} ({', '.join(schema.names)})",
        )
    if function == "PERCENTILE_CONT":
        assert agg.fraction is not None
        fraction = Decimal(str(agg.fraction.value))
        if not 0 <= fraction <= 1:
            raise _fail(
                text,
                agg.fraction.at,
                "PERCENTILE_CONT",
                "the percentile is a fraction in [0, 1] (0.5: the median)",
            )
        p = fraction * 100
        return f"percentile({float(p):g})"
    return METRIC_OF[function]


def _keys(text: str, select: DPSelect, schema: Schema) -> tuple[list[Any], int]:
    """partition_by in GROUP BY order; every key selected is grouped and every key grouped
    is selected (the release has one column per key)."""
    selected: dict[str, tuple[Any, int]] = {}
    aliases: dict[str, Any] = {}
    for item in select.items:
        if isinstance(item.expr, Aggregate):
            continue
        entry = _key_entry(text, item.expr, schema)
        column = key_name(_entry_text(entry))
        if item.alias is not None:
            if item.alias.value.lower() != column.lower():
                raise _fail(
                    text,
                    item.alias.at,
                    f"alias {excerpt(item.alias.value)}",
                    "the "
                    f"release names this key column {column}: write AS {column} or "
                    "leave the alias out",
                )
            aliases[item.alias.value.lower()] = entry
        selected[_entry_text(entry)] = (entry, item.expr.at)
    grouped: list[Any] = []
    for key in select.group_by:
        plain = key.part is None and key.edges is None
        entry = aliases.get(key.column.lower()) if plain else None
        entry = entry if entry is not None else _key_entry(text, key, schema)
        if _entry_text(entry) not in selected:
            raise _fail(
                text,
                key.at,
                f"GROUP BY {excerpt(key_name(_entry_text(entry)))}",
                "a key grouped by must be selected too (the release has a column per key)",
            )
        if any(_entry_text(entry) == _entry_text(g) for g in grouped):
            raise _fail(text, key.at, "GROUP BY", "a key is listed twice")
        grouped.append(entry)
    for entry_text, (_, item_at) in selected.items():
        if not any(_entry_text(g) == entry_text for g in grouped):
            raise _fail(
                text,
                item_at,
                excerpt(key_name(entry_text)),
                "neither grouped by nor aggregated: add it to GROUP BY",
            )
    keys_at = select.group_by[0].at if select.group_by else select.at
    return grouped, keys_at


def _entry_text(entry: Any) -> str:
    if isinstance(entry, dict):
        return BucketKey(entry["bucket"], tuple(float(e) for e in entry["edges"])).text
    return str(entry)


def _key_entry(text: str, key: KeyExpr, schema: Schema) -> Any:
    """The spec's partition_by entry of a key expression."""
    if key.edges is not None:
        edges = [int(e) if e.is_integer() else e for e in key.edges]
        return {"bucket": key.column, "edges": edges}
    if key.part is not None:
        part = TIME_PARTS.get(key.part)
        if part is None:
            rule = (
                "weeks start on Monday here: ISOWEEK or WEEK(MONDAY)"
                if key.part.startswith("WEEK")
                else f"the parts are {', '.join(TIME_PARTS)}"
            )
            raise _fail(text, key.at, f"{key.function}(..., {excerpt(key.part)})", rule)
        if key.column != schema.time_column:
            raise _fail(
                text,
                key.at,
                f"{key.function}({excerpt(key.column)}, ...)",
                f"time keys truncate the input's time column ({schema.time_column})",
            )
        return part
    if key.column in TIME_BUCKETS:
        raise _fail(
            text,
            key.at,
            excerpt(key.column),
            f"a time key is written DATE_TRUNC({schema.time_column}, {key.column.upper()})",
        )
    return key.column


def _public_keys(text: str, select: DPSelect, query: dict[str, Any], at: dict[str, int]) -> None:
    """Key tables (RIGHT OUTER JOIN ... USING (key)) as the query's public partitions: the
    bare source for a query with one listed key, else one source per key column."""
    given = query.get("partition_selection", {}).get("public_partitions")
    listed_keys = [k for k in query["partition_by"] if isinstance(k, str)]
    if given == INPUT_RANGE and any(k not in TIME_BUCKETS for k in listed_keys):
        raise _fail(
            text,
            at["partition_selection.public_partitions"],
            "option public_partitions",
            f"input_range is every bucket of a time key ({', '.join(TIME_BUCKETS)}); a key "
            "column's public keys are a key file, a range 'A..B' or a key table",
        )
    if not select.joins:
        return
    selection = query.setdefault("partition_selection", {})
    if "public_partitions" in selection:
        raise _fail(
            text,
            select.joins[0].at,
            "JOIN",
            "public partitions are given twice "
            "(OPTIONS public_partitions and a key table): give one",
        )
    listed = [k for k in query["partition_by"] if isinstance(k, str)]
    sources: dict[str, Any] = {}
    for join in select.joins:
        if join.source == INPUT_RANGE and join.column not in TIME_BUCKETS:
            raise _fail(
                text,
                join.at,
                "JOIN input_range",
                f"input_range is every bucket of a time key ({', '.join(TIME_BUCKETS)}); "
                f"for key column {excerpt(join.column)} join a key file, "
                "UNNEST(GENERATE_ARRAY(a, b)) or UNNEST([k1, ...])",
            )
        if join.column not in listed:
            raise _fail(
                text,
                join.column_at,
                f"USING ({excerpt(join.column)})",
                f"a key table joins on a grouped key column ({', '.join(listed) or 'none here'})",
            )
        if join.column in sources:
            raise _fail(text, join.at, "JOIN", f"a second key table for {join.column}")
        sources[join.column] = join.source
    only = len(listed) == 1 and len(sources) == 1
    selection["public_partitions"] = next(iter(sources.values())) if only else sources
    at["partition_selection.public_partitions"] = select.joins[0].at
    at["partition_selection"] = select.joins[0].at


# --- spec errors back to the SQL --------------------------------------------------------------

_POSITION = re.compile(r" at position (\d+)")


def _located(exc: SpecError, compiled: _Compiled, text: str, source: str) -> SqlError:
    """A spec error at the SQL that set its field: the longest field path the SQL set, in
    the query the field belongs to, else the job's; a filter's own position inside WHERE."""
    path = exc.field
    query_key = ""
    if path.startswith("queries.") and not compiled.shorthand:
        rest = path.removeprefix("queries.")
        query_key, _, path = rest.partition(".")
    places = compiled.query_at.get(query_key, {}) if query_key else compiled.job_at
    offset = _longest(places, path)
    if offset is None:
        offset = _longest(compiled.job_at, path)
    if offset is None:
        offset = places.get("", compiled.first_at)
    rule = exc.rule
    if path == "filter":
        match = _POSITION.search(rule)
        pieces = compiled.filters.get(query_key)
        if match and pieces:
            inside = int(match.group(1)) - 1
            start, source_at = max((p for p in pieces if p[0] <= inside), default=pieces[0])
            offset = source_at + max(0, inside - start)
            rule = _POSITION.sub("", rule, count=1)
    construct = _construct(path)
    where = Position.of(text, offset)
    return SqlError(where.line, where.column, construct, rule, source)


def _longest(places: Mapping[str, int], path: str) -> int | None:
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        found = places.get(".".join(parts[:n]))
        if found is not None:
            return found
    return None


def _construct(path: str) -> str:
    """How an error names the SQL of a spec field."""
    for spec_field, option in FIELD_OPTIONS.items():
        if path == spec_field:
            return f"option {option}"
    for option, spec_field in OPTIONS.items():
        if path == spec_field:
            return f"option {option}"
    if path == "filter":
        return "WHERE"
    if path in ("partition_by", "partition_key"):
        return "GROUP BY"
    if path in ("bounds.min_value", "bounds.max_value"):
        return "contribution bounds"
    if path.startswith("input"):
        return "FROM"
    return path or "SELECT"
