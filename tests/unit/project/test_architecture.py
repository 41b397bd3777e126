"""Structural rules: the DP core stays engine-neutral and draws no noise of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest
from support import REPO

PACKAGE = REPO / "dppipeline"
CORE = PACKAGE / "core"
CORE_FILES = sorted(CORE.glob("*.py"))
# Engine-neutral layers (import-linter holds the whole graph to the layers in pyproject.toml;
# this checks the files directly, lazy imports included).
NEUTRAL_FILES = sorted(
    path
    for folder in ("core", "spec", "inputs", "lifecycle", "ledger")
    for path in (PACKAGE / folder).glob("*.py")
) + [PACKAGE / "reports" / name for name in ("plan_text.py", "check_release.py")]


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
    assert {p.name for p in CORE_FILES} >= {"plan.py", "planner.py", "mechanisms.py", "tasks.py"}
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


@pytest.mark.parametrize("name", ["filters.py", "filter_parser.py"])
def test_filter_language_needs_no_dataframe_library(name):
    """Filters are parsed and checked where no engine is installed (e.g. an Airflow worker)."""
    imported = {m.split(".")[0] for m in imported_modules(PACKAGE / "spec" / name)}
    assert not imported & {"polars", "pandas", "pyspark", "apache_beam", "numpy"}


# ---------------------------------------------------------------------------------------------
# The import graph as import-linter sees it (grimp): module-level, deferred and TYPE_CHECKING
# imports alike.

# What core may import from the package: itself, the spec, the shared errors and the version.
CORE_MAY_IMPORT = ("dppipeline.core", "dppipeline.spec", "dppipeline.errors", "dppipeline.version")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("dppipeline", cache_dir=None)


def import_cycles(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """The package's import cycles: strongly connected components of more than one module
    (Tarjan's algorithm, iterative), a module importing itself counted as one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[frozenset[str]] = []

    def imported(module: str) -> list[str]:
        return sorted(m for m in graph.find_modules_directly_imported_by(module) if m in index_of)

    index_of = set(graph.modules)
    for root in sorted(index_of):
        if root in index:
            continue
        work = [(root, iter(imported(root)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(imported(child))))
                elif child in on_stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == module:
                        break
                if len(component) > 1 or module in imported(module):
                    cycles.append(frozenset(component))
    return cycles


def test_the_cycle_finder_finds_a_cycle():
    """The check can fail: a graph with a planted cycle shows it, and only it."""
    planted = grimp.ImportGraph()
    for importer, imported in [("a.x", "a.y"), ("a.y", "a.z"), ("a.z", "a.x"), ("a.z", "a.w")]:
        planted.add_import(importer=importer, imported=imported)
    assert import_cycles(planted) == [frozenset({"a.x", "a.y", "a.z"})]


def test_no_import_cycle_within_core(graph):
    in_core = [c for c in import_cycles(graph) if c & graph.find_descendants("dppipeline.core")]
    cycles = [sorted(c) for c in in_core]
    assert not cycles, f"import cycles through dppipeline.core: {cycles}"


def test_no_import_cycle_in_the_package(graph):
    cycles = [sorted(c) for c in import_cycles(graph)]
    assert not cycles, f"import cycles: {cycles}"


def test_core_imports_only_spec_and_errors(graph):
    """Core reads no file and runs nothing: public keys and manifests reach it as values."""
    upward = {
        (module, imported)
        for module in graph.find_descendants("dppipeline.core") | {"dppipeline.core"}
        for imported in graph.find_modules_directly_imported_by(module)
        if imported.startswith("dppipeline") and not imported.startswith(CORE_MAY_IMPORT)
    }
    assert not upward, f"core imports {sorted(upward)}"


# The features above the lifecycle (commands, analysis, reports, synthetic data) reach the
# engines only through their public surface: engines/base.py, the registry and
# engines/in_process.py (import-linter holds the same contract; this reads the graph itself).
FEATURES = ("dppipeline.cli", "dppipeline.analysis", "dppipeline.reports", "dppipeline.synthetic")
ENGINE_INTERNALS = tuple(
    f"dppipeline.engines.{name}" for name in ("kernel", "local", "spark", "beam")
)


def engine_internals_imported(graph: grimp.ImportGraph) -> set[tuple[str, str]]:
    """(feature module, engine module) for every direct import of an engine's internals."""

    def within(module: str, packages: tuple[str, ...]) -> bool:
        return any(module == p or module.startswith(p + ".") for p in packages)

    return {
        (module, imported)
        for module in graph.modules
        if within(module, FEATURES)
        for imported in graph.find_modules_directly_imported_by(module)
        if within(imported, ENGINE_INTERNALS)
    }


def test_the_engine_internals_check_finds_a_planted_import():
    planted = grimp.ImportGraph()
    for importer, imported in [
        ("dppipeline.analysis.tune", "dppipeline.engines.in_process"),
        ("dppipeline.analysis.evaluate", "dppipeline.engines.kernel.sampling"),
        ("dppipeline.cli.main", "dppipeline.engines.spark.spark_session"),
        ("dppipeline.lifecycle.runner", "dppipeline.engines.local.engine"),
    ]:
        planted.add_import(importer=importer, imported=imported)
    assert engine_internals_imported(planted) == {
        ("dppipeline.analysis.evaluate", "dppipeline.engines.kernel.sampling"),
        ("dppipeline.cli.main", "dppipeline.engines.spark.spark_session"),
    }


def test_features_import_no_engine_internals(graph):
    found = sorted(engine_internals_imported(graph))
    assert not found, f"features import engine internals: {found}"
