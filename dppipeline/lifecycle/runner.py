"""One release, start to finish, on any engine: plan -> read -> bound -> release -> publish.

The run sequence (every crash point is safe; see `publication.py` for the folders):

1. plan the budget (no data), discover the input, read the public key lists, check the output
   target; lock the output; settle expired reservations (`Ledger.repair`) and repair what
   crashed runs left beside the output (`publication.heal`); return an already committed
   release with the same key.
2. reserve the budget (`reserved`; a lease renewed by a heartbeat thread): decided outside the
   ledger's lock, recorded under it (`ledger.reserving`); refused with exit 3 when the cap is spent,
   75 when live reservations of other runs hold what is missing.
3. `reading`, immediately before the engine reads the first byte: from here on the budget is
   charged whatever happens (`failed` if the run does not commit).
4. the engine writes the complete release into the staging folder; manifest last; fsync.
5. commit, only while the reservation is still this run's (a run whose lease ran out and was
   settled by another process stops here and publishes nothing).
6. publish: the staging folder becomes the release in one atomic step. SIGINT and SIGTERM are
   held back from 5 to the end of 6: a committed release is always published.
7. clean-up and progress lines: nothing here can change the ledger's outcome (a broken pipe on
   stderr only stops the progress lines).
"""

from __future__ import annotations

import datetime as dt
import errno
import logging
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dppipeline.core.events import release_events
from dppipeline.core.manifest import Manifest, build_manifest
from dppipeline.core.plan import AggregationParams, JobPlan
from dppipeline.core.planner import plan_job
from dppipeline.core.tasks import check_query_columns, plan_tasks
from dppipeline.engines.base import Engine, ReleaseJob
from dppipeline.engines.registry import load_engine
from dppipeline.errors import InputError, OutputError, UsageError
from dppipeline.inputs.files import (
    DailyPartition,
    discover_files,
    discover_partitions,
    select_days,
    with_detected_layout,
)
from dppipeline.inputs.fingerprints import input_contents
from dppipeline.inputs.quarantine import (
    check_writable,
    private_folder,
    run_folder,
    ship_quarantine,
    state_dir,
)
from dppipeline.inputs.quarantine import default_root as quarantine_root
from dppipeline.ledger import BudgetPolicy, InputContent, ReleaseKey, input_fingerprint
from dppipeline.lifecycle.charge import charged
from dppipeline.lifecycle.failpoints import failpoint
from dppipeline.lifecycle.ledger_choice import refuse_unrecorded
from dppipeline.lifecycle.public_keys import read_key_files
from dppipeline.lifecycle.publication import (
    fsync_tree,
)
from dppipeline.lifecycle.store_publication import (
    write_store_manifest,
)
from dppipeline.lifecycle.targets import FolderTarget, ReleaseTarget, StoreTarget, new_run_id
from dppipeline.spec.model import JobSpec
from dppipeline.storage import Location, is_uri, remote_filesystems
from dppipeline.storage.releases import MANIFEST_NAME

if TYPE_CHECKING:  # SQLAlchemy: imported only for a run with a ledger
    from dppipeline.ledger import Ledger, LedgerRow, Reservation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    output: Path | Location  # a local folder, or a URI (`store_publication`)
    run_id: str
    released_partitions: int
    manifest: Manifest
    # In-memory runs: what the engine handed back per query (Beam: the released PCollections)
    datasets: Mapping[str, object] | None = None


@dataclass(frozen=True)
class InputRows:
    """In-memory input (the Python API): the caller's rows as the engine takes them (a Polars
    frame, a Spark DataFrame, a Beam PCollection). No file fingerprint exists, so the release
    key's input fingerprint is `dataset_id` when the caller names the data, else a fresh id:
    every such call is a new release, charged."""

    rows: object
    dataset_id: str | None = None

    def fingerprint(self) -> str:
        return f"dataset:{self.dataset_id}" if self.dataset_id else f"memory:{uuid.uuid4().hex}"


def make_plan(spec: JobSpec, *, require_bounds: bool = True) -> JobPlan:
    """The job's budget split over all its queries; checks every query's columns and (unless
    `require_bounds` is off: `tune`, which recommends them) its contribution bounds first."""
    if require_bounds:
        spec.require_contribution_bounds()
    check_query_columns(spec)
    queries = [
        (
            q.name,
            AggregationParams.from_query(
                q, spec.noise, spec.confidence_intervals, spec.count_noise
            ),
            q.budget_weight,
        )
        for q in spec.queries
    ]
    return plan_job(
        queries,
        spec.budget.epsilon,
        spec.budget.delta,
        prefix_names=not spec.is_shorthand,
        accounting=spec.accounting,
    )


def _as_path_or_uri(where: str | Path | None) -> str | Path | None:
    """A `file://` URI as the local path it names; other URIs and paths as given."""
    if isinstance(where, str) and is_uri(where) and Location.of(where).is_local:
        return Location.of(where).path
    return where


def _remote_quarantine(chosen: str | Path | None, run_id: str) -> Location | None:
    """A quarantine on a store: this run's folder there (rows are staged locally first)."""
    if chosen is None or not is_uri(str(chosen)) or Location.of(str(chosen)).is_local:
        return None
    return Location.of(str(chosen)).join(run_id)


def _quarantine_staging(run_id: str) -> Path:
    """Where an engine writes the rejected rows of a quarantine on a store, before upload."""
    return state_dir().resolve() / "staging" / f"quarantine-{run_id}"


def _quarantine_folders(
    chosen: str | Path | None, run_id: str, output: Path | None
) -> tuple[Path, Location | None]:
    """(the local folder the engine writes rejected rows into, the store folder they are
    shipped to or None). Default: `<state dir>/quarantine/<run_id>/`, with the operator's
    state; a local quarantine is checked against a local output's place (never beside or
    inside a release, see `dppipeline.inputs.quarantine`)."""
    shipped_to = _remote_quarantine(chosen, run_id)
    if shipped_to is not None:
        return _quarantine_staging(run_id), shipped_to
    root = Path(chosen) if chosen else quarantine_root()
    if output is None:
        return root.resolve() / run_id, None
    return run_folder(root, run_id, output), None


def default_scope(spec: JobSpec) -> str:
    """What a cap protects unless the spec names it: the input dataset and the privacy unit."""
    if spec.input.path is None:  # in-memory input: the API names the scope
        if spec.budget.scope is None:
            raise UsageError("scope: required with a ledger for in-memory data (or budget.scope)")
        return spec.budget.scope
    where = Location.of(spec.input.path)
    name = where.path.resolve().name if where.is_local else where.name
    return spec.budget.scope or f"{name}/{spec.privacy_unit}"


def budget_policy(spec: JobSpec) -> BudgetPolicy:
    return BudgetPolicy(
        cap_epsilon=spec.budget.cap_epsilon,
        cap_delta=spec.budget.cap_delta,
        window_days=spec.budget.window_days,
    )


def input_days(spec: JobSpec) -> list[DailyPartition]:
    """The input the spec reads: the daily partitions of its date range, or (layout `files`)
    its files as one part without a day."""
    assert spec.input.path is not None
    if spec.input.layout == "files":
        return discover_files(spec.input.path, spec.input.format)
    return select_days(
        discover_partitions(spec.input.path, spec.input.format),
        spec.input.start_date,
        spec.input.end_date,
        spec.input.path,
    )


def input_period(spec: JobSpec, days: list[DailyPartition]) -> tuple[dt.date, dt.date]:
    """The first and last day a run covers: its daily partitions', or the `files` layout's
    declared period (rows outside it are filtered out by the time column)."""
    if spec.input.path is None:  # in-memory rows: the period the spec states, else today
        today = dt.datetime.now(dt.UTC).date()
        return spec.input.start_date or today, spec.input.end_date or today
    if spec.input.layout == "files":
        assert spec.input.start_date is not None and spec.input.end_date is not None
        return spec.input.start_date, spec.input.end_date
    first, last = days[0].day, days[-1].day
    assert first is not None and last is not None
    return first, last


def release_key(
    spec: JobSpec,
    days: list[DailyPartition],
    spec_hash: str | None = None,
    rows: InputRows | None = None,
) -> ReleaseKey:
    """The ledger key of a spend on these days (or these in-memory rows): scope, spec hash
    (or another request's hash), input fingerprint, date range; with, for files, what they
    hold by content (their footers or ends, no data page: `inputs.fingerprints`), which the
    ledger charges to this scope only."""
    content = None
    if rows is not None:
        fingerprint = rows.fingerprint()
    else:
        assert spec.input.path is not None
        files = [path for day in days for path in day.files]
        fingerprint = input_fingerprint(files, spec.input.path)
        content = InputContent(
            spec.privacy_unit, input_contents(days, spec.input.path, spec.input.format)
        )
    first, last = input_period(spec, days)
    return ReleaseKey(
        scope=default_scope(spec),
        spec_hash=spec_hash or spec.spec_hash(),
        input_fingerprint=fingerprint,
        start_date=first,
        end_date=last,
        content=content,
    )


def open_ledger(ledger: Ledger | str | Path | None) -> Ledger | None:
    if not isinstance(ledger, str | Path):
        return ledger
    from dppipeline.ledger import Ledger  # noqa: PLC0415 (SQLAlchemy: a ledger's runs only)

    return Ledger(ledger)


def ledger_line(book: Ledger, text: str) -> str:
    """A `[ledger]` progress line; every one says which ledger."""
    return f"[ledger] {text} (ledger {book.location})"


def settle_expired(book: Ledger, scope: str, say: Callable[[str], None]) -> None:
    """`Ledger.repair` for one scope (leases that ran out, runs whose process is gone from
    this host), each settled reservation on a `[ledger]` line."""
    for settled_run, state in book.repair(scope):
        row = book.row(settled_run)
        if row is not None and row.note is not None and " expired" not in row.note:
            what = f"reservation of run {settled_run} (its process ended on this host)"
        else:
            what = f"expired reservation of run {settled_run}"
        say(ledger_line(book, f"settled {what}: {state}"))


def check_budget(
    spec: JobSpec,
    ledger: Ledger | str | Path,
    echo: Callable[[str], None] | None = None,
    *,
    new_release: bool = False,
) -> str:
    """Would the ledger accept this release now? Reads no data; settles reservations of dead
    runs in the scope as `run` does (a dead run's reservation must not look like spent budget),
    and writes nothing else. Returns a line saying the release is already published or the
    budget is available, or raises like `run` would: BudgetExceededError (exit 3, do not
    retry), or BudgetHeldError (exit 75: live reservations hold the budget; retry at the time
    it names)."""
    say = _tolerant(echo or _to_stderr)
    if spec.input.path is None:
        raise UsageError("--input: required (or input.path in the job spec)")
    spec = with_detected_layout(spec)
    plan = make_plan(spec)
    days = input_days(spec)
    book = open_ledger(ledger)
    assert book is not None
    key = release_key(spec, days)
    settle_expired(book, key.scope, say)
    existing = None if new_release else book.committed(key)
    if existing is not None:
        return (
            f"already published by run {existing.run_id} to {existing.output}: "
            f"a rerun spends nothing (ledger {book.location})"
        )
    eps, delta = plan.total_spent()
    policy = book.check(
        key, epsilon=eps, delta=delta, policy=budget_policy(spec), events=release_events(plan)
    )
    return (
        f"budget available: epsilon={eps:g} delta={delta:g} in scope {key.scope!r} "
        f"({policy.describe()}; ledger {book.location})"
    )


def run_job(
    spec: JobSpec,
    engine: str | Engine = "local",
    *,
    overwrite: bool = False,
    quarantine: str | Path | None = None,
    seed: int | None = None,
    echo: Callable[[str], None] | None = None,
    ledger: Ledger | str | Path | None = None,
    new_release: bool = False,
) -> RunResult:
    """Runs one release by the run sequence above and returns where it is; raises
    DPPipelineError on bad input.

    With a ledger: a release already committed under the same key is returned as it is (no
    new noise, no new spend) unless `new_release`; otherwise the budget is reserved before any
    data is read and committed before the release is published.
    """
    say = _tolerant(echo or _to_stderr)
    engine_impl = load_engine(engine) if isinstance(engine, str) else engine
    if spec.input.path is None:
        raise UsageError("--input: required (or input.path in the job spec)")
    if spec.output is None:
        raise UsageError("--output: required (or output in the job spec)")
    engine_impl.prepare()  # e.g. start the JVM while pipeline-dp plans the budget
    # The engine's own access to stores (Spark: Hadoop's FileSystem API) for every remote
    # location of the run, from listing the input to writing the pointer.
    with remote_filesystems(engine_impl.file_systems()):
        spec = with_detected_layout(spec)
        return _planned_run(
            spec, engine_impl, overwrite=overwrite, quarantine=quarantine, seed=seed, say=say,
            ledger=ledger, new_release=new_release,
        )  # fmt: skip


def release_rows(
    spec: JobSpec,
    rows: InputRows,
    engine: Engine,
    *,
    quarantine: str | Path | None = None,
    seed: int | None = None,
    echo: Callable[[str], None] | None = None,
    ledger: Ledger | str | Path | None = None,
    new_release: bool = False,
    overwrite: bool = False,
) -> RunResult:
    """`run_job` over in-memory rows (the Python API): the same plan, reservation, `reading`
    mark, engine, manifest and commit. Without `spec.output` the release is staged in a
    private temporary folder the caller reads back (`RunResult.output`) and removes; with it,
    it is published there like a file run's."""
    say = _tolerant(echo or _to_stderr)
    memory_input = spec.input.model_copy(update={"path": None})
    spec = spec.model_copy(update={"input": memory_input})
    return _planned_run(
        spec, engine, overwrite=overwrite, quarantine=quarantine, seed=seed, say=say,
        ledger=ledger, new_release=new_release, rows=rows,
    )  # fmt: skip


def _planned_run(
    spec: JobSpec,
    engine_impl: Engine,
    *,
    overwrite: bool,
    quarantine: str | Path | None,
    seed: int | None,
    say: Callable[[str], None],
    ledger: Ledger | str | Path | None,
    new_release: bool,
    rows: InputRows | None = None,
) -> RunResult:
    """`run_job` (or `release_rows`) from the plan on."""
    plan = make_plan(spec)  # before any data is read
    if rows is not None:
        check_memory_period(spec)
    book = open_ledger(ledger)
    if book is None:
        refuse_unrecorded(spec, "this run")
    days = input_days(spec) if rows is None else []
    spec_hash = spec.spec_hash()  # public key files by content
    tasks = plan_tasks(spec, plan, days, read_key_files(spec))  # public key lists, not data
    if spec.spec_hash() != spec_hash:
        raise InputError("a public key file changed while it was being read; run again")
    run_id = new_run_id()
    chosen = _as_path_or_uri(quarantine or spec.input.quarantine)
    target, where, shipped_to = _release_target(
        spec, run_id, chosen, book, in_memory=rows is not None
    )
    key = release_key(spec, days, spec_hash, rows) if book is not None else None
    if rows is not None and book is not None:
        _check_memory_period(spec, book, key)
    with target.lock():
        if book is not None:
            assert key is not None
            settle_expired(book, key.scope, say)
        for line in target.heal(_fate(book, target.where)):
            say(f"[publish] {target.display()}: {line}")
        if book is not None and not new_release:
            assert key is not None
            published = _already_committed(book, key, target, overwrite, say)
            if published is not None:
                return published
        target.check(overwrite)
        target.probe(run_id)  # before the reservation: a failure here charges nothing
        check_writable(shipped_to if shipped_to is not None else where, run_id)
        job = ReleaseJob(
            spec=spec,
            plan=plan,
            tasks=tasks,
            days=days,
            quarantine=where,
            salt=ReleaseJob.sampling_salt(seed),
            progress=lambda line: say(f"[{engine_impl.name}] {line}"),
            quarantine_shipped_to=shipped_to,
            rows=None if rows is None else rows.rows,
            run_id=run_id,
        )
        manifest, datasets = _release(
            job,
            engine_impl,
            target,
            book=book,
            key=key,
            run_id=run_id,
            overwrite=overwrite,
            spec_hash=spec_hash,
            say=say,
        )
    # Progress lines only: the release is committed and published.
    if book is not None:
        say(ledger_line(book, f"committed run {run_id}"))
    if datasets is None:  # else a Beam transform's: counted only when the caller's pipeline runs
        for name, query in manifest.queries.items():
            say(f"[{engine_impl.name}] {name}: released {query.released_partitions:,} partitions")
    say(f"[{engine_impl.name}] release written to {target.display()}")
    return RunResult(target.where, run_id, manifest.released_partitions, manifest, datasets)


def _release_target(
    spec: JobSpec,
    run_id: str,
    chosen: str | Path | None,
    book: Ledger | None,
    *,
    in_memory: bool,
) -> tuple[ReleaseTarget, Path, Location | None]:
    """Where the release goes (the caller's memory, a local folder or a store), with the local
    folder the engine writes rejected rows into and the store folder they are shipped to."""
    if spec.output is None:
        assert in_memory, "run_job checks the output"
        where, shipped_to = _quarantine_folders(chosen, run_id, None)
        return MemoryTarget(run_id), where, shipped_to
    if Location.of(spec.output).is_local:
        output = Path(spec.output)
        where, shipped_to = _quarantine_folders(chosen, run_id, output)
        guard = {
            "input_path": spec.input.path,
            "ledger_file": book.path if book is not None else None,
            "quarantine": where,
        }
        return FolderTarget(output, guard), where, shipped_to
    where, shipped_to = _quarantine_folders(chosen, run_id, None)
    store = StoreTarget(
        Location.of(spec.output),
        input_path=spec.input.path,
        quarantine=Location.of(str(chosen)) if chosen else None,
    )
    return store, where, shipped_to


def _already_committed(
    book: Ledger,
    key: ReleaseKey,
    target: ReleaseTarget,
    overwrite: bool,
    say: Callable[[str], None],
) -> RunResult | None:
    """The release already committed under `key`, at `target` (no new noise, nothing spent),
    or None."""
    existing = book.committed(key)
    if existing is None:
        return None
    manifest = target.existing(existing, overwrite)
    say(
        ledger_line(
            book,
            f"release already published by run {existing.run_id} "
            f"({existing.reserved_at}): {target.display()}; no new noise drawn, "
            "nothing spent (--new-release to draw again)",
        )
    )
    return RunResult(target.where, existing.run_id, manifest.released_partitions, manifest)


def check_memory_period(spec: JobSpec) -> None:
    """A period stated for in-memory rows is charged, so it must hold the rows: both dates,
    and a time column the period filter keeps rows by (without one, any frame could be
    charged to any period, and a windowed cap evaded by naming new periods)."""
    first, last = spec.input.start_date, spec.input.end_date
    if (first is None) != (last is None):
        missing = "input.start_date" if first is None else "input.end_date"
        raise UsageError(f"{missing}: required with the other date for in-memory data")
    if first is not None and spec.source_schema.time_column is None:
        raise UsageError(
            "input.start_date: in-memory rows can be charged to a period only when the period "
            "filter can hold them to it, and the input schema has no time column (give one "
            "with role event_time or input.time_column, or drop input.start_date and "
            "input.end_date: the release is then charged to today)"
        )


def _check_memory_period(spec: JobSpec, book: Ledger, key: ReleaseKey | None) -> None:
    """In-memory rows without a stated period are charged to today's date: refused in a scope
    whose cap holds per window of data days, which needs the data's real days."""
    assert key is not None
    if spec.input.start_date is not None and spec.input.end_date is not None:
        return
    if book.effective_policy(key.scope, budget_policy(spec)).window_days is not None:
        raise UsageError(
            f"input.start_date: required for in-memory data in scope {key.scope!r}, whose cap "
            "holds per window of data days (give input.start_date and input.end_date)"
        )


class MemoryTarget:
    """An in-memory release: staged in a private temporary folder that the API reads back and
    removes; nothing is published anywhere else. The ledger records it as `memory:<run_id>`."""

    def __init__(self, run_id: str):
        self.where = Path(tempfile.mkdtemp(prefix=f"dppipeline-{run_id}-"))
        self._run_id = run_id

    @property
    def recorded_as(self) -> str:
        return f"memory:{self._run_id}"

    def display(self) -> str:
        return "memory (returned to the caller)"

    def lock(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def heal(self, fate: Callable[[str, dict | None], str]) -> list[str]:
        return []

    def check(self, overwrite: bool) -> None:
        return None

    def probe(self, run_id: str) -> None:
        return None

    def existing(self, row: LedgerRow, overwrite: bool) -> Manifest:
        """A committed in-memory release is not stored: its rows went to that caller."""
        shutil.rmtree(self.where, ignore_errors=True)
        raise OutputError(
            f"this release (run {row.run_id}) was already committed for this dataset_id and "
            "returned to its caller, not stored; pass new_release=True to draw new noise and "
            "spend the budget again, or output= to keep a release"
        )

    def staging(self, run_id: str, engine_writes_to_stores: bool) -> Path:
        return private_folder(self.where)  # owner-only, made by mkdtemp

    def last_look(self, overwrite: bool) -> None:
        return None

    def staged_files(self, staging: Path | Location, run_id: str) -> list[str]:
        return []

    def publish(self, staging: Path | Location, run_id: str, files: list[str]) -> None:
        return None  # the caller reads `staging` back

    def discard(self, staging: Path | Location) -> None:
        shutil.rmtree(self.where, ignore_errors=True)


def _reservation(
    book: Ledger | None, key: ReleaseKey | None, job: ReleaseJob, run_id: str, output: str
) -> Reservation | None:
    if book is None:
        return None
    assert key is not None
    from dppipeline.ledger import Reservation  # noqa: PLC0415 (SQLAlchemy: a ledger's runs only)

    eps_total, delta_total = job.plan.total_spent()
    return Reservation(
        book,
        key,
        run_id=run_id,
        job=job.spec.name,
        epsilon=eps_total,
        delta=delta_total,
        output=output,
        policy=budget_policy(job.spec),
        events=release_events(job.plan),
    )


def _reserved_line(
    job: ReleaseJob, run_id: str, say: Callable[[str], None]
) -> Callable[[Reservation], None]:
    def reserved(spend: Reservation) -> None:
        assert spend.policy is not None
        book, key = spend.ledger, spend.key
        eps_total, delta_total = job.plan.total_spent()
        say(
            ledger_line(
                book,
                f"reserved epsilon={eps_total:g} delta={delta_total:g} in scope "
                f"{key.scope!r} ({spend.policy.describe()}), run {run_id}",
            )
        )

    return reserved


def _release(
    job: ReleaseJob,
    engine_impl: Engine,
    target: ReleaseTarget,
    *,
    book: Ledger | None,
    key: ReleaseKey | None,
    run_id: str,
    overwrite: bool,
    spec_hash: str,
    say: Callable[[str], None],
) -> tuple[Manifest, Mapping[str, object] | None]:
    """Steps 2 to 6 of the run sequence (`charge.charged`); returns the published manifest
    (and what an in-memory engine handed back)."""
    staged = _StagedRelease(
        job, engine_impl, target, run_id=run_id, overwrite=overwrite, spec_hash=spec_hash,
        book=book, say=say,
    )  # fmt: skip
    spend = _reservation(book, key, job, run_id, target.recorded_as)
    return charged(spend, staged, reserved=_reserved_line(job, run_id, say))


class _StagedRelease:
    """A release as the charge sequence drives it: staged by the engine in the target's
    staging folder (manifest last), published by the target."""

    def __init__(
        self,
        job: ReleaseJob,
        engine_impl: Engine,
        target: ReleaseTarget,
        *,
        run_id: str,
        overwrite: bool,
        spec_hash: str,
        book: Ledger | None,
        say: Callable[[str], None],
    ):
        self.job, self.engine, self.target = job, engine_impl, target
        self.run_id, self.overwrite, self.spec_hash = run_id, overwrite, spec_hash
        self.book, self.say = book, say
        self.staging: Path | Location | None = None
        self.files: list[str] = []

    def prepare(self) -> None:
        self.staging = self.target.staging(
            self.run_id, getattr(self.engine, "writes_to_stores", False)
        )

    def stage(self) -> tuple[Manifest, Mapping[str, object] | None]:
        assert self.staging is not None
        return _stage(
            self.job, self.engine, self.staging, run_id=self.run_id, spec_hash=self.spec_hash,
            book=self.book, say=self.say,
        )  # fmt: skip

    def seal(self) -> None:
        assert self.staging is not None
        self.files = self.target.staged_files(self.staging, self.run_id)
        self.target.last_look(self.overwrite)  # still revocable

    def publish(self) -> None:
        assert self.staging is not None
        self.target.publish(self.staging, self.run_id, self.files)

    def discard(self) -> None:
        assert self.staging is not None
        self.target.discard(self.staging)


def _stage(
    job: ReleaseJob,
    engine_impl: Engine,
    staging: Path | Location,
    *,
    run_id: str,
    spec_hash: str,
    book: Ledger | None,
    say: Callable[[str], None],
) -> tuple[Manifest, Mapping[str, object] | None]:
    """The engine's run + the manifest (written last), all on disk in `staging` (or, for an
    engine that writes to stores, all in the run's folder on the store)."""
    spec, days = job.spec, job.days
    first, last = input_period(spec, days)
    if job.rows is not None:
        say(f"[{engine_impl.name}] reading in-memory rows ({first} to {last})")
    else:
        parts = (
            f"{sum(len(d.files) for d in days)} files"
            if spec.input.layout == "files"
            else f"{len(days)} daily partitions"
        )
        say(f"[{engine_impl.name}] reading {parts} ({first} to {last}) from {spec.input.path}")
    try:
        run = engine_impl.run(job, staging)
    finally:
        if job.quarantine_shipped_to is not None:
            ship_quarantine(job.quarantine, job.quarantine_shipped_to)
    failpoint("written")
    rejects = run.rejects
    if rejects is None:  # a Beam transform in the caller's pipeline: rows are read later
        say(f"[{engine_impl.name}] rows are read and checked when the caller's pipeline runs")
    else:
        kept = (
            job.quarantine_shipped_to.display() if job.quarantine_shipped_to else rejects.quarantine
        )
        say(
            f"[{engine_impl.name}] read {rejects.rows_read:,} rows; rejected "
            f"{rejects.rows_rejected:,}"
            + (f" (kept aside in {kept})" if rejects.quarantine else "")
        )
    manifest = build_manifest(
        spec,
        job.plan,
        run_id=run_id,
        engine=engine_impl.name,
        days=(first, last),
        input_files=sum(len(d.files) for d in days),
        released_partitions=run.released_partitions,
        public_keys={
            name: None if keys is None else len(keys)
            for name, keys in job.tasks.public_keys.items()
        },
        spec_hash=spec_hash,
        ledger=str(book.location) if book is not None else None,
    )
    if isinstance(staging, Location):
        write_store_manifest(staging, manifest.to_json())
        return manifest, run.datasets
    (staging / MANIFEST_NAME).write_text(manifest.to_json())
    fsync_tree(staging)
    return manifest, run.datasets


def _fate(book: Ledger | None, output: Path | Location) -> Callable[[str, dict | None], str]:
    """How `heal` treats a crashed run's staging folder, by the ledger: a live reservation is
    left alone, a committed run is published, anything else is removed."""

    def fate(run_id: str, manifest: dict | None) -> str:
        recorded_in = manifest.get("ledger") if manifest is not None else None
        row = book.row(run_id) if book is not None else None
        if row is None:
            if recorded_in is not None and (book is None or recorded_in != str(book.location)):
                raise OutputError(
                    f"output {output}: run {run_id} left a complete release recorded in ledger "
                    f"{recorded_in}; run with that ledger to publish or remove it"
                )
            return "discard"
        assert book is not None
        if row.state in ("reserved", "reading") and book.lease_alive(row):
            return "live"
        if row.state == "committed" and manifest is not None:
            return "publish"
        return "discard"

    return fate


def _to_stderr(line: str) -> None:
    """Progress goes to the operator's log (the CLI prints it on stderr; see `logs`)."""
    log.info(line)


def _tolerant(say: Callable[[str], None]) -> Callable[[str], None]:
    """Progress lines that a closed pipe cannot turn into a failure (`run ... | head`): the
    first broken write stops them, the run goes on."""
    broken = False

    def emit(line: str) -> None:
        nonlocal broken
        if broken:
            return
        try:
            say(line)
        except OSError as exc:
            closed = isinstance(exc, BrokenPipeError | ConnectionResetError)
            if not closed and exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                raise
            broken = True

    return emit
