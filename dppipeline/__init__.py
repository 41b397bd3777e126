"""dppipeline: differentially private per-partition statistics over partitioned transaction data.

The Python API (docs/tutorials/python-api.md) is these names, imported on first use so that `import
dppipeline` stays cheap (no Polars, Spark, Beam or pipeline-dp until a name needs them):

    load_job, Job, plan, Plan, MechanismPlan, release, Release, sql, load_sql, Session, Budget,
    query,
    DPPipelineError, UsageError, SpecError, InputError, OutputError, BudgetExceeded

and `dppipeline.beam.ReleaseTransform` for a Beam pipeline. Everything else may change.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dppipeline.version import __version__

_PUBLIC = {
    "load_job": "dppipeline.api.jobs",
    "Job": "dppipeline.api.jobs",
    "plan": "dppipeline.api.jobs",
    "Plan": "dppipeline.api.jobs",
    "MechanismPlan": "dppipeline.api.jobs",
    "release": "dppipeline.api.frame_release",
    "sql": "dppipeline.api.sql",
    "load_sql": "dppipeline.api.sql",
    "Release": "dppipeline.api.frame_release",
    "Session": "dppipeline.api.session",
    "Budget": "dppipeline.api.session",
    "query": "dppipeline.api.session",
    "DPPipelineError": "dppipeline.errors",
    "UsageError": "dppipeline.errors",
    "SpecError": "dppipeline.errors",
    "InputError": "dppipeline.errors",
    "OutputError": "dppipeline.errors",
    "BudgetExceeded": "dppipeline.errors",
}

__all__ = [
    "Budget",
    "BudgetExceeded",
    "DPPipelineError",
    "InputError",
    "Job",
    "MechanismPlan",
    "OutputError",
    "Plan",
    "Release",
    "Session",
    "SpecError",
    "UsageError",
    "__version__",
    "load_job",
    "load_sql",
    "plan",
    "query",
    "release",
    "sql",
]

if TYPE_CHECKING:  # what type checkers and editors see; at run time `__getattr__` imports
    from dppipeline.api.frame_release import Release, release
    from dppipeline.api.jobs import Job, MechanismPlan, Plan, load_job, plan
    from dppipeline.api.session import Budget, Session, query
    from dppipeline.api.sql import load_sql, sql
    from dppipeline.errors import (
        BudgetExceeded,
        DPPipelineError,
        InputError,
        OutputError,
        SpecError,
        UsageError,
    )


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (PEP 562)."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'dppipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
