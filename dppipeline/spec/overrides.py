"""CLI flag merging: dotted-path overrides (`budget.epsilon`) laid over a spec's YAML data.

The command line and the API give a spec's fields by their YAML path; a flag wins over the
file. A flag of one contribution-bound kind (L0/Linf, or max_contributions) drops the file's
other kind, so that `--max-contributions` can replace a file's L0 and Linf.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from dppipeline.spec.sections import PER_PARTITION_BOUNDS, TOTAL_BOUNDS


def apply_overrides(
    raw: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A copy of the YAML data with each dotted-path override set; an override of None
    keeps the YAML value."""
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
    return data
