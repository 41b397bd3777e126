"""`dppipeline run --check-budget` and `dppipeline check-release`: what the DAGs gate on."""

from __future__ import annotations

import copy
import json

import pyarrow as pa
import pyarrow.parquet as pq

from dppipeline.cli.main import main
from dppipeline.lifecycle.manifests import read_manifest
from dppipeline.storage.releases import MANIFEST_NAME


def run(small_inputs, out, ledger, *extra):
    return main(
        ["run", "--config", "jobs/configs/terminal_stats.yaml", "--input",
         str(small_inputs["parquet"]), "--output", str(out), "--ledger", ledger,
         "--epsilon", "1", *extra]  # epsilon 1: a cap of 1.5 holds one release, not two
    )  # fmt: skip


def test_check_budget_passes_refuses_and_spends_nothing(small_inputs, tmp_path, capsys):
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    day = ["--start-date", "2026-01-01", "--end-date", "2026-01-01", "--cap-epsilon", "1.5"]
    assert run(small_inputs, tmp_path / "a", ledger, *day, "--check-budget") == 0
    assert "budget available" in capsys.readouterr().out
    assert not (tmp_path / "a").exists()
    assert run(small_inputs, tmp_path / "a", ledger, *day) == 0
    capsys.readouterr()
    assert run(small_inputs, tmp_path / "a", ledger, *day, "--check-budget") == 0
    assert "already published" in capsys.readouterr().out
    other = ["--start-date", "2026-01-02", "--end-date", "2026-01-02", "--cap-epsilon", "1.5"]
    assert run(small_inputs, tmp_path / "b", ledger, *other, "--check-budget") == 3
    assert "exhausted" in capsys.readouterr().err


def test_check_release_accepts_a_release_and_names_what_is_wrong(small_inputs, tmp_path, capsys):
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    assert run(small_inputs, tmp_path / "rel", ledger) == 0
    capsys.readouterr()
    assert main(["check-release", str(tmp_path / "rel"), "--ledger", ledger]) == 0
    assert "valid release" in capsys.readouterr().out
    # Another ledger has no record of the run.
    other = f"sqlite:///{tmp_path / 'other.sqlite'}"
    assert main(["check-release", str(tmp_path / "rel"), "--ledger", other]) == 1
    assert "not recorded" in capsys.readouterr().err
    # A column of the wrong type.
    part = next((tmp_path / "rel" / "terminal_stats").glob("*.parquet"))
    table = pq.read_table(part)
    table = table.set_column(1, "count", table.column("count").cast(pa.float32()))
    pq.write_table(table, part)
    assert main(["check-release", str(tmp_path / "rel"), "--no-ledger"]) == 1
    assert "count has type float" in capsys.readouterr().err
    assert main(["check-release", str(tmp_path), "--no-ledger"]) == 1
    assert "no manifest.json" in capsys.readouterr().err


def test_the_manifest_is_typed_and_a_broken_one_is_named(small_inputs, tmp_path, capsys):
    """report, check-release and the runner read the manifest through one model: what is
    written is what the model holds, a later version's extra field is kept, and a manifest
    that breaks the model is refused naming the file and the field."""
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    assert run(small_inputs, tmp_path / "rel", ledger) == 0
    capsys.readouterr()
    path = tmp_path / "rel" / MANIFEST_NAME
    written = json.loads(path.read_text())
    manifest = read_manifest(tmp_path / "rel")
    assert manifest.model_dump(mode="json", exclude_unset=True) == written
    (query,) = manifest.queries.values()
    assert query.released_partitions == written["queries"][query.dataset]["released_partitions"]

    later = {**written, "audit": {"signed_by": "x"}}  # a field a later version adds
    path.write_text(json.dumps(later))
    assert json.loads(read_manifest(tmp_path / "rel").to_json())["audit"] == {"signed_by": "x"}

    broken = copy.deepcopy(written)
    broken["queries"][query.dataset]["released_partitions"] = "many"
    path.write_text(json.dumps(broken))
    assert main(["check-release", str(tmp_path / "rel"), "--no-ledger"]) == 1
    err = capsys.readouterr().err
    assert f"queries.{query.dataset}.released_partitions" in err and str(path) in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1

    path.write_text(json.dumps({**written, "manifest_version": 3}))
    assert main(["report", str(tmp_path / "rel"), "--no-ledger"]) == 1
    assert "manifest_version 3" in capsys.readouterr().err
