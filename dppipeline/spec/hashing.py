"""The spec hash: what a release key knows of the job spec.

It must change exactly when the release would: two specs that give the same release (the same
parameters, the same public keys) hash alike, so a retried night returns the published release
instead of drawing new noise; any change to what is released makes a new key. So the hash
covers a canonical form of the spec:

- every field equal to its default is omitted, so a field added later with a default (an
  upgrade) keeps every existing key;
- no paths (input, output and quarantine folders): moving data or releases changes nothing;
- no ledger-only fields (`budget.scope`, caps, window): they govern the ledger, not the numbers;
- public key files by the sha256 of their bytes, never by path: an edited key list is a new
  release, a moved one is not; an input schema by its columns.

The canonical form is built from the spec's values and each section's defaults (the models'
field defaults), then serialised as sorted, compact JSON. A shorthand spec (one query written
at the top level) is hashed as written, without the query the model derives from it, so keys
made before every job had `queries` stay the same.

The price of omitting defaults: a default must never change its value, or old keys would
match releases made with the new one. Change the field's name (or give the new meaning a new
field) instead.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from dppipeline.errors import InputError
from dppipeline.spec.partition_keys import is_file_source
from dppipeline.storage import Location

# (section, field) pairs left out: paths and ledger-only settings.
EXCLUDED = {
    ("", "output"),
    ("input", "path"),
    ("input", "quarantine"),
    ("budget", "scope"),
    ("budget", "cap_epsilon"),
    ("budget", "cap_delta"),
    ("budget", "window_days"),
}


# Fields whose default was removed (a value became required, or is now chosen per query): the
# old default is still left out, so a spec that states it (or now resolves to it) keeps the
# release key it had when that value was implied. `linf_bounding` was `sample` until unset
# came to mean "scale where the query allows it" (QuerySpec._resolve_linf_bounding): a query
# that now scales hashes with `scale`, a new key for what is a new release.
FORMER_DEFAULTS = {
    "max_partitions_contributed": 1,
    "max_contributions_per_partition": 1,
    "linf_bounding": "sample",
}


def _defaults(value: BaseModel) -> dict[str, Any]:
    """Field -> default of a spec section."""
    return {
        name: info.get_default(call_default_factory=True)
        for name, info in type(value).model_fields.items()
        if not info.is_required()
    }


def _is_default(name: str, value: Any, defaults: dict[str, Any]) -> bool:
    if name in defaults and _plain(value) == _plain(defaults[name]):
        return True
    return name in FORMER_DEFAULTS and value == FORMER_DEFAULTS[name]


def _plain(value: Any) -> Any:
    """A spec value as JSON data (tuples as lists, dates as text, sections as mappings)."""
    if isinstance(value, BaseModel):
        return {name: _plain(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    return value


def _section(value: BaseModel, where: str, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A spec section (`where`: its dotted path) without its defaulted, excluded and `skip`
    fields, recursively; a section left empty is dropped."""
    defaults = _defaults(value)
    out: dict[str, Any] = {}
    for name in type(value).model_fields:
        field_value = getattr(value, name)
        if name in skip or (where, name) in EXCLUDED or _is_default(name, field_value, defaults):
            continue
        path = f"{where}.{name}" if where else name
        if isinstance(field_value, BaseModel):
            content: Any = _section(field_value, path)
        elif isinstance(field_value, tuple) and any(isinstance(v, BaseModel) for v in field_value):
            content = [_section(item, f"{path}[]") for item in field_value]
        else:
            content = _plain(field_value)
        if name == "public_partitions":
            content = key_sources_by_content(content)
        if content != {}:
            out[name] = content
    return out


def key_sources_by_content(sources: Any) -> Any:
    """Public key sources with every file replaced by the sha256 of its bytes."""
    if isinstance(sources, str):
        return {"file_sha256": file_sha256(sources)} if is_file_source(sources) else sources
    if isinstance(sources, dict):
        return {column: key_sources_by_content(source) for column, source in sources.items()}
    return sources


def file_sha256(path: str | Path) -> str:
    """sha256 of a public key file's bytes; a missing or unreadable file names itself."""
    where = Location.of(path)
    try:
        data = where.path.read_bytes() if where.is_local else where.read_bytes()
    except OSError as exc:
        reason = exc.strerror if where.is_local else str(exc).split(": ", 1)[-1]
        raise InputError(f"cannot read public partitions {where.display()}: {reason}") from None
    return hashlib.sha256(data).hexdigest()


def canonical_spec(spec: Any) -> dict[str, Any]:
    """The canonical form of a job spec (see the module docstring). An input schema other
    than the default counts by the columns the spec read (names, types, nullability, role),
    whether from a file or listed inline: a moved or re-described file is the same release,
    a changed column is not, and a file edited after the spec read it changes nothing."""
    out = _section(spec, "", frozenset({"queries"}) if spec.is_shorthand else frozenset())
    if "schema" in out.get("input", {}):
        out["input"]["schema"] = {"columns": spec.source_schema.canonical()}
    return out


def spec_hash(spec: Any) -> str:
    blob = json.dumps(canonical_spec(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()
