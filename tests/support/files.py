"""Small file-tree helpers: write a file, read a tree back, a release as the runner writes it."""

from __future__ import annotations

import json
from pathlib import Path


def touch(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def siblings(folder: Path) -> list[str]:
    """Names in `folder`, sorted; none when it does not exist."""
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def read_tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}


def write_release(folder: Path, run_id: str, text: str = "data") -> Path:
    """A release as the runner writes it: a dataset, then its manifest."""
    touch(folder / "stats" / "part-00000.parquet", text)
    manifest = {"manifest_version": 2, "run_id": run_id, "job": "stats",
                "queries": {"stats": {"dataset": "stats"}}}  # fmt: skip
    touch(folder / "manifest.json", json.dumps(manifest))
    return folder
