"""The operator channel (`dppipeline.logs`): progress through `logging`, `-q` and `-v`, and
data-dependent figures only under `--debug-statistics`, marked NOT PRIVATE."""

from __future__ import annotations

import logging

import pytest
from support import REPO

from dppipeline import logs
from dppipeline.cli import main as cli

CONFIG = REPO / "jobs" / "configs" / "terminal_stats.yaml"


@pytest.fixture(autouse=True)
def _fresh_logging():
    """Each CLI call installs its handlers; leave none behind for the next test."""
    yield
    for logger in (logs.log, logging.getLogger()):
        for handler in [h for h in logger.handlers if type(h).__name__ == "_StderrHandler"]:
            logger.removeHandler(handler)
    logs.log.propagate = True


def run(inputs, tmp_path, engine: str, *flags: str, after: tuple[str, ...] = ()) -> int:
    """`dppipeline FLAGS run ... AFTER` in this process."""
    argv = [
        *flags,
        "run",
        *after,
        "--config", str(CONFIG),
        "--engine", engine,
        "--input", str(inputs["parquet"]),
        "--format", "parquet",
        "--output", str(tmp_path / "release"),
        "--no-ledger",
    ]  # fmt: skip
    return cli.main(argv)


def test_progress_goes_to_stderr_and_quiet_silences_it(small_inputs, tmp_path, capsys):
    assert run(small_inputs, tmp_path / "a", "local") == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(tmp_path / "a" / "release")
    assert "[local] read " in err and "release written to" in err
    assert logs.NOT_PRIVATE not in err

    assert run(small_inputs, tmp_path / "b", "local", "-q") == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(tmp_path / "b" / "release")  # the result line stays
    assert err == ""

    assert run(small_inputs, tmp_path / "c", "local", after=("-q",)) == 0  # after the command
    assert capsys.readouterr().err == ""


def test_verbose_names_each_logger(small_inputs, tmp_path, capsys):
    assert run(small_inputs, tmp_path, "local", "-v") == 0
    assert "INFO dppipeline.lifecycle.runner: [local] read " in capsys.readouterr().err


@pytest.mark.beam
def test_debug_statistics_are_off_by_default_and_marked_when_asked(small_inputs, tmp_path, capsys):
    """Beam's count of (unit, partition) pairs is exact: it is neither printed nor kept as a
    runner metric unless asked for, and then every such line says NOT PRIVATE."""
    assert run(small_inputs, tmp_path / "a", "beam") == 0
    assert "pairs kept" not in capsys.readouterr().err

    assert run(small_inputs, tmp_path / "b", "beam", "--debug-statistics") == 0
    err = capsys.readouterr().err
    marked = [line for line in err.splitlines() if "pairs kept" in line]
    assert len(marked) == 1 and marked[0].startswith(logs.NOT_PRIVATE), err


def test_a_closed_stderr_does_not_fail_the_run(small_inputs, tmp_path, monkeypatch, capsys):
    """`dppipeline run ... 2>&1 | head -n 1`: once the reader is gone, progress stops and the
    run goes on to publish (the ledger must not refund a published release)."""

    class Gone:
        def write(self, _text: str) -> int:
            raise BrokenPipeError

        def flush(self) -> None:
            raise BrokenPipeError

    monkeypatch.setattr("sys.stderr", Gone())
    assert run(small_inputs, tmp_path, "local") == 0
    assert (tmp_path / "release" / "manifest.json").exists()
