"""The paths a spec names: resolved against the YAML file's folder, and checked as locations.

Paths are the fields in `PATH_FIELDS` plus each query's public key files. Relative ones are
relative to the YAML file (`resolve_paths`, when it is read); every one must be a path or a
URI the storage layer accepts (`check_locations`, before the spec is validated).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dppipeline.errors import SpecError
from dppipeline.spec.partition_keys import is_file_source
from dppipeline.storage import Location, is_uri

PATH_FIELDS = (
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
    for path in PATH_FIELDS:
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


def _resolved(path: str, base: Path | Location) -> str:
    if not is_file_source(path) or is_uri(path) or Path(path).is_absolute():
        return path
    base = Location.of(base)
    return str(base.path.joinpath(path).resolve()) if base.is_local else str(base.join(path))


def check_locations(data: dict[str, Any]) -> None:
    """A location the spec names is a path or a URI the storage layer accepts (a known
    scheme, no credentials in it): refused here, before anything is read or recorded. A
    `file://` URI becomes the local path it names, so the rest of the product sees a path."""
    named: list[tuple[str, dict[str, Any], str]] = []  # (field, holder, key)
    for path in PATH_FIELDS:
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
