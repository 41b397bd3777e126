"""The kinds of data the API takes and gives back: pandas, Polars and Spark DataFrames.

Which engine runs is decided by the data: pandas and Polars frames run on the local engine
(in-process), a Spark DataFrame on the Spark engine in its own session (never a new one).
Released datasets come back as the kind that went in. Heavy libraries are imported only
when the data is of their kind (recognised by module name, so nothing here imports pyspark).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from dppipeline.errors import InputError, UsageError, excerpt

FrameKind = Literal["pandas", "polars", "spark"]


def frame_kind(data: object) -> FrameKind:
    """pandas, polars or spark; anything else is a UsageError that says what is taken."""
    module = type(data).__module__ or ""
    name = type(data).__name__
    if name == "DataFrame" and module.startswith("pandas"):
        return "pandas"
    if name == "DataFrame" and module.startswith("polars"):
        return "polars"
    if name == "DataFrame" and module.startswith("pyspark"):
        return "spark"
    if name == "LazyFrame" and module.startswith("polars"):
        raise UsageError("data: a Polars LazyFrame; collect it first (a DataFrame is taken)")
    raise UsageError(
        f"data: must be a pandas, Polars or Spark DataFrame, got {type(data).__name__} "
        "(a Beam PCollection: apply dppipeline.beam.ReleaseTransform in the pipeline)"
    )


def as_polars(data: Any, kind: FrameKind) -> Any:
    """A pandas or Polars frame as the local engine reads it (a Polars DataFrame)."""
    import polars as pl  # noqa: PLC0415

    return data if kind == "polars" else _from_pandas(pl, data)


def _from_pandas(pl: Any, data: Any) -> Any:
    """A pandas frame as a Polars one; a frame that cannot be one is an InputError naming the
    column and the rule, never a value (pyarrow's own errors quote the cell)."""
    names = [str(name) for name in data.columns]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise InputError(f"data: column {excerpt(twice[0])} appears twice; names must be unique")
    try:
        return pl.from_pandas(data)
    except Exception:  # pyarrow's ArrowInvalid / ArrowTypeError, OverflowError, ...
        pass
    for name in data.columns:  # the failing column, found again one column at a time
        try:
            pl.from_pandas(data[[name]])
        except OverflowError:
            raise InputError(
                f"data: column {excerpt(str(name))}: an integer outside the 64-bit range"
            ) from None
        except Exception:
            raise InputError(
                f"data: column {excerpt(str(name))}: values of more than one type (e.g. numbers "
                "and text in an object column); give each column one type"
            ) from None
    raise InputError("data: the frame cannot be converted to Arrow columns")


def read_dataset(folder: Path, kind: FrameKind, spark: Any = None) -> Any:
    """A released dataset folder (Parquet) as the kind of frame the caller gave; a Spark
    DataFrame in the caller's session (`spark`), built from rows on the driver (a release
    has one row per partition) so it outlives the staging folder."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    table = pq.read_table(folder)
    if kind == "polars":
        import polars as pl  # noqa: PLC0415

        return pl.from_arrow(table)
    frame = table.to_pandas()
    if kind == "pandas":
        return frame
    from dppipeline.engines.spark.types import spark_type  # noqa: PLC0415

    ddl = ", ".join(f"`{f.name}` {spark_type(f.type)}" for f in table.schema)
    plain = frame.astype(object).where(frame.notna(), None)
    rows = [tuple(row) for row in plain.itertuples(index=False)]
    return spark.createDataFrame(rows, ddl)
