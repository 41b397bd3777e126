"""The job spec: immutable, self-validating pydantic models of one release.

A spec comes from YAML (`load_raw`), from CLI flags, or both (`build_spec`): flags win. A job
always has `queries`; a spec written as one query at the top level (the shorthand) is expanded
into one query named after the job. Fields are checked by the constrained types below, so an
invalid spec cannot exist; `spec_from_dict` turns pydantic's errors into one `SpecError` that
names the field by its YAML path and the rule it breaks (`budget.epsilon: must be > 0 and
finite, got -1.0`, `queries.q.bounds.min_value: must be <= bounds.max_value ...`).
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from dppipeline.errors import SpecError, UsageError, excerpt
from dppipeline.storage import Location, is_uri

if TYPE_CHECKING:
    from dppipeline.spec.schema import Schema

METRICS = ("count", "sum", "mean", "variance", "stddev", "max", "min", "privacy_id_count")
# Metrics computed from the variance mechanisms (stddev is its square root: no extra budget).
VARIANCE_METRICS = ("variance", "stddev")
# percentile(p), 0 <= p <= 100, is the parametrised metric (PyDP clamps its rank to 99.5%:
# `max` and `min`, an exponential mechanism near the extreme rank, are the DP extremes).
_PERCENTILE = re.compile(r"^percentile\(\s*(\d+(?:\.\d+)?)\s*\)$")
# count_distinct(COLUMN): distinct non-null values of an input column among the kept rows.
_COUNT_DISTINCT = re.compile(r"^count_distinct\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)$")
# Derived partition keys from the job's time column (`input.time_column`, TX_DATETIME by default).
TIME_BUCKETS = ("hour", "day", "week", "month", "year")
# `bucket(COLUMN, e0, e1, ...)`: a numeric column cut at public edges (the canonical text of
# `{bucket: COLUMN, edges: [e0, e1, ...]}`).
_BUCKET = re.compile(r"^\s*bucket\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*((?:,[^,()]+)+)\)\s*$")
MAX_BUCKET_EDGES = 1000
INPUT_LAYOUTS = ("daily", "files")
_RANGE = re.compile(r"^\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*$")
INPUT_RANGE = "input_range"  # public keys of a time bucket: every bucket of the input's days
NOISE_KINDS = ("laplace", "gaussian")
ACCOUNTINGS = ("basic", "pld", "zcdp")  # how a job's mechanisms compose (core/accounting.py)
COUNT_NOISES = ("discrete", "continuous")  # integer or real noise on counts (core/discrete.py)
SELECTION_STRATEGIES = ("truncated_geometric", "laplace_thresholding", "gaussian_thresholding")
INPUT_FORMATS = ("parquet", "csv")

# Numeric limits, found by trying PyDP 1.1.5 / pipeline-dp 0.3.1 and float64 sums (see the
# field docs; `core/planner.py` checks each mechanism of a plan against PyDP as well).
MIN_EPSILON = 2.0**-50  # PyDP refuses a mechanism's epsilon below 2^-50 (~8.9e-16)
MIN_DELTA = 1e-100  # a non-zero delta below: PyDP's selection probabilities turn inf or 0
MAX_DELTA = 1e-3  # above it (epsilon, delta)-DP no longer protects a customer in a thousand
MAX_INT_PARAM = 2**31 - 1  # PyDP takes L0, Linf and pre_threshold as a C++ int
MAX_SCOPE_CHARS = 200  # a ledger scope is echoed on every `[ledger]` line and stored per row
MAX_ABS_BOUND = 1e15  # clipping bounds: sums stay finite, sensitivities far from PyDP's limits
MIN_BOUND_WIDTH = 1e-100  # max - min: PyDP's Gaussian hangs on sensitivities near 1e-308
MAX_WINDOW_DAYS = 36_525  # 100 years of data days
MAX_RANGE_KEYS = 1_000_000  # public keys an 'A..B' range may list
MAX_NAME_CHARS = 100  # job, query and column names (a release folder is named after them)
_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUERY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_RULE = "spec_rule"  # the pydantic error type of every rule below


# --- rules: each raises a pydantic error whose message is the rule; the path comes from pydantic


def _broken(rule: str, at: str = "") -> PydanticCustomError:
    """A broken rule; `at` names a field below the one being validated (model-level checks)."""
    return PydanticCustomError(_RULE, "{rule}", {"rule": rule, "at": at})


def _number(value: Any) -> float:
    if isinstance(value, bool):
        raise _broken(f"must be a number, got {excerpt(value)}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _broken(f"must be a number, got {excerpt(value)}") from None
    if math.isnan(number):
        raise _broken("must be a number, got NaN")
    return number


def _in(low: float, high: float) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        number = _number(value)
        if not low <= number <= high:
            raise _broken(f"must be in [{low}, {high}], got {excerpt(value)}")
        return number

    return check


def _int_in(low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _broken(f"must be an integer from {low:,} to {high:,}, got {excerpt(value)}")
        return value

    return check


def _positive_finite(value: Any) -> float:
    number = _number(value)
    if not number > 0 or math.isinf(number):
        raise _broken(f"must be > 0 and finite, got {excerpt(value)}")
    return number


def _one_of(allowed: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in allowed:
            raise _broken(f"must be one of {', '.join(allowed)}; got {excerpt(value)}")
        return str(value)

    return check


def _path_text(value: Any) -> str | None:
    """Paths are kept as text (a spec must serialise to JSON); an empty one means unset."""
    if isinstance(value, Path):
        return str(value)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _broken(f"must be a path, got {excerpt(value)}")
    return value


def _date(value: Any) -> dt.date | None:
    if value is None or (isinstance(value, dt.date) and not isinstance(value, dt.datetime)):
        return value
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise _broken(f"must be a date YYYY-MM-DD, got {excerpt(value)}")


def _column(value: Any) -> str:
    """A column name: an identifier of at most MAX_NAME_CHARS characters."""
    if not isinstance(value, str) or len(value) > MAX_NAME_CHARS or not _COLUMN.fullmatch(value):
        raise _broken(
            f"must be a column name (letters, digits, _; at most {MAX_NAME_CHARS} characters), "
            f"got {excerpt(value)}"
        )
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _broken(f"must be true or false, got {excerpt(value)}")
    return value


def _query_name(value: Any) -> str:
    if not _is_query_name(value):
        raise _broken(
            "must start with a letter, then letters, digits, _ (at most "
            f"{MAX_NAME_CHARS} characters); got {excerpt(value)}"
        )
    return str(value)


def _job_name(value: Any) -> str:
    if (
        not isinstance(value, str)
        or not value.replace("_", "").isalnum()
        or len(value) > MAX_NAME_CHARS
    ):
        raise _broken(
            f"must be letters, digits and underscores (at most {MAX_NAME_CHARS} characters), "
            f"got {excerpt(value)}"
        )
    return value


def _metrics(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [m.strip() for m in re.split(r",(?![^(]*\))", value) if m.strip()]
    if not isinstance(value, list | tuple):
        raise _broken(f"must be a list of metric names, got {excerpt(value)}")
    metrics = tuple(_metric(m) for m in value)
    if not metrics:
        raise _broken("must name at least one metric")
    if len(set(metrics)) != len(metrics):
        raise _broken(f"lists a metric twice: {excerpt(list(metrics))}")
    return metrics


def _metric(name: Any) -> str:
    try:
        return parse_metric(name)
    except SpecError as exc:
        raise _broken(exc.rule) from None


@dataclass(frozen=True)
class BucketKey:
    """A numeric column cut at public edges e0 < e1 < ... < ek into the keys `[e0, e1)`, ...,
    `[ek, inf)` (text); rows below e0 are in no bucket and not counted. Every bucket is
    released (the edges are public), so a query keyed by buckets alone needs no selection."""

    column: str
    edges: tuple[float, ...]

    @property
    def name(self) -> str:
        """The release's key column."""
        return f"{self.column}_bucket"

    @property
    def labels(self) -> list[str]:
        ends = [*self.edges[1:], math.inf]
        return [f"[{_edge(a)}, {_edge(b)})" for a, b in zip(self.edges, ends, strict=True)]

    @property
    def text(self) -> str:
        """Its canonical `partition_by` entry."""
        return f"bucket({self.column}, {', '.join(_edge(e) for e in self.edges)})"


def _edge(value: float) -> str:
    if math.isinf(value):
        return "inf"
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def bucket_key(entry: str) -> BucketKey | None:
    """The bucket a canonical `partition_by` entry describes; None for a column or time key."""
    match = _BUCKET.match(entry)
    if not match:
        return None
    edges = tuple(float(e) for e in match.group(2).split(",")[1:])
    return BucketKey(match.group(1), edges)


def key_name(entry: str) -> str:
    """The release column of a `partition_by` entry."""
    bucket = bucket_key(entry)
    return entry if bucket is None else bucket.name


def _bucket_entry(raw: Any) -> str:
    """`{bucket: COLUMN, edges: [...]}` or `bucket(COLUMN, e0, ...)` as canonical text."""
    if isinstance(raw, Mapping):
        unknown = sorted(set(map(str, raw)) - {"bucket", "edges"})
        if unknown or "bucket" not in raw or "edges" not in raw:
            raise _broken(
                "a derived key is {bucket: COLUMN, edges: [e0, e1, ...]}, got "
                f"{excerpt(dict(raw))}"
            )
        column, edges = _column(raw["bucket"]), raw["edges"]
    else:
        match = _BUCKET.match(raw)
        assert match is not None
        column = match.group(1)
        edges = [e.strip() for e in match.group(2).split(",")[1:]]
    if not isinstance(edges, list | tuple) or not 1 <= len(edges) <= MAX_BUCKET_EDGES:
        raise _broken(
            f"bucket {column}: edges must be a list of 1 to {MAX_BUCKET_EDGES} numbers, got "
            f"{excerpt(edges)}"
        )
    values = tuple(_number(e) for e in edges)
    if any(math.isinf(v) for v in values):
        raise _broken(f"bucket {column}: edges must be finite (the last bucket is open)")
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise _broken(f"bucket {column}: edges must increase, got {excerpt(list(edges))}")
    return BucketKey(column, values).text


def _partition_by(value: Any) -> tuple[str, ...]:
    keys = (value,) if isinstance(value, str | Mapping) else value
    if not isinstance(keys, list | tuple):
        raise _broken(f"must be a list of column names or derived keys, got {excerpt(keys)}")
    entries = []
    for key in keys:
        if isinstance(key, Mapping) or (isinstance(key, str) and _BUCKET.match(key)):
            entries.append(_bucket_entry(key))
        else:
            entries.append(_column(key))
    names = [key_name(e) for e in entries]
    if len(set(names)) != len(names):
        raise _broken(f"lists a key twice: {excerpt(names)}")
    return tuple(entries)


def _schema_source(value: Any) -> str | tuple[Mapping[str, Any], ...]:
    """A shipped schema's name, a .json file (path or URI), or the columns themselves."""
    from dppipeline.spec.schema import SHIPPED_SCHEMAS, SchemaError, input_schema_from  # noqa: PLC0415

    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        if value not in SHIPPED_SCHEMAS and not value.endswith(".json"):
            raise _broken(
                f"must be one of {', '.join(SHIPPED_SCHEMAS)}, a .json schema file or a list "
                f"of columns; got {excerpt(value)}"
            )
        return value
    if isinstance(value, Mapping):
        value = value.get("fields", value)
    if not isinstance(value, list | tuple):
        raise _broken(
            f"must be a schema name, a .json file or a list of columns, got {excerpt(value)}"
        )
    try:
        input_schema_from(list(value))
    except SchemaError as exc:
        raise _broken(str(exc)) from None
    return tuple(dict(f) for f in value)


Number = Annotated[float, BeforeValidator(_number)]
PositiveFinite = Annotated[float, BeforeValidator(_positive_finite)]
Fraction = Annotated[float, BeforeValidator(_in(0.0, 1.0))]
Bound = Annotated[int, BeforeValidator(_int_in(1, MAX_INT_PARAM))]
PathText = Annotated[str | None, BeforeValidator(_path_text)]
Day = Annotated[dt.date | None, BeforeValidator(_date)]
Column = Annotated[str, BeforeValidator(_column)]
Flag = Annotated[bool, BeforeValidator(_flag)]
Metrics = Annotated[tuple[str, ...], BeforeValidator(_metrics)]
Keys = Annotated[tuple[str, ...], BeforeValidator(_partition_by)]


class _Section(BaseModel):
    """A spec section: frozen; an unknown key is an error naming the key and the known ones."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=False)

    @model_validator(mode="before")
    @classmethod
    def _known_keys_only(cls, raw: Any) -> Any:
        if not isinstance(raw, Mapping):
            if isinstance(raw, cls):
                return raw
            raise _broken("must be a mapping")
        known = set(cls.model_fields)
        unknown = sorted((k for k in raw if k not in known), key=str)
        if unknown:
            key = unknown[0]
            short = isinstance(key, str) and _COLUMN.fullmatch(key) and len(key) <= 40
            raise _broken(
                f"unknown field (known: {', '.join(sorted(known))})",
                at=key if short else excerpt(key),
            )
        return raw


warnings.filterwarnings(  # `input.schema` is the field's name in every spec
    "ignore", message='Field name "schema" in "InputSpec" shadows', category=UserWarning
)


class InputSpec(_Section):
    """Where the input is, what its columns are and which days to read."""

    path: PathText = Field(
        None, description="Input folder, or file with layout files (required here or as --input)."
    )
    format: Annotated[str, BeforeValidator(_one_of(INPUT_FORMATS))] = Field(
        "parquet",
        description=(
            "parquet: DIR/date=YYYY-MM-DD/*.parquet; csv: DIR/YYYY-MM-DD.csv. Unset: detected "
            "from the folder (a folder holding both layouts is refused)."
        ),
    )
    # `schema` shadows pydantic's deprecated BaseModel.schema(): it is the field's name in specs
    schema: Annotated[str | tuple[Mapping[str, Any], ...], BeforeValidator(_schema_source)] = Field(  # type: ignore[assignment]
        "transactions",
        description=(
            "Input columns: a shipped schema (transactions, book_transactions, "
            "card_payments), a .json schema file, or a list of {name, type} columns "
            "(types int64, float64, string, timestamp[us]; optional nullable, role: "
            "event_time)."
        ),
    )
    time_column: Annotated[str | None, BeforeValidator(_optional(_column))] = Field(
        None,
        description=(
            "The timestamp column time keys, date filters and daily partitions are about; "
            "default: the schema's event_time column (TX_DATETIME)."
        ),
    )
    layout: Annotated[str, BeforeValidator(_one_of(INPUT_LAYOUTS))] = Field(
        "daily",
        description=(
            "daily: one file or folder per day (see format); files: one file, or a folder of "
            "files (any names, subfolders included), read whole and filtered to "
            "[start_date, end_date] by the time column (both dates required)."
        ),
    )
    start_date: Day = Field(
        None, description="First day to read, inclusive (YYYY-MM-DD); default: all."
    )
    end_date: Day = Field(
        None, description="Last day to read, inclusive (YYYY-MM-DD); default: all."
    )
    max_rejected_fraction: Fraction = Field(
        0.001, description="Fail the run when more than this share of rows is rejected."
    )
    quarantine: PathText = Field(
        None,
        description=(
            "Operator-only folder for rejected rows (default $DPPIPELINE_STATE_DIR/quarantine);"
            " never inside or beside the release."
        ),
    )

    @model_validator(mode="after")
    def _days_in_order(self) -> InputSpec:
        if self.start_date and self.end_date and self.start_date > self.end_date:
            raise _broken(
                f"must not be after input.end_date ({self.start_date} > {self.end_date})",
                at="start_date",
            )
        if self.layout == "files" and (self.start_date is None or self.end_date is None):
            raise _broken(
                "layout files needs start_date and end_date: the release's period, charged "
                "to the ledger before any row is read",
                at="start_date" if self.start_date is None else "end_date",
            )
        return self


def _cap_epsilon(value: Any) -> float | None:
    if value is None:
        return None
    cap = _number(value)
    if not 0 <= cap < math.inf:
        raise _broken(f"must be >= 0 and finite, got {excerpt(cap)}")
    return cap


def _epsilon(value: Any) -> float:
    eps = _positive_finite(value)
    if eps < MIN_EPSILON:
        raise _broken(
            f"must be >= 2^-50 (~{MIN_EPSILON:.2g}), PyDP's smallest epsilon, got {eps:g}"
        )
    return eps


def _delta(value: Any) -> float:
    delta = _number(value)
    if not 0 <= delta <= MAX_DELTA:
        raise _broken(
            f"must be 0 or in [{MIN_DELTA:g}, {MAX_DELTA:g}]: with probability delta a release "
            "may reveal a customer outright (choose it well below 1 / the number of privacy "
            f"units), got {excerpt(value)}"
        )
    if 0 < delta < MIN_DELTA:
        raise _broken(
            f"must be 0 or >= {MIN_DELTA:g} (PyDP's selection probabilities break down "
            f"below), got {delta:g}"
        )
    return delta


def _scope(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise _broken(f"must be a non-empty name, got {excerpt(value)}")
    if value is not None and len(value) > MAX_SCOPE_CHARS:
        raise _broken(f"at most {MAX_SCOPE_CHARS} characters, got {len(value):,}")
    if value is not None and not value.isprintable():
        raise _broken(f"printable characters only, got {excerpt(value)}")
    return value


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else check(value)


class BudgetSpec(_Section):
    """The privacy budget of the whole run: all metrics and partition selection together."""

    epsilon: Annotated[float, BeforeValidator(_epsilon)] = Field(
        1.0,
        description=(
            "Total epsilon of the release, finite and >= 2^-50 (~8.9e-16); smaller = more "
            "noise. Each mechanism's share must be >= 2^-50 too (PyDP's minimum), and Gaussian "
            "noise needs a share <= 709.78 (above it PyDP's sigma collapses to zero)."
        ),
    )
    delta: Annotated[float, BeforeValidator(_delta)] = Field(
        1e-6,
        description=(
            "Total delta: 0, or in [1e-100, 0.001]; needed (> 0) for Gaussian noise or private "
            "selection (below 1e-100 PyDP's selection probabilities break down)."
        ),
    )
    scope: Annotated[str | None, BeforeValidator(_scope)] = Field(
        None,
        description=(
            "Ledger scope: the dataset and privacy unit the cap protects, at most "
            f"{MAX_SCOPE_CHARS} printable characters (default <input folder name>/<privacy_unit>)."
        ),
    )
    cap_epsilon: Annotated[float | None, BeforeValidator(_cap_epsilon)] = Field(
        None, description="Ledger cap on the scope's total epsilon, finite, >= 0 (unset: no cap)."
    )
    cap_delta: Annotated[float | None, BeforeValidator(_optional(_in(0.0, 1.0)))] = Field(
        None, description="Ledger cap on the scope's total delta, in [0, 1] (unset: no cap)."
    )
    window_days: Annotated[int | None, BeforeValidator(_optional(_int_in(1, MAX_WINDOW_DAYS)))] = (
        Field(
            None,
            description=(
                f"Caps hold per rolling window of this many data days, 1 to {MAX_WINDOW_DAYS:,} "
                "(unset: all time)."
            ),
        )
    )


def _bound_value(value: Any) -> float | None:
    if value is None:
        return None
    number = _number(value)
    if not math.isfinite(number):
        raise _broken(f"must be finite, got {excerpt(value)}")
    if abs(number) > MAX_ABS_BOUND:
        raise _broken(
            f"must be within +-{MAX_ABS_BOUND:g} (float64 sums and PyDP's sensitivity limits), "
            f"got {number:g}"
        )
    return number


BoundValue = Annotated[float | None, BeforeValidator(_bound_value)]


# The L0 x Linf pair; `max_contributions` replaces both (a query takes one kind, never a mix).
PER_PARTITION_BOUNDS = ("max_partitions_contributed", "max_contributions_per_partition")
TOTAL_BOUNDS = ("max_contributions",)


class BoundsSpec(_Section):
    """Contribution bounds: what one privacy unit may change, hence the noise scale."""

    max_partitions_contributed: Bound | None = Field(
        None,
        description=(
            "L0: partitions kept per privacy unit (sampled uniformly when more); an integer "
            f"from 1 to {MAX_INT_PARAM:,} (PyDP's C++ int), with percentiles to "
            f"{MAX_INT_PARAM // 4:,} (its quantile tree multiplies L0 by its height, 4). "
            "Required (or max_contributions) for a query with partition keys."
        ),
    )
    max_contributions_per_partition: Bound | None = Field(
        None,
        description=(
            "Linf: rows kept per privacy unit and partition (sampled uniformly); an integer "
            f"from 1 to {MAX_INT_PARAM:,} (PyDP's C++ int). Required (or max_contributions) "
            "unless the query's only metric is privacy_id_count."
        ),
    )
    max_contributions: Bound | None = Field(
        None,
        description=(
            "Rows kept per privacy unit across all partitions (sampled uniformly), instead of "
            "L0 and Linf (setting it with either is an error); an integer from 1 to "
            f"{MAX_INT_PARAM:,}. Unset: L0 and Linf bound."
        ),
    )
    linf_bounding: Literal["sample", "scale"] = Field(
        "sample",
        description=(
            "How Linf bounds a (privacy unit, partition) pair of more rows: `sample` keeps "
            "Linf of its rows (uniformly); `scale` keeps them all, counts min(rows, Linf) and "
            "scales the clipped sum by min(1, Linf / rows): the same sensitivity, no sampling "
            "variance, and faster on Spark (docs/explanation/bounding.md). Not with percentiles, "
            "max, min, count_distinct or max_contributions."
        ),
    )
    min_value: BoundValue = Field(
        None,
        description=(
            "Values are clipped to [min_value, max_value] (sum, mean, variance, ...); both "
            f"within +-{MAX_ABS_BOUND:g}, so that float64 sums stay finite and sensitivities "
            "stay far below what PyDP refuses (~1e306) or hangs on."
        ),
    )
    max_value: BoundValue = Field(
        None,
        description=(
            f"Upper clipping bound, at least {MIN_BOUND_WIDTH:g} above min_value (the "
            "variance's sensitivity, width^2/8, must stay far above the ~1e-308 on which "
            "PyDP's Gaussian hangs); required for every metric of the value."
        ),
    )

    @model_validator(mode="after")
    def _a_range(self) -> BoundsSpec:
        if self.max_contributions is not None and self.linf_bounding == "scale":
            raise _broken(
                "scale bounds the rows of each (unit, partition) pair; max_contributions "
                "bounds a unit's total rows: use sample with it",
                at="linf_bounding",
            )
        if self.max_contributions is not None:
            pair = [f for f in PER_PARTITION_BOUNDS if f in self.model_fields_set]
            if pair:
                raise _broken(
                    f"must not be set with bounds.{pair[0]}: max_contributions bounds a unit's "
                    "total rows instead of L0 x Linf (use one kind)",
                    at="max_contributions",
                )
        low, high = self.min_value, self.max_value
        if low is None or high is None:
            if low is not high:
                missing = "min_value" if low is None else "max_value"
                raise _broken("min_value and max_value must be set together", at=missing)
            return self
        if low > high:
            raise _broken(f"must be <= bounds.max_value ({low} > {high})", at="min_value")
        if low == high:
            raise _broken(
                f"must be < bounds.max_value (both {low}): an empty range carries no information",
                at="min_value",
            )
        if high - low < MIN_BOUND_WIDTH:
            raise _broken(
                f"must be at least {MIN_BOUND_WIDTH:g} above bounds.min_value (PyDP's Gaussian "
                f"noise hangs on tinier sensitivities), got [{low:g}, {high:g}]",
                at="max_value",
            )
        return self


def _key_sources(value: Any) -> str | dict[str, Any] | list[Any] | None:
    """A file path, an integer range 'A..B', a list of keys (one key column; the query turns
    it into `{column: list}`), or per key column a file, range, list or 'input_range'."""
    if isinstance(value, list | tuple):
        _check_key_list(value, at="")
        return list(value)
    if not isinstance(value, Mapping):
        text = _path_text(value)
        if text is not None:
            _check_range("", text)
        return text
    if not value:
        raise _broken("must name at least one key column")
    for column, source in value.items():
        _column(column)
        if isinstance(source, list | tuple):
            _check_key_list(source, at=column)
        elif not isinstance(source, str | Path) or not str(source):
            raise _broken(
                f"must be a file, a range 'A..B', {INPUT_RANGE!r} or a list; got {excerpt(source)}",
                at=column,
            )
        if isinstance(source, str):
            _check_range(column, source)
    return {str(k): str(v) if isinstance(v, Path) else v for k, v in value.items()}


def _check_key_list(keys: Sequence[Any], at: str) -> None:
    if not keys:
        raise _broken("must list at least one key", at=at)
    if any(isinstance(v, bool | dict | list) or v is None for v in keys):
        raise _broken(f"must list plain keys, got {excerpt(keys)}", at=at)


def _check_range(at: str, source: str) -> None:
    """An integer range 'A..B' of public keys: int64 bounds, A <= B, at most MAX_RANGE_KEYS
    keys (they are listed one by one)."""
    match = _RANGE.match(source)
    if not match:
        return
    if max(len(match.group(1)), len(match.group(2))) > 20:
        raise _broken(f"range {excerpt(source)} must have int64 bounds", at=at)
    low, high = int(match.group(1)), int(match.group(2))
    if low > high:
        raise _broken(f"range {excerpt(source)} is empty (A > B)", at=at)
    if low < -(2**63) or high > 2**63 - 1:
        raise _broken(f"range {excerpt(source)} must have int64 bounds", at=at)
    if high - low + 1 > MAX_RANGE_KEYS:
        raise _broken(
            f"range {excerpt(source)} lists more than {MAX_RANGE_KEYS:,} keys; use a key file",
            at=at,
        )


class SelectionSpec(_Section):
    """Which partitions are released: a public key list, or private selection from the data."""

    public_partitions: Annotated[
        str | dict[str, Any] | list[Any] | None, BeforeValidator(_key_sources)
    ] = Field(
        None,
        description=(
            "Public keys: a file (one key per line, or a CSV with the key columns), an "
            "integer range 'A..B', a list [k1, k2, ...] (one key column), or per key column a "
            "file, range, list or 'input_range' (every time bucket of the input days), whose "
            "product is the key set. Every listed key is released, no other. Unset: private "
            "selection."
        ),
    )
    strategy: Annotated[str, BeforeValidator(_one_of(SELECTION_STRATEGIES))] = Field(
        "truncated_geometric",
        description="Private selection: truncated_geometric, laplace_ or gaussian_thresholding.",
    )
    pre_threshold: Annotated[int | None, BeforeValidator(_optional(_int_in(1, MAX_INT_PARAM)))] = (
        Field(
            None,
            description=(
                "Private selection: never release a partition with fewer privacy units; an "
                f"integer from 1 to {MAX_INT_PARAM:,} (PyDP's C++ int)."
            ),
        )
    )

    @property
    def is_public(self) -> bool:
        return self.public_partitions is not None


def parse_metric(name: Any, where: str = "metrics") -> str:
    """A metric name in canonical form: `count`, ..., `percentile(P)` with 0 <= P <= 100, or
    `count_distinct(COLUMN)` (the column is checked against the input schema later)."""
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
        match = _COUNT_DISTINCT.match(text)
        if match:
            if len(match.group(1)) > MAX_NAME_CHARS:
                raise SpecError(
                    where, f"count_distinct: the column name exceeds {MAX_NAME_CHARS} characters"
                )
            return f"count_distinct({match.group(1)})"
    raise SpecError(
        where,
        f"must be one of {', '.join(METRICS)}, percentile(P) with 0 <= P <= 100 or "
        f"count_distinct(COLUMN); got {excerpt(name)}",
    )


def percentile_of(metric: str) -> float | None:
    """P of a canonical `percentile(P)` metric; None for any other metric."""
    match = _PERCENTILE.match(metric)
    return float(match.group(1)) if match else None


def distinct_column_of(metric: str) -> str | None:
    """COLUMN of a canonical `count_distinct(COLUMN)` metric; None for any other metric."""
    match = _COUNT_DISTINCT.match(metric)
    return match.group(1) if match else None


def distinct_columns(metrics: Sequence[str]) -> tuple[str, ...]:
    """The columns of a query's count_distinct metrics, in the spec's order."""
    return tuple(c for m in metrics if (c := distinct_column_of(m)) is not None)


def metric_column(metric: str) -> str:
    """The release column of a metric: its name, `percentile_P` (`.` as `_`) or
    `count_distinct_COLUMN`."""
    column = distinct_column_of(metric)
    if column is not None:
        return f"count_distinct_{column}"
    p = percentile_of(metric)
    return metric if p is None else f"percentile_{p:g}".replace(".", "_")


def _needs_kept_rows(metric: str) -> bool:
    """Metrics computed from the kept rows themselves, not from a pair's count and sums."""
    return (
        metric in ("max", "min")
        or percentile_of(metric) is not None
        or distinct_column_of(metric) is not None
    )


def _needs_value_bounds(metrics: tuple[str, ...]) -> bool:
    return any(
        m in ("sum", "mean", "max", "min", *VARIANCE_METRICS) or percentile_of(m) is not None
        for m in metrics
    )


class QuerySpec(_Section):
    """One named query: its own filter, keys, metrics and bounds, under the job's budget."""

    name: Annotated[str, BeforeValidator(_query_name)] = Field(
        description="Query name; its dataset's folder in the release."
    )
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
            raise _broken(f"must be a filter expression, got {excerpt(text)}")
        return text  # parsed against the job's input schema (JobSpec._columns_exist)

    @model_validator(mode="after")
    def _consistent(self) -> QuerySpec:
        rows_needed = [m for m in self.metrics if _needs_kept_rows(m)]
        if self.bounds.linf_bounding == "scale" and rows_needed:
            raise _broken(
                f"scale keeps no rows, only each pair's count and sum; {rows_needed[0]} needs "
                "the kept rows: use sample for this query",
                at="bounds.linf_bounding",
            )
        if self.needs_value_bounds and self.bounds.min_value is None:
            raise _broken(
                "min_value and max_value are required for sum, mean, variance, max, min and "
                "percentiles",
                at="bounds.min_value",
            )
        selection = self.partition_selection
        sources = selection.public_partitions
        if not self.partition_by and (sources is not None or selection.pre_threshold is not None):
            raise _broken(
                "a global total (partition_by: []) has one partition: nothing to select",
                at="partition_selection",
            )
        where = "partition_selection.public_partitions"
        listed = self.listed_keys
        if isinstance(sources, list):  # a key list: of the one key column
            if len(listed) != 1:
                raise _broken(
                    "a key list needs one partition_by column; give one list per column instead",
                    at=where,
                )
            keyed = selection.model_copy(update={"public_partitions": {listed[0]: sources}})
            object.__setattr__(self, "partition_selection", keyed)  # still validating: frozen after
            sources = keyed.public_partitions
        if isinstance(sources, dict) and set(sources) != set(listed):
            buckets = [b for b in self.partition_by if bucket_key(b) is not None]
            implied = f" (bucket keys {', '.join(buckets)} list themselves)" if buckets else ""
            raise _broken(
                f"must give keys for exactly the partition_by columns {listed}, "
                f"got {excerpt(sorted(sources))}{implied}",
                at=where,
            )
        if isinstance(sources, str) and _RANGE.match(sources) and len(listed) != 1:
            raise _broken(
                "a range needs one partition_by column; give one source per column instead",
                at=where,
            )
        return self

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
        return _needs_value_bounds(self.metrics)

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


# Job fields that are every query's defaults: a query that does not set one takes the job's
# (bounds field by field; partition_by from partition_key). partition_selection is the
# shorthand's only: an explicit query selects privately unless it names its keys.
_INHERITED = ("metrics", "value")
SHORTHAND_FIELDS = (
    "partition_key", "metrics", "value", "bounds", "partition_selection", "filter",
)  # fmt: skip


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


class JobSpec(_Section):
    """One release: per-partition DP statistics of one or more queries under one budget.

    `queries` always holds at least one query. A spec written without `queries` (the
    shorthand) is one query named after the job, made of the job's partition_key, metrics,
    value, bounds and partition_selection; with `queries`, those job fields are the queries'
    defaults. `is_shorthand` remembers which was written: it decides only how names read
    (error paths, mechanism names) and keeps the spec hash of existing shorthand specs.
    """

    name: Annotated[str, BeforeValidator(_job_name)] = Field(
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
    noise: Annotated[str, BeforeValidator(_one_of(NOISE_KINDS))] = Field(
        "laplace", description="Noise kind: laplace or gaussian."
    )
    accounting: Annotated[str, BeforeValidator(_one_of(ACCOUNTINGS))] = Field(
        "basic",
        description=(
            "How the job's mechanisms compose: basic (shares add up), pld (privacy loss "
            "distributions) or zcdp (Rényi/zCDP), both by dp_accounting: less noise for the "
            "same (epsilon, delta), most with gaussian noise; needs budget.delta > 0."
        ),
    )
    count_noise: Annotated[str, BeforeValidator(_one_of(COUNT_NOISES))] = Field(
        "discrete",
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

    @model_validator(mode="wrap")
    @classmethod
    def _one_shape(cls, raw: Any, handler: Callable[[Any], JobSpec]) -> JobSpec:
        """Expands the shorthand, or fills each query's unset fields from the job's."""
        if isinstance(raw, JobSpec):
            return raw
        if not isinstance(raw, Mapping):
            raise _broken("must be a mapping of fields at the top level")
        data = dict(raw)
        shorthand = data.get("queries") is None
        data["queries"] = [_shorthand_query(data)] if shorthand else _queries(data["queries"], data)
        spec = handler(data)
        spec._shorthand = shorthand
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
        from dppipeline.spec.filters import parse_filter  # noqa: PLC0415 (filters use models)
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
            where = self.query_path(query)
            for entry in query.partition_by:
                self._check_key(schema, entry, f"{where}partition_by")
            if query.needs_value_bounds:
                _check_column(schema, query.value, f"{where}value", ("int64", "float64"))
            if query.filter is not None:
                parse_filter(query.filter, schema, where=f"{where}filter")
            for column in distinct_columns(query.metrics):
                if column == unit:  # distinct units: privacy_id_count, sensitivity 1, not Linf
                    raise SpecError(
                        f"{where}metrics",
                        f"count_distinct({column}) counts privacy units: use privacy_id_count",
                    )
                if column not in schema.names:
                    raise SpecError(
                        f"{where}metrics",
                        f"count_distinct({column}): {column!r} is not an input column ({listed})",
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
            raise _broken("must differ from privacy_unit", at="partition_key")
        names = [q.name for q in self.queries]
        for name in names:
            if names.count(name) > 1:
                raise _broken("two queries have this name", at=f"queries.{name}")
        if self.noise == "gaussian" and self.budget.delta == 0:
            raise _broken("must be > 0 for gaussian noise", at="budget.delta")
        if self.accounting != "basic" and self.budget.delta == 0:
            raise _broken(f"must be > 0 for {self.accounting} accounting", at="budget.delta")
        if self.budget.delta == 0:
            for query in self.queries:
                if not query.is_public:
                    where = self.query_path(query).removesuffix(".")
                    raise _broken(
                        f"must be > 0 for private partition selection ("
                        f"{where + ': ' if where else ''}or give public_partitions)",
                        at="budget.delta",
                    )
        self._columns_exist()
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

    def spec_hash(self) -> str:
        """sha256 of the canonical spec: what decides the release's numbers, defaults left
        out, public key files by content (see `hashing.py`); for release keys."""
        from dppipeline.spec.hashing import spec_hash  # noqa: PLC0415

        return spec_hash(self)


def _shorthand_query(job: Mapping[str, Any]) -> dict[str, Any]:
    """The one query of a spec written without `queries`: the job's own fields."""
    query: dict[str, Any] = {"name": job.get("name", JobSpec.model_fields["name"].default)}
    if "partition_key" in job:
        query["partition_by"] = [job["partition_key"]]
    for name in ("metrics", "value", "bounds", "partition_selection", "filter"):
        if job.get(name) is not None:
            query[name] = job[name]
    return query


def _with_job_filter(job_filter: Any, own: Any) -> Any:
    """A query's filter under the job's: both must hold (`(job) and (query)`)."""
    if not isinstance(job_filter, str) or not job_filter.strip():
        return own if own is not None else job_filter
    if not isinstance(own, str) or not own.strip():
        return job_filter if own is None else own  # a broken own filter gets its own error
    return f"({job_filter}) and ({own})"


def _queries(raw_queries: Any, job: Mapping[str, Any]) -> list[Any]:
    """Queries as written, each with the job's fields as defaults for what it leaves unset."""
    if not isinstance(raw_queries, list) or not raw_queries:
        raise _broken("must be a non-empty list of queries", at="queries")
    queries: list[Any] = []
    for raw in raw_queries:
        if not isinstance(raw, Mapping):
            queries.append(raw)  # its error, with its position, comes from the model
            continue
        query = {k: job[k] for k in _INHERITED if k in job and k not in raw}
        query.update(raw)
        if job.get("filter") is not None:
            query["filter"] = _with_job_filter(job["filter"], raw.get("filter"))
        if "partition_by" not in raw:
            query["partition_by"] = [job.get("partition_key") or "TERMINAL_ID"]
        job_bounds, own_bounds = job.get("bounds"), raw.get("bounds")
        if isinstance(job_bounds, Mapping) and (
            own_bounds is None or isinstance(own_bounds, Mapping)
        ):
            query["bounds"] = {**_inherited_bounds(job_bounds, own_bounds), **(own_bounds or {})}
        queries.append(query)
    return queries


def _inherited_bounds(
    job_bounds: Mapping[str, Any], own_bounds: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The job's bounds a query takes: all of them, except that a query which sets one kind
    of contribution bound (L0/Linf, or max_contributions) takes none of the other kind."""
    own = set(own_bounds or {})
    drop: set[str] = set()
    if own & set(TOTAL_BOUNDS):  # how Linf bounds is of the L0/Linf kind too
        drop |= {*PER_PARTITION_BOUNDS, "linf_bounding"}
    if own & set(PER_PARTITION_BOUNDS):
        drop |= set(TOTAL_BOUNDS)
    return {k: v for k, v in job_bounds.items() if k not in drop}


def _is_query_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and len(name) <= MAX_NAME_CHARS
        and _QUERY_NAME.fullmatch(name) is not None
    )


def _spec_error(exc: ValidationError, raw: Mapping[str, Any] | None) -> SpecError:
    """pydantic's first error as one SpecError: the YAML path of the field and the rule."""
    error = exc.errors(include_url=False, include_input=False)[0]
    loc = list(error["loc"])
    ctx = error.get("ctx") or {}
    if error["type"] == _RULE:
        rule = str(ctx["rule"])
        if ctx.get("at"):
            loc += str(ctx["at"]).split(".")
    elif error["type"] == "missing":
        rule = "is required"
    else:
        rule = error["msg"]
    return SpecError(_yaml_path(loc, raw) or "job spec", rule)


def _yaml_path(loc: list[Any], raw: Mapping[str, Any] | None) -> str:
    """pydantic's location as the YAML path a user wrote: a query by its name (or its 1-based
    position when it has no valid name); the shorthand's one query as the job itself."""
    parts: list[str] = []
    written = raw.get("queries") if isinstance(raw, Mapping) else None
    position = 0
    while position < len(loc):
        part = loc[position]
        if part == "queries" and position + 1 < len(loc) and isinstance(loc[position + 1], int):
            index = int(loc[position + 1])
            position += 2
            if not isinstance(written, list):
                continue  # the shorthand's query: its fields are the job's
            name = written[index].get("name") if isinstance(written[index], Mapping) else None
            parts.append(f"queries.{name}" if _is_query_name(name) else f"queries[{index + 1}]")
            continue
        parts.append(str(part))
        position += 1
    return ".".join(parts)


def spec_from_dict(raw: Mapping[str, Any], source: str = "job spec") -> JobSpec:
    """Builds a JobSpec from plain data (parsed YAML); unknown keys are errors, not ignored."""
    if not isinstance(raw, Mapping):
        raise SpecError(source, "must be a mapping of fields at the top level")
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise _spec_error(exc, raw) from None


def budget_from_dict(raw: Any, source: str) -> BudgetSpec:
    """Just the budget section of a spec (for `dppipeline budget`), validated."""
    try:
        return BudgetSpec.model_validate({} if raw is None else raw)
    except ValidationError as exc:
        error = _spec_error(exc, None)
        field = "budget" if error.field == "job spec" else f"budget.{error.field}"
        raise SpecError(f"{source}: {field}", error.rule) from None


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
    source = Location.of(path)
    path = source.display()  # how errors name it
    try:
        if source.is_local:
            with source.path.open("rb") as file:
                data = file.read(MAX_SPEC_BYTES + 1)
        else:
            data = source.read_bytes()
    except OSError as exc:
        reason = exc.strerror if source.is_local else str(exc).split(": ", 1)[-1]
        raise UsageError(f"cannot read job spec {path}: {reason}") from None
    return resolve_paths(parse_raw(data, path), source.parent)


def parse_raw(data: bytes, path: str) -> dict[str, Any]:
    """`load_raw` of a spec's bytes (`path`: how errors name it); relative paths as written."""
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
    return raw


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


def resolve_paths(raw: Mapping[str, Any], base: Path | Location) -> dict[str, Any]:
    """Relative paths in a YAML spec are relative to the YAML file's folder (local or a URI),
    as in compose files, so a job runs the same from any working directory (Airflow,
    spark-submit); URIs are kept as written."""
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


def _resolved(path: str, base: Path | Location) -> str:
    if not is_file_source(path) or is_uri(path) or Path(path).is_absolute():
        return path
    base = Location.of(base)
    return str(base.path.joinpath(path).resolve()) if base.is_local else str(base.join(path))


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
        if parents == ["bounds"]:  # a flag of one bound kind replaces the file's other kind
            other = PER_PARTITION_BOUNDS if leaf in TOTAL_BOUNDS else TOTAL_BOUNDS
            if leaf in (*PER_PARTITION_BOUNDS, *TOTAL_BOUNDS):
                for name in other:
                    if (overrides or {}).get(f"bounds.{name}") is None:
                        target.pop(name, None)
        target[leaf] = value
    try:
        _check_locations(data)
        return spec_from_dict(data)
    except SpecError as exc:
        if source is None:
            raise
        raise SpecError(f"{source}: {exc.field}", exc.rule) from None


def _check_locations(data: dict[str, Any]) -> None:
    """A location the spec names is a path or a URI the storage layer accepts (a known
    scheme, no credentials in it): refused here, before anything is read or recorded. A
    `file://` URI becomes the local path it names, so the rest of the product sees a path."""
    named: list[tuple[str, dict[str, Any], str]] = []  # (field, holder, key)
    for path in _PATH_FIELDS:
        holder: Any = data
        for part in path[:-1]:
            holder = holder.get(part) if isinstance(holder, dict) else None
        if isinstance(holder, dict):
            named.append((".".join(path), holder, path[-1]))
    queries = data.get("queries")
    for index, query in enumerate(queries if isinstance(queries, list) else []):
        selection = query.get("partition_selection") if isinstance(query, dict) else None
        if not isinstance(selection, dict):
            continue
        field = f"queries[{index}].partition_selection.public_partitions"
        sources = selection.get("public_partitions")
        if isinstance(sources, dict):
            named += [(f"{field}.{column}", sources, column) for column in sources]
        else:
            named.append((field, selection, "public_partitions"))
    for field, holder, key in named:
        value = holder.get(key)
        if isinstance(value, str) and is_uri(value):
            try:
                where = Location.of(value)
            except ValueError as exc:
                raise SpecError(field, str(exc)) from None
            if where.is_local:
                holder[key] = where.uri


def load_spec(path: str | Path) -> JobSpec:
    """Reads and validates a YAML job spec."""
    return build_spec(load_raw(path), source=str(path))


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
    for name, info in JobSpec.model_fields.items():
        doc = info.description or ""
        section = info.annotation
        if name == "queries":
            rows.append((name, "[]", doc))
            for sub, sub_info in QuerySpec.model_fields.items():
                default = _QUERY_DEFAULTS.get(sub, repr(sub_info.default))
                rows.append((f"queries[].{sub}", default, sub_info.description or ""))
        elif isinstance(section, type) and issubclass(section, _Section):
            for sub, sub_info in section.model_fields.items():
                default = "required" if sub in PER_PARTITION_BOUNDS else repr(sub_info.default)
                rows.append((f"{name}.{sub}", default, sub_info.description or ""))
        else:
            rows.append((name, repr(info.default), doc))
    return rows
