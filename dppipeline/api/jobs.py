"""Jobs and plans: a job spec from YAML, a dict or the spec model; its budget split, typed.

Light on purpose: nothing here imports an engine or reads data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dppipeline.spec.loader import load_raw, parse_raw
from dppipeline.spec.model import JobSpec, build_spec
from dppipeline.spec.paths import resolve_paths

Job = JobSpec  # the job spec: frozen, validated; each error names the field and the rule

JobSource = str | Path | Mapping[str, Any] | JobSpec


def load_job(source: JobSource, **overrides: Any) -> JobSpec:
    """A job from a YAML file (a Path, or a str naming a `.yaml`/`.yml` file), YAML text, a
    dict of spec fields or a JobSpec. `overrides`: dotted fields as keywords with `__` for the
    dot (`budget__epsilon=0.5`), as the CLI's flags override a file."""
    dotted = {
        name.replace("__", "."): value for name, value in overrides.items() if value is not None
    }
    if isinstance(source, JobSpec):
        return build_spec(job_fields(source), dotted) if dotted else source
    if isinstance(source, Mapping):
        return build_spec(source, dotted, source="job")
    if isinstance(source, Path) or ("\n" not in source and source.endswith((".yaml", ".yml"))):
        return build_spec(load_raw(source), dotted, source=str(source))
    raw = resolve_paths(parse_raw(source.encode(), "job spec text"), Path.cwd())
    return build_spec(raw, dotted, source="job spec text")


def job_fields(spec: JobSpec) -> dict[str, Any]:
    """The spec's fields as a dict `build_spec` takes back: a shorthand job without the one
    query it expands to, so that overrides of its fields reach the query, and its hash (the
    release key) stays the one of the same spec written out."""
    fields = spec.to_dict()
    if spec.is_shorthand:
        del fields["queries"]
    return fields


@dataclass(frozen=True)
class MechanismPlan:
    """One mechanism of a query: its share of the budget and the noise it adds (`noise_std`
    None for mechanisms that add no additive noise: selection, percentiles, max, min)."""

    query: str
    mechanism: str  # count, sum, centred_sum, partition_selection, ...
    kind: str  # laplace, gaussian, truncated_geometric, exponential, ...
    epsilon: float
    delta: float
    noise_std: float | None


@dataclass(frozen=True)
class Plan:
    """A job's budget split, computed before any data is read (what `dppipeline plan` shows).
    A selection shared by several queries is listed under each of them but spent once
    (`epsilon`, `delta`: the job's totals)."""

    epsilon: float
    delta: float
    accounting: str
    mechanisms: tuple[MechanismPlan, ...]

    @property
    def queries(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m.query for m in self.mechanisms))

    def query(self, name: str) -> tuple[MechanismPlan, ...]:
        """A query's mechanisms; KeyError for a query the job does not have."""
        found = tuple(m for m in self.mechanisms if m.query == name)
        if not found:
            raise KeyError(name)
        return found

    def noise_std(self, query: str, mechanism: str) -> float | None:
        return next(m.noise_std for m in self.query(query) if m.mechanism == mechanism)


def plan(job: JobSource) -> Plan:
    """The job's budget split per query and mechanism, with each one's noise standard
    deviation; reads no data and spends nothing."""
    from dppipeline.lifecycle.runner import make_plan  # noqa: PLC0415 (pipeline-dp)

    job_plan = make_plan(load_job(job))
    spent = job_plan.total_spent()
    mechanisms = tuple(
        MechanismPlan(
            query=query.name,
            mechanism=m.name,
            kind=m.kind,
            epsilon=m.epsilon,
            delta=m.delta,
            noise_std=m.noise_stddev,
        )
        for query in job_plan.queries
        for m in query.plan.mechanisms
    )
    return Plan(spent[0], spent[1], job_plan.accounting, mechanisms)
