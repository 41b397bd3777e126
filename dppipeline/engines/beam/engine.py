"""The Beam engine: composite transforms that parallelise on any runner; DirectRunner locally.

    ReadTransactions -> ValidateTransactions -> BoundContributions -> AggregatePerPartition
        -> ReleaseDP -> WriteRelease          (rejected rows -> WriteRejected, quarantine)

Elements are batches, never single rows: a Parquet row group, a whole CSV file, or the rows
of one shard. The launcher lists the input parts (reading the Parquet footers and the CSV
headers, so a bad file fails before the pipeline starts); workers open each listed file through
Beam's `FileSystems` (a path is opened, never matched as a pattern) and validate it with the
local engine's functions (the same contract, the same reasons, the same positions). Rejected
rows and unreadable-file reports are written through Beam's file systems to `_scratch/` in the
staging area, read back by the launcher and removed before the run returns. Per-row work is
numpy and Polars inside a DoFn, the way Beam's own batched IO works, so the runner's
per-element cost is paid per batch (PipelineDP's BeamBackend pays it per row, several times).

Bounding is exact whatever the bundles are:

- Rows are routed to `unit_shards` shards by a stable hash of the privacy unit, so all of a
  unit's rows meet in one shard.
- Linf: every row gets its priority, a keyed hash of the run's secret salt and the row's
  identity (file, row number), and a combiner keeps, per (privacy unit, partition) pair, the
  `max_contributions_per_partition` lowest. Bottom-k composes across bundles, so the combiner
  cuts data before the shuffle (a customer with 100,000 rows at one terminal ships 10 of
  them), and a retried bundle keeps the same rows.
- L0: per shard, `bounding.sample_contributions` (the local engine's code) keeps the
  `max_partitions_contributed` pairs per unit of lowest keyed hash of (salt, key, unit) and
  aggregates them.
- Per-partition partial aggregates are routed to `partition_shards` shards by a stable hash of
  the key, summed by a combiner, aligned with the public partitions (a PCollection joined by
  CoGroupByKey) and released by `core.mechanisms` in a DoFn: one batch per shard.
- Each shard's released rows are sorted by key into a part under `_parts/` in the staging
  area; once every part is written, one DoFn merges them, a row group per part at a time,
  into the dataset's one file (`engines.kernel.release_file`: the name, row order and
  metadata every engine writes), and the launcher removes `_parts/`.

Public partitions also reach the first step as a side input, to drop unlisted rows before
bounding (no unit spends its L0 on a partition that is never released).
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import apache_beam as beam
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from dppipeline.core.tasks import (
    read_schema,
)
from dppipeline.engines.base import EngineRun, ReleaseJob
from dppipeline.engines.beam.bound import BoundContributions
from dppipeline.engines.beam.elements import METRICS_NAMESPACE
from dppipeline.engines.beam.memory import ValidateRows, gated_rows, input_counts, keep_rejected
from dppipeline.engines.beam.read import (
    InputPart,
    ReadTransactions,
    ValidateBatch,
    ValidateTransactions,
    input_parts,
    rejected_arrow_schema,
)
from dppipeline.engines.beam.shard_release import (
    AggregatePerPartition,
    ReleaseDP,
    WriteParquetFile,
    WriteRelease,
    parquet_name,
)
from dppipeline.engines.kernel.polars_read import (
    first_rejected,
)
from dppipeline.engines.kernel.release_file import RELEASE_FILE
from dppipeline.errors import InputError, OutputError, UsageError
from dppipeline.inputs.contract import (
    RejectSummary,
    check_rejected_fraction,
)
from dppipeline.inputs.files import file_stamp
from dppipeline.inputs.quarantine import private_folder, write_rejected
from dppipeline.logs import statistic
from dppipeline.settings import state_dir
from dppipeline.storage import Location

log = logging.getLogger(__name__)

# Rows per shard the defaults aim at: enough to amortise a DoFn call, small enough for a worker.
MIN_SHARDS, MAX_SHARDS = 4, 4096
ROWS_PER_SHARD = 4_000_000
BYTES_PER_ROW_ESTIMATE = 12  # compressed Parquet / CSV bytes per transaction, roughly


def default_shards(input_bytes: int) -> int:
    """Shards for the data size: about ROWS_PER_SHARD rows each, within [4, 4096]."""
    rows = input_bytes / BYTES_PER_ROW_ESTIMATE
    return int(min(MAX_SHARDS, max(MIN_SHARDS, math.ceil(rows / ROWS_PER_SHARD))))


def check_pipeline_options(args: Sequence[str]) -> PipelineOptions:
    """Beam's PipelineOptions from command-line flags; an unknown flag is a usage error
    (Beam itself only logs and drops it, so a typo would silently change the run)."""
    from apache_beam.options.pipeline_options import _BeamArgumentParser  # noqa: PLC0415

    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    _, unknown = parser.parse_known_args(list(args))
    if unknown:
        raise UsageError(f"unknown Beam pipeline option {unknown[0]!r} (see PipelineOptions)")
    return PipelineOptions(list(args))


class BeamEngine:
    """Beam engine: DirectRunner by default; any runner through standard pipeline options."""

    name = "beam"
    writes_to_stores = True  # workers write through Beam's file systems (s3, gs, hdfs)

    def __init__(
        self,
        pipeline_args: Sequence[str] = (),
        unit_shards: int | None = None,
        partition_shards: int | None = None,
    ):
        self._args = list(pipeline_args)
        if not any(arg.startswith("--default_sdk_harness_log_level") for arg in self._args):
            # Quiet workers by default (multi_processing workers log every bundle at INFO).
            self._args.append("--default_sdk_harness_log_level=WARNING")
        self._options = check_pipeline_options(self._args)
        self._unit_shards, self._partition_shards = unit_shards, partition_shards

    def prepare(self) -> None:
        """Nothing to start: the runner starts when the pipeline runs."""

    def file_systems(self) -> None:
        """pyarrow's clients (Beam's workers use Beam's own file systems)."""
        return None

    def run(self, job: ReleaseJob, staging: Path | Location) -> EngineRun:
        if job.rows is not None:  # a caller's PCollection: build the graph on it
            return self._expand(job)
        started = time.monotonic()
        folder = str(staging)  # a local folder, or the run's folder on a store

        def progress(step: str) -> None:
            job.progress(f"{time.monotonic() - started:6.1f}s {step}")

        spec = job.spec
        schema = read_schema(spec, job.tasks.tasks)
        parts = input_parts(job.days, spec.input.format, schema)
        input_bytes = sum(file_stamp(path)[0] for day in job.days for path in day.files)
        unit_shards = self._unit_shards or default_shards(input_bytes)
        partition_shards = self._partition_shards or unit_shards
        # Rejected rows and unreadable-file reports go through Beam's file systems to a
        # scratch folder every worker can reach (`_scratch_folder`), are read back here, and
        # the folder is removed before this returns.
        scratch = Scratch(_scratch_folder(job, staging), len(parts))
        try:
            scratch.create()
            pipeline = beam.Pipeline(options=self._options)
            self._build(
                pipeline,
                job,
                parts=parts,
                staging=folder,
                scratch=scratch,
                unit_shards=unit_shards,
                partition_shards=partition_shards,
            )
            runner = self._options.get_all_options().get("runner") or "DirectRunner"
            n_files = sum(len(day.files) for day in job.days)
            progress(
                f"Beam {beam.__version__} on {runner}: {n_files} files, "
                f"{len(job.tasks.tasks)} aggregation(s), {unit_shards} privacy-unit shards, "
                f"{partition_shards} partition shards"
            )
            result = pipeline.run()
            result.wait_until_finish()
            counters = _counters(result)
            progress("pipeline done")
            if "pairs_after_linf" in counters:
                statistic(log, f"{counters['pairs_after_linf']:,} (unit, partition) pairs kept")
            rejects = self._check_input(counters, job, scratch)
        finally:
            scratch.remove()
            _remove_parts(staging)
        released = {
            query.name: _rows_in(Location.of(staging).join(query.name, RELEASE_FILE))
            for query in job.plan.queries
        }
        return EngineRun(rejects=rejects, released_partitions=released)

    def _build(
        self,
        pipeline: beam.Pipeline,
        job: ReleaseJob,
        *,
        parts: Sequence[InputPart],
        staging: str,
        scratch: Scratch,
        unit_shards: int,
        partition_shards: int,
    ) -> None:
        spec = job.spec
        schema = read_schema(spec, job.tasks.tasks)
        batches = pipeline | "ReadTransactions" >> ReadTransactions(parts, schema)
        checked = batches | "ValidateTransactions" >> ValidateTransactions(schema)
        _ = checked[ValidateBatch.REJECTED] | "WriteRejected" >> beam.ParDo(
            WriteParquetFile(scratch.folder, "rejected", rejected_arrow_schema(schema))
        )
        _ = checked[ValidateBatch.UNREADABLE] | "WriteUnreadable" >> beam.ParDo(
            _WriteText(scratch.folder, "unreadable")
        )
        released = _bound_and_release(checked.valid, job, unit_shards, partition_shards)
        for query in job.plan.queries:
            _ = released[query.name] | f"WriteRelease[{query.name}]" >> WriteRelease(
                FileSystems.join(staging, query.name),
                FileSystems.join(staging, PARTS, query.name),
                job.release_schema(query.name),
                job.tasks.task(query.name).key_names,
                partition_shards,
            )

    def _expand(self, job: ReleaseJob) -> EngineRun:
        """The release as transforms on the caller's PCollection (`memory`): validated like
        file parts, rejected rows kept in the run's quarantine, the released rows of each
        query a PCollection of dicts, gated on the rejected fraction. Nothing runs here: the
        caller runs the pipeline, so the runner's counts are unknown (`rejects` None)."""
        spec = job.spec
        schema = read_schema(spec, job.tasks.tasks)
        shards = self._unit_shards or MIN_SHARDS
        partition_shards = self._partition_shards or shards
        checked = job.rows | "ValidateRows" >> ValidateRows(schema)
        keep_rejected(checked, job.quarantine, schema)
        counts = input_counts(checked)
        record = release_record(job)
        released = _bound_and_release(checked.valid, job, shards, partition_shards, record)
        fraction = spec.input.max_rejected_fraction
        datasets = {
            q.name: gated_rows(released[q.name], counts, fraction, f"Released[{q.name}]")
            for q in job.plan.queries
        }
        job.progress(f"Beam {beam.__version__}: release transforms added to the caller's pipeline")
        job.progress(
            f"noise is drawn once for this charge: every run of the pipeline returns the "
            f"release kept in {record}"
        )
        return EngineRun(
            rejects=None,
            released_partitions=dict.fromkeys(datasets, 0),
            datasets=datasets,
        )

    def _check_input(
        self, counters: dict[str, int], job: ReleaseJob, scratch: Scratch
    ) -> RejectSummary:
        """Unreadable files fail the run, naming the first; rejected rows go to the
        quarantine, and above max_rejected_fraction fail it, naming the first bad row."""
        messages = scratch.unreadable_messages()
        if messages:
            raise InputError(messages[0])
        rows = counters.get("rows_read", 0)
        schema = rejected_arrow_schema(read_schema(job.spec, job.tasks.tasks))
        rejected = scratch.rejected_rows(schema)  # parts in file order, rows in row order
        summary = RejectSummary(rows, rejected.num_rows, None)
        if rejected.num_rows:
            path = write_rejected(rejected, job.quarantine)
            first = first_rejected(pl.from_arrow(rejected), job.spec.input.format)
            summary = RejectSummary(rows, rejected.num_rows, first, path)
        check_rejected_fraction(summary, job.spec.input.max_rejected_fraction)
        return summary


def _bound_and_release(
    valid, job: ReleaseJob, unit_shards: int, partition_shards: int, record: str | None = None
) -> dict:
    """Valid row batches -> per task: bound and aggregate -> {query: released Arrow tables}
    (`record`: where a transform keeps its release, so that noise is drawn once)."""
    aggregates = {
        task.name: (
            valid
            | f"BoundContributions[{task.name}]"
            >> BoundContributions(
                task, job.spec.privacy_unit, unit_shards, partition_shards, job.salt
            )
            | f"AggregatePerPartition[{task.name}]" >> AggregatePerPartition(task)
        )
        for task in job.tasks.tasks
    }
    return aggregates | "ReleaseDP" >> ReleaseDP(job, partition_shards, record)


def release_record(job: ReleaseJob) -> str:
    """Where a transform's released shards are kept (`record.py`): operator-only, beside the
    quarantine: on its store when it is on one (where distributed workers reach it), else in
    the state folder under the run's id."""
    if job.quarantine_shipped_to is not None:
        return str(job.quarantine_shipped_to.join("release-record"))
    return str((state_dir() / "releases" / job.run_id).resolve())


SCRATCH = "_scratch"
PARTS = "_parts"  # each dataset's sorted parts before their merge, in the staging area


def _remove_parts(staging: Path | Location) -> None:
    """The sorted parts are not part of the release: removed, and checked gone, before it is
    published (a store's run folder is published as listed)."""
    parts = Location.of(staging).join(PARTS)
    if parts.is_local:
        shutil.rmtree(parts.path, ignore_errors=True)
        return
    parts.delete_tree()
    if parts.files():
        raise OutputError(f"could not remove the sorted parts {parts.display()}")


def _scratch_folder(job: ReleaseJob, staging: Path | Location) -> str:
    """Where workers leave raw rejected rows: an operator-only place, never under a store's
    release prefix (a crashed run's files there stay until the next run removes them). A
    local output: its private staging folder. A store output: the quarantine's run folder
    when the quarantine is on a store (what a distributed runner needs), else a private
    folder beside the local quarantine."""
    if not isinstance(staging, Location) or staging.is_local:
        return FileSystems.join(str(staging), SCRATCH)
    if job.quarantine_shipped_to is not None:
        return str(job.quarantine_shipped_to.join(SCRATCH))
    quarantine = Path(job.quarantine)
    return str(quarantine.parent / f"{SCRATCH}-{quarantine.name}")


def _rows_in(path: Location) -> int:
    """A released file's row count, from its footer."""
    fs, inner = path.filesystem()
    with fs.open_input_file(inner) as handle:
        return int(pq.ParquetFile(handle).metadata.num_rows)


@dataclass(frozen=True)
class Scratch:
    """The folder (under the staging area) where workers leave rejected rows and unreadable
    file reports for the launcher, through Beam's file systems: one file per input part,
    named by the part's index (exact names: nothing is matched as a pattern)."""

    folder: str
    parts: int

    @property
    def is_local(self) -> bool:
        return FileSystems.get_scheme(self.folder) is None

    def create(self) -> None:
        if self.is_local:
            private_folder(Path(self.folder))  # raw rows: owner-only, even for a moment
        else:
            FileSystems.mkdirs(self.folder)

    def unreadable_messages(self) -> list[str]:
        """The reports, in the launcher's order of the parts (files in day order)."""
        messages = []
        for index in range(self.parts):
            path = FileSystems.join(self.folder, f"unreadable-{index:05d}.txt")
            if FileSystems.exists(path):
                with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                    messages.append(f.read().decode())
        return messages

    def rejected_rows(self, schema: pa.Schema) -> pa.Table:
        """Every part's rejected rows, in the launcher's order of the parts."""
        tables = [schema.empty_table()]
        for index in range(self.parts):
            path = parquet_name(self.folder, "rejected", index)
            if FileSystems.exists(path):
                with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                    tables.append(pq.read_table(f))
        return pa.concat_tables(tables)

    def remove(self) -> None:
        """Raw rejected rows must not stay beside the release: removed, and checked gone
        (Beam's local delete matches its argument as a pattern, its S3 delete of a prefix
        removes nothing, so the storage layer removes the folder)."""
        if self.is_local:
            shutil.rmtree(self.folder, ignore_errors=True)
            return
        where = Location.of(self.folder)
        where.delete_tree()
        if where.files():
            raise OutputError(f"could not remove the scratch folder {where.display()}")


class _WriteText(beam.DoFn):
    """(number, text) -> `<folder>/<prefix>-<number>.txt` through Beam's file systems."""

    def __init__(self, folder: str, prefix: str):
        self._folder, self._prefix = folder, prefix

    def process(self, element) -> None:
        number, text = element
        path = FileSystems.join(self._folder, f"{self._prefix}-{number:05d}.txt")
        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.write(text.encode())


def _counters(result) -> dict[str, int]:
    """This run's dppipeline counters (committed where the runner reports them)."""
    query = result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))
    counters: dict[str, int] = {}
    for counter in query["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        counters[counter.key.metric.name] = counters.get(counter.key.metric.name, 0) + int(value)
    return counters
