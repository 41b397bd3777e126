"""A CLI process imports only what its run uses (issue 35: start-up of a Laplace run).

Each case runs the CLI's `_command` in a fresh interpreter, then lists the heavy libraries
left in `sys.modules`. In-process `_command` skips the CLI's own guards (apache_beam marked
absent, scipy.stats lazy), so an import of pipeline-dp shows up with all it drags in.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import REPO

from dppipeline.synthetic.transactions import generate

CONFIG = REPO / "jobs" / "configs" / "terminal_stats.yaml"
# What a local Laplace run with public partitions does not need (and what each costs a process).
HEAVY = ("apache_beam", "pyspark", "sqlalchemy", "scipy", "dp_accounting", "pipeline_dp", "sqlglot")
PROBE = """
import json, sys
from dppipeline.cli.main import _command
code = _command(sys.argv[1:])
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY))
print(json.dumps({"code": code, "heavy": heavy}))
"""


def imported_heavy(*args: object) -> list[str]:
    """The heavy libraries a CLI command imported (it must succeed)."""
    script = f"HEAVY = {HEAVY!r}\n{PROBE}"
    result = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["code"] == 0, result.stderr
    return out["heavy"]


@pytest.fixture(scope="module")
def tiny_input(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("startup") / "input"
    generate(folder, customers=40, terminals=20, days=2, tx_per_day=100, seed=5)
    return str(folder)


def test_laplace_local_run_without_ledger_imports_none_of_them(tiny_input, tmp_path):
    args = ("run", "--config", CONFIG, "--input", tiny_input, "--output", tmp_path / "out")
    assert imported_heavy(*args, "--no-ledger") == []


@pytest.mark.slow
def test_laplace_local_run_with_ledger_imports_sqlalchemy_only(tiny_input, tmp_path):
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    args = ("run", "--config", CONFIG, "--input", tiny_input, "--output", tmp_path / "out")
    assert imported_heavy(*args, "--ledger", ledger) == ["sqlalchemy"]


def test_laplace_plan_imports_none_of_them():
    assert imported_heavy("plan", "--config", CONFIG) == []


@pytest.mark.slow
def test_gaussian_plan_imports_pipeline_dp():
    """The probe sees what a plan that needs pipeline-dp imports (Gaussian calibration)."""
    heavy = imported_heavy("plan", "--config", CONFIG, "--noise", "gaussian")
    assert "pipeline_dp" in heavy


def test_plan_with_a_filter_imports_sqlglot(tmp_path):
    """The probe sees sqlglot where the job has a filter to parse."""
    public = REPO / "schemas" / "public_terminals.csv"
    text = CONFIG.read_text().replace("../../schemas/public_terminals.csv", str(public))
    config = tmp_path / "job.yaml"
    config.write_text(text + 'filter: "TX_AMOUNT >= 0"\n')
    assert "sqlglot" in imported_heavy("plan", "--config", config)
