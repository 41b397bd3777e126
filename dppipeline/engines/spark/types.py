"""Spark SQL types derived from the Arrow types of `spec/schemas/*.json` and of Parquet
footers: the one map from Arrow to Spark."""

from __future__ import annotations

import pyarrow as pa

from dppipeline.spec.schema import Field, Schema

_BY_NAME = {
    "int8": "tinyint",
    "int16": "smallint",
    "int32": "int",
    "int64": "bigint",
    "uint8": "smallint",
    "uint16": "int",
    "uint32": "bigint",
    "uint64": "decimal(20,0)",
    "float": "float",
    "double": "double",
    "string": "string",
    "large_string": "string",
    "date32[day]": "date",
}


def spark_type(arrow: pa.DataType) -> str:
    """The Spark SQL (DDL) name of an Arrow type; timestamps by zone: a zoned timestamp is
    Spark's `timestamp`, one without a zone `timestamp_ntz`."""
    if pa.types.is_timestamp(arrow):
        return "timestamp" if arrow.tz else "timestamp_ntz"
    if pa.types.is_list(arrow):
        return f"array<{spark_type(arrow.value_type)}>"
    return _BY_NAME[str(arrow)]


def field_type(field: Field) -> str:
    """A schema field's Spark type (usable in casts)."""
    return spark_type(field.arrow_type)


def to_spark_ddl(schema: Schema | pa.Schema) -> str:
    """A schema as a Spark DDL string (`StructType.fromDDL`)."""
    if isinstance(schema, pa.Schema):
        return ", ".join(f"{f.name} {spark_type(f.type)}" for f in schema)
    return ", ".join(
        f"{f.name} {field_type(f)}" + ("" if f.nullable else " NOT NULL") for f in schema.fields
    )
