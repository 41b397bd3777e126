"""Contribution bounding on Beam: clip and route rows by privacy unit, Linf per (unit,
partition) pair by a combiner (sampled: bottom-k of row priorities; scaled: each pair's row
count and sums, no rows kept), L0 per unit shard (see the engine's docstring)."""

from __future__ import annotations

import datetime as dt

import apache_beam as beam
import numpy as np
import pandas as pd
import polars as pl
from apache_beam.metrics.metric import Metrics
from apache_beam.typehints import KV, Any

from dppipeline import settings
from dppipeline.core.tasks import (
    AggregationTask,
    canonical_keys,
)
from dppipeline.engines.beam.elements import (
    METRICS_NAMESPACE,
    CompactingCombineFn,
    ContributionBlock,
    PairPartials,
)
from dppipeline.engines.kernel.bounding import (
    aggregates_frame,
    stable_shard,
)
from dppipeline.engines.kernel.polars_tasks import (
    DEVIATIONS,
    ROWS,
    SQUARES,
    bound_and_aggregate,
    distinct_arrays,
    pair_partials,
    task_rows,
)
from dppipeline.engines.kernel.sampling import (
    SamplingKeys,
    row_priorities,
    unit_kind_of,
)
from dppipeline.inputs.csv_records import ROW

_KEY_SEPARATOR = "\x1f"  # joins the parts of a composite key (ASCII unit separator)


def encoded_key(task: AggregationTask) -> str:
    """The one column a task's key travels in: the key itself when it is one int64 or string
    column, else `_key` (a composite key or a time bucket, as text; a global total: 0)."""
    keys = task.keys
    if len(keys) == 1 and keys[0].kind in ("int64", "string"):
        return keys[0].name
    return "_key"


def encode_keys(frame: pl.DataFrame, task: AggregationTask) -> np.ndarray:
    """The task's keys of each row as one numpy array, the same in every worker."""
    if not task.keys:
        return np.zeros(frame.height, dtype=np.int64)
    if encoded_key(task) != "_key":
        return frame.get_column(task.keys[0].name).to_numpy()
    parts = [pl.col(k.name).cast(pl.String) for k in task.keys]
    return frame.select(pl.concat_str(parts, separator=_KEY_SEPARATOR)).to_series().to_numpy()


def decode_keys(encoded: np.ndarray, task: AggregationTask) -> pd.DataFrame:
    """Inverse of `encode_keys`: canonical key columns (no column for a global total)."""
    if not task.keys:
        return pd.DataFrame(index=range(len(encoded)))
    if encoded_key(task) != "_key":
        return canonical_keys(pd.DataFrame({task.keys[0].name: encoded}), task.keys)
    split = pd.Series(encoded, dtype=object).str.split(_KEY_SEPARATOR, expand=True)
    frame = pd.DataFrame(index=range(len(encoded)))
    for i, key in enumerate(task.keys):
        column = split[i] if len(encoded) else pd.Series([], dtype=object)
        if key.kind == "int64":
            frame[key.name] = column.astype("int64")
        elif key.kind == "date":
            frame[key.name] = [dt.date.fromisoformat(v) for v in column]
        else:
            frame[key.name] = column.astype(object)
    return frame


def encode_key_frame(keys: pd.DataFrame, task: AggregationTask) -> np.ndarray:
    """`encode_keys` of a pandas key list (public partitions), formatted as rows are."""
    return encode_keys(pl.from_pandas(keys[task.key_names]), task)


class _ClipAndShard(beam.DoFn):
    """Valid rows -> (unit shard, ContributionBlock): the task's filter, keys and public
    keys applied, values clipped, every row given its Linf priority from its identity."""

    def __init__(self, task: AggregationTask, unit: str, unit_shards: int, salt: bytes):
        self._task, self._unit = task, unit
        self._shards, self._salt = unit_shards, salt
        self._public: pl.DataFrame | None = None

    def setup(self) -> None:
        self._keys = SamplingKeys.from_salt(self._salt)
        if self._task.public_keys is not None:  # converted once per worker, not per batch
            self._public = pl.from_pandas(self._task.public_keys, include_index=False)

    def process(self, element) -> list:
        source, rows = element
        frame = task_rows(rows, self._task, self._unit, public=self._public)
        if frame.height == 0:
            return []
        units = frame.get_column(self._unit).to_numpy()
        keys = encode_keys(frame, self._task)
        values = frame.get_column("_value").to_numpy()
        # A batch holds rows of one file: (source, `_row`) identifies each row.
        positions = frame.get_column(ROW).to_numpy() if ROW in frame.columns else None
        if positions is None:  # rows built in memory (tests): numbered within the batch
            positions = np.arange(frame.height)
        priority = row_priorities(self._keys, [source], np.zeros(len(units), np.int64), positions)
        distinct = tuple(v for _, v in distinct_arrays(frame, self._task))
        block = ContributionBlock(units, keys, priority, values, distinct)
        return by_unit_shard(units, block, self._shards)


def by_unit_shard(units: np.ndarray, block, shards: int) -> list:
    """A block's entries -> (unit shard, the entries of that shard), one element per shard
    present: all of a unit's entries go to one shard whatever the batch."""
    shard = stable_shard(units, shards)
    order = np.argsort(shard, kind="stable")
    bounds = np.flatnonzero(np.diff(shard[order])) + 1
    return [(int(shard[part[0]]), block.take(part)) for part in np.split(order, bounds)]


class _SumPairsAndShard(beam.DoFn):
    """Scaled Linf bounding: valid rows -> (unit shard, PairPartials): the task's filter, keys
    and public keys applied, values clipped, then the batch's rows summed per (unit,
    partition) pair by Polars. No row priority and no row leaves the batch: a pair of
    100,000 rows in a batch is one entry."""

    def __init__(self, task: AggregationTask, unit: str, unit_shards: int):
        self._task, self._unit, self._shards = task, unit, unit_shards
        self._public: pl.DataFrame | None = None

    def setup(self) -> None:
        if self._task.public_keys is not None:  # converted once per worker, not per batch
            self._public = pl.from_pandas(self._task.public_keys, include_index=False)

    def process(self, element) -> list:
        _, rows = element
        frame = task_rows(rows, self._task, self._unit, public=self._public)
        if frame.height == 0:
            return []
        # (unit, keys..., _rows, _deviations[, _squares]): one row per pair of the batch
        pairs = pair_partials(frame, self._task, self._unit)
        units = pairs.get_column(self._unit).to_numpy()
        block = PairPartials(
            units,
            encode_keys(pairs, self._task),
            pairs.get_column(ROWS).to_numpy(),
            pairs.get_column(DEVIATIONS).to_numpy(),
            pairs.get_column(SQUARES).to_numpy() if SQUARES in pairs.columns else None,
        )
        return by_unit_shard(units, block, self._shards)


class _SumPerPair(CompactingCombineFn):
    """Scaled Linf bounding: each (unit, partition) pair's partials summed across batches.
    Partials add, so the runner lifts this combiner before the shuffle and a shard's
    accumulator holds one entry per pair, however many rows a pair has."""

    def _merge(self, blocks: list[PairPartials]) -> PairPartials:
        return PairPartials.merge(blocks)


class _SampleRowsPerPair(CompactingCombineFn):
    """Linf: the lowest-priority `k` rows of each (privacy unit, partition) pair (uniform);
    with `per_unit`, of each privacy unit across its partitions (`max_contributions`)."""

    def __init__(self, k: int, per_unit: bool = False):
        self._k, self._per_unit = k, per_unit

    def _merge(self, blocks: list[ContributionBlock]) -> ContributionBlock:
        block = ContributionBlock.concat(blocks)
        return (
            block.bottom_k_per_unit(self._k) if self._per_unit else block.bottom_k_per_pair(self._k)
        )

    def _compact(self, blocks: list[ContributionBlock]) -> list[ContributionBlock]:
        # Even one block is cut to k per pair: a single bundle may hold a whole heavy pair.
        return [self._merge(blocks)] if blocks else []


class _SamplePartitionsPerUnit(beam.DoFn):
    """L0 + aggregation within a unit shard -> (partition shard, partial aggregates)."""

    def __init__(self, task: AggregationTask, unit: str, partition_shards: int, salt: bytes):
        self._task, self._key = task, encoded_key(task)
        self._shards, self._salt = partition_shards, salt
        # The exact number of (unit, partition) pairs is not private: a runner's UI shows
        # every counter, so it exists only under --debug-statistics (read by the launcher).
        self._pairs = (
            Metrics.counter(METRICS_NAMESPACE, "pairs_after_linf")
            if settings.debug_statistics()
            else None
        )

    def setup(self) -> None:
        self._keys = SamplingKeys.from_salt(self._salt)

    def process(self, element) -> list:
        _, block = element
        if block is None or len(block) == 0:
            return []
        unit_codes, unit_values = pd.factorize(block.unit)
        key_codes, key_values = pd.factorize(block.key)
        unit_values, key_values = np.asarray(unit_values), np.asarray(key_values)
        pairs = self._pairs
        common = {
            "privacy_codes": unit_codes.astype(np.int64),
            "unit_values": unit_values,
            "unit_kind": unit_kind_of(unit_values),
            "key_codes": key_codes.astype(np.int64),
            "key_values": decode_keys(key_values, self._task),
            "on_sample": None if pairs is None else lambda s: pairs.inc(len(s.pair_key_codes)),
        }
        if isinstance(block, PairPartials):
            # Scaled: one entry per pair; L0 keeps each unit's pairs of lowest priority and
            # each kept pair is scaled to at most Linf rows' worth (the local engine's code).
            bounded = bound_and_aggregate(
                self._task,
                self._keys,
                **common,
                row_priority=np.zeros(len(block)),
                values=None,
                row_counts=block.rows,
                deviations=(block.deviations, block.squares),
            )
        else:
            # The rows are already <= Linf per pair; the sample keeps them all and keeps the
            # L0 pairs of lowest priority per unit, with the local engine's code (under
            # max_contributions: already <= K per unit, which the same code keeps whole).
            bounded = bound_and_aggregate(
                self._task,
                self._keys,
                **common,
                row_priority=block.priority,
                values=block.value,
                distinct=list(zip(self._task.distinct, block.distinct, strict=True)),
            )
        # count_distinct: value sets, not counts (a partition's units span unit shards).
        partial = aggregates_frame(bounded, self._key, key_values, distinct_sets=True)
        target = stable_shard(partial[self._key].to_numpy(), self._shards)
        return [
            (int(target_shard), part.reset_index(drop=True))
            for target_shard, part in partial.groupby(target, sort=False)
        ]


class BoundContributions(beam.PTransform):
    """(source, valid rows) -> (partition shard, partial aggregates) of one task: Linf then
    L0. Sampled: each keeps the entries of lowest priority under the run's salt. Scaled (the
    default where no metric needs rows): each pair's rows are summed, L0 keeps pairs by
    priority and each kept pair is scaled to at most Linf rows' worth."""

    def __init__(
        self,
        task: AggregationTask,
        unit: str,
        unit_shards: int,
        partition_shards: int,
        salt: bytes,
    ):
        super().__init__()
        self._task, self._unit, self._salt = task, unit, salt
        self._unit_shards, self._partition_shards = unit_shards, partition_shards

    def expand(self, valid):
        task = self._task
        if task.scaled and task.max_contributions is None:
            # (unit shard, PairPartials): per pair its rows and sums, summed before the shuffle
            linf = (
                valid
                | "SumPerPairAndShardByPrivacyUnit"
                >> beam.ParDo(
                    _SumPairsAndShard(task, self._unit, self._unit_shards)
                ).with_output_types(KV[int, Any])
                | "SumPerPair" >> beam.CombinePerKey(_SumPerPair())
            )
        else:
            # (unit shard, ContributionBlock): <= Linf rows per pair (<= K per unit)
            linf = (
                valid
                | "ClipAndShardByPrivacyUnit"
                >> beam.ParDo(
                    _ClipAndShard(task, self._unit, self._unit_shards, self._salt)
                ).with_output_types(KV[int, Any])
                | (
                    "SampleRowsPerPartition"
                    if task.max_contributions is None
                    else "SampleRowsPerPrivacyUnit"
                )
                >> beam.CombinePerKey(
                    _SampleRowsPerPair(task.max_contributions_per_partition)
                    if task.max_contributions is None
                    else _SampleRowsPerPair(task.max_contributions, per_unit=True)
                )
            )
        return linf | "SamplePartitionsPerUnit" >> beam.ParDo(
            _SamplePartitionsPerUnit(task, self._unit, self._partition_shards, self._salt)
        ).with_output_types(KV[int, Any])
