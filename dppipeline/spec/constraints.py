"""The rules a spec's values obey, as constrained types: a field is declared with one of them.

Each rule is a pydantic `BeforeValidator` that raises `broken(rule)`: a pydantic error whose
message is the rule, in the words `SpecError` shows (`must be > 0 and finite, got -1.0`);
pydantic supplies the path, and `messages.spec_error` turns both into one line.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

from dppipeline.errors import SpecError, excerpt
from dppipeline.spec.limits import (
    MAX_ABS_BOUND,
    MAX_BUCKET_EDGES,
    MAX_DELTA,
    MAX_INT_PARAM,
    MAX_NAME_CHARS,
    MAX_RANGE_KEYS,
    MAX_SCOPE_CHARS,
    MAX_WINDOW_DAYS,
    MIN_DELTA,
    MIN_EPSILON,
)
from dppipeline.spec.metrics import parse_metric
from dppipeline.spec.partition_keys import BUCKET_TEXT, INPUT_RANGE, KEY_RANGE, BucketKey, key_name
from dppipeline.spec.vocabulary import (
    ACCOUNTINGS,
    COUNT_NOISES,
    INPUT_FORMATS,
    INPUT_LAYOUTS,
    NOISE_KINDS,
    SELECTION_STRATEGIES,
    SHIPPED_SCHEMAS,
)

COLUMN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUERY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
RULE = "spec_rule"  # the pydantic error type of every rule below


def broken(rule: str, at: str = "") -> PydanticCustomError:
    """A broken rule; `at` names a field below the one being validated (model-level checks)."""
    return PydanticCustomError(RULE, "{rule}", {"rule": rule, "at": at})


def _number(value: Any) -> float:
    if isinstance(value, bool):
        raise broken(f"must be a number, got {excerpt(value)}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise broken(f"must be a number, got {excerpt(value)}") from None
    if math.isnan(number):
        raise broken("must be a number, got NaN")
    return number


def _in(low: float, high: float) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        number = _number(value)
        if not low <= number <= high:
            raise broken(f"must be in [{low}, {high}], got {excerpt(value)}")
        return number

    return check


def _int_in(low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise broken(f"must be an integer from {low:,} to {high:,}, got {excerpt(value)}")
        return value

    return check


def _positive_finite(value: Any) -> float:
    number = _number(value)
    if not number > 0 or math.isinf(number):
        raise broken(f"must be > 0 and finite, got {excerpt(value)}")
    return number


def _one_of(allowed: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in allowed:
            raise broken(f"must be one of {', '.join(allowed)}; got {excerpt(value)}")
        return str(value)

    return check


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else check(value)


def _path_text(value: Any) -> str | None:
    """Paths are kept as text (a spec must serialise to JSON); an empty one means unset."""
    if isinstance(value, Path):
        return str(value)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise broken(f"must be a path, got {excerpt(value)}")
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
    raise broken(f"must be a date YYYY-MM-DD, got {excerpt(value)}")


def _column(value: Any) -> str:
    """A column name: an identifier of at most MAX_NAME_CHARS characters."""
    if (
        not isinstance(value, str)
        or len(value) > MAX_NAME_CHARS
        or not COLUMN_NAME.fullmatch(value)
    ):
        raise broken(
            f"must be a column name (letters, digits, _; at most {MAX_NAME_CHARS} characters), "
            f"got {excerpt(value)}"
        )
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise broken(f"must be true or false, got {excerpt(value)}")
    return value


def is_query_name(name: Any) -> bool:
    """A query name: a letter, then letters, digits, _ (it names a release folder)."""
    return (
        isinstance(name, str)
        and len(name) <= MAX_NAME_CHARS
        and _QUERY_NAME.fullmatch(name) is not None
    )


def _query_name(value: Any) -> str:
    if not is_query_name(value):
        raise broken(
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
        raise broken(
            f"must be letters, digits and underscores (at most {MAX_NAME_CHARS} characters), "
            f"got {excerpt(value)}"
        )
    return value


def _metrics(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [m.strip() for m in re.split(r",(?![^(]*\))", value) if m.strip()]
    if not isinstance(value, list | tuple):
        raise broken(f"must be a list of metric names, got {excerpt(value)}")
    metrics = tuple(_metric(m) for m in value)
    if not metrics:
        raise broken("must name at least one metric")
    if len(set(metrics)) != len(metrics):
        raise broken(f"lists a metric twice: {excerpt(list(metrics))}")
    return metrics


def _metric(name: Any) -> str:
    try:
        return parse_metric(name)
    except SpecError as exc:
        raise broken(exc.rule) from None


def _bucket_entry(raw: Any) -> str:
    """`{bucket: COLUMN, edges: [...]}` or `bucket(COLUMN, e0, ...)` as canonical text."""
    if isinstance(raw, Mapping):
        unknown = sorted(set(map(str, raw)) - {"bucket", "edges"})
        if unknown or "bucket" not in raw or "edges" not in raw:
            raise broken(
                "a derived key is {bucket: COLUMN, edges: [e0, e1, ...]}, got "
                f"{excerpt(dict(raw))}"
            )
        column, edges = _column(raw["bucket"]), raw["edges"]
    else:
        match = BUCKET_TEXT.match(raw)
        assert match is not None
        column = match.group(1)
        edges = [e.strip() for e in match.group(2).split(",")[1:]]
    if not isinstance(edges, list | tuple) or not 1 <= len(edges) <= MAX_BUCKET_EDGES:
        raise broken(
            f"bucket {column}: edges must be a list of 1 to {MAX_BUCKET_EDGES} numbers, got "
            f"{excerpt(edges)}"
        )
    values = tuple(_number(e) for e in edges)
    if any(math.isinf(v) for v in values):
        raise broken(f"bucket {column}: edges must be finite (the last bucket is open)")
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise broken(f"bucket {column}: edges must increase, got {excerpt(list(edges))}")
    return BucketKey(column, values).text


def _partition_by(value: Any) -> tuple[str, ...]:
    keys = (value,) if isinstance(value, str | Mapping) else value
    if not isinstance(keys, list | tuple):
        raise broken(f"must be a list of column names or derived keys, got {excerpt(keys)}")
    entries = []
    for key in keys:
        if isinstance(key, Mapping) or (isinstance(key, str) and BUCKET_TEXT.match(key)):
            entries.append(_bucket_entry(key))
        else:
            entries.append(_column(key))
    names = [key_name(e) for e in entries]
    if len(set(names)) != len(names):
        raise broken(f"lists a key twice: {excerpt(names)}")
    return tuple(entries)


def _schema_source(value: Any) -> str | tuple[Mapping[str, Any], ...]:
    """A shipped schema's name, a .json file (path or URI), or the columns themselves."""
    from dppipeline.spec.schema import SchemaError, input_schema_from  # noqa: PLC0415 (pyarrow)

    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        if value not in SHIPPED_SCHEMAS and not value.endswith(".json"):
            raise broken(
                f"must be one of {', '.join(SHIPPED_SCHEMAS)}, a .json schema file or a list "
                f"of columns; got {excerpt(value)}"
            )
        return value
    if isinstance(value, Mapping):
        value = value.get("fields", value)
    if not isinstance(value, list | tuple):
        raise broken(
            f"must be a schema name, a .json file or a list of columns, got {excerpt(value)}"
        )
    try:
        input_schema_from(list(value))
    except SchemaError as exc:
        raise broken(str(exc)) from None
    return tuple(dict(f) for f in value)


def _cap_epsilon(value: Any) -> float | None:
    if value is None:
        return None
    cap = _number(value)
    if not 0 <= cap < math.inf:
        raise broken(f"must be >= 0 and finite, got {excerpt(cap)}")
    return cap


def _epsilon(value: Any) -> float:
    eps = _positive_finite(value)
    if eps < MIN_EPSILON:
        raise broken(f"must be >= 2^-50 (~{MIN_EPSILON:.2g}), PyDP's smallest epsilon, got {eps:g}")
    return eps


def _delta(value: Any) -> float:
    delta = _number(value)
    if not 0 <= delta <= MAX_DELTA:
        raise broken(
            f"must be 0 or in [{MIN_DELTA:g}, {MAX_DELTA:g}]: with probability delta a release "
            "may reveal a customer outright (choose it well below 1 / the number of privacy "
            f"units), got {excerpt(value)}"
        )
    if 0 < delta < MIN_DELTA:
        raise broken(
            f"must be 0 or >= {MIN_DELTA:g} (PyDP's selection probabilities break down "
            f"below), got {delta:g}"
        )
    return delta


def _scope(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise broken(f"must be a non-empty name, got {excerpt(value)}")
    if value is not None and len(value) > MAX_SCOPE_CHARS:
        raise broken(f"at most {MAX_SCOPE_CHARS} characters, got {len(value):,}")
    if value is not None and not value.isprintable():
        raise broken(f"printable characters only, got {excerpt(value)}")
    return value


def _bound_value(value: Any) -> float | None:
    if value is None:
        return None
    number = _number(value)
    if not math.isfinite(number):
        raise broken(f"must be finite, got {excerpt(value)}")
    if abs(number) > MAX_ABS_BOUND:
        raise broken(
            f"must be within +-{MAX_ABS_BOUND:g} (float64 sums and PyDP's sensitivity limits), "
            f"got {number:g}"
        )
    return number


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
        raise broken("must name at least one key column")
    for column, source in value.items():
        _column(column)
        if isinstance(source, list | tuple):
            _check_key_list(source, at=column)
        elif not isinstance(source, str | Path) or not str(source):
            raise broken(
                f"must be a file, a range 'A..B', {INPUT_RANGE!r} or a list; got {excerpt(source)}",
                at=column,
            )
        if isinstance(source, str):
            _check_range(column, source)
    return {str(k): str(v) if isinstance(v, Path) else v for k, v in value.items()}


def _check_key_list(keys: Sequence[Any], at: str) -> None:
    if not keys:
        raise broken("must list at least one key", at=at)
    if any(isinstance(v, bool | dict | list) or v is None for v in keys):
        raise broken(f"must list plain keys, got {excerpt(keys)}", at=at)


def _check_range(at: str, source: str) -> None:
    """An integer range 'A..B' of public keys: int64 bounds, A <= B, at most MAX_RANGE_KEYS
    keys (they are listed one by one)."""
    match = KEY_RANGE.match(source)
    if not match:
        return
    if max(len(match.group(1)), len(match.group(2))) > 20:
        raise broken(f"range {excerpt(source)} must have int64 bounds", at=at)
    low, high = int(match.group(1)), int(match.group(2))
    if low > high:
        raise broken(f"range {excerpt(source)} is empty (A > B)", at=at)
    if low < -(2**63) or high > 2**63 - 1:
        raise broken(f"range {excerpt(source)} must have int64 bounds", at=at)
    if high - low + 1 > MAX_RANGE_KEYS:
        raise broken(
            f"range {excerpt(source)} lists more than {MAX_RANGE_KEYS:,} keys; use a key file",
            at=at,
        )


# The constrained types the sections' fields are declared with.
Number = Annotated[float, BeforeValidator(_number)]
PositiveFinite = Annotated[float, BeforeValidator(_positive_finite)]
Fraction = Annotated[float, BeforeValidator(_in(0.0, 1.0))]
Bound = Annotated[int, BeforeValidator(_int_in(1, MAX_INT_PARAM))]
PathText = Annotated[str | None, BeforeValidator(_path_text)]
Day = Annotated[dt.date | None, BeforeValidator(_date)]
Column = Annotated[str, BeforeValidator(_column)]
OptionalColumn = Annotated[str | None, BeforeValidator(_optional(_column))]
Flag = Annotated[bool, BeforeValidator(_flag)]
Metrics = Annotated[tuple[str, ...], BeforeValidator(_metrics)]
Keys = Annotated[tuple[str, ...], BeforeValidator(_partition_by)]
QueryName = Annotated[str, BeforeValidator(_query_name)]
JobName = Annotated[str, BeforeValidator(_job_name)]
SchemaSource = Annotated[str | tuple[Mapping[str, Any], ...], BeforeValidator(_schema_source)]
Epsilon = Annotated[float, BeforeValidator(_epsilon)]
Delta = Annotated[float, BeforeValidator(_delta)]
Scope = Annotated[str | None, BeforeValidator(_scope)]
CapEpsilon = Annotated[float | None, BeforeValidator(_cap_epsilon)]
CapDelta = Annotated[float | None, BeforeValidator(_optional(_in(0.0, 1.0)))]
WindowDays = Annotated[int | None, BeforeValidator(_optional(_int_in(1, MAX_WINDOW_DAYS)))]
BoundValue = Annotated[float | None, BeforeValidator(_bound_value)]
KeySources = Annotated[str | dict[str, Any] | list[Any] | None, BeforeValidator(_key_sources)]
PreThreshold = Annotated[int | None, BeforeValidator(_optional(_int_in(1, MAX_INT_PARAM)))]
# A word of the spec's vocabulary (`vocabulary.py`).
InputFormat = Annotated[str, BeforeValidator(_one_of(INPUT_FORMATS))]
InputLayout = Annotated[str, BeforeValidator(_one_of(INPUT_LAYOUTS))]
SelectionStrategy = Annotated[str, BeforeValidator(_one_of(SELECTION_STRATEGIES))]
NoiseKind = Annotated[str, BeforeValidator(_one_of(NOISE_KINDS))]
Accounting = Annotated[str, BeforeValidator(_one_of(ACCOUNTINGS))]
CountNoise = Annotated[str, BeforeValidator(_one_of(COUNT_NOISES))]
