"""Schemas as data: `schemas/*.json` is the one source of truth for every engine.

The JSON files ship inside the package (see `schema_dir`) and are turned into pyarrow schemas
here; the Spark engine turns the same fields into a StructType.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pyarrow as pa

_ARROW_TYPES: dict[str, pa.DataType] = {
    "int64": pa.int64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "timestamp[us]": pa.timestamp("us"),
    "date32": pa.date32(),
}


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
