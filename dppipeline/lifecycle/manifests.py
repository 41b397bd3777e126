"""A published release's manifest read back as the model (`core.manifest.Manifest`)."""

from __future__ import annotations

from pathlib import Path

from dppipeline.core.manifest import Manifest, parse_manifest
from dppipeline.storage import Location
from dppipeline.storage.releases import manifest_text


def read_manifest(release: str | Path | Location) -> Manifest:
    """The manifest of a release (local folder, or a store's pointer); InputError naming the
    file and the first field that breaks the model (a missing file, a version this code does
    not read, a wrong type)."""
    where, text = manifest_text(release)
    return parse_manifest(text, where)
