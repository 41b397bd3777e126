"""Engines by name, as `run_job` takes them."""

from __future__ import annotations


def engine_named(name: str, request):
    """ "local", "spark" (the session fixture started first) or a Beam engine with few shards."""
    if name == "spark":
        request.getfixturevalue("spark")
        return "spark"
    if name == "beam":
        from dppipeline.engines.beam.engine import BeamEngine

        return BeamEngine(unit_shards=2, partition_shards=2)
    return name
