"""Rejected rows stay with the operator: `<state dir>/quarantine/<run_id>/`, owner-only, never
inside or beside the release, never named by the manifest (issue 16 item 2)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pandas as pd
import pytest
from support.data import with_one_bad_row
from support.engines import engine_named

from dppipeline.cli.main import main
from dppipeline.engines.beam.engine import BeamEngine
from dppipeline.errors import UsageError
from dppipeline.lifecycle.runner import run_job
from dppipeline.spec.model import build_spec

PAIR = ["--max-partitions-contributed", "1", "--max-contributions-per-partition", "1"]


def spec(root: Path, output: Path, **extra):
    values = {
        "input.path": str(root),
        "input.format": "csv",
        "output": str(output),
        "bounds.min_value": 0.0,
        "bounds.max_value": 100.0,
        "bounds.max_partitions_contributed": 1,
        "bounds.max_contributions_per_partition": 1,
    }
    values.update(extra)
    return build_spec({}, values)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("engine", ["local", "spark", "beam"])
def test_rejected_rows_go_to_the_state_folder_owner_only(small_inputs, tmp_path, engine, request):
    bad = with_one_bad_row(small_inputs, tmp_path / "in")
    output = tmp_path / "share" / "release"
    result = run_job(
        spec(tmp_path / "in", output), engine_named(engine, request), echo=lambda _: None
    )

    state = Path(os.environ["DPPIPELINE_STATE_DIR"])
    folder = state / "quarantine" / result.run_id
    rejected = pd.read_parquet(folder / "rejected.parquet")  # a file, or Spark's folder of parts
    assert (rejected["_source_file"].tolist(), rejected["_row"].tolist()) == ([str(bad)], [6])
    assert rejected["TX_AMOUNT"].tolist() == ["abc"]  # the raw row, for the operator only
    for path in [state / "quarantine", folder, *folder.rglob("*")]:
        assert mode(path) == (0o700 if path.is_dir() else 0o600), path
    # Nothing beside the release or inside it; the manifest does not say where rows went.
    assert sorted(p.name for p in output.parent.iterdir()) == ["release"]
    assert "quarantine" not in (output / "manifest.json").read_text()
    assert result.run_id in str(folder)


@pytest.mark.parametrize(
    "where",
    [
        lambda out: out,  # the release folder itself
        lambda out: out / "rejected",  # inside it
        lambda out: out.parent,  # its parent: the release's readers list it
        lambda out: out.parent / "release_quarantine",  # beside it (the old default)
    ],
    ids=["release", "inside", "parent", "beside"],
)
def test_a_quarantine_the_release_readers_could_see_is_refused(
    small_inputs, tmp_path, where, capsys
):
    """Refused before anything is read, with one line and exit 2, from the flag and from
    the spec alike."""
    with_one_bad_row(small_inputs, tmp_path / "in")
    output = tmp_path / "share" / "release"
    quarantine = where(output)
    argv = ["run", "--no-ledger", "--format", "csv", "--input", str(tmp_path / "in")]
    argv += ["--output", str(output), "--min-value", "0", "--max-value", "100", *PAIR]
    assert main([*argv, "--quarantine", str(quarantine)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dppipeline run: error: --quarantine: "), err
    assert "operator-only" in err[0]
    assert not output.exists()
    with pytest.raises(UsageError):
        run_job(
            spec(tmp_path / "in", output, **{"input.quarantine": str(quarantine)}),
            echo=lambda _: None,
        )


def test_a_chosen_quarantine_is_used_from_the_flag_or_the_spec(small_inputs, tmp_path, capsys):
    with_one_bad_row(small_inputs, tmp_path / "in")
    chosen = tmp_path / "operator" / "rejects"
    result = run_job(
        spec(tmp_path / "in", tmp_path / "a", **{"input.quarantine": str(chosen)}),
        echo=lambda _: None,
    )
    assert (chosen / result.run_id / "rejected.parquet").is_file()
    assert mode(chosen) == 0o700  # created here, so owner-only
    flag = tmp_path / "operator" / "by_flag"
    argv = ["run", "--no-ledger", "--format", "csv", "--input", str(tmp_path / "in")]
    argv += ["--output", str(tmp_path / "b"), "--min-value", "0", "--max-value", "100", *PAIR]
    assert main([*argv, "--quarantine", str(flag)]) == 0
    assert len(list(flag.glob("*/rejected.parquet"))) == 1
    assert str(flag) not in capsys.readouterr().out  # stdout is the release's path only
    assert "quarantine" not in (tmp_path / "b" / "manifest.json").read_text()


def test_a_quarantine_elsewhere_is_accepted(tmp_path):
    from dppipeline.inputs.quarantine import check_place

    output = tmp_path / "share" / "release"
    check_place(tmp_path / "state" / "quarantine", output)
    check_place(tmp_path / "share" / "x" / "y", output)  # not in the parent's listing


@pytest.mark.beam
def test_beam_leaves_no_scratch_outside_the_staging_area(small_inputs, tmp_path, monkeypatch):
    """Beam's rejected rows travel through the staging area, not a folder on the launching
    machine that remote workers cannot reach (issue 16 item 7), and none is left behind."""
    import tempfile

    local_temp = tmp_path / "launcher_tmp"
    local_temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(local_temp))
    with_one_bad_row(small_inputs, tmp_path / "in")
    output = tmp_path / "release"
    said: list[str] = []
    seen: dict[str, list[str]] = {}

    def echo(line: str) -> None:
        said.append(line)
        if "pipeline done" in line:  # the workers are done, the launcher has not read back
            seen["temp"] = [p.name for p in local_temp.iterdir()]
            seen["scratch"] = [p.name for p in tmp_path.glob(".release.staging-*/_scratch/*")]

    engine = BeamEngine(unit_shards=2, partition_shards=2)
    run_job(spec(tmp_path / "in", output), engine, echo=echo)
    assert any("rejected 1" in line for line in said), said
    assert seen["scratch"] == ["rejected-00000.parquet"], seen
    assert not [name for name in seen["temp"] if name.startswith("dppipeline")], seen
    assert not [p for p in local_temp.iterdir() if p.name.startswith("dppipeline")]
    assert sorted(p.name for p in output.iterdir()) == ["manifest.json", "terminal_stats"]
    assert not list(tmp_path.glob(".release*"))  # staging and its scratch removed
