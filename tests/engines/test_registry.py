"""The engine registry: each name gives its engine, an unknown name is one line naming the
choices, and an engine's heavy library (pyspark) is imported only when that engine is chosen."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from support import REPO

from dppipeline.engines.registry import load_engine
from dppipeline.errors import UsageError
from dppipeline.spec.vocabulary import ENGINES


@pytest.mark.parametrize("typo", ["spakr", "Local", ""])
def test_an_unknown_engine_is_one_line_naming_the_choices(typo):
    with pytest.raises(UsageError) as raised:
        load_engine(typo)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("--engine: must be one of ")
    assert all(name in message for name in ENGINES)


def test_local_and_spark_by_name():
    """No JVM is started: a Spark engine starts its session only when it is prepared."""
    from dppipeline.engines.local.engine import LocalEngine
    from dppipeline.engines.spark.engine import SparkEngine

    local, spark = load_engine("local"), load_engine("spark")
    assert type(local) is LocalEngine and local.name == "local"
    assert type(spark) is SparkEngine and spark.name == "spark"


def test_a_spark_engine_in_the_callers_session():
    """The API's Spark engine runs in the DataFrame's own session (a stand-in object here:
    the registry only hands it on)."""
    session = object()
    assert load_engine("spark", session=session)._spark is session
    with pytest.raises(UsageError, match="only the spark engine takes a session"):
        load_engine("local", session=session)


@pytest.mark.parametrize("name", ["local", "spark"])
def test_only_beam_takes_command_line_options(name):
    with pytest.raises(UsageError, match="unrecognized arguments: --direct_num_workers=2"):
        load_engine(name, ["--direct_num_workers=2"])


@pytest.mark.beam
def test_beam_by_name_with_its_pipeline_options():
    from dppipeline.engines.beam.engine import BeamEngine

    engine = load_engine("beam", ["--direct_num_workers=2"])
    assert type(engine) is BeamEngine and engine.name == "beam"
    assert "--direct_num_workers=2" in engine._args


def test_the_local_engine_starts_without_pyspark():
    """In a fresh interpreter, loading and preparing the local engine leaves pyspark out.
    (apache_beam cannot be checked so: pipeline-dp itself imports it whenever it is
    installed.)"""
    program = (
        "import sys\n"
        "from dppipeline.engines.registry import load_engine\n"
        "load_engine('local').prepare()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]", done.stderr


def test_the_registry_names_no_engine_library():
    """Its engines come from their own modules, imported inside the makers: the registry
    module itself imports neither pyspark nor apache_beam."""
    tree = ast.parse((REPO / "dppipeline" / "engines" / "registry.py").read_text())
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        for name in (
            [a.name for a in node.names] if isinstance(node, ast.Import)
            else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        )
    }  # fmt: skip
    assert imported.isdisjoint({"pyspark", "apache_beam"})
    assert "dppipeline" in imported
