"""One lock file per role (issue 19): the package declares ranges, the locks pin. What ships to
Spark executors and Beam workers is what they need, at the versions the tests ran."""

from __future__ import annotations

import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from support import REPO as ROOT

NEVER_ON_WORKERS = {"pyspark", "apache-beam", "apache-airflow", "pytest", "ruff", "mypy",
                    "duckdb", "moto", "hypothesis", "matplotlib", "pgserver"}  # fmt: skip


def pins(name: str) -> dict[str, str]:
    found = {}
    for line in (ROOT / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            package, _, version = line.partition("==")
            assert version, f"{name}: {line!r} is not an exact pin"
            found[canonicalize_name(package)] = version
    return found


def declared(group: str | None = None) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = project["dependencies"] if group is None else project["optional-dependencies"][group]
    return [Requirement(text) for text in found]


def test_the_package_declares_ranges_not_pins():
    for group in (None, "report", "spark", "beam", "dev"):
        for requirement in declared(group):
            operators = {spec.operator for spec in requirement.specifier}
            assert "==" not in operators and {">=", "<"} <= operators, str(requirement)


@pytest.mark.parametrize("role", ["requirements-runtime.lock", "requirements-beam-worker.lock"])
def test_a_role_lock_is_the_development_lock_restricted_to_what_the_role_needs(role):
    """Same versions as requirements.lock (what the tests ran); every runtime dependency in its
    declared range; nothing of the development, Spark, Beam or Airflow tool chain."""
    development, locked = pins("requirements.lock"), pins(role)
    assert {p: v for p, v in locked.items() if development.get(p) != v} == {}
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{role} lacks {name}"
        assert requirement.specifier.contains(locked[name]), (name, locked[name])
    assert NEVER_ON_WORKERS.isdisjoint(locked), NEVER_ON_WORKERS & set(locked)


def test_beam_workers_get_the_runtime_lock_and_beams_s3_client():
    runtime, worker = pins("requirements-runtime.lock"), pins("requirements-beam-worker.lock")
    assert runtime.items() <= worker.items()
    assert {"boto3", "botocore"} <= set(worker) - set(runtime)


def test_the_development_lock_satisfies_every_declared_range():
    development = pins("requirements.lock")
    for group in (None, "report", "spark", "beam", "dev"):
        for requirement in declared(group):
            name = canonicalize_name(requirement.name)
            assert requirement.specifier.contains(development[name]), (name, development[name])


def test_the_executor_archive_and_the_beam_recipe_use_the_role_locks():
    script = (ROOT / "scripts" / "pack_executor_env.sh").read_text()
    assert 'LOCK="$ROOT/requirements-runtime.lock"' in script
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    docs = "\n".join(page.read_text() for page in pages)  # the recipe: how-to/beam-runners.md
    assert "--requirements_file=requirements-beam-worker.lock" in docs
    assert "--requirements_file=requirements.lock" not in docs
