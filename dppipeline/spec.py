"""The job spec: an immutable, self-validating description of one release.

A spec comes from YAML (`load_raw`), from CLI flags, or both (`build_spec`): flags win.
Every dataclass validates itself in `__post_init__`, so an invalid spec cannot exist; errors name
the field by its YAML path and the rule it breaks (`budget.epsilon: must be > 0, got -1.0`).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from dppipeline.errors import SpecError, UsageError

METRICS = ("count", "sum", "mean", "variance", "privacy_id_count")
# percentile(p), 0 <= p <= 100, is the parametrised metric; percentile(100) is a DP maximum.
_PERCENTILE = re.compile(r"^percentile\(\s*(\d+(?:\.\d+)?)\s*\)$")
TIME_BUCKETS = ("day", "week", "month")  # derived partition keys, from TX_DATETIME
_RANGE = re.compile(r"^\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*$")
INPUT_RANGE = "input_range"  # public keys of a time bucket: every bucket of the input's days
NOISE_KINDS = ("laplace", "gaussian")
SELECTION_STRATEGIES = ("truncated_geometric", "laplace_thresholding", "gaussian_thresholding")
INPUT_FORMATS = ("parquet", "csv")


def _doc(text: str) -> dict[str, str]:
    """Field metadata: the one-line doc shown by `dppipeline spec-doc` and in the README."""
    return {"doc": text}


@dataclass(frozen=True)
class InputSpec:
    """Where the transactions are and which days to read."""

    path: str | None = field(
        default=None, metadata=_doc("Input folder (required here or as --input).")
    )
    format: str = field(
        default="parquet",
        metadata=_doc("parquet: DIR/date=YYYY-MM-DD/*.parquet; csv: DIR/YYYY-MM-DD.csv."),
    )
    start_date: dt.date | None = field(
        default=None, metadata=_doc("First day to read, inclusive (YYYY-MM-DD); default: all.")
    )
    end_date: dt.date | None = field(
        default=None, metadata=_doc("Last day to read, inclusive (YYYY-MM-DD); default: all.")
    )
    max_rejected_fraction: float = field(
        default=0.001,
        metadata=_doc("Fail the run when more than this share of rows is rejected."),
    )
    quarantine: str | None = field(
        default=None,
        metadata=_doc(
            "Operator-only folder for rejected rows (default $DPPIPELINE_STATE_DIR/quarantine);"
            " never inside or beside the release."
        ),
    )

    def __post_init__(self) -> None:
        _path_as_text(self, "path", "input.path")
        _path_as_text(self, "quarantine", "input.quarantine")
        _one_of("input.format", self.format, INPUT_FORMATS)
        for name in ("start_date", "end_date"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, dt.date):
                object.__setattr__(self, name, _parse_date(f"input.{name}", value))
        if self.start_date and self.end_date and self.start_date > self.end_date:
            raise SpecError(
                "input.start_date",
                f"must not be after input.end_date ({self.start_date} > {self.end_date})",
            )
        _number_in("input.max_rejected_fraction", self.max_rejected_fraction, 0.0, 1.0)


@dataclass(frozen=True)
class BudgetSpec:
    """The privacy budget of the whole run: all metrics and partition selection together."""

    epsilon: float = field(
        default=1.0, metadata=_doc("Total epsilon of the release (> 0); smaller = more noise.")
    )
    delta: float = field(
        default=1e-6,
        metadata=_doc(
            "Total delta in [0, 1); needed (> 0) for Gaussian noise or private selection."
        ),
    )

    scope: str | None = field(
        default=None,
        metadata=_doc(
            "Ledger scope: the dataset and privacy unit the cap protects (default "
            "<input folder name>/<privacy_unit>)."
        ),
    )
    cap_epsilon: float | None = field(
        default=None, metadata=_doc("Ledger cap on the scope's total epsilon (unset: no cap).")
    )
    cap_delta: float | None = field(
        default=None, metadata=_doc("Ledger cap on the scope's total delta (unset: no cap).")
    )
    window_days: int | None = field(
        default=None,
        metadata=_doc("Caps hold per rolling window of this many data days (unset: all time)."),
    )

    def __post_init__(self) -> None:
        for name in ("cap_epsilon", "cap_delta"):
            value = getattr(self, name)
            if value is not None:
                number = _number(f"budget.{name}", value)
                if number < 0:
                    raise SpecError(f"budget.{name}", f"must be >= 0, got {value!r}")
                object.__setattr__(self, name, number)
        if self.window_days is not None and (
            isinstance(self.window_days, bool)
            or not isinstance(self.window_days, int)
            or self.window_days < 1
        ):
            raise SpecError(
                "budget.window_days", f"must be an integer >= 1, got {self.window_days!r}"
            )
        if self.scope is not None and (not isinstance(self.scope, str) or not self.scope):
            raise SpecError("budget.scope", f"must be a non-empty name, got {self.scope!r}")
        eps = _number("budget.epsilon", self.epsilon)
        if not eps > 0 or math.isinf(eps):
            raise SpecError("budget.epsilon", f"must be > 0 and finite, got {self.epsilon!r}")
        delta = _number("budget.delta", self.delta)
        if not 0 <= delta < 1:
            raise SpecError("budget.delta", f"must be in [0, 1), got {self.delta!r}")
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", delta)


@dataclass(frozen=True)
class BoundsSpec:
    """Contribution bounds: what one privacy unit may change, hence the noise scale."""

    max_partitions_contributed: int = field(
        default=1,
        metadata=_doc("L0: partitions kept per privacy unit (sampled uniformly when more)."),
    )
    max_contributions_per_partition: int = field(
        default=1,
        metadata=_doc("Linf: rows kept per privacy unit and partition (sampled uniformly)."),
    )
    min_value: float | None = field(
        default=None,
        metadata=_doc("Values are clipped to [min_value, max_value] (sum, mean, variance, ...)."),
    )
    max_value: float | None = field(
        default=None,
        metadata=_doc("Upper clipping bound; required for every metric of the value."),
    )

    def __post_init__(self) -> None:
        for name in ("max_partitions_contributed", "max_contributions_per_partition"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"bounds.{name}", f"must be an integer >= 1, got {value!r}")
        for name in ("min_value", "max_value"):
            value = getattr(self, name)
            if value is not None:
                number = _number(f"bounds.{name}", value)
                if not math.isfinite(number):
                    raise SpecError(f"bounds.{name}", f"must be finite, got {value!r}")
                object.__setattr__(self, name, number)
        if (self.min_value is None) != (self.max_value is None):
            missing = "min_value" if self.min_value is None else "max_value"
            raise SpecError(f"bounds.{missing}", "min_value and max_value must be set together")
        if self.min_value is not None and self.max_value is not None:
            if self.min_value > self.max_value:
                raise SpecError(
                    "bounds.min_value",
                    f"must be <= bounds.max_value ({self.min_value} > {self.max_value})",
                )
            if self.min_value == self.max_value:
                raise SpecError(
                    "bounds.min_value",
                    f"must be < bounds.max_value (both {self.min_value}): an empty range "
                    "carries no information",
                )


@dataclass(frozen=True)
class SelectionSpec:
    """Which partitions are released: a public key list, or private selection from the data."""

    public_partitions: str | dict[str, Any] | None = field(
        default=None,
        metadata=_doc(
            "Public keys: a file (one key per line, or a CSV with the key columns), an "
            "integer range 'A..B', or per key column a file, range, list or 'input_range' "
            "(every time bucket of the input days), whose product is the key set. Every "
            "listed key is released, no other. Unset: private selection."
        ),
    )
    strategy: str = field(
        default="truncated_geometric",
        metadata=_doc("Private selection: truncated_geometric, laplace_ or gaussian_thresholding."),
    )
    pre_threshold: int | None = field(
        default=None,
        metadata=_doc("Private selection: never release a partition with fewer privacy units."),
    )

    def __post_init__(self) -> None:
        if isinstance(self.public_partitions, Mapping):
            _check_key_sources(self.public_partitions)
            object.__setattr__(self, "public_partitions", dict(self.public_partitions))
        else:
            _path_as_text(self, "public_partitions", "partition_selection.public_partitions")
        _one_of("partition_selection.strategy", self.strategy, SELECTION_STRATEGIES)
        if self.pre_threshold is not None and (
            isinstance(self.pre_threshold, bool)
            or not isinstance(self.pre_threshold, int)
            or self.pre_threshold < 1
        ):
            raise SpecError(
                "partition_selection.pre_threshold",
                f"must be an integer >= 1, got {self.pre_threshold!r}",
            )

    @property
    def is_public(self) -> bool:
        return self.public_partitions is not None


def _check_key_sources(sources: Mapping[str, Any]) -> None:
    """Per key column: a file path, an integer range 'A..B', 'input_range' or a list."""
    where = "partition_selection.public_partitions"
    if not sources:
        raise SpecError(where, "must name at least one key column")
    for column, source in sources.items():
        if isinstance(source, list | tuple):
            if not source:
                raise SpecError(f"{where}.{column}", "must list at least one key")
            if any(isinstance(v, bool | dict | list) or v is None for v in source):
                raise SpecError(f"{where}.{column}", f"must list plain keys, got {source!r}")
        elif not isinstance(source, str | Path) or not str(source):
            raise SpecError(
                f"{where}.{column}",
                f"must be a file, a range 'A..B', {INPUT_RANGE!r} or a list; got {source!r}",
            )
        match = _RANGE.match(str(source)) if isinstance(source, str) else None
        if match and int(match.group(1)) > int(match.group(2)):
            raise SpecError(f"{where}.{column}", f"range {source!r} is empty (A > B)")


def parse_metric(name: Any, where: str = "metrics") -> str:
    """A metric name in canonical form: `count`, ..., or `percentile(P)` with 0 <= P <= 100."""
    if isinstance(name, str):
        text = name.strip()
        if text in METRICS:
            return text
        match = _PERCENTILE.match(text)
        if match:
            p = float(match.group(1))
            if not 0 <= p <= 100:
                raise SpecError(where, f"percentile must be in [0, 100], got {match.group(1)}")
            return f"percentile({p:g})"
    raise SpecError(
        where,
        f"must be one of {', '.join(METRICS)} or percentile(P) with 0 <= P <= 100; got {name!r}",
    )


def percentile_of(metric: str) -> float | None:
    """P of a canonical `percentile(P)` metric; None for any other metric."""
    match = _PERCENTILE.match(metric)
    return float(match.group(1)) if match else None


def metric_column(metric: str) -> str:
    """The release column of a metric: its name, or `percentile_P` (`.` as `_`)."""
    p = percentile_of(metric)
    return metric if p is None else f"percentile_{p:g}".replace(".", "_")


def _metrics_tuple(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [m.strip() for m in re.split(r",(?![^(]*\))", value) if m.strip()]
    if not isinstance(value, list | tuple):
        raise SpecError(where, f"must be a list of metric names, got {value!r}")
    metrics = tuple(parse_metric(m, where) for m in value)
    if not metrics:
        raise SpecError(where, "must name at least one metric")
    if len(set(metrics)) != len(metrics):
        raise SpecError(where, f"lists a metric twice: {list(metrics)}")
    return metrics


def _needs_value_bounds(metrics: tuple[str, ...]) -> bool:
    return any(m in ("sum", "mean", "variance") or percentile_of(m) is not None for m in metrics)


@dataclass(frozen=True)
class QuerySpec:
    """One named query of a multi-query job: its own filter, keys, metrics and bounds."""

    name: str = field(metadata=_doc("Query name; its dataset's folder in the release."))
    partition_by: tuple[str, ...] = field(
        default=("TERMINAL_ID",),
        metadata=_doc(
            "Key columns of the output rows: input columns and/or the time buckets day, week, "
            "month (of TX_DATETIME); [] for one global total."
        ),
    )
    metrics: tuple[str, ...] = field(
        default=("count", "sum", "mean"),
        metadata=_doc("count, sum, mean, variance, privacy_id_count, percentile(P)."),
    )
    value: str = field(default="TX_AMOUNT", metadata=_doc("Column aggregated by value metrics."))
    filter: str | None = field(
        default=None,
        metadata=_doc(
            'Rows the query reads, e.g. "TERMINAL_ID in 1..100 and TX_AMOUNT >= 25" '
            "(comparisons, ranges, in, between, and/or/not)."
        ),
    )
    bounds: BoundsSpec = field(
        default_factory=BoundsSpec, metadata=_doc("Contribution bounds (job bounds by default).")
    )
    partition_selection: SelectionSpec = field(
        default_factory=SelectionSpec,
        metadata=_doc("Public keys or private selection (not inherited from the job)."),
    )
    budget_weight: float = field(
        default=1.0, metadata=_doc("Share of the job budget relative to the other queries.")
    )

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", self.name):
            raise SpecError(
                "name", f"must start with a letter, then letters, digits, _; got {self.name!r}"
            )
        keys = self.partition_by
        if isinstance(keys, str):
            keys = (keys,)
        if not isinstance(keys, list | tuple) or not all(isinstance(k, str) for k in keys):
            raise SpecError("partition_by", f"must be a list of column names, got {keys!r}")
        if len(set(keys)) != len(keys):
            raise SpecError("partition_by", f"lists a key twice: {list(keys)}")
        object.__setattr__(self, "partition_by", tuple(keys))
        object.__setattr__(self, "metrics", _metrics_tuple(self.metrics, "metrics"))
        if not isinstance(self.value, str) or not self.value:
            raise SpecError("value", "must be a column name")
        if self.filter is not None:
            if not isinstance(self.filter, str) or not self.filter.strip():
                raise SpecError("filter", f"must be a filter expression, got {self.filter!r}")
            from dppipeline.filters import parse_filter  # noqa: PLC0415
            from dppipeline.schemas import transactions_schema  # noqa: PLC0415

            parse_filter(self.filter, transactions_schema(), where="filter")
        weight = _number("budget_weight", self.budget_weight)
        if not weight > 0 or math.isinf(weight):
            raise SpecError("budget_weight", f"must be > 0 and finite, got {self.budget_weight!r}")
        object.__setattr__(self, "budget_weight", weight)
        if self.needs_value_bounds and self.bounds.min_value is None:
            raise SpecError(
                "bounds.min_value",
                "min_value and max_value are required for sum, mean, variance and percentiles",
            )
        selection = self.partition_selection
        if not self.partition_by and (
            selection.public_partitions is not None or selection.pre_threshold is not None
        ):
            raise SpecError(
                "partition_selection",
                "a global total (partition_by: []) has one partition: nothing to select",
            )
        if isinstance(selection.public_partitions, dict):
            listed = set(selection.public_partitions)
            if listed != set(self.partition_by):
                raise SpecError(
                    "partition_selection.public_partitions",
                    f"must give keys for exactly the partition_by columns "
                    f"{list(self.partition_by)}, got {sorted(listed)}",
                )
        elif (
            isinstance(selection.public_partitions, str)
            and _RANGE.match(selection.public_partitions)
            and len(self.partition_by) != 1
        ):
            raise SpecError(
                "partition_selection.public_partitions",
                "a range needs one partition_by column; give one source per column instead",
            )

    @property
    def needs_value_bounds(self) -> bool:
        return _needs_value_bounds(self.metrics)

    @property
    def is_public(self) -> bool:
        """Public keys, or a global total (its one partition is known in advance)."""
        return self.partition_selection.is_public or not self.partition_by


@dataclass(frozen=True)
class JobSpec:
    """One release: per-partition DP statistics of one value column."""

    name: str = field(
        default="terminal_stats", metadata=_doc("Job name; the release dataset's folder name.")
    )
    privacy_unit: str = field(
        default="CUSTOMER_ID", metadata=_doc("Column of the privacy unit (what is protected).")
    )
    partition_key: str = field(
        default="TERMINAL_ID", metadata=_doc("Column whose values are the output partitions.")
    )
    value: str = field(
        default="TX_AMOUNT", metadata=_doc("Column aggregated by sum, mean, variance, ...")
    )
    metrics: tuple[str, ...] = field(
        default=("count", "sum", "mean"),
        metadata=_doc("Any of count, sum, mean, variance, privacy_id_count, percentile(P)."),
    )
    noise: str = field(default="laplace", metadata=_doc("Noise kind: laplace or gaussian."))
    confidence_intervals: bool = field(
        default=False,
        metadata=_doc(
            "Release 95% intervals <metric>_ci_low/_ci_high beside count, sum, mean and "
            "privacy_id_count (from the noise distribution: no extra budget)."
        ),
    )
    budget: BudgetSpec = field(default_factory=BudgetSpec, metadata=_doc("Privacy budget."))
    bounds: BoundsSpec = field(default_factory=BoundsSpec, metadata=_doc("Contribution bounds."))
    partition_selection: SelectionSpec = field(
        default_factory=SelectionSpec, metadata=_doc("Public keys or private selection.")
    )
    input: InputSpec = field(default_factory=InputSpec, metadata=_doc("Input data."))
    output: str | None = field(
        default=None, metadata=_doc("Release folder (required here or as --output).")
    )
    queries: tuple[QuerySpec, ...] = field(
        default=(),
        metadata=_doc(
            "Several named queries under the job's one budget (see 'Several queries in one "
            "job'); the fields above are their defaults. Unset: one query, named after the job."
        ),
    )

    def __post_init__(self) -> None:
        _path_as_text(self, "output", "output")
        if not isinstance(self.name, str) or not self.name.replace("_", "").isalnum():
            raise SpecError("name", f"must be letters, digits and underscores, got {self.name!r}")
        for name in ("privacy_unit", "partition_key", "value"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise SpecError(name, "must be a column name")
        if self.privacy_unit == self.partition_key:
            raise SpecError("partition_key", "must differ from privacy_unit")
        object.__setattr__(self, "metrics", _metrics_tuple(self.metrics, "metrics"))
        _one_of("noise", self.noise, NOISE_KINDS)
        if not isinstance(self.confidence_intervals, bool):
            raise SpecError(
                "confidence_intervals", f"must be true or false, got {self.confidence_intervals!r}"
            )
        queries = tuple(self.queries)
        object.__setattr__(self, "queries", queries)
        if queries:
            _check_queries(queries)
        elif self.needs_value_bounds and self.bounds.min_value is None:
            raise SpecError(
                "bounds.min_value",
                "min_value and max_value are required for sum, mean, variance and percentiles",
            )
        if self.noise == "gaussian" and self.budget.delta == 0:
            raise SpecError("budget.delta", "must be > 0 for gaussian noise")
        if self.budget.delta == 0:
            for query in self.query_specs:
                if not query.is_public:
                    where = f"queries.{query.name}: " if queries else ""
                    raise SpecError(
                        "budget.delta",
                        f"must be > 0 for private partition selection ({where}or give "
                        "public_partitions)",
                    )

    @property
    def needs_value_bounds(self) -> bool:
        return _needs_value_bounds(self.metrics)

    @property
    def is_multi_query(self) -> bool:
        return bool(self.queries)

    @property
    def query_specs(self) -> tuple[QuerySpec, ...]:
        """The job's queries; a single-query job is one query named after the job."""
        if self.queries:
            return self.queries
        return (
            QuerySpec(
                name=self.name,
                partition_by=(self.partition_key,),
                metrics=self.metrics,
                value=self.value,
                bounds=self.bounds,
                partition_selection=self.partition_selection,
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(dataclasses.asdict(self))

    def spec_hash(self) -> str:
        """sha256 of the canonical spec: what decides the release's numbers, defaults left
        out, public key files by content (see `spec_hash.py`); for release keys."""
        from dppipeline.spec_hash import spec_hash  # noqa: PLC0415

        return spec_hash(self)


def _check_queries(queries: tuple[QuerySpec, ...]) -> None:
    names = [q.name for q in queries]
    for name in names:
        if names.count(name) > 1:
            raise SpecError(f"queries.{name}", "two queries have this name")


_SECTIONS: dict[str, type] = {
    "budget": BudgetSpec,
    "bounds": BoundsSpec,
    "partition_selection": SelectionSpec,
    "input": InputSpec,
}


def spec_from_dict(raw: Mapping[str, Any], source: str = "job spec") -> JobSpec:
    """Builds a JobSpec from plain data (parsed YAML); unknown keys are errors, not ignored."""
    if not isinstance(raw, Mapping):
        raise SpecError(source, "must be a mapping of fields at the top level")
    known = {f.name for f in fields(JobSpec)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SpecError(unknown[0], f"unknown field (known: {', '.join(sorted(known))})")
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        section = _SECTIONS.get(key)
        if section is not None:
            kwargs[key] = _section_from_dict(key, section, value)
        elif key == "metrics" and isinstance(value, list):
            kwargs[key] = tuple(value)
        elif key != "queries":
            kwargs[key] = value
    if raw.get("queries") is not None:
        kwargs["queries"] = _queries_from_dict(raw["queries"], raw)
    try:
        return JobSpec(**kwargs)
    except TypeError as exc:  # a wrong type that the dataclass itself rejected
        raise SpecError(source, str(exc)) from None


# Job fields a query inherits when it does not set them (bounds: field by field).
_INHERITED = ("metrics", "value")


def _queries_from_dict(raw_queries: Any, job: Mapping[str, Any]) -> tuple[QuerySpec, ...]:
    """Queries from YAML (a list of mappings, each with a name), job fields as defaults."""
    if not isinstance(raw_queries, list) or not raw_queries:
        raise SpecError("queries", "must be a non-empty list of queries")
    known = {f.name for f in fields(QuerySpec)}
    queries = []
    for position, raw in enumerate(raw_queries, start=1):
        if not isinstance(raw, Mapping):
            raise SpecError(f"queries[{position}]", "must be a mapping with a name")
        name = raw.get("name")
        where = f"queries.{name}" if isinstance(name, str) else f"queries[{position}]"
        unknown = sorted(set(raw) - known)
        if unknown:
            raise SpecError(
                f"{where}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(known))})"
            )
        kwargs: dict[str, Any] = {k: job[k] for k in _INHERITED if k in job and k not in raw}
        kwargs.update({k: v for k, v in raw.items() if k not in ("bounds", "partition_selection")})
        if "partition_by" not in raw:
            kwargs["partition_by"] = (job.get("partition_key") or "TERMINAL_ID",)
        try:
            job_bounds = job.get("bounds") or {}
            bounds = {**(job_bounds if isinstance(job_bounds, Mapping) else {})}
            bounds.update(_mapping(raw.get("bounds"), "bounds"))
            kwargs["bounds"] = _section_from_dict("bounds", BoundsSpec, bounds)
            kwargs["partition_selection"] = _section_from_dict(
                "partition_selection", SelectionSpec, raw.get("partition_selection")
            )
            query = QuerySpec(**kwargs)
        except SpecError as exc:
            raise SpecError(f"{where}.{exc.field}", exc.rule) from None
        except TypeError as exc:
            raise SpecError(where, str(exc)) from None
        queries.append(query)
    return tuple(queries)


def _mapping(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(name, "must be a mapping")
    return dict(value)


def _section_from_dict(name: str, cls: type, value: Any) -> Any:
    if value is None:
        return cls()
    if not isinstance(value, Mapping):
        raise SpecError(name, "must be a mapping")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise SpecError(
            f"{name}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(known))})"
        )
    return cls(**value)


def budget_from_dict(raw: Any, source: str) -> BudgetSpec:
    """Just the budget section of a spec (for `dppipeline budget`), validated."""
    try:
        return _section_from_dict("budget", BudgetSpec, raw)
    except SpecError as exc:
        raise SpecError(f"{source}: {exc.field}", exc.rule) from None


def load_raw(path: str | Path) -> dict[str, Any]:
    """Reads a YAML job spec into plain data; errors say which file and where."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read job spec {path}: {exc.strerror}") from None
    try:
        raw = yaml.load(text, Loader=_SpecLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{path}: not valid YAML{where}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: a job spec must be a mapping of fields")
    return resolve_paths(raw, path.resolve().parent)


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that leaves dates as text, so `_parse_date` names the field of a bad one
    (PyYAML itself raises a bare ValueError for `2026-02-30`)."""


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}

_PATH_FIELDS = (
    ("input", "path"),
    ("input", "quarantine"),
    ("output",),
    ("partition_selection", "public_partitions"),
)


def resolve_paths(raw: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """Relative paths in a YAML spec are relative to the YAML file's folder, as in compose
    files, so a job runs the same from any working directory (Airflow, spark-submit)."""
    data = copy.deepcopy(dict(raw))
    for path in _PATH_FIELDS:
        target = data
        for part in path[:-1]:
            target = target.get(part) if isinstance(target, dict) else None
        if isinstance(target, dict) and isinstance(target.get(path[-1]), str):
            target[path[-1]] = _resolved(target[path[-1]], base)
    queries = data.get("queries")
    for query in queries if isinstance(queries, list) else []:
        selection = query.get("partition_selection") if isinstance(query, dict) else None
        if not isinstance(selection, dict):
            continue
        sources = selection.get("public_partitions")
        if isinstance(sources, str):
            selection["public_partitions"] = _resolved(sources, base)
        elif isinstance(sources, dict):
            for column, source in sources.items():
                if isinstance(source, str):
                    sources[column] = _resolved(source, base)
    return data


def is_file_source(source: str) -> bool:
    """A public key source that names a file (not a range 'A..B' nor 'input_range')."""
    return source != INPUT_RANGE and not _RANGE.match(source)


def _resolved(path: str, base: Path) -> str:
    if not is_file_source(path) or Path(path).is_absolute():
        return path
    return str((base / path).resolve())


def build_spec(
    raw: Mapping[str, Any], overrides: Mapping[str, Any] | None = None, source: str | None = None
) -> JobSpec:
    """A validated spec from YAML data plus dotted-path overrides (`budget.epsilon`); an
    override of None keeps the YAML value."""
    data = copy.deepcopy(dict(raw))
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        target = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            nested = target.get(part)
            if not isinstance(nested, dict):
                nested = {}
                target[part] = nested
            target = nested
        target[leaf] = value
    try:
        return spec_from_dict(data)
    except SpecError as exc:
        if source is None:
            raise
        raise SpecError(f"{source}: {exc.field}", exc.rule) from None


def load_spec(path: str | Path) -> JobSpec:
    """Reads and validates a YAML job spec."""
    return build_spec(load_raw(path), source=str(path))


def _path_as_text(obj: object, attr: str, field_name: str) -> None:
    """Paths are kept as text (a spec must serialise to JSON); an empty one means unset."""
    value = getattr(obj, attr)
    if isinstance(value, Path):
        object.__setattr__(obj, attr, str(value))
    elif value == "":
        object.__setattr__(obj, attr, None)
    elif value is not None and not isinstance(value, str):
        raise SpecError(field_name, f"must be a path, got {value!r}")


def _parse_date(field_name: str, value: Any) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise SpecError(field_name, f"must be a date YYYY-MM-DD, got {value!r}")


def _number(field_name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise SpecError(field_name, f"must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SpecError(field_name, f"must be a number, got {value!r}") from None
    if math.isnan(number):
        raise SpecError(field_name, "must be a number, got NaN")
    return number


def _number_in(field_name: str, value: Any, low: float, high: float) -> float:
    number = _number(field_name, value)
    if not low <= number <= high:
        raise SpecError(field_name, f"must be in [{low}, {high}], got {value!r}")
    return number


def _one_of(field_name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(field_name, f"must be one of {', '.join(allowed)}; got {value!r}")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


# How a query's unset fields are filled, for the field table.
_QUERY_DEFAULTS = {
    "name": "required",
    "partition_by": "[partition_key]",
    "metrics": "job's metrics",
    "value": "job's value",
    "bounds": "job's bounds",
    "partition_selection": "private",
}


def describe_fields() -> list[tuple[str, str, str]]:
    """(yaml path, default, doc) for every field, for the README and `dppipeline spec-doc`."""
    rows: list[tuple[str, str, str]] = []
    for f in fields(JobSpec):
        section = _SECTIONS.get(f.name)
        if f.name == "queries":
            rows.append((f.name, "[]", f.metadata.get("doc", "")))
            for sub in fields(QuerySpec):
                rows.append(
                    (
                        f"queries[].{sub.name}",
                        _QUERY_DEFAULTS.get(sub.name, repr(sub.default)),
                        sub.metadata.get("doc", ""),
                    )
                )
        elif section is not None:
            for sub in fields(section):
                default = sub.default if sub.default is not dataclasses.MISSING else ""
                rows.append((f"{f.name}.{sub.name}", repr(default), sub.metadata.get("doc", "")))
        else:
            default = f.default if f.default is not dataclasses.MISSING else ""
            rows.append((f.name, repr(default), f.metadata.get("doc", "")))
    return rows
