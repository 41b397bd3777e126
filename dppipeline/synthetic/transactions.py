"""Synthetic card transactions shaped like the fraud-detection handbook's simulator.

The Packt book "Privacy-Preserving Machine Learning" uses the data set of the "Reproducible
Machine Learning for Credit Card Fraud Detection" handbook; this module reproduces its generative
model (customers and terminals on a 100x100 map, customers buying at terminals near home) without
its per-customer Python loops, so millions of rows take seconds. It gives the pipeline realistic
input: uneven contributions per customer (the privacy unit) and many terminals (partitions).

Randomness: the population comes from `default_rng(seed)` and day `d` from its own child stream
`SeedSequence(seed, spawn_key=(d,))`, so a day's rows depend only on the seed, the population
arguments and `d`: never on the output format or on how many days are generated.
"""

from __future__ import annotations

import datetime
import numbers
import os
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from dppipeline.spec.schema import load_schema
from dppipeline.storage import Location, is_uri

__all__ = ["FORMATS", "GenerateSummary", "Population", "build_population", "day_path", "generate"]

FORMATS: tuple[str, ...] = ("csv", "parquet")
# The tables `generate` writes, each under its shipped schema (`schemas/<table>.json`).
TABLES: tuple[str, ...] = ("transactions", "book_transactions", "card_payments")
FRAUD_AMOUNT = 220.0  # the handbook's fraud scenario 1: any amount above is fraudulent
MERCHANT_CATEGORIES = (
    "grocery", "restaurants", "fuel", "clothing", "electronics", "travel", "health", "leisure",
)  # fmt: skip
COUNTRIES = ("BE", "DE", "FR", "LU", "NL")  # by the terminal's x on the map
CHANNELS = ("pos", "pos", "pos", "pos", "pos", "contactless", "contactless", "contactless",
            "online", "online")  # fmt: skip
MAP_SIZE = 100.0
DEFAULT_RADIUS = 5.0
SECONDS_PER_DAY = 86_400
TIME_MEAN_S = SECONDS_PER_DAY / 2
TIME_STD_S = 20_000.0
# Bounds the customers x terminals distance block held in memory while building neighbourhoods.
_DISTANCE_BLOCK_CELLS = 1 << 22
_US_PER_S = 1_000_000


@dataclass(frozen=True)
class GenerateSummary:
    """What `generate` wrote: enough for a caller to log it or to find the files."""

    output: Path | Location  # a local folder, or a folder on a store (a URI)
    fmt: str
    days: int
    rows: int
    files: list[Path | Location]


@dataclass(frozen=True)
class Population:
    """Customer and terminal profiles plus each customer's reachable terminals.

    `customers` has CUSTOMER_ID, x_customer_id, y_customer_id, mean_amount, std_amount and
    mean_nb_tx_per_day (the handbook's column names); `terminals` has TERMINAL_ID, x_terminal_id
    and y_terminal_id. Customer `c` may buy at `terminal_ids[offsets[c]:offsets[c + 1]]` (CSR
    layout, ascending ids): the terminals strictly within `radius` of home, or the single nearest
    terminal when none is, so that a day's terminal picks are one vectorised gather.
    """

    customers: pd.DataFrame
    terminals: pd.DataFrame
    offsets: np.ndarray
    terminal_ids: np.ndarray
    radius: float


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum} (got {value!r})")
    return int(value)


def _check_radius(radius: object) -> float:
    if (
        isinstance(radius, bool)
        or not isinstance(radius, numbers.Real)
        or not np.isfinite(float(radius))
        or float(radius) < 0
    ):
        raise ValueError(f"radius: must be a finite number >= 0 (got {radius!r})")
    return float(radius)


def _nearest(cust_xy: np.ndarray, term_xy: np.ndarray) -> np.ndarray:
    """Index of each customer's nearest terminal: brute force in blocks of bounded memory."""
    block = max(1, _DISTANCE_BLOCK_CELLS // len(term_xy))
    out = np.empty(len(cust_xy), dtype=np.int64)
    for start in range(0, len(cust_xy), block):
        part = cust_xy[start : start + block]
        d2 = (part[:, None, 0] - term_xy[None, :, 0]) ** 2
        d2 += (part[:, None, 1] - term_xy[None, :, 1]) ** 2
        out[start : start + block] = d2.argmin(axis=1)
    return out


def _neighbourhoods(
    cust_xy: np.ndarray, term_xy: np.ndarray, radius: float
) -> tuple[np.ndarray, np.ndarray]:
    """CSR (offsets, terminal ids) of terminals strictly within `radius`, nearest as a fallback.

    Terminals are bucketed on a grid of cells at least `radius` wide, so a customer's candidates
    are the terminals of its 3x3 block of cells: about 9 r^2/100^2 of all terminals instead of
    all of them, which keeps 10x the default population in well under a second. Customers are
    processed in blocks so the candidate pairs held at once stay bounded.
    """
    n_cust, n_term = len(cust_xy), len(term_xy)
    pair_keys: list[np.ndarray] = []  # customer * n_term + terminal, for accepted pairs
    if radius > 0:
        grid = max(1, min(1024, int(MAP_SIZE // radius)))
        cell_size = MAP_SIZE / grid

        def cell_xy(xy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            cell = np.minimum((xy // cell_size).astype(np.int64), grid - 1)
            return cell[:, 0], cell[:, 1]

        tcx, tcy = cell_xy(term_xy)
        by_cell = np.argsort(tcx * grid + tcy, kind="stable")
        cell_start = np.searchsorted((tcx * grid + tcy)[by_cell], np.arange(grid * grid + 1))
        ccx, ccy = cell_xy(cust_xy)
        per_customer = max(1.0, n_term * min(1.0, 9 / (grid * grid)))
        block = max(1, int(_DISTANCE_BLOCK_CELLS // per_customer))
        r2 = radius * radius
        for start in range(0, n_cust, block):
            cust = np.arange(start, min(start + block, n_cust), dtype=np.int64)
            # One (customer, neighbouring cell) row per valid offset: its slice of `by_cell`.
            owners, lo, hi = [], [], []
            for dx in (-1, 0, 1):
                for dy in (-1, 0, 1):
                    nx, ny = ccx[cust] + dx, ccy[cust] + dy
                    ok = (nx >= 0) & (nx < grid) & (ny >= 0) & (ny < grid)
                    cell = nx[ok] * grid + ny[ok]
                    owners.append(cust[ok])
                    lo.append(cell_start[cell])
                    hi.append(cell_start[cell + 1])
            owner, first = np.concatenate(owners), np.concatenate(lo)
            length = np.concatenate(hi) - first
            row = np.repeat(np.arange(len(owner)), length)
            within_row = np.arange(len(row)) - np.repeat(np.cumsum(length) - length, length)
            cand_c = owner[row]
            cand_t = by_cell[first[row] + within_row]
            d2 = (cust_xy[cand_c, 0] - term_xy[cand_t, 0]) ** 2
            d2 += (cust_xy[cand_c, 1] - term_xy[cand_t, 1]) ** 2
            keep = d2 < r2
            pair_keys.append(cand_c[keep] * n_term + cand_t[keep])
    keys = np.concatenate(pair_keys) if pair_keys else np.empty(0, dtype=np.int64)
    counts = np.bincount(keys // n_term, minlength=n_cust)
    lonely = np.flatnonzero(counts == 0)
    if len(lonely):
        keys = np.concatenate([keys, lonely * n_term + _nearest(cust_xy[lonely], term_xy)])
        counts[lonely] = 1
    keys.sort()  # by customer, then terminal id: the CSR order
    offsets = np.zeros(n_cust + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets, keys % n_term


def build_population(
    customers: int, terminals: int, seed: int = 0, radius: float = DEFAULT_RADIUS
) -> Population:
    """Draw the handbook's customer and terminal profiles; exposed so tests can check geography.

    Per customer: home uniform on the map, mean amount uniform in [5, 100], std = mean / 2, mean
    number of transactions per day uniform in [0, 4]. Terminals: uniform on the map.
    """
    customers = _check_int("customers", customers, 1)
    terminals = _check_int("terminals", terminals, 1)
    seed = _check_int("seed", seed, 0)
    radius = _check_radius(radius)

    rng = np.random.default_rng(seed)
    cust_xy = rng.uniform(0.0, MAP_SIZE, size=(customers, 2))
    mean_amount = rng.uniform(5.0, 100.0, size=customers)
    mean_nb_tx = rng.uniform(0.0, 4.0, size=customers)
    term_xy = rng.uniform(0.0, MAP_SIZE, size=(terminals, 2))
    offsets, terminal_ids = _neighbourhoods(cust_xy, term_xy, radius)

    customer_table = pd.DataFrame(
        {
            "CUSTOMER_ID": np.arange(customers, dtype=np.int64),
            "x_customer_id": cust_xy[:, 0],
            "y_customer_id": cust_xy[:, 1],
            "mean_amount": mean_amount,
            "std_amount": mean_amount / 2,
            "mean_nb_tx_per_day": mean_nb_tx,
        }
    )
    terminal_table = pd.DataFrame(
        {
            "TERMINAL_ID": np.arange(terminals, dtype=np.int64),
            "x_terminal_id": term_xy[:, 0],
            "y_terminal_id": term_xy[:, 1],
        }
    )
    return Population(customer_table, terminal_table, offsets, terminal_ids, radius)


def _daily_rates(population: Population, tx_per_day: int | None) -> np.ndarray:
    """Per-customer Poisson rates, scaled so their sum (the expected rows a day) is tx_per_day."""
    base = population.customers["mean_nb_tx_per_day"].to_numpy()
    if tx_per_day is None:
        return base
    total = base.sum()
    if total <= 0:  # only reachable with all-zero uniform draws; spread the volume evenly
        return np.full(len(base), tx_per_day / len(base))
    return base * (tx_per_day / total)


def _day_table(
    population: Population,
    rates: np.ndarray,
    rng: np.random.Generator,
    *,
    day_start_us: int,
    first_id: int,
    schema: pa.Schema,
    day_index: int = 0,
    table: str = "transactions",
) -> pa.Table:
    """One day's transactions, sorted by time (ties by customer) and numbered from first_id,
    with the columns of `table`. The book's and the card table's extra columns come from
    the same draws (no extra random numbers), so every table holds the same transactions."""
    n_per_customer = rng.poisson(rates)
    cust = np.repeat(np.arange(len(rates), dtype=np.int64), n_per_customer)
    n = len(cust)

    # Whole seconds, so the CSV layout (HH:MM:SS) holds exactly what Parquet holds.
    seconds = np.clip(np.floor(rng.normal(TIME_MEAN_S, TIME_STD_S, n)), 0, SECONDS_PER_DAY - 1)

    mean = population.customers["mean_amount"].to_numpy()[cust]
    std = population.customers["std_amount"].to_numpy()[cust]
    amount = rng.normal(mean, std)
    negative = np.flatnonzero(amount < 0)
    amount[negative] = rng.uniform(0.0, 2 * mean[negative])
    amount = np.round(amount, 2)

    offsets = population.offsets
    start = offsets[cust]
    pick = start + rng.integers(0, offsets[cust + 1] - start)
    terminal = population.terminal_ids[pick]

    order = np.argsort(seconds, kind="stable")
    timestamps = day_start_us + seconds[order].astype(np.int64) * _US_PER_S
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    amount, terminal, cust = amount[order], terminal[order], cust[order]
    columns = [
        pa.array(ids),
        pa.array(timestamps, type=pa.timestamp("us")),
        pa.array(cust),
        pa.array(terminal),
        pa.array(amount),
    ]
    if table == "book_transactions":
        fraud = (amount > FRAUD_AMOUNT).astype(np.int64)
        columns += [
            pa.array(day_index * SECONDS_PER_DAY + seconds[order].astype(np.int64)),
            pa.array(np.full(n, day_index, dtype=np.int64)),
            pa.array(fraud),
            pa.array(fraud),  # scenario 1 (0: genuine)
        ]
    elif table == "card_payments":
        columns = _card_columns(
            population,
            ids=ids,
            timestamps=timestamps,
            cards=cust,
            merchants=terminal,
            amount=amount,
        )
    return pa.Table.from_arrays(columns, schema=schema)


def _card_columns(
    population: Population,
    *,
    ids: np.ndarray,
    timestamps: np.ndarray,
    cards: np.ndarray,
    merchants: np.ndarray,
    amount: np.ndarray,
) -> list[pa.Array]:
    """The card table: a merchant's category and country are its terminal's (category by
    id, country by its place on the map); the channel is spread over payments by id."""
    x = population.terminals["x_terminal_id"].to_numpy()[merchants]
    country = np.minimum((x / MAP_SIZE * len(COUNTRIES)).astype(np.int64), len(COUNTRIES) - 1)
    category = (merchants * 2654435761) % len(MERCHANT_CATEGORIES)
    channel = (ids * 40503) % len(CHANNELS)
    return [
        pa.array(ids),
        pa.array(timestamps, type=pa.timestamp("us")),
        pa.array(cards),
        pa.array(merchants),
        pa.array(np.asarray(MERCHANT_CATEGORIES)[category]),
        pa.array(np.asarray(COUNTRIES)[country]),
        pa.array(np.asarray(CHANNELS)[channel]),
        pa.array(amount),
    ]


def _write_atomically(path: Path, write: Callable[[str], None]) -> None:
    """Write to a hidden temporary file beside `path`, then rename it into place.

    Readers never see a half-written file; the leading dot makes dataset readers skip the
    temporary if the process dies before the rename. The writer creates the file itself (not
    mkstemp, whose 0600 mode would survive the rename), so the umask decides permissions.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = str(path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_csv(table: pa.Table, path: Path) -> None:
    # timestamp[s] renders as "YYYY-MM-DD HH:MM:SS"; the safe cast fails loudly on sub-seconds.
    as_seconds = table.set_column(
        1, table.field(1).with_type(pa.timestamp("s")), table.column(1).cast(pa.timestamp("s"))
    )
    options = pacsv.WriteOptions(quoting_header="none", quoting_style="none")
    _write_atomically(path, lambda tmp: pacsv.write_csv(as_seconds, tmp, write_options=options))


def _write_parquet(table: pa.Table, path: Path) -> None:
    _write_atomically(path, lambda tmp: pq.write_table(table, tmp))


def day_path(output: Path, fmt: str, day: datetime.date) -> Path:
    """Where a day's file lives in each layout (the readers' partitioning contract)."""
    if fmt == "csv":
        return output / f"{day.isoformat()}.csv"
    return output / f"date={day.isoformat()}" / "part-00000.parquet"


def generate(
    output: str | Path,
    *,
    fmt: str = "parquet",
    customers: int = 5000,
    terminals: int = 1000,
    days: int = 30,
    start_date: datetime.date = datetime.date(2026, 1, 1),
    tx_per_day: int | None = 25000,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    table: str = "transactions",
    single_file: bool = False,
) -> GenerateSummary:
    """Write `days` days of synthetic transactions under `output`, one file per day (or,
    `single_file`, all in `output/<table>.<fmt>`, as the book's `transactions.csv`), with the
    columns of `table` (`TABLES`).

    The same arguments give byte-identical files. TRANSACTION_ID runs from 0 in time order over
    all days written. Existing files of other days are left alone; the days generated are
    replaced atomically. `tx_per_day=None` keeps the handbook's unscaled rates (about 2 a day
    per customer).
    """
    if fmt not in FORMATS:
        allowed = ", ".join(repr(f) for f in FORMATS)
        raise ValueError(f"fmt: must be one of {allowed} (got {fmt!r})")
    if table not in TABLES:
        raise ValueError(f"table: must be one of {', '.join(TABLES)} (got {table!r})")
    customers = _check_int("customers", customers, 1)
    terminals = _check_int("terminals", terminals, 1)
    days = _check_int("days", days, 1)
    seed = _check_int("seed", seed, 0)
    if tx_per_day is not None:
        tx_per_day = _check_int("tx_per_day", tx_per_day, 0)
    if not isinstance(start_date, datetime.date) or isinstance(start_date, datetime.datetime):
        raise ValueError(f"start_date: must be a datetime.date (got {start_date!r})")
    try:
        start_date + datetime.timedelta(days=days - 1)
    except OverflowError:
        raise ValueError("days: start_date + days - 1 must be a valid date") from None
    where = Location.of(output)  # a URI goes to its store, never to a local folder `s3:`
    if where.exists() and not where.is_dir():
        raise ValueError(f"output: must be a folder, not a file ({where.display()})")
    if where.is_local:
        folder = where.path if is_uri(os.fspath(output)) else Path(output)  # as given
        return _generate(folder, folder, fmt=fmt, customers=customers,
                         terminals=terminals, days=days, start_date=start_date,
                         tx_per_day=tx_per_day, seed=seed, progress=progress, table=table,
                         single_file=single_file)  # fmt: skip
    # On a store: each file written locally first, then uploaded whole (one PUT) and removed.
    with tempfile.TemporaryDirectory(prefix="dppipeline-generate-") as scratch:
        return _generate(Path(scratch), where, fmt=fmt, customers=customers,
                         terminals=terminals, days=days, start_date=start_date,
                         tx_per_day=tx_per_day, seed=seed, progress=progress, table=table,
                         single_file=single_file)  # fmt: skip


def _generate(
    local: Path,
    output: Path | Location,
    *,
    fmt: str,
    customers: int,
    terminals: int,
    days: int,
    start_date: datetime.date,
    tx_per_day: int | None,
    seed: int,
    progress: Callable[[str], None] | None,
    table: str,
    single_file: bool,
) -> GenerateSummary:
    """`generate` into the folder `local`; each file is then moved to its place under
    `output` when that is a store (else `output` is `local`)."""

    def place(path: Path) -> Path | Location:
        if isinstance(output, Path):
            return path
        target = output.join(*path.relative_to(local).parts)
        target.write_bytes(path.read_bytes())
        path.unlink()
        return target

    population = build_population(customers, terminals, seed)
    rates = _daily_rates(population, tx_per_day)
    schema = load_schema(table).to_arrow()
    writer = _write_csv if fmt == "csv" else _write_parquet
    epoch = datetime.date(1970, 1, 1)
    report_every = max(1, -(-days // 10))

    rows = 0
    files: list[Path] = []
    tables: list[pa.Table] = []
    for d in range(days):
        day = start_date + datetime.timedelta(days=d)
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(d,)))
        day_start_us = (day - epoch).days * SECONDS_PER_DAY * _US_PER_S
        day_rows = _day_table(
            population,
            rates,
            rng,
            day_start_us=day_start_us,
            first_id=rows,
            schema=schema,
            day_index=d,
            table=table,
        )
        if single_file:
            tables.append(day_rows)
        else:
            path = day_path(local, fmt, day)
            writer(day_rows, path)
            files.append(place(path))
        rows += day_rows.num_rows
        if progress is not None and ((d + 1) % report_every == 0 or d + 1 == days):
            progress(f"generated {d + 1}/{days} days, {rows:,} rows")
    if single_file:
        path = local / f"{table}.{fmt}"
        writer(pa.concat_tables(tables), path)
        files.append(place(path))
    return GenerateSummary(output=output, fmt=fmt, days=days, rows=rows, files=files)
