"""One release, start to finish, on any engine: plan -> read -> bound -> release -> publish.

The order matters for privacy and safety: the budget split is computed and the output target
checked before any data is read; the release is written to a staging folder and renamed into
place only when complete.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dppipeline.core.budget import AggregationParams, BudgetPlan, plan_budget
from dppipeline.core.manifest import MANIFEST_NAME, build_manifest
from dppipeline.engines.base import Engine, ReleaseJob
from dppipeline.errors import UsageError
from dppipeline.io import (
    check_release_target,
    discover_partitions,
    publish_atomically,
    read_public_partitions,
    select_days,
)
from dppipeline.schemas import transactions_schema
from dppipeline.spec import JobSpec

log = logging.getLogger("dppipeline")
ENGINES = ("local", "spark", "beam")


@dataclass(frozen=True)
class RunResult:
    output: Path
    run_id: str
    released_partitions: int
    manifest: dict


def check_columns(spec: JobSpec) -> None:
    """The spec's columns must exist in the input schema with a type that fits their role."""
    schema = transactions_schema()
    for role, types in (
        ("privacy_unit", ("int64", "string")),
        ("partition_key", ("int64", "string")),
        ("value", ("int64", "float64")),
    ):
        column = getattr(spec, role)
        if column not in schema.names:
            raise UsageError(
                f"{role}: column {column!r} is not in schemas/transactions.json "
                f"({', '.join(schema.names)})"
            )
        if schema.field(column).type not in types:
            raise UsageError(
                f"{role}: column {column} has type {schema.field(column).type}, "
                f"needs one of {', '.join(types)}"
            )


def make_plan(spec: JobSpec) -> BudgetPlan:
    check_columns(spec)
    return plan_budget(AggregationParams.from_spec(spec), spec.budget.epsilon, spec.budget.delta)


def default_quarantine(output: Path, run_id: str) -> Path:
    """Beside the release, never inside it: `<output>_quarantine/<run_id>/`."""
    return output.parent / f"{output.name}_quarantine" / run_id


def load_engine(name: str) -> Engine:
    """Engines import their heavy dependencies (pyspark, apache_beam) only when chosen."""
    if name not in ENGINES:
        raise UsageError(f"--engine: must be one of {', '.join(ENGINES)}; got {name!r}")
    if name == "local":
        from dppipeline.engines.local import LocalEngine  # noqa: PLC0415

        return LocalEngine()
    if name == "spark":
        from dppipeline.engines.spark import SparkEngine  # noqa: PLC0415

        return SparkEngine()
    raise UsageError(f"--engine {name}: not available yet in this version; use local or spark")


def run_job(
    spec: JobSpec,
    engine: str | Engine = "local",
    *,
    overwrite: bool = False,
    quarantine: Path | None = None,
    seed: int | None = None,
    echo: Callable[[str], None] | None = None,
) -> RunResult:
    """Runs one release and returns where it is; raises DPPipelineError on bad input."""
    say = echo or (lambda line: print(line, file=sys.stderr))
    engine_impl = load_engine(engine) if isinstance(engine, str) else engine
    if spec.input.path is None:
        raise UsageError("--input: required (or input.path in the job spec)")
    if spec.output is None:
        raise UsageError("--output: required (or output in the job spec)")
    engine_impl.prepare()  # e.g. start the JVM while pipeline-dp plans the budget
    plan = make_plan(spec)  # before any data is read
    output = check_release_target(spec.output, overwrite)
    run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]
    key = spec.partition_key
    public_keys = None
    if spec.partition_selection.public_partitions is not None:
        public_keys = read_public_partitions(
            spec.partition_selection.public_partitions, key, transactions_schema().field(key).type
        )
    days = select_days(
        discover_partitions(spec.input.path, spec.input.format),
        spec.input.start_date,
        spec.input.end_date,
        spec.input.path,
    )
    job = ReleaseJob(
        spec=spec,
        plan=plan,
        days=days,
        public_keys=public_keys,
        quarantine=quarantine or default_quarantine(output, run_id),
        seed=seed,
        progress=lambda line: say(f"[{engine_impl.name}] {line}"),
    )
    say(
        f"[{engine_impl.name}] reading {len(days)} daily partitions "
        f"({days[0].day} to {days[-1].day}) from {spec.input.path}"
    )
    manifests: list[dict] = []

    def write(staging: Path) -> None:
        run = engine_impl.run(job, staging / spec.name)
        rejects = run.rejects
        say(
            f"[{engine_impl.name}] read {rejects.rows_read:,} rows; rejected "
            f"{rejects.rows_rejected:,}"
            + (f" (kept aside in {rejects.quarantine})" if rejects.quarantine else "")
        )
        manifest = build_manifest(
            spec,
            plan,
            run_id=run_id,
            engine=engine_impl.name,
            days=(days[0].day, days[-1].day),
            input_files=sum(len(d.files) for d in days),
            released_partitions=run.released_partitions,
            public_partitions_count=None if public_keys is None else len(public_keys),
            dataset=spec.name,
        )
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
        manifests.append(manifest)

    publish_atomically(output, write, overwrite)
    manifest = manifests[0]
    say(f"[{engine_impl.name}] released {manifest['released_partitions']:,} partitions to {output}")
    return RunResult(output, run_id, manifest["released_partitions"], manifest)
