"""`sql(query, data)`: a DP SQL query released over in-memory data, by `release`'s rules.

The query compiles to the job spec its YAML twin gives (`dppipeline.dpsql`), which then runs
through `release`: the same ledger resolution, one charge, the same manifest. `load_sql` is
the compiled job alone (for `plan`, or for `release` with a job).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from dppipeline.api.frame_release import Release, release
from dppipeline.dpsql.compile import compile_sql, read_query_file
from dppipeline.errors import UsageError
from dppipeline.spec.model import JobSpec

Frame = TypeVar("Frame")


def load_sql(query: str | Path, *, name: str | None = None) -> JobSpec:
    """The JobSpec of a DP SQL query: its text, or a `.sql` file (a Path, or a str naming
    one; relative key files are then relative to its folder, and its stem is the job's name
    unless `name` or the SELECT names it). Raises SqlError (line:column, the construct, the
    rule) for a query the dialect refuses."""
    if isinstance(query, Path) or ("\n" not in query and query.strip().endswith(".sql")):
        path = Path(query)
        try:
            text = read_query_file(path, str(path))
        except OSError as exc:
            raise UsageError(f"cannot read query file {path}: {exc.strerror}") from None
        return compile_sql(text, name=name or path.stem, base=path.parent, source=str(path))
    return compile_sql(query, name=name)


def sql(
    query: str | Path, data: Frame, *, name: str | None = None, **options: Any
) -> Release[Frame]:
    """Releases the DP SQL `query` (text or a `.sql` file) over `data` (pandas, Polars or
    Spark DataFrame) as `release(load_sql(query), data, **options)` does: `options` are
    `release`'s (ledger, scope, dataset_id, seed, new_release, output, quarantine, echo)."""
    return release(load_sql(query, name=name), data, **options)
