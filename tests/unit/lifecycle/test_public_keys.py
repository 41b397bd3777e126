"""Public keys never come from the data: a key file that is the input, or one of its files,
is refused by every front end before anything is read or charged (`JobSpec.refuse_input_as_keys`,
called where the run reads its key files). Such a file lists the data's own keys, which one
customer alone can add: the leak public partitions exist to avoid."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import yaml
from support.cli import one_error_line, run_cli
from support.data import SMALL, START

import dppipeline
from dppipeline.errors import SpecError
from dppipeline.synthetic.transactions import generate

BOUNDS = {"max_partitions_contributed": 2, "max_contributions_per_partition": 2}


@pytest.fixture(scope="module")
def csv_input(tmp_path_factory) -> Path:
    return generate(
        tmp_path_factory.mktemp("tx") / "tx", fmt="csv", start_date=START, **SMALL
    ).output


def a_data_file(folder: Path) -> Path:
    return sorted(folder.rglob("*.csv"))[0]


def charges(ledger: Path) -> int:
    if not ledger.exists():
        return 0
    with sqlite3.connect(ledger) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        return (
            db.execute("SELECT count(*) FROM releases").fetchone()[0] if "releases" in tables else 0
        )


def run_args(csv_input: Path, keys: Path, tmp_path: Path) -> list[object]:
    return [
        *("run", "--engine", "local", "--input", csv_input, "--format", "csv"),
        *("--output", tmp_path / "release", "--ledger", f"sqlite:///{tmp_path / 'ledger.sqlite'}"),
        *("--metrics", "count", "--public-partitions", keys),
        *("--max-partitions-contributed", "2", "--max-contributions-per-partition", "2"),
    ]


def test_the_cli_refuses_a_file_of_the_input_as_its_key_file(csv_input, tmp_path):
    result = run_cli(*run_args(csv_input, a_data_file(csv_input), tmp_path))
    assert result.returncode == 2, result.stderr
    line = one_error_line(result)
    assert "partition_selection.public_partitions" in line
    assert "is the input or lies in its folder" in line
    assert not (tmp_path / "release").exists()
    assert charges(tmp_path / "ledger.sqlite") == 0


def test_a_key_file_beside_the_input_is_released(csv_input, tmp_path):
    """The control: the same run with the keys in a file of their own releases and charges."""
    keys = tmp_path / "terminals.csv"
    keys.write_text("TERMINAL_ID\n" + "".join(f"{k}\n" for k in range(SMALL["terminals"])))
    result = run_cli(*run_args(csv_input, keys, tmp_path))
    assert result.returncode == 0, result.stderr
    assert charges(tmp_path / "ledger.sqlite") == 1


def test_a_yaml_job_refuses_it_too(csv_input, tmp_path):
    """The same rule for a job file (a pandas or Spark frame given to the API has no input
    path: its rows are the caller's, and so are its key files)."""
    job = {
        "name": "keys_from_the_data",
        "privacy_unit": "CUSTOMER_ID",
        "partition_key": "TERMINAL_ID",
        "metrics": ["count"],
        "bounds": BOUNDS,
        "input": {"path": str(csv_input), "format": "csv"},
        "partition_selection": {"public_partitions": str(a_data_file(csv_input))},
    }
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(job))
    ledger = tmp_path / "ledger.sqlite"
    result = run_cli(
        "run", "--config", config, "--output", tmp_path / "release", "--ledger", ledger
    )
    assert result.returncode == 2, result.stderr
    assert "partition_selection.public_partitions" in one_error_line(result)
    assert not (tmp_path / "release").exists()
    assert charges(ledger) == 0
    with pytest.raises(SpecError, match="is the input or lies in its folder"):
        dppipeline.load_job(config).refuse_input_as_keys()
