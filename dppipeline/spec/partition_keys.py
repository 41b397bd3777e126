"""The partition-key grammar: time keys, bucket keys and the public key sources a spec names.

A `partition_by` entry is a column, a time key of the job's time column (`TIME_BUCKETS`), or
a bucket key `bucket(COLUMN, e0, e1, ...)` (the canonical text of `{bucket: COLUMN, edges:
[e0, e1, ...]}`). A public key source is a file, an integer range 'A..B' or `input_range`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

# Derived partition keys from the job's time column (`input.time_column`, TX_DATETIME by default).
TIME_BUCKETS = ("hour", "day", "week", "month", "year")
# `bucket(COLUMN, e0, e1, ...)`: a numeric column cut at public edges.
BUCKET_TEXT = re.compile(r"^\s*bucket\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*((?:,[^,()]+)+)\)\s*$")
# An integer range 'A..B' of public keys (both ends included).
KEY_RANGE = re.compile(r"^\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*$")
INPUT_RANGE = "input_range"  # public keys of a time bucket: every bucket of the input's days


@dataclass(frozen=True)
class BucketKey:
    """A numeric column cut at public edges e0 < e1 < ... < ek into the keys `[e0, e1)`, ...,
    `[ek, inf)` (text); rows below e0 are in no bucket and not counted. Every bucket is
    released (the edges are public), so a query keyed by buckets alone needs no selection."""

    column: str
    edges: tuple[float, ...]

    @property
    def name(self) -> str:
        """The release's key column."""
        return f"{self.column}_bucket"

    @property
    def labels(self) -> list[str]:
        ends = [*self.edges[1:], math.inf]
        return [f"[{_edge(a)}, {_edge(b)})" for a, b in zip(self.edges, ends, strict=True)]

    @property
    def text(self) -> str:
        """Its canonical `partition_by` entry."""
        return f"bucket({self.column}, {', '.join(_edge(e) for e in self.edges)})"


def _edge(value: float) -> str:
    if math.isinf(value):
        return "inf"
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def bucket_key(entry: str) -> BucketKey | None:
    """The bucket a canonical `partition_by` entry describes; None for a column or time key."""
    match = BUCKET_TEXT.match(entry)
    if not match:
        return None
    edges = tuple(float(e) for e in match.group(2).split(",")[1:])
    return BucketKey(match.group(1), edges)


def key_name(entry: str) -> str:
    """The release column of a `partition_by` entry."""
    bucket = bucket_key(entry)
    return entry if bucket is None else bucket.name


def lies_within(key_file: str, data: str) -> bool:
    """Whether `key_file` is the input `data` or lies in its folder (paths or URIs)."""
    if "://" in key_file or "://" in data:
        key, top = key_file.rstrip("/"), data.rstrip("/")
        return key == top or key.startswith(top + "/")
    key_path, top_path = Path(key_file).resolve(), Path(data).resolve()
    return key_path == top_path or top_path in key_path.parents


def is_file_source(source: str) -> bool:
    """A public key source that names a file (not a range 'A..B' nor 'input_range')."""
    return source != INPUT_RANGE and not KEY_RANGE.match(source)
