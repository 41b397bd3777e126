"""What flows between the Beam transforms: blocks of clipped contributions (column-wise, never
single rows) and the combiner base that keeps their accumulators compact."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import apache_beam as beam
import numpy as np
import pandas as pd
from apache_beam.typehints import Any

from dppipeline.engines.kernel.bounding import (
    bottom_k_per_group,
)

METRICS_NAMESPACE = "dppipeline"
COMPACT_EVERY = 16  # combiner: compact an accumulator after this many added blocks


# Elements


@dataclass(frozen=True)
class ContributionBlock:
    """Clipped contributions, column-wise, each with its Linf sampling priority (a keyed hash
    of the run's salt and the row's identity, see `engines.sampling`)."""

    unit: np.ndarray
    key: np.ndarray
    priority: np.ndarray
    value: np.ndarray
    # The task's count_distinct columns, one array each (the rows' values), in task order.
    distinct: tuple[np.ndarray, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.unit)

    def take(self, positions: np.ndarray) -> ContributionBlock:
        return ContributionBlock(
            self.unit[positions],
            self.key[positions],
            self.priority[positions],
            self.value[positions],
            tuple(d[positions] for d in self.distinct),
        )

    @staticmethod
    def concat(blocks: Sequence[ContributionBlock]) -> ContributionBlock:
        if len(blocks) == 1:
            return blocks[0]
        return ContributionBlock(
            *(np.concatenate([getattr(b, f) for b in blocks]) for f in _BLOCK_FIELDS),
            tuple(
                np.concatenate([b.distinct[i] for b in blocks])
                for i in range(len(blocks[0].distinct))
            ),
        )

    def pair_codes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(unit codes, unit values, key codes, key values, pair codes) for this block's rows;
        code i has value values[i]."""
        unit_codes, unit_values = pd.factorize(self.unit)
        key_codes, key_values = pd.factorize(self.key)
        n_keys = max(len(key_values), 1)
        pair = unit_codes.astype(np.int64) * n_keys + key_codes
        return (
            unit_codes.astype(np.int64),
            np.asarray(unit_values),
            key_codes.astype(np.int64),
            np.asarray(key_values),
            pair,
        )

    def bottom_k_per_pair(self, k: int) -> ContributionBlock:
        """The k lowest-priority rows of each (privacy unit, partition) pair (equal
        priorities, a hash collision, settled by value: the same rows whatever the order
        bundles arrive in)."""
        if len(self) <= k:
            return self
        *_, pair = self.pair_codes()
        return self.take(bottom_k_per_group(pair, self.priority, k, self.value))

    def bottom_k_per_unit(self, k: int) -> ContributionBlock:
        """The k lowest-priority rows of each privacy unit, across its partitions
        (`max_contributions`; ties settled by value as in `bottom_k_per_pair`)."""
        if len(self) <= k:
            return self
        return self.take(bottom_k_per_group(self.unit, self.priority, k, self.value))


_BLOCK_FIELDS = ("unit", "key", "priority", "value")


@dataclass(frozen=True)
class PairPartials:
    """Scaled Linf bounding: one entry per (privacy unit, partition) pair seen, column-wise,
    with its row count and its clipped values' sums of (x - mid) and, for the variance,
    of (x - mid)^2 (mid: the bounds' midpoint, `polars_tasks.pair_partials`). Scaling needs
    no more, so no row is kept, no row priority exists, and a heavy pair is one entry."""

    unit: np.ndarray
    key: np.ndarray
    rows: np.ndarray  # int64
    deviations: np.ndarray
    squares: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.unit)

    def take(self, positions: np.ndarray) -> PairPartials:
        squares = None if self.squares is None else self.squares[positions]
        return PairPartials(
            self.unit[positions],
            self.key[positions],
            self.rows[positions],
            self.deviations[positions],
            squares,
        )

    @staticmethod
    def merge(blocks: Sequence[PairPartials]) -> PairPartials:
        """The blocks' entries summed per pair: partials compose by addition, so the combiner
        merges them before the shuffle (combiner lifting) whatever the bundles are."""
        if len(blocks) == 1:
            return blocks[0]
        unit = np.concatenate([b.unit for b in blocks])
        key = np.concatenate([b.key for b in blocks])
        unit_codes, _ = pd.factorize(unit)
        key_codes, key_values = pd.factorize(key)
        pair = unit_codes.astype(np.int64) * max(len(key_values), 1) + key_codes
        group, pairs = pd.factorize(pair)
        first = np.zeros(len(pairs), dtype=np.int64)
        first[group[::-1]] = np.arange(len(group) - 1, -1, -1)  # each pair's first entry

        def summed(part: Sequence[np.ndarray]) -> np.ndarray:
            return np.bincount(group, weights=np.concatenate(part), minlength=len(pairs))

        squares = None if blocks[0].squares is None else summed([b.squares for b in blocks])
        return PairPartials(
            unit[first],
            key[first],
            summed([b.rows for b in blocks]).astype(np.int64),
            summed([b.deviations for b in blocks]),
            squares,
        )


class CompactingCombineFn(beam.CombineFn):
    """A combiner whose accumulator is a list of blocks, compacted into one (`_merge`) every
    COMPACT_EVERY added blocks and whenever the runner merges or extracts."""

    def _merge(self, items: list) -> Any:
        raise NotImplementedError

    def create_accumulator(self) -> list:
        return []

    def _compact(self, items: list) -> list:
        return items if len(items) <= 1 else [self._merge(items)]

    def add_input(self, items, item):
        items.append(item)
        return self._compact(items) if len(items) >= COMPACT_EVERY else items

    def merge_accumulators(self, accumulators):
        return self._compact([item for items in accumulators for item in items])

    def compact(self, items):
        return self._compact(items)

    def extract_output(self, items):
        compacted = self._compact(items)
        return compacted[0] if compacted else None
