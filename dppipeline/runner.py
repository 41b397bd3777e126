"""One release, start to finish, on any engine: plan -> read -> bound -> release -> publish.

The order matters for privacy and safety: the budget split is computed and the output target
checked before any data is read; the release is written to a staging folder and renamed into
place only when complete.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import shutil
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dppipeline.core.budget import AggregationParams, JobPlan, plan_job
from dppipeline.core.manifest import MANIFEST_NAME, build_manifest, published_run_id
from dppipeline.engines.base import Engine, ReleaseJob
from dppipeline.errors import InputError, UsageError
from dppipeline.io import (
    DailyPartition,
    check_release_target,
    discover_partitions,
    publish_atomically,
    select_days,
)
from dppipeline.ledger import (
    BudgetPolicy,
    Ledger,
    LedgerRow,
    ReleaseKey,
    input_fingerprint,
)
from dppipeline.queries import check_query_columns, plan_tasks
from dppipeline.spec import JobSpec

log = logging.getLogger("dppipeline")
ENGINES = ("local", "spark", "beam")


@dataclass(frozen=True)
class RunResult:
    output: Path
    run_id: str
    released_partitions: int
    manifest: dict


def make_plan(spec: JobSpec) -> JobPlan:
    """The job's budget split over all its queries; checks every query's columns first."""
    check_query_columns(spec)
    queries = [
        (
            q.name,
            AggregationParams.from_query(q, spec.noise, spec.confidence_intervals),
            q.budget_weight,
        )
        for q in spec.query_specs
    ]
    return plan_job(
        queries, spec.budget.epsilon, spec.budget.delta, prefix_names=spec.is_multi_query
    )


def default_quarantine(output: Path, run_id: str) -> Path:
    """Beside the release, never inside it: `<output>_quarantine/<run_id>/`."""
    return output.parent / f"{output.name}_quarantine" / run_id


def load_engine(name: str, options: Sequence[str] = ()) -> Engine:
    """Engines import their heavy dependencies (pyspark, apache_beam) only when chosen.
    `options`: the engine's own command-line options (Beam pipeline options)."""
    if name not in ENGINES:
        raise UsageError(f"--engine: must be one of {', '.join(ENGINES)}; got {name!r}")
    if options and name != "beam":
        raise UsageError(f"unrecognized arguments: {' '.join(options)}")
    if name == "local":
        from dppipeline.engines.local import LocalEngine  # noqa: PLC0415

        return LocalEngine()
    if name == "spark":
        from dppipeline.engines.spark import SparkEngine  # noqa: PLC0415

        return SparkEngine()
    from dppipeline.engines.beam import BeamEngine  # noqa: PLC0415

    return BeamEngine(options)


def default_scope(spec: JobSpec) -> str:
    """What a cap protects unless the spec names it: the input dataset and the privacy unit."""
    assert spec.input.path is not None
    return spec.budget.scope or f"{Path(spec.input.path).resolve().name}/{spec.privacy_unit}"


def budget_policy(spec: JobSpec) -> BudgetPolicy:
    return BudgetPolicy(
        cap_epsilon=spec.budget.cap_epsilon,
        cap_delta=spec.budget.cap_delta,
        window_days=spec.budget.window_days,
    )


def input_days(spec: JobSpec) -> list[DailyPartition]:
    """The daily partitions the spec reads (its date range of the input folder)."""
    assert spec.input.path is not None
    return select_days(
        discover_partitions(spec.input.path, spec.input.format),
        spec.input.start_date,
        spec.input.end_date,
        spec.input.path,
    )


def release_key(
    spec: JobSpec, days: list[DailyPartition], spec_hash: str | None = None
) -> ReleaseKey:
    """The ledger key of a spend on these days: scope, spec hash (or another request's
    hash), input fingerprint, date range."""
    assert spec.input.path is not None
    files = [path for day in days for path in day.files]
    return ReleaseKey(
        scope=default_scope(spec),
        spec_hash=spec_hash or spec.spec_hash(),
        input_fingerprint=input_fingerprint(files, Path(spec.input.path)),
        start_date=days[0].day,
        end_date=days[-1].day,
    )


def check_budget(spec: JobSpec, ledger: Ledger | str | Path) -> str:
    """Would the ledger accept this release now? Reads no data and writes nothing: returns a
    line saying the release is already published or the budget is available, or raises
    BudgetExceededError (exit 3) like `run` would."""
    if spec.input.path is None:
        raise UsageError("--input: required (or input.path in the job spec)")
    plan = make_plan(spec)
    days = input_days(spec)
    book = Ledger(ledger) if isinstance(ledger, str | Path) else ledger
    key = release_key(spec, days)
    existing = book.committed(key)
    if existing is not None:
        return (
            f"already published by run {existing.run_id} to {existing.output}: "
            "a rerun spends nothing"
        )
    eps, delta = plan.total_spent()
    book.check(key, epsilon=eps, delta=delta, policy=budget_policy(spec))
    return (
        f"budget available: epsilon={eps:g} delta={delta:g} in scope {key.scope!r} "
        f"({budget_policy(spec).describe()})"
    )


def run_job(
    spec: JobSpec,
    engine: str | Engine = "local",
    *,
    overwrite: bool = False,
    quarantine: Path | None = None,
    seed: int | None = None,
    echo: Callable[[str], None] | None = None,
    ledger: Ledger | str | Path | None = None,
    new_release: bool = False,
) -> RunResult:
    """Runs one release and returns where it is; raises DPPipelineError on bad input.

    With a ledger: a release already committed under the same key is returned as it is (no
    new noise, no new spend) unless `new_release`; otherwise the budget is reserved before any
    data is read, committed once the release is published, and aborted if the run fails.
    """
    say = echo or (lambda line: print(line, file=sys.stderr))
    engine_impl = load_engine(engine) if isinstance(engine, str) else engine
    if spec.input.path is None:
        raise UsageError("--input: required (or input.path in the job spec)")
    if spec.output is None:
        raise UsageError("--output: required (or output in the job spec)")
    engine_impl.prepare()  # e.g. start the JVM while pipeline-dp plans the budget
    plan = make_plan(spec)  # before any data is read
    days = input_days(spec)
    tasks = plan_tasks(spec, plan, days)  # reads public key lists, not data
    run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]
    book = Ledger(ledger) if isinstance(ledger, str | Path) else ledger
    if book is not None:
        key = release_key(spec, days)
        for settled_run, state in book.repair(key.scope):
            say(f"[ledger] settled interrupted run {settled_run}: {state}")
        existing = None if new_release else book.committed(key)
        if existing is not None:
            return _existing_release(existing, Path(spec.output), overwrite, say)
    output = check_release_target(spec.output, overwrite)
    job = ReleaseJob(
        spec=spec,
        plan=plan,
        tasks=tasks,
        days=days,
        quarantine=quarantine or default_quarantine(output, run_id),
        salt=ReleaseJob.sampling_salt(seed),
        progress=lambda line: say(f"[{engine_impl.name}] {line}"),
    )
    eps_total, delta_total = plan.total_spent()
    spend = contextlib.nullcontext()
    if book is not None:
        spend = book.spending(
            key,
            run_id=run_id,
            job=spec.name,
            epsilon=eps_total,
            delta=delta_total,
            output=str(output.resolve()),
            policy=budget_policy(spec),
            failure_note="run failed before publishing",
        )
    with spend:
        if book is not None:
            say(
                f"[ledger] reserved epsilon={eps_total:g} delta={delta_total:g} in scope "
                f"{key.scope!r} ({budget_policy(spec).describe()})"
            )
        result = _release(
            job, engine_impl, run_id=run_id, output=output, overwrite=overwrite, say=say
        )
    if book is not None:
        say(f"[ledger] committed run {run_id}")
    return result


def _existing_release(
    row: LedgerRow, output: Path, overwrite: bool, say: Callable[[str], None]
) -> RunResult:
    """The committed release with this key, at `output` (copied byte for byte if it was
    published elsewhere). No noise is drawn and nothing is spent."""
    published = Path(row.output)
    if published_run_id(published) != row.run_id:
        raise InputError(
            f"this release (run {row.run_id}) was published to {published}, which no longer "
            "holds it; pass --new-release to draw new noise and spend the budget again"
        )
    if published.resolve() != output.resolve():
        check_release_target(output, overwrite)
        publish_atomically(
            output,
            lambda staging: shutil.copytree(published, staging, dirs_exist_ok=True),
            overwrite,
        )
    manifest = json.loads((output / MANIFEST_NAME).read_text())
    say(
        f"[ledger] release already published by run {row.run_id} ({row.reserved_at}): "
        f"{output}; no new noise drawn, nothing spent (--new-release to draw again)"
    )
    return RunResult(output, row.run_id, manifest["released_partitions"], manifest)


def _release(
    job: ReleaseJob,
    engine_impl: Engine,
    *,
    run_id: str,
    output: Path,
    overwrite: bool,
    say: Callable[[str], None],
) -> RunResult:
    """Engine run + manifest, published atomically into `output`."""
    spec, days = job.spec, job.days
    say(
        f"[{engine_impl.name}] reading {len(days)} daily partitions "
        f"({days[0].day} to {days[-1].day}) from {spec.input.path}"
    )
    manifests: list[dict] = []

    def write(staging: Path) -> None:
        run = engine_impl.run(job, staging)
        rejects = run.rejects
        say(
            f"[{engine_impl.name}] read {rejects.rows_read:,} rows; rejected "
            f"{rejects.rows_rejected:,}"
            + (f" (kept aside in {rejects.quarantine})" if rejects.quarantine else "")
        )
        manifest = build_manifest(
            spec,
            job.plan,
            run_id=run_id,
            engine=engine_impl.name,
            days=(days[0].day, days[-1].day),
            input_files=sum(len(d.files) for d in days),
            released_partitions=run.released_partitions,
            public_keys={
                name: None if keys is None else len(keys)
                for name, keys in job.tasks.public_keys.items()
            },
        )
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
        manifests.append(manifest)

    publish_atomically(output, write, overwrite)
    manifest = manifests[0]
    for name, query in manifest["queries"].items():
        say(f"[{engine_impl.name}] {name}: released {query['released_partitions']:,} partitions")
    say(f"[{engine_impl.name}] release written to {output}")
    return RunResult(output, run_id, manifest["released_partitions"], manifest)
