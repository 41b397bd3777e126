"""Engines by name: the one place that turns `local`, `spark` or `beam` (and the engine's own
options) into an engine.

Each engine's module is imported only when that engine is chosen, so pyspark and apache_beam
load for their own engine and nowhere else (the import-linter contract "Only the Spark and
Beam engines import pyspark and apache_beam"): a local run starts no JVM and no Beam.
The CLI's `--engine`, the runner, the Python API (which picks an engine from the kind of frame
it is given) and the Beam transform all take their engine from here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dppipeline.engines.base import Engine
from dppipeline.errors import UsageError
from dppipeline.spec.vocabulary import ENGINES


def _local(options: Sequence[str], session: Any) -> Engine:
    from dppipeline.engines.local.engine import LocalEngine  # noqa: PLC0415

    return LocalEngine()


def _spark(options: Sequence[str], session: Any) -> Engine:
    from dppipeline.engines.spark.engine import SparkEngine  # noqa: PLC0415

    return SparkEngine(session)


def _beam(options: Sequence[str], session: Any) -> Engine:
    from dppipeline.engines.beam.engine import BeamEngine  # noqa: PLC0415

    return BeamEngine(options)


# name -> how to make it (options: the engine's own command-line options; session: a Spark
# session the caller already has). Keyed in the order of the spec's vocabulary.
_MAKERS: dict[str, Callable[[Sequence[str], Any], Engine]] = {
    "local": _local,
    "spark": _spark,
    "beam": _beam,
}
assert tuple(_MAKERS) == ENGINES, "every engine the spec names has a maker here"

# Engines that take command-line options of their own (Beam's pipeline options).
TAKES_OPTIONS = ("beam",)


def start_early(name: str) -> None:
    """Begins, in the background, what engine `name` takes longest to start, before the rest of
    a run is imported: Spark's JVM takes longer to start than everything up to the first read
    (the engine collects the session it began). The other engines start at once."""
    if name == "spark":
        from dppipeline.engines.spark.spark_session import start_spark_early  # noqa: PLC0415

        start_spark_early()


def load_engine(name: str, options: Sequence[str] = (), *, session: Any = None) -> Engine:
    """The engine called `name`. `options`: its own command-line options (Beam pipeline
    options; refused for the others); `session`: for Spark, the caller's SparkSession (unset:
    the engine gets or starts one)."""
    maker = _MAKERS.get(name)
    if maker is None:
        raise UsageError(f"--engine: must be one of {', '.join(ENGINES)}; got {name!r}")
    if options and name not in TAKES_OPTIONS:
        raise UsageError(f"unrecognized arguments: {' '.join(options)}")
    if session is not None and name != "spark":
        raise UsageError(f"engine {name}: only the spark engine takes a session")
    return maker(options, session)
