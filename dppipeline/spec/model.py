"""The job spec: JobSpec and QuerySpec, and the functions that build a validated one.

A spec comes from YAML (`loader.load_raw`), from CLI flags, or both (`build_spec`): flags win
(`overrides.py`). A job always has `queries`; a spec written as one query at the top level
(the shorthand) is expanded into one query named after the job (`shorthand.py`). Fields are
checked by the constrained types of `constraints.py`, the sections by `sections.py`, so an
invalid spec cannot exist; `spec_from_dict` turns pydantic's errors into one `SpecError` that
names the field by its YAML path and the rule it breaks (`messages.py`: `budget.epsilon: must
be > 0 and finite, got -1.0`, `queries.q.bounds.min_value: must be <= bounds.max_value ...`).

The package's other modules, one job each: `vocabulary.py` (closed word lists), `limits.py`
(numeric limits), `metrics.py` (the metric grammar), `partition_keys.py` (partition keys and
public key sources), `paths.py` (the paths a spec names), `field_table.py` (`spec-doc`),
`schema.py` (input schemas), `filters.py` (row filters), `hashing.py` (the spec hash).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from dppipeline.errors import SpecError, excerpt
from dppipeline.spec import hashing
from dppipeline.spec.constraints import (
    Accounting,
    Column,
    CountNoise,
    Flag,
    JobName,
    Keys,
    Metrics,
    NoiseKind,
    PathText,
    PositiveFinite,
    QueryName,
    broken,
)
from dppipeline.spec.loader import load_raw
from dppipeline.spec.messages import spec_error
from dppipeline.spec.metrics import distinct_columns, needs_kept_rows, needs_value_bounds
from dppipeline.spec.overrides import apply_overrides
from dppipeline.spec.partition_keys import (
    KEY_RANGE,
    TIME_BUCKETS,
    bucket_key,
    is_file_source,
    key_name,
    lies_within,
)
from dppipeline.spec.paths import check_locations
from dppipeline.spec.sections import (
    BoundsSpec,
    BudgetSpec,
    InputSpec,
    Section,
    SelectionSpec,
)
from dppipeline.spec.shorthand import with_queries
from dppipeline.spec.vocabulary import ACCOUNTINGS, COUNT_NOISES, NOISE_KINDS

if TYPE_CHECKING:
    from dppipeline.spec.schema import Schema


class QuerySpec(Section):
    """One named query: its own filter, keys, metrics and bounds, under the job's budget."""

    name: QueryName = Field(description="Query name; its dataset's folder in the release.")
    partition_by: Keys = Field(
        ("TERMINAL_ID",),
        description=(
            "Key columns of the output rows: int64/string input columns, time keys hour, day, "
            "week, month, year (of the time column), {bucket: COLUMN, edges: [e0, e1, ...]} "
            "(a number cut at public edges; every bucket released); [] for one global total."
        ),
    )
    metrics: Metrics = Field(
        ("count", "sum", "mean"),
        description=(
            "count, sum, mean, variance, stddev, max, min, privacy_id_count, percentile(P), "
            "count_distinct(COLUMN)."
        ),
    )
    value: Column = Field("TX_AMOUNT", description="Column aggregated by value metrics.")
    filter: str | None = Field(
        None,
        description=(
            'Rows the query reads, e.g. "TERMINAL_ID in 1..100 and TX_AMOUNT >= 25" '
            "(comparisons, ranges, in, between, and/or/not); at most 100,000 characters, 500 "
            "conditions, 10,000 values per 'in' list and 20 levels of nesting (brackets, "
            "`not`, signs)."
        ),
    )
    bounds: BoundsSpec = Field(
        default_factory=BoundsSpec, description="Contribution bounds (job bounds by default)."
    )
    partition_selection: SelectionSpec = Field(
        default_factory=SelectionSpec,
        description="Public keys or private selection (not inherited from the job).",
    )
    budget_weight: PositiveFinite = Field(
        1.0, description="Share of the job budget relative to the other queries."
    )

    @field_validator("filter", mode="before")
    @classmethod
    def _a_filter(cls, text: Any) -> str | None:
        if text is None:
            return None
        if not isinstance(text, str) or not text.strip():
            raise broken(f"must be a filter expression, got {excerpt(text)}")
        return text  # parsed against the job's input schema (JobSpec._columns_exist)

    @model_validator(mode="after")
    def _consistent(self) -> QuerySpec:
        self._bounds_fit_metrics()
        self._resolve_linf_bounding()
        self._keys_fit_selection()
        return self

    def _resolve_linf_bounding(self) -> None:
        """An unset `bounds.linf_bounding` becomes this query's choice, so that the spec hash
        (hence the release key), the plan and the manifest all see it: `scale` (the same
        sensitivities, no sampling variance, docs/explanation/bounding.md) unless a metric
        needs the kept rows or `max_contributions` bounds a unit's total rows."""
        bounds = self.bounds
        if bounds.linf_bounding is not None:
            return
        samples = bounds.max_contributions is not None or any(map(needs_kept_rows, self.metrics))
        resolved = bounds.model_copy(update={"linf_bounding": "sample" if samples else "scale"})
        object.__setattr__(self, "bounds", resolved)  # still validating: frozen after

    def _bounds_fit_metrics(self) -> None:
        rows_needed = [m for m in self.metrics if needs_kept_rows(m)]
        if self.bounds.linf_bounding == "scale" and rows_needed:
            raise broken(
                f"scale keeps no rows, only each pair's count and sum; {rows_needed[0]} needs "
                "the kept rows: use sample for this query",
                at="bounds.linf_bounding",
            )
        if self.needs_value_bounds and self.bounds.min_value is None:
            raise broken(
                "min_value and max_value are required for sum, mean, variance, max, min and "
                "percentiles",
                at="bounds.min_value",
            )

    def _keys_fit_selection(self) -> None:
        """Public keys are given for exactly the listed key columns (a key list or a range
        for the one column); a key list becomes `{column: list}`."""
        selection = self.partition_selection
        sources = selection.public_partitions
        if not self.partition_by and (sources is not None or selection.pre_threshold is not None):
            raise broken(
                "a global total (partition_by: []) has one partition: nothing to select",
                at="partition_selection",
            )
        where = "partition_selection.public_partitions"
        listed = self.listed_keys
        if isinstance(sources, list):  # a key list: of the one key column
            if len(listed) != 1:
                raise broken(
                    "a key list needs one partition_by column; give one list per column instead",
                    at=where,
                )
            keyed = selection.model_copy(update={"public_partitions": {listed[0]: sources}})
            object.__setattr__(self, "partition_selection", keyed)  # still validating: frozen after
            sources = keyed.public_partitions
        if isinstance(sources, dict) and set(sources) != set(listed):
            buckets = [b for b in self.partition_by if bucket_key(b) is not None]
            implied = f" (bucket keys {', '.join(buckets)} list themselves)" if buckets else ""
            raise broken(
                f"must give keys for exactly the partition_by columns {listed}, "
                f"got {excerpt(sorted(sources))}{implied}",
                at=where,
            )
        if isinstance(sources, str) and KEY_RANGE.match(sources) and len(listed) != 1:
            raise broken(
                "a range needs one partition_by column; give one source per column instead",
                at=where,
            )

    def missing_bounds(self) -> tuple[str, str] | None:
        """(field, rule) of a contribution bound the query needs and does not state. No
        default suits every dataset: one too small silently drops most rows (L0 = Linf = 1
        released nothing on the demo data), one too large drowns the values in noise."""
        bounds = self.bounds
        if bounds.max_contributions is not None:
            return None
        if self.partition_by and bounds.max_partitions_contributed is None:
            return (
                "max_partitions_contributed",
                "required: the most partitions one privacy unit may contribute to (L0) sets "
                "the noise, and no default suits every dataset (or give bounds.max_contributions, "
                "a unit's total rows; `dppipeline tune` recommends bounds)",
            )
        if set(self.metrics) != {"privacy_id_count"} and (
            bounds.max_contributions_per_partition is None
        ):
            return (
                "max_contributions_per_partition",
                "required: the most rows one privacy unit may contribute to a partition "
                "(Linf) sets the noise, and no default suits every dataset (or give "
                "bounds.max_contributions, a unit's total rows; `dppipeline tune` recommends "
                "bounds)",
            )
        return None

    @property
    def pair_bounds(self) -> tuple[int, int]:
        """(L0, Linf) of a validated query bounded per partition: the stated bounds, and 1
        where the query does not use one (a global total's one partition; Linf for
        privacy_id_count alone, which counts a unit once per partition)."""
        bounds = self.bounds
        return (bounds.max_partitions_contributed or 1, bounds.max_contributions_per_partition or 1)

    @property
    def needs_value_bounds(self) -> bool:
        return needs_value_bounds(self.metrics)

    @property
    def listed_keys(self) -> list[str]:
        """The key columns public keys are listed for: all but bucket keys (public by their
        edges)."""
        return [k for k in self.partition_by if bucket_key(k) is None]

    @property
    def key_names(self) -> list[str]:
        """The release's key columns, in partition_by order."""
        return [key_name(k) for k in self.partition_by]

    @property
    def is_public(self) -> bool:
        """Public keys, or keys known in advance: a global total (one partition), or bucket
        keys alone (every bucket)."""
        return self.partition_selection.is_public or not self.listed_keys


def _check_column(schema: Schema, name: str, where: str, types: tuple[str, ...]) -> None:
    """`name` is a non-null column of `schema` with one of `types`."""
    if name not in schema.names:
        time = f" nor a time key ({', '.join(TIME_BUCKETS)})" if "int64" in types else ""
        raise SpecError(
            where,
            f"{name!r} is not a column of the input schema {schema.name} "
            f"({', '.join(schema.names)}){time}",
        )
    field = schema.field(name)
    if field.type not in types:
        raise SpecError(where, f"column {name} has type {field.type}; needs {' or '.join(types)}")
    if field.nullable:
        raise SpecError(where, f"column {name} is nullable: keys and values must not be")


class JobSpec(Section):
    """One release: per-partition DP statistics of one or more queries under one budget.

    `queries` always holds at least one query. A spec written without `queries` (the
    shorthand) is one query named after the job, made of the job's partition_key, metrics,
    value, bounds and partition_selection; with `queries`, those job fields are the queries'
    defaults. `is_shorthand` remembers which was written: it decides only how names read
    (error paths, mechanism names) and keeps the spec hash of existing shorthand specs.
    """

    name: JobName = Field(
        "terminal_stats", description="Job name; the release dataset's folder name."
    )
    privacy_unit: Column = Field(
        "CUSTOMER_ID", description="Column of the privacy unit (what is protected)."
    )
    partition_key: Column = Field(
        "TERMINAL_ID", description="Column whose values are the output partitions."
    )
    value: Column = Field("TX_AMOUNT", description="Column aggregated by sum, mean, variance, ...")
    filter: str | None = Field(
        None,
        description=(
            "Rows the job reads, in the syntax of a query's filter: the shorthand's one query "
            "takes it; with queries, each query reads the rows both its own filter and this "
            "one keep."
        ),
    )
    metrics: Metrics = Field(
        ("count", "sum", "mean"),
        description=(
            "Any of count, sum, mean, variance, stddev (the square root of the variance, no "
            "extra budget), max, min (an exponential mechanism over 1,024 public candidates in "
            "[min_value, max_value]), privacy_id_count, percentile(P), count_distinct(COLUMN) "
            "(distinct non-null values of an input column among the kept rows; noise as count)."
        ),
    )
    noise: NoiseKind = Field(NOISE_KINDS[0], description=f"Noise kind: {' or '.join(NOISE_KINDS)}.")
    accounting: Accounting = Field(
        ACCOUNTINGS[0],
        description=(
            "How the job's mechanisms compose: basic (shares add up), pld (privacy loss "
            "distributions) or zcdp (Rényi/zCDP), both by dp_accounting: less noise for the "
            "same (epsilon, delta), most with gaussian noise; needs budget.delta > 0."
        ),
    )
    count_noise: CountNoise = Field(
        COUNT_NOISES[0],
        description=(
            "Noise on count and privacy_id_count: discrete (OpenDP's discrete Laplace or "
            "Gaussian, integers released) or continuous (PyDP's, decimals released)."
        ),
    )
    confidence_intervals: Flag = Field(
        False,
        description=(
            "Release 95% intervals <metric>_ci_low/_ci_high beside count, sum, mean, "
            "variance, stddev, privacy_id_count and count_distinct (from the noise "
            "distribution: no extra budget)."
        ),
    )
    budget: BudgetSpec = Field(default_factory=BudgetSpec, description="Privacy budget.")
    bounds: BoundsSpec = Field(default_factory=BoundsSpec, description="Contribution bounds.")
    partition_selection: SelectionSpec = Field(
        default_factory=SelectionSpec, description="Public keys or private selection."
    )
    input: InputSpec = Field(default_factory=InputSpec, description="Input data.")
    output: PathText = Field(None, description="Release folder (required here or as --output).")
    queries: tuple[QuerySpec, ...] = Field(
        (),
        description=(
            "Several named queries under the job's one budget (see 'Several queries in one "
            "job'); the fields above are their defaults. Unset: one query, named after the job."
        ),
    )

    _shorthand: bool = PrivateAttr(default=False)
    _schema: Schema | None = PrivateAttr(default=None)
    # The DP SQL text the spec was compiled from (`dpsql.compile_sql`), for the manifest: not a
    # field, so neither the spec hash (the release key) nor to_dict sees it.
    _query_text: str | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _one_shape(cls, raw: Any, handler: Callable[[Any], JobSpec]) -> JobSpec:
        """Expands the shorthand, or fills each query's unset fields from the job's."""
        if isinstance(raw, JobSpec):
            return raw
        if not isinstance(raw, Mapping):
            raise broken("must be a mapping of fields at the top level")
        data, shorthand = with_queries(raw, cls.model_fields["name"].default)
        spec = handler(data)
        spec._shorthand = shorthand
        if shorthand:  # the job's bounds are its one query's: hashed with the resolved choice
            choice = spec.queries[0].bounds.linf_bounding
            bounds = spec.bounds.model_copy(update={"linf_bounding": choice})
            object.__setattr__(spec, "bounds", bounds)
        return spec

    @property
    def source_schema(self) -> Schema:
        """The input schema (`input.schema`), its time column set (`input.time_column`)."""
        from dppipeline.spec.schema import input_schema_from  # noqa: PLC0415

        if self._schema is None:
            schema = input_schema_from(self.input.schema).with_time_column(self.input.time_column)
            object.__setattr__(self, "_schema", schema)
        assert self._schema is not None
        return self._schema

    def _columns_exist(self) -> None:
        """Every column the job names is in its input schema, with a type that fits its role;
        filters parse against it. Raises SpecError naming the field (the spec's YAML path)."""
        from dppipeline.spec.schema import SchemaError  # noqa: PLC0415

        try:
            schema = self.source_schema
        except SchemaError as exc:
            at = "input.time_column" if self.input.time_column else "input.schema"
            raise SpecError(at, str(exc)) from None
        listed = ", ".join(schema.names)
        unit = self.privacy_unit
        if unit not in schema.names:
            raise SpecError(
                "privacy_unit", f"column {unit} is not in the input schema {schema.name} ({listed})"
            )
        if schema.field(unit).type not in ("int64", "string") or schema.field(unit).nullable:
            raise SpecError(
                "privacy_unit", f"column {unit} must be a non-null int64 or string column"
            )
        if self.input.layout == "files" and schema.time_column is None:
            raise SpecError(
                "input.layout",
                "files needs a time column to select the period by (input.time_column)",
            )
        for query in self.queries:
            self._query_columns_exist(schema, query)

    def _query_columns_exist(self, schema: Schema, query: QuerySpec) -> None:
        """`_columns_exist` for the columns one query names: keys, value, filter, metrics."""
        where = self.query_path(query)
        for entry in query.partition_by:
            self._check_key(schema, entry, f"{where}partition_by")
        if query.needs_value_bounds:
            _check_column(schema, query.value, f"{where}value", ("int64", "float64"))
        if query.filter is not None:
            from dppipeline.spec.filter_parser import parse_filter  # noqa: PLC0415 (sqlglot)

            parse_filter(query.filter, schema, where=f"{where}filter")
        for column in distinct_columns(query.metrics):
            if column == self.privacy_unit:  # distinct units: privacy_id_count (sensitivity 1)
                raise SpecError(
                    f"{where}metrics",
                    f"count_distinct({column}) counts privacy units: use privacy_id_count",
                )
            if column not in schema.names:
                raise SpecError(
                    f"{where}metrics",
                    f"count_distinct({column}): {column!r} is not an input column "
                    f"({', '.join(schema.names)})",
                )

    def _check_key(self, schema: Schema, entry: str, where: str) -> None:
        if entry in TIME_BUCKETS:
            if schema.time_column is None:
                raise SpecError(
                    where,
                    f"time key {entry} needs a time column: input schema {schema.name} has none "
                    "(set input.time_column or a column's role: event_time)",
                )
            return
        if entry == self.privacy_unit:
            raise SpecError(where, "must not include the privacy unit")
        bucket = bucket_key(entry)
        if bucket is not None and bucket.column == self.privacy_unit:
            # A function of the unit is the unit again: a bucket per ID (narrow edges) keys
            # a release by customer, which the rule above refuses for the column itself.
            raise SpecError(where, "must not bucket the privacy unit")
        if bucket is not None:
            _check_column(schema, bucket.column, where, ("int64", "float64"))
            return
        if entry in schema.names and schema.field(entry).type == "float64":
            raise SpecError(
                where,
                f"column {entry} has type float64; keys must be int64 or string (cut a number "
                f"into buckets: {{bucket: {entry}, edges: [e0, e1, ...]}})",
            )
        _check_column(schema, entry, where, ("int64", "string"))

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.privacy_unit == self.partition_key:
            raise broken("must differ from privacy_unit", at="partition_key")
        names = [q.name for q in self.queries]
        for name in names:
            if names.count(name) > 1:
                raise broken("two queries have this name", at=f"queries.{name}")
        if self.noise == "gaussian" and self.budget.delta == 0:
            raise broken("must be > 0 for gaussian noise", at="budget.delta")
        if self.accounting != "basic" and self.budget.delta == 0:
            raise broken(f"must be > 0 for {self.accounting} accounting", at="budget.delta")
        if self.budget.delta == 0:
            for query in self.queries:
                if not query.is_public:
                    where = self.query_path(query).removesuffix(".")
                    raise broken(
                        f"must be > 0 for private partition selection ("
                        f"{where + ': ' if where else ''}or give public_partitions)",
                        at="budget.delta",
                    )
        self._columns_exist()
        return self

    @property
    def query_text(self) -> str | None:
        """The DP SQL this spec was compiled from (None for a YAML spec)."""
        return self._query_text

    def with_query_text(self, text: str) -> JobSpec:
        """This spec, remembering the SQL it was compiled from (the manifest's `query`)."""
        self._query_text = text
        return self

    @property
    def is_shorthand(self) -> bool:
        """Written as one query at the top level (no `queries`)."""
        return self._shorthand

    def query_path(self, query: QuerySpec) -> str:
        """The YAML path prefix of a query's fields: '' for the shorthand (they are the
        job's), else `queries.<name>.`."""
        return "" if self._shorthand else f"queries.{query.name}."

    def query(self, name: str) -> QuerySpec:
        return next(q for q in self.queries if q.name == name)

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON data (as the manifest records it)."""
        return self.model_dump(mode="json")

    def require_contribution_bounds(self) -> None:
        """Raises SpecError naming the first contribution bound a query uses and does not
        state (`QuerySpec.missing_bounds`). Every release plans through this; `tune`, which
        recommends those bounds, does not need them."""
        for query in self.queries:
            missing = query.missing_bounds()
            if missing is not None:
                where = "" if self.is_shorthand else f"queries.{query.name}."
                raise SpecError(f"{where}bounds.{missing[0]}", missing[1])

    def input_key_files(self) -> list[tuple[QuerySpec, str]]:
        """Each public key file (query, source) that is the input (`input.path`) or lies in its
        folder: its keys are the data's own, which one privacy unit alone can add, the leak
        public partitions exist to avoid (`refuse_input_as_keys`)."""
        data = self.input.path
        found: list[tuple[QuerySpec, str]] = []
        if not data:
            return found
        for query in self.queries:
            sources = query.partition_selection.public_partitions
            named = sources.values() if isinstance(sources, Mapping) else [sources]
            found += [
                (query, source)
                for source in named
                if isinstance(source, str) and is_file_source(source) and lies_within(source, data)
            ]
        return found

    def refuse_input_as_keys(self) -> None:
        """Raises SpecError naming the first public key file that is the input or in its
        folder (`input_key_files`). Every run reads its key files through this
        (`lifecycle.public_keys`), whichever front end made the spec."""
        for query, source in self.input_key_files():
            raise SpecError(
                f"{self.query_path(query)}partition_selection.public_partitions",
                f"{source} is the input or lies in its folder: public keys must not come from "
                "the data (one customer alone could add a key); name a file of public keys or "
                "a range 'A..B'",
            )

    def spec_hash(self) -> str:
        """sha256 of the canonical spec: what decides the release's numbers, defaults left
        out, public key files by content (see `hashing.py`); for release keys."""
        return hashing.spec_hash(self)


def spec_from_dict(raw: Mapping[str, Any], source: str = "job spec") -> JobSpec:
    """Builds a JobSpec from plain data (parsed YAML); unknown keys are errors, not ignored."""
    if not isinstance(raw, Mapping):
        raise SpecError(source, "must be a mapping of fields at the top level")
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise spec_error(exc, raw) from None


def budget_from_dict(raw: Any, source: str) -> BudgetSpec:
    """Just the budget section of a spec (for `dppipeline budget`), validated."""
    try:
        return BudgetSpec.model_validate({} if raw is None else raw)
    except ValidationError as exc:
        error = spec_error(exc, None)
        field = "budget" if error.field == "job spec" else f"budget.{error.field}"
        raise SpecError(f"{source}: {field}", error.rule) from None


def build_spec(
    raw: Mapping[str, Any], overrides: Mapping[str, Any] | None = None, source: str | None = None
) -> JobSpec:
    """A validated spec from YAML data plus dotted-path overrides (`budget.epsilon`); an
    override of None keeps the YAML value."""
    data = apply_overrides(raw, overrides)
    try:
        check_locations(data)
        return spec_from_dict(data)
    except SpecError as exc:
        if source is None:
            raise
        raise SpecError(f"{source}: {exc.field}", exc.rule) from None


def load_spec(path: str | Path) -> JobSpec:
    """Reads and validates a YAML job spec."""
    return build_spec(load_raw(path), source=str(path))
