"""Contribution bounding on Beam: clip and route rows by privacy unit, Linf per (unit,
partition) pair by a bottom-k combiner, L0 per unit shard (see the engine's docstring)."""

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
)
from dppipeline.engines.kernel.bounding import (
    aggregates_frame,
    stable_shard,
)
from dppipeline.engines.kernel.polars_tasks import (
    bound_and_aggregate,
    distinct_arrays,
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
        shard = stable_shard(units, self._shards)
        order = np.argsort(shard, kind="stable")
        bounds = np.flatnonzero(np.diff(shard[order])) + 1
        return [
            (int(shard[positions[0]]), block.take(positions))
            for positions in np.split(order, bounds)
        ]


class _SampleRowsPerPair(CompactingCombineFn):
    """Linf: the lowest-priority `k` rows of each (privacy unit, partition) pair (uniform);
    with `per_unit`, of each privacy unit across its partitions (`max_contributions`); with
    k None, every row (scaled Linf bounding scales the pair's aggregates after L0)."""

    def __init__(self, k: int | None, per_unit: bool = False):
        self._k, self._per_unit = k, per_unit  # k None: every row (scaled Linf bounding)

    def _merge(self, blocks: list[ContributionBlock]) -> ContributionBlock:
        block = ContributionBlock.concat(blocks)
        if self._k is None:
            return block
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
        unit_codes, unit_values, key_codes, key_values, _ = block.pair_codes()
        pairs = self._pairs
        # The rows are already <= Linf per pair (scaled: all rows, scaled after L0); the
        # sample keeps them all and keeps the L0 pairs of lowest priority per unit, with the
        # local engine's code (under max_contributions: already <= K per unit, which the same
        # code keeps whole).
        bounded = bound_and_aggregate(
            self._task,
            self._keys,
            privacy_codes=unit_codes,
            unit_values=unit_values,
            unit_kind=unit_kind_of(unit_values),
            key_codes=key_codes,
            key_values=decode_keys(key_values, self._task),
            row_priority=block.priority,
            values=block.value,
            on_sample=None if pairs is None else lambda s: pairs.inc(len(s.pair_key_codes)),
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
    L0, each keeping the entries of lowest priority under the run's salt."""

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
        return (
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
                _SampleRowsPerPair(None if task.scaled else task.max_contributions_per_partition)
                if task.max_contributions is None
                else _SampleRowsPerPair(task.max_contributions, per_unit=True)
            )
            | "SamplePartitionsPerUnit"
            >> beam.ParDo(
                _SamplePartitionsPerUnit(task, self._unit, self._partition_shards, self._salt)
            ).with_output_types(KV[int, Any])
        )
