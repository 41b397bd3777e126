"""Error translation: pydantic's validation error as the one-line `SpecError` a user reads.

The message is the rule a field broke (`constraints.broken`); the field is named by the YAML path
the user wrote (`budget.epsilon`, `queries.daily.bounds.min_value`), never pydantic's
location with list indices and model names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from dppipeline.errors import SpecError
from dppipeline.spec.constraints import RULE, is_query_name


def spec_error(exc: ValidationError, raw: Mapping[str, Any] | None) -> SpecError:
    """pydantic's first error as one SpecError: the YAML path of the field and the rule."""
    error = exc.errors(include_url=False, include_input=False)[0]
    loc = list(error["loc"])
    ctx = error.get("ctx") or {}
    if error["type"] == RULE:
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
            parts.append(f"queries.{name}" if is_query_name(name) else f"queries[{index + 1}]")
            continue
        parts.append(str(part))
        position += 1
    return ".".join(parts)
