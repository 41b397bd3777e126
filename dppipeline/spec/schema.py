"""Schemas as data: one list of typed columns is the one source of truth for every engine.

A job's input schema is a shipped schema by name (`transactions`, the default; `book_transactions`
(the fraud handbook's CSV columns); `card_payments` (a merchant-category table)), a JSON file of
the same shape, or columns listed in the spec (`input.schema`). The JSON files ship inside the
package (see `schema_dir`) and are turned into pyarrow schemas here; the Spark engine turns the
same fields into a StructType. The event-time column (role `event_time`, or `input.time_column`)
is the one time buckets and daily partitions are about.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa

from dppipeline.spec.vocabulary import SHIPPED_SCHEMAS

_ARROW_TYPES: dict[str, pa.DataType] = {
    "int64": pa.int64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "timestamp[us]": pa.timestamp("us"),
    "date32": pa.date32(),
}


# Types an input column may have (what the input contract can parse and check).
INPUT_TYPES = ("int64", "float64", "string", "timestamp[us]")
EVENT_TIME = "event_time"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_COLUMNS = 1000


class SchemaError(ValueError):
    """A schema that cannot be used: the message is the rule (the caller adds where)."""


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    nullable: bool
    description: str
    role: str | None = None

    @property
    def arrow_type(self) -> pa.DataType:
        return _ARROW_TYPES[self.type]


@dataclass(frozen=True)
class Schema:
    name: str
    description: str
    fields: tuple[Field, ...]

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def subset(self, names: set[str] | list[str]) -> Schema:
        """The fields named, in schema order: what a job reads and validates."""
        wanted = set(names)
        unknown = wanted - set(self.names)
        if unknown:
            raise KeyError(sorted(unknown)[0])
        fields = tuple(f for f in self.fields if f.name in wanted)
        return Schema(self.name, self.description, fields)

    def to_arrow(self) -> pa.Schema:
        return pa.schema([pa.field(f.name, f.arrow_type, nullable=f.nullable) for f in self.fields])

    @property
    def time_column(self) -> str | None:
        """The event-time column (role `event_time`): time buckets and daily partitions."""
        return next((f.name for f in self.fields if f.role == EVENT_TIME), None)

    def with_time_column(self, name: str | None) -> Schema:
        """This schema with `name` as its event-time column (None: as declared)."""
        if name is None or name == self.time_column:
            return self
        if name not in self.names:
            raise SchemaError(f"no column {name} in schema {self.name} ({', '.join(self.names)})")
        if self.field(name).type != "timestamp[us]":
            raise SchemaError(
                f"column {name} has type {self.field(name).type}; the time column must be a "
                "timestamp[us]"
            )
        fields = tuple(
            replace(
                f, role=EVENT_TIME if f.name == name else (None if f.role == EVENT_TIME else f.role)
            )
            for f in self.fields
        )
        return Schema(self.name, self.description, fields)

    def without_event_time(self) -> Schema:
        """The same columns with no event-time role (no row is checked against a day)."""
        fields = tuple(replace(f, role=None) if f.role == EVENT_TIME else f for f in self.fields)
        return Schema(self.name, self.description, fields)

    def canonical(self) -> list[dict[str, Any]]:
        """The fields as plain data (what a release key hashes for a schema file)."""
        return [
            {"name": f.name, "type": f.type, "nullable": f.nullable, "role": f.role}
            for f in self.fields
        ]


def schema_dir() -> Path:
    """`dppipeline/spec/schemas/`, shipped inside the package (the repository's top-level
    `schemas/` is a link to it)."""
    return Path(__file__).resolve().parent / "schemas"


@cache
def load_schema(name: str) -> Schema:
    raw = json.loads((schema_dir() / f"{name}.json").read_text())
    fields = tuple(
        Field(
            name=f["name"],
            type=f["type"],
            nullable=bool(f.get("nullable", True)),
            description=f.get("description", ""),
            role=f.get("role"),
        )
        for f in raw["fields"]
    )
    return Schema(name=raw["name"], description=raw.get("description", ""), fields=fields)


def input_schema_from(source: str | list[Any] | tuple[Any, ...] | Mapping[str, Any]) -> Schema:
    """An input schema from what a spec names: a shipped schema, a JSON file (path or URI;
    `{"name":..., "fields": [...]}` or just the list of fields), or the fields themselves.
    Every rule broken is a SchemaError whose message names the field and the rule."""
    if isinstance(source, str):
        if source in SHIPPED_SCHEMAS:
            return load_schema(source)
        return _schema_file(source)
    if isinstance(source, Mapping):
        return _schema_data(source, "inline")
    return _schema_data({"name": "inline", "fields": list(source)}, "inline")


def _schema_file(path: str) -> Schema:
    """A schema JSON file, read each time it is asked for (a spec keeps what it read): a
    process that lives on (a scheduler, a notebook) must see an edited file, whose release
    key changes with its columns."""
    from dppipeline.storage import Location, StorageError  # noqa: PLC0415

    if not path.endswith(".json"):
        raise SchemaError(
            f"must be one of {', '.join(SHIPPED_SCHEMAS)} or a .json schema file, got {path!r}"
        )
    where = Location.of(path)
    try:
        data = where.path.read_bytes() if where.is_local else where.read_bytes()
    except (OSError, StorageError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc).split(": ", 1)[-1]
        raise SchemaError(f"cannot read schema file {where.display()}: {reason}") from None
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SchemaError(f"schema file {where.display()} is not JSON: {exc}") from None
    if isinstance(raw, list):
        raw = {"name": Path(path).stem, "fields": raw}
    if not isinstance(raw, Mapping):
        raise SchemaError(f"schema file {where.display()}: must hold an object with 'fields'")
    return _schema_data(raw, Path(where.display()).stem)


def _schema_data(raw: Mapping[str, Any], default_name: str) -> Schema:
    unknown = sorted(set(raw) - {"name", "description", "fields"})
    if unknown:
        raise SchemaError(f"unknown key {unknown[0]!r} (known: name, description, fields)")
    fields_raw = raw.get("fields")
    if not isinstance(fields_raw, list | tuple) or not fields_raw:
        raise SchemaError("fields: must be a non-empty list of columns")
    if len(fields_raw) > MAX_COLUMNS:
        raise SchemaError(f"fields: at most {MAX_COLUMNS} columns")
    fields = tuple(_field(i, f) for i, f in enumerate(fields_raw))
    names = [f.name for f in fields]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise SchemaError(f"fields: column {twice} is listed twice")
    if sum(f.role == EVENT_TIME for f in fields) > 1:
        raise SchemaError(f"fields: at most one column has role {EVENT_TIME}")
    name = raw.get("name", default_name)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SchemaError(f"name: must be letters, digits and _, got {name!r}")
    return Schema(name=name, description=str(raw.get("description", "")), fields=fields)


def _field(index: int, raw: Any) -> Field:
    at = f"fields[{index}]"
    if not isinstance(raw, Mapping):
        raise SchemaError(f"{at}: must be a mapping with name and type")
    unknown = sorted(set(raw) - {"name", "type", "nullable", "description", "role"})
    if unknown:
        raise SchemaError(
            f"{at}: unknown key {unknown[0]!r} (known: name, type, nullable, description, role)"
        )
    name = raw.get("name")
    if not isinstance(name, str) or len(name) > 100 or not _NAME.fullmatch(name):
        raise SchemaError(f"{at}.name: must be a column name (letters, digits, _), got {name!r}")
    type_ = raw.get("type")
    if type_ not in INPUT_TYPES:
        raise SchemaError(
            f"{at}.type: column {name} must have one of the types {', '.join(INPUT_TYPES)}, "
            f"got {type_!r}"
        )
    nullable = raw.get("nullable", False)
    if not isinstance(nullable, bool):
        raise SchemaError(f"{at}.nullable: must be true or false")
    role = raw.get("role")
    if role not in (None, EVENT_TIME):
        raise SchemaError(f"{at}.role: must be {EVENT_TIME} (the time column) or unset")
    if role == EVENT_TIME and type_ != "timestamp[us]":
        raise SchemaError(f"{at}.role: the {EVENT_TIME} column must be a timestamp[us]")
    description = raw.get("description", "")
    return Field(name, type_, nullable, str(description), role)


def transactions_schema() -> Schema:
    return load_schema("transactions")


def release_schema(
    key_columns: list[tuple[str, pa.DataType]], metric_columns: list[str]
) -> pa.Schema:
    """The release's Arrow schema: key columns, then the metric columns in the order given.

    Types come from `terminal_stats.json`; `percentile_P`, `count_distinct_COLUMN` and
    `<metric>_ci_low/_ci_high` columns take the type of their pattern entry there.
    """
    spec = load_schema("terminal_stats")
    typed = {f.name: f for f in spec.fields if f.role == "metric"}
    fields = [pa.field(name, typ, nullable=False) for name, typ in key_columns]
    for name in metric_columns:
        if name.endswith(("_ci_low", "_ci_high")):
            f = typed["<metric>_ci_low" if name.endswith("_low") else "<metric>_ci_high"]
        elif name.startswith("percentile_"):
            f = typed["percentile_P"]
        elif name.startswith("count_distinct_"):
            f = typed["count_distinct_COLUMN"]
        else:
            f = typed[name]
        fields.append(pa.field(name, f.arrow_type, nullable=f.nullable))
    return pa.schema(fields)
