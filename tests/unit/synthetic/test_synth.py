"""Tests for the synthetic transaction generator: layout, schema, determinism, model rules."""

from __future__ import annotations

import datetime
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from dppipeline.spec.schema import schema_dir, transactions_schema
from dppipeline.synthetic.transactions import (
    DEFAULT_RADIUS,
    GenerateSummary,
    build_population,
    generate,
)

SMALL = {"customers": 300, "terminals": 80, "days": 3, "tx_per_day": 1500}
START = datetime.date(2026, 1, 1)
DATES = [(START + datetime.timedelta(days=d)).isoformat() for d in range(SMALL["days"])]
# Sigmas of slack on Poisson counts. Any seed fails a 6-sigma two-sided check with probability
# about 2e-9 per count (normal approximation), i.e. never in practice; the seeds here are fixed
# anyway, so a failure means the rates are wrong, not bad luck.
SIGMAS = 6


def _expected_arrow_schema() -> pa.Schema:
    """The schema straight from the JSON file, independently of dppipeline.spec.schema."""
    raw = json.loads((schema_dir() / "transactions.json").read_text())
    types = {"int64": pa.int64(), "float64": pa.float64(), "timestamp[us]": pa.timestamp("us")}
    return pa.schema(
        [pa.field(f["name"], types[f["type"]], nullable=f["nullable"]) for f in raw["fields"]]
    )


def _read_parquet_dir(root: Path) -> pa.Table:
    files = sorted(root.glob("date=*/part-00000.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files])


def _read_csv_dir(root: Path) -> pa.Table:
    schema = transactions_schema().to_arrow()
    options = pacsv.ConvertOptions(column_types={f.name: f.type for f in schema})
    tables = [pacsv.read_csv(f, convert_options=options) for f in sorted(root.glob("*.csv"))]
    return pa.concat_tables(tables).cast(schema)


def _file_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def parquet_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GenerateSummary]:
    root = tmp_path_factory.mktemp("parquet") / "tx"
    return root, generate(root, fmt="parquet", seed=7, **SMALL)


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GenerateSummary]:
    root = tmp_path_factory.mktemp("csv") / "tx"
    return root, generate(root, fmt="csv", seed=7, **SMALL)


def test_parquet_schema_is_exactly_the_json_schema(parquet_run):
    root, _ = parquet_run
    expected = _expected_arrow_schema()
    assert expected.names == [
        "TRANSACTION_ID",
        "TX_DATETIME",
        "CUSTOMER_ID",
        "TERMINAL_ID",
        "TX_AMOUNT",
    ]
    for f in sorted(root.rglob("*.parquet")):
        assert pq.read_schema(f).remove_metadata().equals(expected), f


def test_csv_header_and_datetime_format(csv_run):
    root, _ = csv_run
    lines = (root / f"{DATES[0]}.csv").read_text().splitlines()
    assert lines[0] == ",".join(_expected_arrow_schema().names)
    first_datetime = lines[1].split(",")[1]
    parsed = datetime.datetime.strptime(first_datetime, "%Y-%m-%d %H:%M:%S")
    assert parsed.date() == START


def test_layout_paths(parquet_run, csv_run):
    proot, psummary = parquet_run
    croot, csummary = csv_run
    expected_parquet = [proot / f"date={d}" / "part-00000.parquet" for d in DATES]
    expected_csv = [croot / f"{d}.csv" for d in DATES]
    assert psummary.files == expected_parquet
    assert csummary.files == expected_csv
    # Nothing else left behind (no temporary files).
    assert sorted(p for p in proot.rglob("*") if p.is_file()) == expected_parquet
    assert sorted(croot.iterdir()) == expected_csv
    assert (psummary.output, psummary.fmt, psummary.days) == (proot, "parquet", SMALL["days"])
    reference = proot.parent / "reference.txt"
    reference.write_text("")  # created the ordinary way: the umask decides its mode
    for f in expected_parquet + expected_csv:
        assert f.stat().st_mode & 0o777 == reference.stat().st_mode & 0o777, f
    assert psummary.rows == _read_parquet_dir(proot).num_rows


def test_csv_and_parquet_hold_the_same_rows(parquet_run, csv_run):
    ptable = _read_parquet_dir(parquet_run[0])
    ctable = _read_csv_dir(csv_run[0])
    assert ptable.num_rows > 0
    assert ctable.equals(ptable.replace_schema_metadata(None))
    assert parquet_run[1].rows == csv_run[1].rows


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_deterministic_bytes_and_seed_sensitive(tmp_path, fmt):
    kwargs = {"fmt": fmt, "customers": 200, "terminals": 50, "days": 2, "tx_per_day": 500}
    a = _file_bytes(generate(tmp_path / "a", seed=3, **kwargs).output)
    b = _file_bytes(generate(tmp_path / "b", seed=3, **kwargs).output)
    c = _file_bytes(generate(tmp_path / "c", seed=4, **kwargs).output)
    assert a == b
    assert a.keys() == c.keys()
    assert all(a[name] != c[name] for name in a)


def test_day_draws_do_not_depend_on_number_of_days(tmp_path):
    kwargs = {"customers": 200, "terminals": 50, "tx_per_day": 500, "seed": 1}
    two = _file_bytes(generate(tmp_path / "two", days=2, **kwargs).output)
    three = _file_bytes(generate(tmp_path / "three", days=3, **kwargs).output)
    assert two == {k: three[k] for k in two}


def test_transaction_ids_unique_consecutive_in_time_order(parquet_run):
    root, _ = parquet_run
    table = _read_parquet_dir(root)
    ids = table.column("TRANSACTION_ID").to_numpy()
    assert len(np.unique(ids)) == len(ids)
    np.testing.assert_array_equal(ids, np.arange(len(ids)))
    times = table.column("TX_DATETIME").to_numpy()
    assert (np.diff(times) >= np.timedelta64(0)).all()


def test_each_file_holds_its_own_day(parquet_run):
    _, summary = parquet_run
    for day, path in zip(DATES, summary.files, strict=True):
        times = pq.read_table(path).column("TX_DATETIME").to_numpy()
        assert (times.astype("datetime64[D]") == np.datetime64(day)).all()
        assert (times.astype("datetime64[s]") == times).all()  # whole seconds


def test_daily_counts_close_to_tx_per_day(tmp_path):
    tx_per_day, days = 4000, 5
    summary = generate(
        tmp_path / "tx", customers=400, terminals=50, days=days, tx_per_day=tx_per_day, seed=11
    )
    counts = [pq.read_metadata(f).num_rows for f in summary.files]
    # A day's count is a sum of independent Poissons: Poisson(tx_per_day), variance tx_per_day.
    for count in counts:
        assert abs(count - tx_per_day) <= SIGMAS * math.sqrt(tx_per_day), counts
    total = days * tx_per_day
    assert abs(sum(counts) - total) <= SIGMAS * math.sqrt(total), counts
    assert summary.rows == sum(counts)


def test_unscaled_rates_follow_the_handbook(tmp_path):
    customers, days = 300, 4
    expected = days * build_population(customers, 50, seed=5).customers["mean_nb_tx_per_day"].sum()
    summary = generate(
        tmp_path / "tx", customers=customers, terminals=50, days=days, tx_per_day=None, seed=5
    )
    assert abs(summary.rows - expected) <= SIGMAS * math.sqrt(expected)


def test_zero_tx_per_day_writes_empty_days(tmp_path):
    summary = generate(tmp_path / "tx", fmt="csv", days=2, tx_per_day=0, customers=10, terminals=5)
    assert summary.rows == 0
    for f in summary.files:
        assert f.read_text().splitlines() == [",".join(transactions_schema().names)]


def _distances(pop, cust: np.ndarray, term: np.ndarray) -> np.ndarray:
    c = pop.customers
    t = pop.terminals
    dx = c["x_customer_id"].to_numpy()[cust] - t["x_terminal_id"].to_numpy()[term]
    dy = c["y_customer_id"].to_numpy()[cust] - t["y_terminal_id"].to_numpy()[term]
    return np.hypot(dx, dy)


def test_population_neighbourhoods_are_radius_or_nearest():
    customers, terminals = 400, 60  # sparse enough that some customers have no terminal in r
    pop = build_population(customers, terminals, seed=2, radius=DEFAULT_RADIUS)
    c = pop.customers
    assert c["CUSTOMER_ID"].tolist() == list(range(customers))
    assert ((c["mean_amount"] >= 5) & (c["mean_amount"] <= 100)).all()
    np.testing.assert_allclose(c["std_amount"], c["mean_amount"] / 2)
    assert ((c["mean_nb_tx_per_day"] >= 0) & (c["mean_nb_tx_per_day"] <= 4)).all()
    assert pop.offsets[0] == 0 and pop.offsets[-1] == len(pop.terminal_ids)

    all_t = np.arange(terminals)
    sizes = np.diff(pop.offsets)
    assert (sizes >= 1).all()
    lonely = 0
    for cid in range(customers):  # brute-force reference, one customer at a time
        dist = _distances(pop, np.full(terminals, cid), all_t)
        got = pop.terminal_ids[pop.offsets[cid] : pop.offsets[cid + 1]].tolist()
        within = np.flatnonzero(dist < DEFAULT_RADIUS).tolist()
        if within:
            assert got == within, cid
        else:
            lonely += 1
            assert got == [int(dist.argmin())], cid
    assert 0 < lonely < customers  # both branches exercised
    assert sizes.max() > 1
    again = build_population(customers, terminals, seed=2, radius=DEFAULT_RADIUS)
    other = build_population(customers, terminals, seed=3, radius=DEFAULT_RADIUS)
    assert again.customers.equals(c) and again.terminals.equals(pop.terminals)
    assert not other.customers.equals(c) and not other.terminals.equals(pop.terminals)


@pytest.mark.parametrize("radius", [0.0, 0.5, 5.0, 33.4, 150.0])
def test_neighbourhoods_match_brute_force_at_any_radius(radius):
    pop = build_population(500, 200, seed=4, radius=radius)
    c, t = pop.customers, pop.terminals
    dist = np.hypot(
        c["x_customer_id"].to_numpy()[:, None] - t["x_terminal_id"].to_numpy()[None, :],
        c["y_customer_id"].to_numpy()[:, None] - t["y_terminal_id"].to_numpy()[None, :],
    )
    allowed = dist < radius
    lonely = ~allowed.any(axis=1)
    allowed[np.flatnonzero(lonely), dist[lonely].argmin(axis=1)] = True
    np.testing.assert_array_equal(pop.offsets, np.r_[0, np.cumsum(allowed.sum(axis=1))])
    np.testing.assert_array_equal(pop.terminal_ids, np.nonzero(allowed)[1])


def test_customers_buy_only_at_reachable_terminals(parquet_run):
    root, _ = parquet_run
    table = _read_parquet_dir(root)
    cust = table.column("CUSTOMER_ID").to_numpy()
    term = table.column("TERMINAL_ID").to_numpy()
    pop = build_population(SMALL["customers"], SMALL["terminals"], seed=7)
    dist = _distances(pop, cust, term)
    all_t = np.arange(SMALL["terminals"])
    nearest = np.array(
        [
            _distances(pop, np.full(len(all_t), cid), all_t).argmin()
            for cid in range(len(pop.customers))
        ]
    )
    ok = (dist < DEFAULT_RADIUS) | (term == nearest[cust])
    assert ok.all(), np.flatnonzero(~ok)[:10]
    assert (dist >= DEFAULT_RADIUS).any()  # the nearest-terminal fallback shows up in the data
    # Uniform choice among reachable terminals: most customers with several use more than one.
    pairs = np.unique(cust * SMALL["terminals"] + term)
    assert len(pairs) > len(np.unique(cust))


def test_amounts_non_negative_in_cents_and_near_customer_means(parquet_run):
    root, _ = parquet_run
    table = _read_parquet_dir(root)
    amount = table.column("TX_AMOUNT").to_numpy()
    assert (amount >= 0).all()
    np.testing.assert_array_equal(np.round(amount, 2), amount)  # whole cents
    mean = (
        build_population(SMALL["customers"], SMALL["terminals"], seed=7)
        .customers["mean_amount"]
        .to_numpy()[table.column("CUSTOMER_ID").to_numpy()]
    )
    assert (amount <= mean * 8).all()  # normal(mean, mean/2): 14 sigmas away is impossible
    assert abs(amount.mean() / mean.mean() - 1) < 0.05


def test_progress_reports_about_every_tenth(tmp_path):
    lines: list[str] = []
    summary = generate(
        tmp_path / "tx", days=20, customers=20, terminals=5, tx_per_day=10, progress=lines.append
    )
    assert len(lines) == 10
    assert lines[0].startswith("generated 2/20 days, ")
    assert lines[-1] == f"generated 20/20 days, {summary.rows:,} rows"


def test_rewrites_only_generated_days(tmp_path):
    root = tmp_path / "tx"
    kwargs = {"customers": 50, "terminals": 10, "tx_per_day": 100}
    first = generate(root, days=3, seed=1, **kwargs)
    before = _file_bytes(root)
    (root / "notes.txt").write_text("keep me")
    second = generate(root, days=1, start_date=START + datetime.timedelta(days=1), seed=2, **kwargs)
    after = _file_bytes(root)
    changed = str(second.files[0].relative_to(root))
    assert changed == str(first.files[1].relative_to(root))
    assert after[changed] != before[changed]
    assert after.pop("notes.txt") == b"keep me"
    assert after.keys() == before.keys()
    assert all(after[k] == before[k] for k in before if k != changed)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"fmt": "json"}, "fmt"),
        ({"customers": 0}, "customers"),
        ({"customers": 2.5}, "customers"),
        ({"terminals": 0}, "terminals"),
        ({"days": 0}, "days"),
        ({"days": True}, "days"),
        ({"tx_per_day": -1}, "tx_per_day"),
        ({"seed": -1}, "seed"),
        ({"start_date": "2026-01-01"}, "start_date"),
    ],
)
def test_invalid_arguments_raise_one_line_value_error(tmp_path, kwargs, name):
    with pytest.raises(ValueError) as info:
        generate(tmp_path / "tx", **kwargs)
    message = str(info.value)
    assert message.startswith(f"{name}:")
    assert "\n" not in message
    if name == "fmt":
        assert "'csv'" in message and "'parquet'" in message
    assert not (tmp_path / "tx").exists()  # validated before anything is written


def test_invalid_radius_names_the_argument():
    with pytest.raises(ValueError, match=r"^radius:"):
        build_population(10, 10, radius=-1)


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    root = tmp_path / "tx"
    kwargs = {"customers": 50, "terminals": 10, "tx_per_day": 100, "days": 1}
    old = generate(root, seed=1, **kwargs).files[0].read_bytes()

    def broken_write(table, where, **_):
        Path(where).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", broken_write)
    with pytest.raises(OSError, match="disk full"):
        generate(root, seed=2, **kwargs)
    assert _file_bytes(root) == {f"date={DATES[0]}/part-00000.parquet": old}
