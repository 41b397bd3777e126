"""Environment variables: read only by dppipeline/settings.py, each documented in
docs/reference/environment.md, each checked with a one-line error, each read at call time."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

from dppipeline import settings
from dppipeline.cli.main import main
from dppipeline.errors import UsageError
from dppipeline.ledger import Ledger
from dppipeline.lifecycle import failpoints

ROOT = REPO
PACKAGE = ROOT / "dppipeline"
SETTINGS = PACKAGE / "settings.py"
DOC = ROOT / "docs" / "reference" / "environment.md"
# os functions that read or write the process environment.
ENVIRONMENT_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}

# Bad values of every variable that has a rule (each must be refused with its one line).
BAD_VALUES: dict[str, list[str]] = {
    "DPPIPELINE_LEDGER_TIMEOUT": ["soon", "0", "-3", "inf", "nan"],
    "DPPIPELINE_LEASE_SECONDS": ["2m", "0", "-1", "inf"],
    "DPPIPELINE_LEASE_RENEW_SECONDS": ["often", "0", "-5"],
    "DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS": ["many", "1.5", "-1", "1e6"],
    "DPPIPELINE_SPARK_LOG_LEVEL": ["LOUD", "warning"],
    "DPPIPELINE_FAILPOINT": ["reserved", "nowhere:kill", "reserved:explode", "reading:kill,x"],
}
# Good values the same functions accept, and what they read them as.
GOOD_VALUES: list[tuple[str, str, object]] = [
    ("DPPIPELINE_LEDGER_TIMEOUT", "0.5", 0.5),
    ("DPPIPELINE_LEASE_SECONDS", "30", 30.0),
    ("DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS", "0", 0),
    ("DPPIPELINE_SPARK_LOG_LEVEL", "info", "info"),
    ("DPPIPELINE_FAILPOINT", "reserved:kill, published:error", (
        ("reserved", "kill"), ("published", "error"))),
]  # fmt: skip
READERS = {
    "DPPIPELINE_LEDGER_TIMEOUT": settings.ledger_timeout,
    "DPPIPELINE_LEASE_SECONDS": settings.lease_seconds,
    "DPPIPELINE_LEASE_RENEW_SECONDS": settings.renew_seconds,
    "DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS": settings.driver_release_max_partitions,
    "DPPIPELINE_SPARK_LOG_LEVEL": settings.spark_log_level,
    "DPPIPELINE_FAILPOINT": settings.failpoints,
}
JOB = [
    "--min-value", "0", "--max-value", "100", "--max-partitions-contributed", "1",
    "--max-contributions-per-partition", "1", "--metrics", "count",
]  # fmt: skip


def environment_uses(path: Path) -> list[str]:
    """Where `path` reads or writes the environment: `os.environ`, `os.getenv`, ... and
    `from os import environ` (strings and comments do not count)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT_NAMES:
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: os.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno}: from os import {alias.name}"
                for alias in node.names
                if alias.name in ENVIRONMENT_NAMES
            ]
    return found


def documented_table() -> dict[str, list[str]]:
    """The rows of the doc's "Read by dppipeline" table: variable -> its other cells."""
    section = DOC.read_text().split("## Read by dppipeline", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([A-Z0-9_]+)`", cells[0]) if line.startswith("|") else None
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} listed twice"
            rows[match.group(1)] = cells[1:]
    return rows


def run_cli(*args: object, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "DPPIPELINE_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "dppipeline", *map(str, args)],
        capture_output=True, text=True, env={**base, **env}, timeout=180, check=False,
    )  # fmt: skip


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No registered variable set (restored after the test), so each test sets its own."""
    for name in settings.VARIABLES:
        if name not in ("JAVA_HOME", "PYSPARK_PYTHON", "DPPIPELINE_STATE_DIR"):
            monkeypatch.delenv(name, raising=False)
    return monkeypatch


# --------------------------------------------------------------------- one reader, documented


def test_only_settings_touches_the_environment():
    files = sorted(PACKAGE.rglob("*.py"))
    assert SETTINGS in files and len(files) > 50
    assert environment_uses(SETTINGS), "the scan finds nothing: it cannot be trusted"
    offenders = [use for path in files if path != SETTINGS for use in environment_uses(path)]
    assert offenders == [], "read environment variables through dppipeline.settings"
    # The issue's own check: `grep -rn "os.environ" dppipeline` finds settings.py only.
    texts = [p for p in files if "os.environ" in p.read_text() and p != SETTINGS]
    assert texts == []


def test_the_doc_lists_exactly_the_registry():
    table = documented_table()
    assert list(table) == list(settings.VARIABLES)  # same variables, same order
    for name, (default, meaning, readers, rule) in table.items():
        variable = settings.VARIABLES[name]
        assert (default, meaning, readers) == (variable.default, variable.meaning, variable.readers)
        assert rule == (variable.rule or "any value"), name


def test_every_checked_variable_has_bad_values_here():
    checked = {name for name, v in settings.VARIABLES.items() if v.check is not None}
    assert checked == set(BAD_VALUES) == set(READERS)
    assert all(settings.VARIABLES[name].rule for name in checked)


def test_the_failpoint_rule_is_what_the_failpoints_do():
    assert set(failpoints._SIGNALS) | {"error"} == set(settings.FAILPOINT_ACTIONS)
    assert failpoints.STAGES == settings.FAILPOINT_STAGES
    documented = re.findall(r"^    (\w+) {2,}", failpoints.__doc__ or "", re.MULTILINE)
    assert tuple(documented) == settings.FAILPOINT_STAGES


# --------------------------------------------------------------------- checked, one line


@pytest.mark.parametrize(
    ("name", "value"), [(n, v) for n, values in BAD_VALUES.items() for v in values]
)
def test_a_bad_value_is_one_line_naming_the_variable_and_the_rule(
    name, value, clean_environment, tmp_path, capsys
):
    clean_environment.setenv(name, value)
    expected = f"{name} {settings.VARIABLES[name].rule}"
    with pytest.raises(UsageError) as raised:
        READERS[name]()
    assert str(raised.value) == expected
    with pytest.raises(UsageError):
        settings.validate()
    # Through the CLI: exit 2, that line, before the ledger is opened.
    ledger = tmp_path / "never.sqlite"
    capsys.readouterr()
    assert main(["budget", "show", "--ledger", str(ledger)]) == 2
    assert one_line(capsys.readouterr().err) == f"dppipeline budget: error: {expected}"
    assert not ledger.exists()


def test_a_renewal_not_shorter_than_the_lease_is_refused(clean_environment):
    clean_environment.setenv("DPPIPELINE_LEASE_SECONDS", "30")
    clean_environment.setenv("DPPIPELINE_LEASE_RENEW_SECONDS", "30")
    with pytest.raises(UsageError) as raised:
        settings.renew_seconds()
    rule = settings.VARIABLES["DPPIPELINE_LEASE_RENEW_SECONDS"].rule
    assert str(raised.value) == f"DPPIPELINE_LEASE_RENEW_SECONDS {rule} (30 s)"
    clean_environment.setenv("DPPIPELINE_LEASE_RENEW_SECONDS", "29.5")
    assert settings.renew_seconds() == 29.5


@pytest.mark.parametrize(("name", "value", "read"), GOOD_VALUES, ids=[g[0] for g in GOOD_VALUES])
def test_a_good_value_is_read_when_asked(name, value, read, clean_environment):
    default = READERS[name]()
    clean_environment.setenv(name, value)
    assert READERS[name]() == read != default  # read at call time, not at import
    settings.validate()
    clean_environment.setenv(name, "")  # empty: the default
    assert READERS[name]() == default


def test_defaults_when_nothing_is_set(clean_environment, tmp_path):
    clean_environment.setenv("DPPIPELINE_STATE_DIR", str(tmp_path / "st"))
    assert settings.default_ledger() == str(tmp_path / "st" / "ledger.sqlite")
    assert settings.lease_seconds() == 120.0 and settings.renew_seconds() == 20.0
    assert settings.ledger_timeout() == 10.0
    assert settings.driver_release_max_partitions() == 1_000_000
    assert (settings.spark_master(), settings.spark_log_level()) == ("local[*]", "WARN")
    assert settings.spark_java_options() == "-XX:+UseParallelGC"
    assert settings.failpoints() == () and settings.host_id() is None
    assert not (settings.debug() or settings.debug_statistics() or settings.publish_no_exchange())
    clean_environment.setenv("DPPIPELINE_SPARK_JAVA_OPTIONS", "")  # set but empty: no options
    assert settings.spark_java_options() == ""
    for flag in ("0", ""):
        clean_environment.setenv("DPPIPELINE_DEBUG", flag)
        assert not settings.debug()
    clean_environment.setenv("DPPIPELINE_DEBUG", "yes")
    assert settings.debug()


def test_the_docs_example_runs_as_shown(tmp_path):
    text = DOC.read_text()
    command, output = re.search(r"\n    \$ (.+)\n    (.+)\n", text).groups()  # type: ignore[union-attr]
    words = shlex.split(command)
    start = words.index("dppipeline")
    env = dict(word.split("=", 1) for word in words[:start])
    assert env and set(env) <= set(settings.VARIABLES)
    result = run_cli(*words[start + 1 :], env={**env, "DPPIPELINE_STATE_DIR": str(tmp_path / "s")})
    assert result.returncode == 2
    assert one_line(result.stderr) == output
    assert not (tmp_path / "s").exists()


# --------------------------------------------------------------------- through the public path


def test_the_ledger_and_host_id_come_from_the_environment(small_inputs, tmp_path):
    """A CLI run without --ledger charges $DPPIPELINE_LEDGER, as $DPPIPELINE_HOST_ID."""
    ledger = tmp_path / "elsewhere" / "ledger.sqlite"
    ledger.parent.mkdir()
    state = tmp_path / "state"
    env = {
        "DPPIPELINE_LEDGER": f"sqlite:///{ledger}",
        "DPPIPELINE_HOST_ID": "settings-test-host",
        "DPPIPELINE_STATE_DIR": str(state),
    }
    result = run_cli(
        "run", "--input", small_inputs["parquet"], *JOB, "--output", tmp_path / "out", env=env
    )
    assert result.returncode == 0, result.stderr
    rows = Ledger(f"sqlite:///{ledger}").rows()
    assert [(r.state, r.host_id) for r in rows] == [("committed", "settings-test-host")]
    assert not (state / "ledger.sqlite").exists()


def test_a_bad_failpoint_stops_the_run_before_the_ledger(small_inputs, tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    env = {"DPPIPELINE_LEDGER": f"sqlite:///{ledger}", "DPPIPELINE_FAILPOINT": "reserved:boom"}
    result = run_cli(
        "run", "--input", small_inputs["parquet"], *JOB, "--output", tmp_path / "out", env=env
    )
    assert result.returncode == 2
    rule = settings.VARIABLES["DPPIPELINE_FAILPOINT"].rule
    assert one_line(result.stderr) == f"dppipeline run: error: DPPIPELINE_FAILPOINT {rule}"
    assert not ledger.exists() and not (tmp_path / "out").exists()


def test_debug_statistics_reach_the_processes_a_run_starts(clean_environment):
    """`--debug-statistics` is exported to this process's environment (and a child's); a CLI
    run without it turns it off even when the environment had it on."""
    code = "from dppipeline import settings; print(settings.debug_statistics())"
    probe = [sys.executable, "-c", code]

    def child() -> str:
        return subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()

    settings.export_debug_statistics(True)
    assert settings.debug_statistics() and child() == "True"
    settings.export_debug_statistics(False)
    assert not settings.debug_statistics() and child() == "False"
    clean_environment.setenv(settings.DEBUG_STATISTICS_VARIABLE, "1")
    assert main(["spec-doc"]) == 0
    assert not settings.debug_statistics()
