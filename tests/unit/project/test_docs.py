"""The layout the docs describe is the layout of the code."""

from __future__ import annotations

import re
import tomllib

from support import REPO as ROOT

PACKAGE = ROOT / "dppipeline"


def named_paths(text: str) -> set[str]:
    """`folder/` and `folder/file.py` names a document gives for the package."""
    return set(re.findall(r"(?<![\w/.-])((?:[a-z_][a-z_-]*/)+(?:[a-z_]+\.py)?)(?![A-Z0-9])", text))


def exists(path: str) -> bool:
    """In the package, under engines/ (an engine's folder), or in the repository."""
    return any((base / path).exists() for base in (PACKAGE, PACKAGE / "engines", ROOT))


def test_every_package_and_module_the_architecture_names_exists():
    named = named_paths((ROOT / "docs" / "explanation" / "architecture.md").read_text())
    assert len(named) > 15
    missing = [p for p in named if not exists(p)]
    assert not missing, missing


def test_every_doc_the_readme_links_exists_and_names_existing_code():
    """Design notes live in docs/explanation/; the README links them, and they name real
    files."""
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/explanation/[\w.]+\.md)\)", readme))
    assert {
        "docs/explanation/engines.md",
        "docs/explanation/operations.md",
        "docs/explanation/benchmarks.md",
    } <= linked
    for doc in linked:
        assert (ROOT / doc).is_file(), doc
        prose = re.sub(r"```text\n.*?```", "", (ROOT / doc).read_text(), flags=re.S)  # logs
        prose = prose.replace("n/a", "")  # a table's "not measured", not a folder
        missing = [p for p in named_paths(prose) if not exists(p)]
        assert not missing, (doc, missing)


def test_the_layout_names_what_exists():
    """The layout (moved from the README to the architecture page) names existing files."""
    page = (ROOT / "docs" / "explanation" / "architecture.md").read_text()
    layout = page.split("## Layout", 1)[1].split("\n## ", 1)[0]
    named = named_paths(layout)
    assert len(named) > 15
    missing = [p for p in named if not exists(p)]
    assert not missing, missing


def test_every_layer_package_is_in_the_contracts_and_the_architecture():
    """A new top-level package must take its place in the layers (and the doc)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    layers = config["tool"]["importlinter"]["contracts"][0]["layers"]
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    # A layer may hold siblings: "a | b" (independent of each other) or "a : b".
    named = {name.strip() for layer in layers for name in re.split(r"[|:]", layer)}
    assert {name.removeprefix("dppipeline.") for name in named} == packages
    doc = (ROOT / "docs" / "explanation" / "architecture.md").read_text()
    assert all(f"{name}/" in doc for name in packages)


def test_the_spec_reference_field_table_is_what_spec_doc_prints(capsys):
    """The job spec table of docs/reference/job-spec.md is generated (`dppipeline spec-doc
    --markdown`); edit the field docs in spec/model.py and paste the new table when this
    fails."""
    from dppipeline.cli.main import main

    assert main(["spec-doc", "--markdown"]) == 0
    table = capsys.readouterr().out.strip()
    assert table.count("\n") > 20
    assert table in (ROOT / "docs" / "reference" / "job-spec.md").read_text()
