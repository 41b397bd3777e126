"""Sampling priorities for contribution bounding: keyed hashes of a per-run secret salt.

Every engine bounds contributions by keeping the entries of lowest priority (see `bounding`).
A priority is a deterministic function of the run's salt and of what it ranks, so any re-run of
a task (a Spark retry, a recomputed stage, a Beam bundle retried on another worker) keeps the
same rows:

- a row, for Linf: xxhash64(linf secret, `_source_file`, `_row`);
- a (privacy unit, partition) pair, for L0: xxhash64(L0 secret, key columns..., privacy unit).

The hash is Spark's `xxhash64` (XXH64 chained over its arguments, seed 42), so Spark computes it
in the JVM with no Python per row; here it is the same function in numpy (8- and 4-byte inputs,
vectorised) and the `xxhash` library (text), so the three engines keep the same rows given the
same salt and the same row identities. The two 64-bit secrets come from the 16-byte salt
through BLAKE2b; they never appear in a log, a manifest or a Spark plan (Spark receives them as
data, see `engines.spark`), and `SamplingKeys` does not print them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import xxhash

SALT_BYTES = 16
SPARK_SEED = 42  # the seed Spark's xxhash64 starts its chain with
_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
_EPOCH = dt.date(1970, 1, 1)


def new_salt(seed: int | None = None) -> bytes:
    """A fresh secret salt for one run; or, for tests that pass a seed, one derived from it."""
    if seed is None:
        return secrets.token_bytes(SALT_BYTES)
    return hashlib.blake2b(
        str(seed).encode(), digest_size=SALT_BYTES, person=b"dppipeline-seed"
    ).digest()


@dataclass(frozen=True)
class SamplingKeys:
    """The two 64-bit secrets (signed, as Spark longs) that key the Linf and L0 priorities."""

    linf: int = field(repr=False)
    l0: int = field(repr=False)

    @classmethod
    def from_salt(cls, salt: bytes) -> SamplingKeys:
        if len(salt) < SALT_BYTES:
            raise ValueError(f"a sampling salt has at least {SALT_BYTES} bytes")
        digest = hashlib.blake2b(salt, digest_size=16, person=b"dppipeline-keys").digest()
        return cls(
            linf=int.from_bytes(digest[:8], "little", signed=True),
            l0=int.from_bytes(digest[8:], "little", signed=True),
        )


# ---------------------------------------------------------------------------------------------
# XXH64 as Spark's xxhash64 computes it (org.apache.spark.sql.catalyst.expressions.XXH64)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _avalanche(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    return h ^ (h >> np.uint64(32))


def _as_seed(seed: np.ndarray | int) -> np.ndarray:
    return np.asarray(seed, dtype=np.int64).view(np.uint64)


def hash_longs(values: np.ndarray, seed: np.ndarray | int) -> np.ndarray:
    """XXH64 of each int64 (8 bytes, little-endian) with its seed: Spark's hashLong."""
    v = np.asarray(values, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        h = _as_seed(seed) + _P5 + np.uint64(8)
        h = h ^ (_rotl(v * _P2, 31) * _P1)
        h = _rotl(h, 27) * _P1 + _P4
        return _avalanche(h).view(np.int64)


def hash_ints(values: np.ndarray, seed: np.ndarray | int) -> np.ndarray:
    """XXH64 of each int32 (4 bytes) with its seed: Spark's hashInt (dates are days)."""
    v = np.asarray(values, dtype=np.int64).astype(np.uint32).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = _as_seed(seed) + _P5 + np.uint64(4)
        h = h ^ (v * _P1)
        h = _rotl(h, 23) * _P2 + _P3
        return _avalanche(h).view(np.int64)


def hash_texts(values: Sequence[str], seed: np.ndarray | int) -> np.ndarray:
    """XXH64 of each text's UTF-8 bytes with its seed (one library call per text)."""
    seeds = np.broadcast_to(_as_seed(seed), (len(values),))
    out = np.fromiter(
        (
            xxhash.xxh64_intdigest(str(v).encode(), int(s))
            for v, s in zip(values, seeds, strict=True)
        ),
        dtype=np.uint64,
        count=len(values),
    )
    return out.view(np.int64)


def hash_column(values: np.ndarray | pd.Series, kind: str, seed: np.ndarray | int) -> np.ndarray:
    """One key or privacy-unit column, hashed as Spark hashes its type: int64 as a long, a
    date (day or week bucket) as an int of days since 1970, anything else as text."""
    if kind == "int64":
        return hash_longs(np.asarray(values, dtype=np.int64), seed)
    if kind == "date":
        days = np.array([(v - _EPOCH).days for v in values], dtype=np.int64)
        return hash_ints(days, seed)
    return hash_texts([str(v) for v in values], seed)


def start(secret: int) -> int:
    """The chain's state after hashing the secret (a long) first, as Spark does."""
    return int(hash_longs(np.array([secret]), SPARK_SEED)[0])


# ---------------------------------------------------------------------------------------------
# Priorities


def row_priorities(
    keys: SamplingKeys, files: Sequence[str], file_codes: np.ndarray, rows: np.ndarray
) -> np.ndarray:
    """Linf priority of each row: xxhash64(linf secret, file text, row), the file given as a
    code into `files` (each file's text is hashed once)."""
    file_seeds = hash_texts(list(files), start(keys.linf))
    return hash_longs(rows, file_seeds[np.asarray(file_codes, dtype=np.int64)])


def partition_seeds(
    keys: SamplingKeys, key_values: pd.DataFrame, kinds: Sequence[str]
) -> np.ndarray:
    """Per partition key (row of `key_values`, columns in key order), the chain state after the
    L0 secret and the key columns; a global total (no column) has one key."""
    seeds = np.full(len(key_values), start(keys.l0), dtype=np.int64)
    for column, kind in zip(key_values.columns, kinds, strict=True):
        seeds = hash_column(key_values[column].to_numpy(), kind, seeds)
    return seeds


def unit_kind_of(units: np.ndarray) -> str:
    """How a privacy-unit column hashes: `int64` for integers, else as text (a string unit)."""
    return "int64" if np.issubdtype(units.dtype, np.integer) else "string"


def pair_priorities(seeds: np.ndarray, units: np.ndarray, unit_kind: str) -> np.ndarray:
    """L0 priority of each (privacy unit, partition) pair, from its partition's seed."""
    return hash_column(units, unit_kind, seeds)
