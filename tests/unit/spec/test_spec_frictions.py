"""Small frictions an analyst hit (issue 20): the input layout detected without --format, key
lists written inline, a top-level filter for a one-query job, defaults in --help, plan
wording. Each is checked as a user meets it: the CLI or the spec as written."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from support.cli import run_cli as cli

from dppipeline.errors import SpecError
from dppipeline.spec.model import build_spec

HUGE = [
    "--epsilon",
    "1e7",
    "--min-value",
    "0",
    "--max-value",
    "150",
    "--max-partitions-contributed",
    "50",
    "--max-contributions-per-partition",
    "100",
]
# L0 = Linf = 1, stated: the bounds the spec-only checks below once took by default.
PAIR = {"max_partitions_contributed": 1, "max_contributions_per_partition": 1}


@pytest.mark.slow
def test_a_folder_of_daily_csv_files_needs_no_format_flag(small_inputs, tmp_path):
    """Without --format, `YYYY-MM-DD.csv` files are read as CSV; the release key is the one
    `--format csv` gives (a rerun with the flag is the same release: nothing spent)."""
    ledger = f"sqlite:///{tmp_path / 'l.sqlite'}"
    args = [
        "run",
        "--input",
        small_inputs["csv"],
        "--output",
        tmp_path / "out",
        "--metrics",
        "count",
        "--public-partitions",
        "0..59",
        *HUGE,
        "--ledger",
        ledger,
    ]
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["input"]["format"] == "csv"
    released = pd.read_parquet(tmp_path / "out" / "terminal_stats")
    rows = sum(len(pd.read_csv(p)) for p in small_inputs["csv"].glob("*.csv"))
    assert abs(released["count"].sum() - rows) < 1
    again = cli(*args, "--format", "csv")
    assert again.returncode == 0, again.stderr
    assert "no new noise drawn, nothing spent" in again.stderr


def test_a_folder_mixing_layouts_is_refused_in_one_line(small_inputs, tmp_path):
    mixed = tmp_path / "mixed"
    shutil.copytree(small_inputs["parquet"], mixed)
    shutil.copy(sorted(small_inputs["csv"].glob("*.csv"))[0], mixed)
    args = ["run", "--input", mixed, "--output", tmp_path / "out", "--metrics", "count",
            "--public-partitions", "0..59", *HUGE, "--no-ledger"]  # fmt: skip
    done = cli(*args)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line == (
        f"dppipeline run: error: input folder {mixed} mixes layouts (date=2026-01-01/ and "
        "2026-01-01.csv): keep one per folder, or name it with --format (input.format)"
    )
    assert not (tmp_path / "out").exists()
    named = cli(*args, "--format", "parquet")
    assert named.returncode == 0, named.stderr


def test_public_keys_can_be_listed_inline():
    spec = build_spec(
        {
            "metrics": ["count"],
            "bounds": PAIR,
            "partition_selection": {"public_partitions": [3, 1, 2]},
        }
    )
    assert spec.queries[0].partition_selection.public_partitions == {"TERMINAL_ID": [3, 1, 2]}
    same = build_spec(
        {
            "metrics": ["count"],
            "bounds": PAIR,
            "partition_selection": {"public_partitions": {"TERMINAL_ID": [3, 1, 2]}},
        }
    )
    assert spec.spec_hash() != "" and spec.queries == same.queries
    with pytest.raises(SpecError, match="a key list needs one partition_by column"):
        build_spec(
            {
                "queries": [
                    {
                        "name": "q",
                        "metrics": ["count"],
                        "bounds": PAIR,
                        "partition_by": ["TERMINAL_ID", "day"],
                        "partition_selection": {"public_partitions": [1, 2]},
                    }
                ]
            }
        )
    with pytest.raises(SpecError, match="public_partitions: must list at least one key"):
        build_spec(
            {"metrics": ["count"], "bounds": PAIR, "partition_selection": {"public_partitions": []}}
        )


def test_a_job_level_filter_applies_to_its_queries(small_inputs, tmp_path):
    """The shorthand's one query reads what the job's filter keeps; with queries, each reads
    what both filters keep. Exact at a huge epsilon against pandas."""
    from dppipeline.lifecycle.runner import run_job

    spec = build_spec(
        {
            "filter": "TX_AMOUNT >= 25",
            "input": {"path": str(small_inputs["parquet"])},
            "output": str(tmp_path / "out"),
            "budget": {"epsilon": 1e7},
            "bounds": {"max_partitions_contributed": 50, "max_contributions_per_partition": 100},
            "queries": [
                {
                    "name": "big",
                    "metrics": ["count"],
                    "partition_selection": {"public_partitions": "0..59"},
                },
                {
                    "name": "big_low_terminals",
                    "metrics": ["count"],
                    "filter": "TERMINAL_ID < 10",
                    "partition_selection": {"public_partitions": "0..9"},
                },
            ],
        }
    )
    run_job(spec, "local", echo=lambda _: None)
    rows = pd.read_parquet(small_inputs["parquet"])
    kept = rows[rows["TX_AMOUNT"] >= 25]
    for name, truth in (("big", kept), ("big_low_terminals", kept[kept["TERMINAL_ID"] < 10])):
        released = pd.read_parquet(tmp_path / "out" / name)
        assert abs(released["count"].sum() - len(truth)) < 1, name
    shorthand = build_spec({"filter": "TX_AMOUNT >= 25", "metrics": ["count"], "bounds": PAIR})
    assert shorthand.queries[0].filter == "TX_AMOUNT >= 25"


def test_generate_help_shows_defaults_and_plan_says_rows_for_counts():
    helped = cli("generate", "--help")
    assert "(default: 5000)" in helped.stdout and "(default: parquet)" in helped.stdout
    planned = cli(
        "plan", "--metrics", "count,privacy_id_count,sum", "--min-value", "0", "--max-value", "100",
        "--max-partitions-contributed", "1", "--max-contributions-per-partition", "1",
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    assert "count, privacy_id_count of rows; sum of TX_AMOUNT per TERMINAL_ID" in planned.stdout
