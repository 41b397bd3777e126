"""Shorthand expansion: the job's fields as its queries' defaults.

A spec written without `queries` (the shorthand) is one query named after the job, made of
the job's partition_key, metrics, value, bounds, partition_selection and filter; with
`queries`, those job fields fill what each query leaves unset. Works on the data as written,
before validation, so that errors name the fields the user wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dppipeline.spec.constraints import broken
from dppipeline.spec.sections import PER_PARTITION_BOUNDS, TOTAL_BOUNDS

# Job fields that are every query's defaults: a query that does not set one takes the job's
# (bounds field by field; partition_by from partition_key). partition_selection is the
# shorthand's only: an explicit query selects privately unless it names its keys.
_INHERITED = ("metrics", "value")
SHORTHAND_FIELDS = (
    "partition_key", "metrics", "value", "bounds", "partition_selection", "filter",
)  # fmt: skip


def with_queries(raw: Mapping[str, Any], job_name: str) -> tuple[dict[str, Any], bool]:
    """The job's data with `queries` filled in, and whether it was written as the shorthand
    (`job_name`: the job's name when the data does not give one)."""
    data = dict(raw)
    shorthand = data.get("queries") is None
    data["queries"] = (
        [_shorthand_query(data, job_name)] if shorthand else _queries(data["queries"], data)
    )
    return data, shorthand


def _shorthand_query(job: Mapping[str, Any], job_name: str) -> dict[str, Any]:
    """The one query of a spec written without `queries`: the job's own fields."""
    query: dict[str, Any] = {"name": job.get("name", job_name)}
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
        raise broken("must be a non-empty list of queries", at="queries")
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
