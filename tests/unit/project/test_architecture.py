"""Structural rules: the DP core stays engine-neutral and draws no noise of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support import REPO

PACKAGE = REPO / "dppipeline"
CORE = PACKAGE / "core"
CORE_FILES = sorted(CORE.glob("*.py"))
# Engine-neutral layers (import-linter holds the whole graph to the layers in pyproject.toml;
# this checks the files directly, lazy imports included).
NEUTRAL_FILES = sorted(
    path
    for folder in ("core", "spec", "inputs", "orchestration", "ledger")
    for path in (PACKAGE / folder).glob("*.py")
) + [PACKAGE / "commands" / name for name in ("plan.py", "check_release.py")]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_core_files_found():
    assert {p.name for p in CORE_FILES} >= {"budget.py", "release.py", "manifest.py", "tasks.py"}
    assert len(NEUTRAL_FILES) > 30


@pytest.mark.parametrize("path", NEUTRAL_FILES, ids=lambda p: p.name)
def test_core_imports_no_engine(path):
    engines = {m for m in imported_modules(path) if m.split(".")[0] in {"pyspark", "apache_beam"}}
    assert not engines, f"{path.name} imports {engines}"


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_core_draws_no_insecure_randomness(path):
    """Released noise comes from PyDP; `random` and numpy's generators are not allowed here."""
    text = path.read_text()
    assert "random" not in {m.split(".")[0] for m in imported_modules(path)}
    assert "np.random" not in text and "numpy.random" not in text


def test_filter_language_needs_no_dataframe_library():
    """Filters are parsed and checked where no engine is installed (e.g. an Airflow worker)."""
    imported = {m.split(".")[0] for m in imported_modules(PACKAGE / "spec" / "filters.py")}
    assert not imported & {"polars", "pandas", "pyspark", "apache_beam", "numpy"}
