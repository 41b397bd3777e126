"""The field reference: every spec field's YAML path, default and meaning, read from the models.

For `dppipeline spec-doc` and the README's field table, so that the reference is the models'
own descriptions and cannot drift from them.
"""

from __future__ import annotations

from dppipeline.spec.model import JobSpec, QuerySpec
from dppipeline.spec.sections import PER_PARTITION_BOUNDS, Section

# How a query's unset fields are filled, for the field table.
_QUERY_DEFAULTS = {
    "name": "required",
    "partition_by": "[partition_key]",
    "metrics": "job's metrics",
    "value": "job's value",
    "bounds": "job's bounds",
    "partition_selection": "private",
}
# Section fields whose default is not one value: how an unset one is filled.
_SECTION_DEFAULTS = {
    **dict.fromkeys(PER_PARTITION_BOUNDS, "required"),
    "linf_bounding": "per query: scale where allowed, else sample",
}


def describe_fields() -> list[tuple[str, str, str]]:
    """(yaml path, default, doc) for every field, for the README and `dppipeline spec-doc`."""
    rows: list[tuple[str, str, str]] = []
    for name, info in JobSpec.model_fields.items():
        doc = info.description or ""
        section = info.annotation
        if name == "queries":
            rows.append((name, "[]", doc))
            for sub, sub_info in QuerySpec.model_fields.items():
                default = _QUERY_DEFAULTS.get(sub, repr(sub_info.default))
                rows.append((f"queries[].{sub}", default, sub_info.description or ""))
        elif isinstance(section, type) and issubclass(section, Section):
            for sub, sub_info in section.model_fields.items():
                default = _SECTION_DEFAULTS.get(sub, repr(sub_info.default))
                rows.append((f"{name}.{sub}", default, sub_info.description or ""))
        else:
            rows.append((name, repr(info.default), doc))
    return rows
