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

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dppipeline.core.budget import AggregationParams, BudgetPlan, plan_budget
from dppipeline.core.manifest import MANIFEST_NAME, build_manifest
from dppipeline.core.release import add_empty_public_partitions, release_partitions
from dppipeline.errors import UsageError
from dppipeline.io import (
    check_release_target,
    discover_partitions,
    publish_atomically,
    read_public_partitions,
    select_days,
)
from dppipeline.schemas import release_schema, transactions_schema
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


def write_release(folder: Path, dataset: str, table: pa.Table, manifest: dict) -> None:
    (folder / dataset).mkdir()
    pq.write_table(table, folder / dataset / "part-00000.parquet")
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")


def run_job(
    spec: JobSpec,
    engine: str = "local",
    *,
    overwrite: bool = False,
    quarantine: Path | None = None,
    seed: int | None = None,
    echo: Callable[[str], None] | None = None,
) -> RunResult:
    """Runs one release and returns where it is; raises DPPipelineError on bad input."""
    say = echo or (lambda line: print(line, file=sys.stderr))
    if engine not in ENGINES:
        raise UsageError(f"--engine: must be one of {', '.join(ENGINES)}; got {engine!r}")
    if engine != "local":
        raise UsageError(
            f"--engine {engine}: not available yet in this version; use --engine local"
        )
    if spec.input.path is None:
        raise UsageError("--input: required (or input.path in the job spec)")
    if spec.output is None:
        raise UsageError("--output: required (or output in the job spec)")
    plan = make_plan(spec)  # before any data is read
    output = check_release_target(spec.output, overwrite)
    run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]
    quarantine = quarantine or default_quarantine(output, run_id)
    key = spec.partition_key
    key_type = transactions_schema().field(key).type
    public_keys = None
    if spec.partition_selection.public_partitions is not None:
        public_keys = read_public_partitions(
            spec.partition_selection.public_partitions, key, key_type
        )
    days = select_days(
        discover_partitions(spec.input.path, spec.input.format),
        spec.input.start_date,
        spec.input.end_date,
        spec.input.path,
    )
    say(
        f"reading {len(days)} daily partitions ({days[0].day} to {days[-1].day}) "
        f"from {spec.input.path}"
    )
    from dppipeline.engines import local  # noqa: PLC0415 - engines load on demand

    result = local.compute_aggregates(spec, days, public_keys, quarantine, seed=seed)
    rejects = result.rejects
    say(
        f"read {rejects.rows_read:,} rows; rejected {rejects.rows_rejected:,}"
        + (f" (kept aside in {rejects.quarantine})" if rejects.quarantine else "")
    )
    aggregates = result.aggregates
    if public_keys is not None:
        aggregates = add_empty_public_partitions(aggregates, [key], public_keys)
    released = release_partitions(aggregates, [key], plan)
    table = _to_release_table(released, key, key_type, spec)
    manifest = build_manifest(
        spec,
        plan,
        run_id=run_id,
        engine=engine,
        days=(days[0].day, days[-1].day),
        input_files=sum(len(d.files) for d in days),
        released_partitions=table.num_rows,
        public_partitions_count=None if public_keys is None else len(public_keys),
        dataset=spec.name,
    )
    publish_atomically(
        output, lambda folder: write_release(folder, spec.name, table, manifest), overwrite
    )
    say(f"released {table.num_rows:,} partitions to {output}")
    return RunResult(output, run_id, table.num_rows, manifest)


def _to_release_table(released: pd.DataFrame, key: str, key_type: str, spec: JobSpec) -> pa.Table:
    arrow_key = pa.int64() if key_type == "int64" else pa.string()
    schema = release_schema([(key, arrow_key)], list(spec.metrics))
    return pa.Table.from_pandas(released[schema.names], schema=schema, preserve_index=False)
