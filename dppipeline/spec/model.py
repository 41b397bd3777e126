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

from dppipeline.errors import SpecError, UsageError, excerpt

METRICS = ("count", "sum", "mean", "variance", "privacy_id_count")
# percentile(p), 0 <= p <= 100, is the parametrised metric; percentile(100) is a DP maximum.
_PERCENTILE = re.compile(r"^percentile\(\s*(\d+(?:\.\d+)?)\s*\)$")
TIME_BUCKETS = ("day", "week", "month")  # derived partition keys, from TX_DATETIME
_RANGE = re.compile(r"^\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*$")
INPUT_RANGE = "input_range"  # public keys of a time bucket: every bucket of the input's days
NOISE_KINDS = ("laplace", "gaussian")
SELECTION_STRATEGIES = ("truncated_geometric", "laplace_thresholding", "gaussian_thresholding")
INPUT_FORMATS = ("parquet", "csv")

# Numeric limits, found by trying PyDP 1.1.5 / pipeline-dp 0.3.1 and float64 sums (see the
# field docs; `core/budget.py` checks each mechanism of a plan against PyDP as well).
MIN_EPSILON = 2.0**-50  # PyDP refuses a mechanism's epsilon below 2^-50 (~8.9e-16)
MIN_DELTA = 1e-100  # a non-zero delta below: PyDP's selection probabilities turn inf or 0
MAX_INT_PARAM = 2**31 - 1  # PyDP takes L0, Linf and pre_threshold as a C++ int
MAX_ABS_BOUND = 1e15  # clipping bounds: sums stay finite, sensitivities far from PyDP's limits
MIN_BOUND_WIDTH = 1e-100  # max - min: PyDP's Gaussian hangs on sensitivities near 1e-308
MAX_WINDOW_DAYS = 36_525  # 100 years of data days
MAX_RANGE_KEYS = 1_000_000  # public keys an 'A..B' range may list
MAX_NAME_CHARS = 100  # job, query and column names (a release folder is named after them)
_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
        default=1.0,
        metadata=_doc(
            "Total epsilon of the release, finite and >= 2^-50 (~8.9e-16); smaller = more "
            "noise. Each mechanism's share must be >= 2^-50 too (PyDP's minimum), and Gaussian "
            "noise needs a share <= 709.78 (above it PyDP's sigma collapses to zero)."
        ),
    )
    delta: float = field(
        default=1e-6,
        metadata=_doc(
            "Total delta: 0, or in [1e-100, 1); needed (> 0) for Gaussian noise or private "
            "selection (below 1e-100 PyDP's selection probabilities break down)."
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
        default=None,
        metadata=_doc("Ledger cap on the scope's total epsilon, finite, >= 0 (unset: no cap)."),
    )
    cap_delta: float | None = field(
        default=None,
        metadata=_doc("Ledger cap on the scope's total delta, in [0, 1] (unset: no cap)."),
    )
    window_days: int | None = field(
        default=None,
        metadata=_doc(
            f"Caps hold per rolling window of this many data days, 1 to {MAX_WINDOW_DAYS:,} "
            "(unset: all time)."
        ),
    )

    def __post_init__(self) -> None:
        if self.cap_epsilon is not None:
            cap = _number("budget.cap_epsilon", self.cap_epsilon)
            if not 0 <= cap < math.inf:
                raise SpecError(
                    "budget.cap_epsilon", f"must be >= 0 and finite, got {excerpt(cap)}"
                )
            object.__setattr__(self, "cap_epsilon", cap)
        if self.cap_delta is not None:
            object.__setattr__(
                self, "cap_delta", _number_in("budget.cap_delta", self.cap_delta, 0.0, 1.0)
            )
        if self.window_days is not None:
            _integer_in("budget.window_days", self.window_days, 1, MAX_WINDOW_DAYS)
        if self.scope is not None and (not isinstance(self.scope, str) or not self.scope):
            raise SpecError("budget.scope", f"must be a non-empty name, got {excerpt(self.scope)}")
        eps = _number("budget.epsilon", self.epsilon)
        if not eps > 0 or math.isinf(eps):
            raise SpecError(
                "budget.epsilon", f"must be > 0 and finite, got {excerpt(self.epsilon)}"
            )
        if eps < MIN_EPSILON:
            raise SpecError(
                "budget.epsilon",
                f"must be >= 2^-50 (~{MIN_EPSILON:.2g}), PyDP's smallest epsilon, got {eps:g}",
            )
        delta = _number("budget.delta", self.delta)
        if not 0 <= delta < 1:
            raise SpecError("budget.delta", f"must be in [0, 1), got {excerpt(self.delta)}")
        if 0 < delta < MIN_DELTA:
            raise SpecError(
                "budget.delta",
                f"must be 0 or >= {MIN_DELTA:g} (PyDP's selection probabilities break down "
                f"below), got {delta:g}",
            )
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", delta)


@dataclass(frozen=True)
class BoundsSpec:
    """Contribution bounds: what one privacy unit may change, hence the noise scale."""

    max_partitions_contributed: int = field(
        default=1,
        metadata=_doc(
            "L0: partitions kept per privacy unit (sampled uniformly when more); an integer "
            f"from 1 to {MAX_INT_PARAM:,} (PyDP's C++ int), with percentiles to "
            f"{MAX_INT_PARAM // 4:,} (its quantile tree multiplies L0 by its height, 4)."
        ),
    )
    max_contributions_per_partition: int = field(
        default=1,
        metadata=_doc(
            "Linf: rows kept per privacy unit and partition (sampled uniformly); an integer "
            f"from 1 to {MAX_INT_PARAM:,} (PyDP's C++ int)."
        ),
    )
    min_value: float | None = field(
        default=None,
        metadata=_doc(
            "Values are clipped to [min_value, max_value] (sum, mean, variance, ...); both "
            f"within +-{MAX_ABS_BOUND:g}, so that float64 sums stay finite and sensitivities "
            "stay far below what PyDP refuses (~1e306) or hangs on."
        ),
    )
    max_value: float | None = field(
        default=None,
        metadata=_doc(
            f"Upper clipping bound, at least {MIN_BOUND_WIDTH:g} above min_value (the "
            "variance's sensitivity, width^2/8, must stay far above the ~1e-308 on which "
            "PyDP's Gaussian hangs); required for every metric of the value."
        ),
    )

    def __post_init__(self) -> None:
        for name in ("max_partitions_contributed", "max_contributions_per_partition"):
            _integer_in(f"bounds.{name}", getattr(self, name), 1, MAX_INT_PARAM)
        for name in ("min_value", "max_value"):
            value = getattr(self, name)
            if value is not None:
                number = _number(f"bounds.{name}", value)
                if not math.isfinite(number):
                    raise SpecError(f"bounds.{name}", f"must be finite, got {excerpt(value)}")
                if abs(number) > MAX_ABS_BOUND:
                    raise SpecError(
                        f"bounds.{name}",
                        f"must be within +-{MAX_ABS_BOUND:g} (float64 sums and PyDP's "
                        f"sensitivity limits), got {number:g}",
                    )
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
            if self.max_value - self.min_value < MIN_BOUND_WIDTH:
                raise SpecError(
                    "bounds.max_value",
                    f"must be at least {MIN_BOUND_WIDTH:g} above bounds.min_value (PyDP's "
                    f"Gaussian noise hangs on tinier sensitivities), got [{self.min_value:g}, "
                    f"{self.max_value:g}]",
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
        metadata=_doc(
            "Private selection: never release a partition with fewer privacy units; an "
            f"integer from 1 to {MAX_INT_PARAM:,} (PyDP's C++ int)."
        ),
    )

    def __post_init__(self) -> None:
        if isinstance(self.public_partitions, Mapping):
            _check_key_sources(self.public_partitions)
            object.__setattr__(self, "public_partitions", dict(self.public_partitions))
        else:
            _path_as_text(self, "public_partitions", "partition_selection.public_partitions")
            if isinstance(self.public_partitions, str):
                _check_range("partition_selection.public_partitions", self.public_partitions)
        _one_of("partition_selection.strategy", self.strategy, SELECTION_STRATEGIES)
        if self.pre_threshold is not None:
            _integer_in("partition_selection.pre_threshold", self.pre_threshold, 1, MAX_INT_PARAM)

    @property
    def is_public(self) -> bool:
        return self.public_partitions is not None


def _check_key_sources(sources: Mapping[str, Any]) -> None:
    """Per key column: a file path, an integer range 'A..B', 'input_range' or a list."""
    where = "partition_selection.public_partitions"
    if not sources:
        raise SpecError(where, "must name at least one key column")
    for column, source in sources.items():
        _column(where, column)
        if isinstance(source, list | tuple):
            if not source:
                raise SpecError(f"{where}.{column}", "must list at least one key")
            if any(isinstance(v, bool | dict | list) or v is None for v in source):
                raise SpecError(f"{where}.{column}", f"must list plain keys, got {excerpt(source)}")
        elif not isinstance(source, str | Path) or not str(source):
            raise SpecError(
                f"{where}.{column}",
                f"must be a file, a range 'A..B', {INPUT_RANGE!r} or a list; got {excerpt(source)}",
            )
        if isinstance(source, str):
            _check_range(f"{where}.{column}", source)


def _check_range(where: str, source: str) -> None:
    """An integer range 'A..B' of public keys: int64 bounds, A <= B, at most MAX_RANGE_KEYS
    keys (they are listed one by one)."""
    match = _RANGE.match(source)
    if not match:
        return
    if max(len(match.group(1)), len(match.group(2))) > 20:
        raise SpecError(where, f"range {excerpt(source)} must have int64 bounds")
    low, high = int(match.group(1)), int(match.group(2))
    if low > high:
        raise SpecError(where, f"range {excerpt(source)} is empty (A > B)")
    if low < -(2**63) or high > 2**63 - 1:
        raise SpecError(where, f"range {excerpt(source)} must have int64 bounds")
    if high - low + 1 > MAX_RANGE_KEYS:
        raise SpecError(
            where,
            f"range {excerpt(source)} lists more than {MAX_RANGE_KEYS:,} keys; use a key file",
        )


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
        f"must be one of {', '.join(METRICS)} or percentile(P) with 0 <= P <= 100; "
        f"got {excerpt(name)}",
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
        raise SpecError(where, f"must be a list of metric names, got {excerpt(value)}")
    metrics = tuple(parse_metric(m, where) for m in value)
    if not metrics:
        raise SpecError(where, "must name at least one metric")
    if len(set(metrics)) != len(metrics):
        raise SpecError(where, f"lists a metric twice: {excerpt(list(metrics))}")
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
            "(comparisons, ranges, in, between, and/or/not); at most 100,000 characters, 500 "
            "conditions and 10,000 values per 'in' list."
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
        if not _is_query_name(self.name):
            raise SpecError(
                "name",
                "must start with a letter, then letters, digits, _ (at most "
                f"{MAX_NAME_CHARS} characters); got {excerpt(self.name)}",
            )
        keys = self.partition_by
        if isinstance(keys, str):
            keys = (keys,)
        if not isinstance(keys, list | tuple):
            raise SpecError("partition_by", f"must be a list of column names, got {excerpt(keys)}")
        for key in keys:
            _column("partition_by", key)
        if len(set(keys)) != len(keys):
            raise SpecError("partition_by", f"lists a key twice: {excerpt(list(keys))}")
        object.__setattr__(self, "partition_by", tuple(keys))
        object.__setattr__(self, "metrics", _metrics_tuple(self.metrics, "metrics"))
        _column("value", self.value)
        if self.filter is not None:
            if not isinstance(self.filter, str) or not self.filter.strip():
                raise SpecError(
                    "filter", f"must be a filter expression, got {excerpt(self.filter)}"
                )
            from dppipeline.spec.filters import parse_filter  # noqa: PLC0415
            from dppipeline.spec.schema import transactions_schema  # noqa: PLC0415

            parse_filter(self.filter, transactions_schema(), where="filter")
        weight = _number("budget_weight", self.budget_weight)
        if not weight > 0 or math.isinf(weight):
            raise SpecError(
                "budget_weight", f"must be > 0 and finite, got {excerpt(self.budget_weight)}"
            )
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
                    f"{list(self.partition_by)}, got {excerpt(sorted(listed))}",
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
        if (
            not isinstance(self.name, str)
            or not self.name.replace("_", "").isalnum()
            or len(self.name) > MAX_NAME_CHARS
        ):
            raise SpecError(
                "name",
                f"must be letters, digits and underscores (at most {MAX_NAME_CHARS} "
                f"characters), got {excerpt(self.name)}",
            )
        for name in ("privacy_unit", "partition_key", "value"):
            _column(name, getattr(self, name))
        if self.privacy_unit == self.partition_key:
            raise SpecError("partition_key", "must differ from privacy_unit")
        object.__setattr__(self, "metrics", _metrics_tuple(self.metrics, "metrics"))
        _one_of("noise", self.noise, NOISE_KINDS)
        if not isinstance(self.confidence_intervals, bool):
            raise SpecError(
                "confidence_intervals",
                f"must be true or false, got {excerpt(self.confidence_intervals)}",
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
        content: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        return content

    def spec_hash(self) -> str:
        """sha256 of the canonical spec: what decides the release's numbers, defaults left
        out, public key files by content (see `spec_hash.py`); for release keys."""
        from dppipeline.spec.hashing import spec_hash  # noqa: PLC0415

        return spec_hash(self)


def _is_query_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and len(name) <= MAX_NAME_CHARS
        and re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name) is not None
    )


def _column(field_name: str, value: Any) -> str:
    """A column name: an identifier of at most MAX_NAME_CHARS characters."""
    if not isinstance(value, str) or len(value) > MAX_NAME_CHARS or not _COLUMN.fullmatch(value):
        raise SpecError(
            field_name,
            f"must be a column name (letters, digits, _; at most {MAX_NAME_CHARS} characters), "
            f"got {excerpt(value)}",
        )
    return value


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
    _refuse_unknown("", raw, JobSpec)
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
    queries = []
    for position, raw in enumerate(raw_queries, start=1):
        if not isinstance(raw, Mapping):
            raise SpecError(f"queries[{position}]", "must be a mapping with a name")
        name = raw.get("name")
        where = f"queries.{name}" if _is_query_name(name) else f"queries[{position}]"
        _refuse_unknown(f"{where}.", raw, QuerySpec)
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
    _refuse_unknown(f"{name}.", value, cls)
    return cls(**value)


def _refuse_unknown(prefix: str, raw: Mapping[Any, Any], cls: type) -> None:
    """SpecError naming the first key of `raw` that is not a field of `cls`."""
    known = {f.name for f in fields(cls)}
    unknown = sorted((k for k in raw if k not in known), key=str)
    if unknown:
        key = unknown[0]
        named = key if isinstance(key, str) and _COLUMN.fullmatch(key) and len(key) <= 40 else None
        raise SpecError(
            f"{prefix}{named or excerpt(key)}",
            f"unknown field (known: {', '.join(sorted(known))})",
        )


def budget_from_dict(raw: Any, source: str) -> BudgetSpec:
    """Just the budget section of a spec (for `dppipeline budget`), validated."""
    try:
        budget: BudgetSpec = _section_from_dict("budget", BudgetSpec, raw)
    except SpecError as exc:
        raise SpecError(f"{source}: {exc.field}", exc.rule) from None
    return budget


MAX_SPEC_BYTES = 1 << 20  # 1 MiB: a job spec is a few kB; key lists belong in key files
MAX_SPEC_VALUES = 100_000  # YAML values, every alias counted as the values it stands for
MAX_SPEC_DEPTH = 32  # nesting of YAML collections (a spec needs 5)
MAX_SPEC_INT_DIGITS = 40  # an integer literal longer than this is no spec value


def load_raw(path: str | Path) -> dict[str, Any]:
    """Reads a YAML job spec into plain data; errors say which file and where.

    Bounded: at most MAX_SPEC_BYTES of UTF-8, MAX_SPEC_VALUES values once aliases are
    expanded (a few hundred bytes of nested aliases can stand for billions), MAX_SPEC_DEPTH
    levels; a key given twice in one mapping is an error, not "the last one wins".
    """
    path = Path(path)
    try:
        with path.open("rb") as file:
            data = file.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read job spec {path}: {exc.strerror}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise UsageError(
            f"{path}: a job spec may have at most {MAX_SPEC_BYTES:,} bytes; put long key "
            "lists in a key file (partition_selection.public_partitions)"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte {exc.start + 1:,})") from None
    try:
        raw = yaml.load(text, Loader=_SpecLoader)
    except _SpecYAMLError as exc:
        raise UsageError(f"{path}: line {exc.line}: {exc.rule}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{path}: not valid YAML{where}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: a job spec must be a mapping of fields")
    return resolve_paths(raw, path.resolve().parent)


# What PyYAML's constructors raise for a value that does not fit its explicit tag.
_CONSTRUCTOR_ERRORS = (ValueError, KeyError, IndexError, TypeError, OverflowError)


class _SpecYAMLError(yaml.YAMLError):
    """A spec-specific YAML rule broken at a line (duplicate key, too many values, ...)."""

    def __init__(self, rule: str, mark: yaml.Mark | None):
        super().__init__(rule)
        self.rule = rule
        self.line = mark.line + 1 if mark is not None else 1


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader with the bounds of `load_raw`. Dates stay text, so `_parse_date` names the
    field of a bad one (PyYAML itself raises a bare ValueError for `2026-02-30`)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_SPEC_DEPTH:
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise _SpecYAMLError(
                    f"nested deeper than {MAX_SPEC_DEPTH} levels", event.start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: yaml.Node) -> Any:
        values = _expanded_values(node)
        if values > MAX_SPEC_VALUES:
            raise _SpecYAMLError(
                f"aliases expand to {values:,} values, more than the {MAX_SPEC_VALUES:,} a job "
                "spec may hold",
                node.start_mark,
            )
        try:
            return super().construct_document(node)
        except _CONSTRUCTOR_ERRORS:  # raised in a collection's deferred second step
            raise _SpecYAMLError("a value that does not fit its tag", node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):  # `!!map [a]`: PyYAML's error
            return super().construct_mapping(node, deep=deep)
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue  # merge keys (<<) may be overridden; a complex key is PyYAML's error
            key = self.construct_object(key_node)
            if key in first_line:
                raise _SpecYAMLError(
                    f"key {excerpt(key)} given twice in one mapping (first at line "
                    f"{first_line[key]})",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """PyYAML's constructors raise ValueError, KeyError or IndexError for a value that
        does not fit an explicit tag (`!!int 0x{}`, `!!bool maybe`, `!!float ''`)."""
        try:
            return super().construct_object(node, deep=deep)
        except _CONSTRUCTOR_ERRORS:
            tag = node.tag.rsplit(":", 1)[-1]
            raise _SpecYAMLError(
                f"a value that is not a valid {excerpt(tag)}", node.start_mark
            ) from None

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        if isinstance(node.value, str) and len(node.value) > MAX_SPEC_INT_DIGITS:
            raise _SpecYAMLError(
                f"an integer of {len(str(node.value)):,} characters; at most {MAX_SPEC_INT_DIGITS}",
                node.start_mark,
            )
        return super().construct_yaml_int(node)

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> str:  # type: ignore[override]
        return str(self.construct_scalar(node))  # an explicit !!timestamp stays text too


_SpecLoader.add_constructor("tag:yaml.org,2002:int", _SpecLoader.construct_yaml_int)
_SpecLoader.add_constructor("tag:yaml.org,2002:timestamp", _SpecLoader.construct_yaml_timestamp)
_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _expanded_values(root: yaml.Node) -> int:
    """How many values the document holds with every alias expanded, computed on the node
    graph (an alias is the same node object again) in time linear in the text."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise _SpecYAMLError("an alias refers to a collection that holds it", node.start_mark)
        open_nodes.add(key)
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(item) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        else:
            total = 1
        open_nodes.discard(key)
        sizes[key] = total
        return total

    return size(root)


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
        target: Any = data
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
        raise SpecError(field_name, f"must be a path, got {excerpt(value)}")


def _parse_date(field_name: str, value: Any) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise SpecError(field_name, f"must be a date YYYY-MM-DD, got {excerpt(value)}")


def _number(field_name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise SpecError(field_name, f"must be a number, got {excerpt(value)}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SpecError(field_name, f"must be a number, got {excerpt(value)}") from None
    if math.isnan(number):
        raise SpecError(field_name, "must be a number, got NaN")
    return number


def _number_in(field_name: str, value: Any, low: float, high: float) -> float:
    number = _number(field_name, value)
    if not low <= number <= high:
        raise SpecError(field_name, f"must be in [{low}, {high}], got {excerpt(value)}")
    return number


def _integer_in(field_name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SpecError(
            field_name, f"must be an integer from {low:,} to {high:,}, got {excerpt(value)}"
        )
    return value


def _one_of(field_name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(field_name, f"must be one of {', '.join(allowed)}; got {excerpt(value)}")


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
