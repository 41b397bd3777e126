"""The command-line contract, exercised through a real `python -m dppipeline` subprocess."""

from __future__ import annotations

import json
import math
import os
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support import REPO
from support.cli import run_cli
from support.data import DAYS, SMALL
from support.files import tree_bytes

from dppipeline.ledger import Ledger

VALUE_BOUNDS = ["--min-value", "0", "--max-value", "100"]
PAIR_BOUNDS = ["--max-partitions-contributed", "1", "--max-contributions-per-partition", "1"]
BOUNDS = [*VALUE_BOUNDS, *PAIR_BOUNDS]
RUN = ["run", "--input", "{input}", "--output", "{output}", *BOUNDS]
MANIFEST_BOUNDS = {
    "max_partitions_contributed",
    "max_contributions_per_partition",
    "min_value",
    "max_value",
    "linf_bounding",
}
QUERY = "terminal_stats"  # the default job name: a single-query job's one query


def stderr_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def write_keys(path: Path, keys: range) -> Path:
    path.write_text("TERMINAL_ID\n" + "".join(f"{k}\n" for k in keys))
    return path


# --------------------------------------------------------------------------- error cases

# (argv with placeholders, files to create in {aux}, exit code, words the stderr line names)
ERROR_CASES = [
    pytest.param([*RUN, "--epsilon", "0"], {}, 2, ["--epsilon"], id="epsilon-zero"),
    pytest.param([*RUN, "--epsilon", "-1"], {}, 2, ["--epsilon"], id="epsilon-negative"),
    pytest.param([*RUN, "--delta", "1"], {}, 2, ["--delta"], id="delta-one"),
    pytest.param([*RUN, "--delta", "-1e-9"], {}, 2, ["--delta"], id="delta-negative"),
    pytest.param(
        [*RUN, "--min-value", "10", "--max-value", "1"], {}, 2, ["--min-value"], id="min-gt-max"
    ),
    pytest.param(
        [*RUN, "--metrics", "count,median"], {}, 2, ["--metrics", "median"], id="unknown-metric"
    ),
    pytest.param([*RUN, "--engine", "flink"], {}, 2, ["--engine", "flink"], id="unknown-engine"),
    pytest.param(
        [*RUN, "--engine", "beam", "--direct_num_wrkers=2"],
        {},
        2,
        ["Beam pipeline option", "--direct_num_wrkers"],
        id="beam-unknown-option",
    ),
    pytest.param(
        [*RUN, "--runner=DirectRunner"], {}, 2, ["unrecognized", "--runner"], id="local-beam-option"
    ),
    pytest.param([*RUN, "--epsilom", "1"], {}, 2, ["--epsilom"], id="unknown-flag"),
    pytest.param([*RUN, "--epsilon", "abc"], {}, 2, ["--epsilon", "abc"], id="flag-not-number"),
    pytest.param([*RUN, "--noise", "cauchy"], {}, 2, ["--noise"], id="flag-bad-choice"),
    pytest.param([*RUN, "--start-date", "2026-02-30"], {}, 2, ["--start-date"], id="flag-bad-date"),
    pytest.param(
        [*RUN, "--start-date", "2026-01-03", "--end-date", "2026-01-01"],
        {},
        2,
        ["--start-date"],
        id="start-after-end",
    ),
    pytest.param(["run", "--output", "{output}", *BOUNDS], {}, 2, ["--input"], id="no-input-flag"),
    pytest.param(
        [*RUN, "--config", "{aux}/job.yaml"],
        {"job.yaml": "budget:\n  epsilon: -1\n"},
        2,
        ["job.yaml", "budget.epsilon"],
        id="config-bad-value",
    ),
    pytest.param(
        [*RUN, "--config", "{aux}/job.yaml"],
        {"job.yaml": "budget:\n  epsilom: 1\n"},
        2,
        ["job.yaml", "budget.epsilom"],
        id="config-unknown-field",
    ),
    pytest.param(
        [*RUN, "--config", "{aux}/job.yaml"],
        {"job.yaml": "name: x\nbudget:\n  epsilon: 1.0\n   delta: 1\n"},
        2,
        ["job.yaml", "line 4"],
        id="config-yaml-syntax",
    ),
    pytest.param(
        [*RUN, "--config", "{aux}/job.yaml"],
        # An unquoted date YAML itself cannot build (Feb 30): still a spec error, not a crash.
        {"job.yaml": "input:\n  start_date: 2026-02-30\n"},
        2,
        ["job.yaml", "start_date"],
        id="config-impossible-date",
    ),
    pytest.param(
        [*RUN, "--config", "{aux}/missing.yaml"], {}, 2, ["missing.yaml"], id="config-missing"
    ),
    pytest.param([*RUN, "--input", "{aux}/nowhere"], {}, 1, ["nowhere"], id="input-missing"),
    pytest.param([*RUN, "--input", "{aux}/empty"], {"empty/": ""}, 1, ["empty"], id="input-empty"),
    pytest.param(
        [*RUN, "--input", "{aux}/data.txt"], {"data.txt": "x"}, 1, ["data.txt"], id="input-file"
    ),
    pytest.param(
        [*RUN, "--start-date", "2027-01-01"],
        {},
        1,
        [DAYS[0].isoformat(), DAYS[-1].isoformat()],
        id="no-days-in-range",
    ),
    pytest.param(
        [*RUN, "--public-partitions", "{aux}/keys.csv"],
        {},
        1,
        ["keys.csv"],
        id="public-partitions-missing",
    ),
    pytest.param(
        ["generate", "--output", "{output}", "--customers", "0"],
        {},
        2,
        ["customers"],
        id="generate-zero-customers",
    ),
    # Numbers PyDP or float64 sums cannot handle: a one-line error naming the field (issue 15).
    pytest.param([*RUN, "--epsilon", "1e-15"], {}, 2, ["budget.epsilon", "2^-50"], id="eps-1e-15"),
    pytest.param(
        [*RUN, "--min-value", "-1e308", "--max-value", "1e308"],
        {},
        2,
        ["--min-value (bounds.min_value)", "1e+15"],
        id="bounds-1e308",
    ),
    pytest.param(
        [*RUN, "--max-partitions-contributed", str(10**23)],
        {},
        2,
        ["--max-partitions-contributed", "2,147,483,647"],
        id="l0-1e23",
    ),
    pytest.param(
        [*RUN, "--pre-threshold", str(10**23)],
        {},
        2,
        ["--pre-threshold", "2,147,483,647"],
        id="pre-threshold-1e23",
    ),
    pytest.param(
        [*RUN, "--epsilon", "3000", "--noise", "gaussian"],
        {},
        2,
        ["budget.epsilon", "Gaussian", "use laplace"],
        id="gaussian-beyond-pydp",
    ),
    # What a user typed is quoted as a short, escaped excerpt.
    pytest.param(
        [*RUN, "--metrics", "x" * 100_000],
        {},
        2,
        ["--metrics", "(100,000 characters)"],
        id="long-metrics",
    ),
    pytest.param(
        [*RUN, "--epsilon", "9" * 100_000 + "x"],
        {},
        2,
        ["--epsilon", "(100,001 characters)"],
        id="long-number",
    ),
    pytest.param(
        [*RUN, "--partition-selection", "x" * 100_000],
        {},
        2,
        ["--partition-selection", "(100,000 characters)"],
        id="long-choice",
    ),
    pytest.param(
        [*RUN, "--noise", "gauss\nian"], {}, 2, ["--noise", "gauss\\nian"], id="newline-choice"
    ),
    pytest.param(
        [*RUN, "--config", "{aux}/job.yaml"],
        {"job.yaml": "budget:\n  epsilon: 1\nbudget:\n  epsilon: 9\n"},
        2,
        ["job.yaml", "line 3", "'budget' given twice"],
        id="config-duplicate-key",
    ),
    pytest.param(
        [*RUN, "--config", "{aux}/job.yaml"],
        {"job.yaml": "name: " + "A" * 1_000_000 + "\n"},
        2,
        ["job.yaml", "name:", "(1,000,000 characters)"],
        id="config-long-name",
    ),
    pytest.param(
        [*RUN, "--config", "{aux}/job.yaml"],
        {
            "job.yaml": "queries:\n  - name: q\n    filter: "
            + " or ".join(["TERMINAL_ID < 1"] * 501)
        },
        2,
        ["queries.q.filter", "more than 500 conditions"],
        id="config-filter-too-long",
    ),
    # No silent bounds: L0 = Linf = 1 released nothing on the demo data, exit 0, charged.
    pytest.param(
        ["run", "--input", "{input}", "--output", "{output}", "--metrics", "count"],
        {},
        2,
        ["--max-partitions-contributed", "bounds.max_partitions_contributed", "required"],
        id="no-l0",
    ),
    pytest.param(
        [
            "run",
            "--input",
            "{input}",
            "--output",
            "{output}",
            "--metrics",
            "count",
            "--max-partitions-contributed",
            "4",
        ],
        {},
        2,
        ["--max-contributions-per-partition", "required"],
        id="no-linf",
    ),
    pytest.param(
        [*RUN, "--delta", "0.999999"], {}, 2, ["--delta", "reveal a customer"], id="delta-near-1"
    ),
    pytest.param(
        [*RUN, "--no-ledger", "--cap-epsilon", "1"],
        {},
        2,
        ["budget.cap_epsilon", "only a ledger enforces it", "--no-ledger"],
        id="cap-without-ledger",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "files", "exit_code", "words"), ERROR_CASES)
def test_error_is_one_line_and_leaves_no_output(
    tmp_path, small_inputs, argv, files, exit_code, words
):
    aux = tmp_path / "aux"
    aux.mkdir()
    for name, text in files.items():
        if name.endswith("/"):
            (aux / name).mkdir()
        else:
            (aux / name).write_text(text)
    dest = tmp_path / "dest"
    dest.mkdir()
    output = dest / "release"
    values = {"input": small_inputs["parquet"], "output": output, "aux": aux}
    result = run_cli(*(arg.format(**values) for arg in argv))

    assert result.returncode == exit_code, result.stderr[-800:]
    assert "Traceback" not in result.stderr
    lines = stderr_lines(result)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("dppipeline")
    assert len(lines[0]) < 1000, lines[0][:1000]
    for word in words:
        assert word in lines[0]
    # Neither the release, nor a staging or retired folder, nor a quarantine folder.
    assert sorted(p.name for p in dest.iterdir()) == []


# --------------------------------------------------------------------------- successful runs


@pytest.fixture(scope="module")
def releases(tmp_path_factory, small_inputs) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """One release per input layout, over the public key list 0..terminals-1."""
    base = tmp_path_factory.mktemp("releases")
    keys = write_keys(base / "keys.csv", range(SMALL["terminals"]))
    runs = {}
    for fmt in ("parquet", "csv"):
        output = base / fmt / "release"
        result = run_cli(
            "run",
            "--engine",
            "local",
            "--input",
            small_inputs[fmt],
            "--output",
            output,
            "--format",
            fmt,
            "--public-partitions",
            keys,
            "--epsilon",
            "2",
            "--delta",
            "1e-7",
            "--max-partitions-contributed",
            "3",
            "--max-contributions-per-partition",
            "2",
            *VALUE_BOUNDS,
        )
        runs[fmt] = (output, result)
    return runs


def check_manifest(manifest: dict) -> None:
    assert manifest["manifest_version"] == 2
    assert manifest["epsilon"] == 2.0
    assert manifest["delta"] == 1e-7
    assert manifest["noise"] == "laplace"
    # A single-query job: its one query is named after the job.
    assert list(manifest["queries"]) == [QUERY]
    query = manifest["queries"][QUERY]
    assert query["bounds"] == {
        "max_partitions_contributed": 3,
        "max_contributions_per_partition": 2,
        "min_value": 0.0,
        "max_value": 100.0,
        "linf_bounding": "scale",  # count, sum, mean: the default scales
    }
    assert set(query["bounds"]) == MANIFEST_BOUNDS
    assert query["partition_selection"]["type"] == "public"
    assert query["partition_selection"]["public_partitions_count"] == SMALL["terminals"]
    metrics = query["metrics"]
    assert set(metrics) == {"count", "sum", "mean"}
    for name in ("count", "sum"):
        std = metrics[name]["noise_stddev"]
        assert isinstance(std, float)
        assert math.isfinite(std)
        assert std > 0
    assert "noise_stddev" in metrics["mean"]
    assert metrics["mean"]["noise_stddev"] is None


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_run_publishes_release_and_manifest(releases, fmt):
    output, result = releases[fmt]
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout.strip().splitlines()[-1] == str(output)
    assert sorted(p.name for p in output.iterdir()) == ["manifest.json", "terminal_stats"]
    part = output / "terminal_stats" / "part-00000.parquet"
    assert part.is_file()
    table = pq.read_table(part)
    assert table.column_names == ["TERMINAL_ID", "count", "sum", "mean"]
    # Public partitions: every listed key once, no other.
    assert sorted(table.column("TERMINAL_ID").to_pylist()) == list(range(SMALL["terminals"]))
    assert all(0.0 <= m <= 100.0 for m in table.column("mean").to_pylist())

    manifest = json.loads((output / "manifest.json").read_text())
    check_manifest(manifest)
    assert manifest["input"]["format"] == fmt
    assert manifest["input"]["start_date"] == DAYS[0].isoformat()
    assert manifest["input"]["end_date"] == DAYS[-1].isoformat()
    assert manifest["input"]["files"] == len(DAYS)
    # Atomic publication leaves nothing beside the release (and no rows were rejected).
    assert sorted(p.name for p in output.parent.iterdir()) == ["release"]


@pytest.mark.slow
def test_existing_release_refused_then_overwritten(tmp_path, releases, small_inputs):
    source, first = releases["parquet"]
    assert first.returncode == 0, first.stderr
    dest = tmp_path / "dest"
    output = dest / "release"
    shutil.copytree(source, output)
    before = tree_bytes(output)
    old_manifest = json.loads((output / "manifest.json").read_text())
    args = ["run", "--input", small_inputs["parquet"], "--output", output, *BOUNDS]

    refused = run_cli(*args)
    assert refused.returncode == 1, refused.stderr
    assert "Traceback" not in refused.stderr
    lines = stderr_lines(refused)
    assert len(lines) == 1, refused.stderr
    assert "--overwrite" in lines[0]
    assert str(output) in lines[0]
    assert tree_bytes(output) == before
    assert sorted(p.name for p in dest.iterdir()) == ["release"]

    replaced = run_cli(*args, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["run_id"] != old_manifest["run_id"]
    # This run used private selection: the manifest says so, with the release thresholds.
    selection = manifest["queries"][QUERY]["partition_selection"]
    assert selection["type"] == "private"
    assert 1 <= selection["privacy_units_needed_p50"] <= selection["privacy_units_needed_p95"]
    assert manifest["epsilon"] == 1.0
    assert sorted(p.name for p in output.iterdir()) == ["manifest.json", "terminal_stats"]
    assert sorted(p.name for p in dest.iterdir()) == ["release"]


@pytest.mark.parametrize(
    ("flags", "first", "last"),
    [
        pytest.param(["--start-date", "2026-01-02", "--end-date", "2026-01-02"], 1, 1, id="one"),
        pytest.param(["--start-date", "2026-01-02"], 1, 2, id="open-end"),
    ],
)
def test_date_range_selects_days(tmp_path, small_inputs, flags, first, last):
    output = tmp_path / "release"
    result = run_cli(
        "run",
        "--input",
        small_inputs["csv"],
        "--format",
        "csv",
        "--output",
        output,
        *BOUNDS,
        *flags,
    )
    assert result.returncode == 0, result.stderr
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["input"] == {
        "format": "csv",
        "start_date": DAYS[first].isoformat(),
        "end_date": DAYS[last].isoformat(),
        "files": last - first + 1,
    }


# --------------------------------------------------------------------------- plan

_MECHANISM_ROW = re.compile(
    r"^\s+(\w+)\s+(?:(?:discrete_)?laplace|(?:discrete_)?gaussian|truncated_geometric"
    r"|\w+_thresholding)\s+(\S+)\s+(\S+)"
)


def test_plan_private_selection_without_input(tmp_path):
    from dppipeline.core.plan import privacy_units_needed
    from dppipeline.lifecycle.runner import make_plan
    from dppipeline.spec.model import build_spec

    flags = ["--epsilon", "2", "--delta", "1e-5", *BOUNDS]
    result = run_cli("plan", *flags, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    out = result.stdout
    assert "epsilon=2 delta=1e-05" in out

    rows = [m.groups() for m in map(_MECHANISM_ROW.match, out.splitlines()) if m]
    assert [name for name, _, _ in rows] == ["count", "centred_sum", "partition_selection"]
    assert math.isclose(sum(float(eps) for _, eps, _ in rows), 2.0, rel_tol=1e-3)
    assert math.isclose(sum(float(d) for _, _, d in rows), 1e-5, rel_tol=1e-3)

    needs = re.search(
        r"needs (\d+) distinct CUSTOMER_ID .*50%, (\d+) for 95%", out.replace("\n", " ")
    )
    assert needs is not None, out
    p50, p95 = int(needs.group(1)), int(needs.group(2))
    plan = make_plan(
        build_spec(
            {},
            {
                "budget.epsilon": 2.0,
                "budget.delta": 1e-5,
                "bounds.min_value": 0.0,
                "bounds.max_value": 100.0,
                "bounds.max_partitions_contributed": 1,
                "bounds.max_contributions_per_partition": 1,
            },
        )
    )
    query_plan = plan.queries[0].plan
    assert (p50, p95) == (
        privacy_units_needed(query_plan, 0.5),
        privacy_units_needed(query_plan, 0.95),
    )
    assert p50 < p95
    assert list(tmp_path.iterdir()) == []  # wrote nothing


def test_plan_reads_no_data(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(
        "input:\n  path: does-not-exist\noutput: release\n"
        "partition_selection:\n  public_partitions: keys-not-there.csv\n"
        "bounds: {min_value: 0, max_value: 100, max_partitions_contributed: 1,"
        " max_contributions_per_partition: 1}\n"
    )
    result = run_cli("plan", "--config", config, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "partition selection: public keys" in result.stdout
    assert "needs" not in result.stdout  # no selection threshold under public partitions
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]


# --------------------------------------------------------------------------- generate, help


@pytest.mark.parametrize(
    ("fmt", "pattern"),
    [("parquet", "date={}/part-00000.parquet"), ("csv", "{}.csv")],
)
def test_generate_writes_daily_files(tmp_path, fmt, pattern):
    output = tmp_path / "tx"
    result = run_cli(
        "generate",
        "--output",
        output,
        "--format",
        fmt,
        "--customers",
        "200",
        "--terminals",
        "50",
        "--days",
        "2",
        "--start-date",
        "2026-03-30",
        "--tx-per-day",
        "300",
        "--seed",
        "5",
    )
    assert result.returncode == 0, result.stderr
    expected = sorted(pattern.format(day) for day in ("2026-03-30", "2026-03-31"))
    written = sorted(str(p.relative_to(output)) for p in output.rglob("*") if p.is_file())
    assert written == expected
    if fmt == "parquet":
        rows = sum(pq.read_metadata(output / name).num_rows for name in expected)
    else:
        rows = sum(len((output / name).read_text().splitlines()) - 1 for name in expected)
    assert rows > 0
    assert f"wrote {rows:,} transactions in 2 files" in result.stdout


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ([], ["generate", "run", "plan"]),
        (["generate"], ["--output", "--format", "--tx-per-day", "--seed"]),
        (["run"], ["--engine", "--input", "--output", "--overwrite", "--public-partitions"]),
        (["plan"], ["--config", "--epsilon", "--delta", "--max-partitions-contributed"]),
    ],
    ids=["top", "generate", "run", "plan"],
)
def test_help(command, words):
    result = run_cli(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: dppipeline")
    for word in words:
        assert word in result.stdout


def test_spark_without_java_fails_in_one_line(tmp_path, small_inputs):
    """The JVM starts in the background before the heavy imports; when Java is missing, the
    error from that thread still reaches the user as one line, exit 2, and nothing is written."""
    env = {k: v for k, v in os.environ.items() if k not in ("DPPIPELINE_DEBUG", "JAVA_HOME")}
    env["PATH"] = str(tmp_path / "no-java")  # an empty PATH: no `java` anywhere
    output = tmp_path / "release"
    argv = ["run", "--engine", "spark", "--input", small_inputs["parquet"], "--output", output]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dppipeline",
            *map(str, argv),
            "--metrics",
            "count",
            "--no-ledger",
            *PAIR_BOUNDS,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    errors = [line for line in stderr_lines(result) if "error" in line]
    assert errors == [
        "dppipeline run: error: --engine spark needs Java 17 or newer: install a JDK and put "
        "`java` on PATH or set JAVA_HOME"
    ]
    assert "Traceback" not in result.stderr
    assert not output.exists()


# --------------------------------------------------------------------------- failures as one line

LIVE_STATES = ("reserved", "reading")


def ledger_states(ledger: Path) -> list[str]:
    if not ledger.exists():
        return []
    with sqlite3.connect(ledger) as db:
        return [row[0] for row in db.execute("SELECT state FROM releases")]


def check_one_line_failure(result, exit_code: int, *words: str) -> str:
    assert result.returncode == exit_code, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in stderr_lines(result) if not line.startswith("[")]
    assert len(errors) == 1, result.stderr
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def run_release_into(output: Path, inputs, ledger: Path, prefix=(), **kwargs):
    """`dppipeline run` of the small input into `output`, in a subprocess (`prefix`: a
    command that runs it, e.g. setpriv; `kwargs`: for subprocess.run)."""
    env = {k: v for k, v in os.environ.items() if k != "DPPIPELINE_DEBUG"}
    argv = [
        *prefix,
        sys.executable,
        "-m",
        "dppipeline",
        "run",
        "--input",
        str(inputs["parquet"]),
        "--output",
        str(output),
        "--ledger",
        f"sqlite:///{ledger}",
        "--public-partitions",
        "0..99999",  # a release of 100,000 rows: a few MB
        *BOUNDS,
    ]
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=120, check=False, **kwargs
    )


def without_root_override() -> list[str]:
    """A command prefix under which file modes hold: root ignores them unless it gives up
    CAP_DAC_OVERRIDE (util-linux's setpriv); nothing for another user."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: file modes cannot be enforced")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


def test_read_only_output_folder_is_one_line(tmp_path, small_inputs):
    parent = tmp_path / "read-only"
    parent.mkdir()
    parent.chmod(0o555)
    ledger = tmp_path / "ledger.sqlite"
    try:
        result = run_release_into(parent / "release", small_inputs, ledger, without_root_override())
    finally:
        parent.chmod(0o755)
    check_one_line_failure(result, 1, str(parent), "Permission denied (EACCES)")
    assert list(parent.iterdir()) == []
    assert not set(ledger_states(ledger)) & {*LIVE_STATES, "committed"}


def test_output_under_a_regular_file_is_one_line(tmp_path, small_inputs):
    regular = tmp_path / "a-file"
    regular.write_text("not a folder\n")
    ledger = tmp_path / "ledger.sqlite"
    result = run_release_into(regular / "release", small_inputs, ledger)
    check_one_line_failure(result, 1, str(regular))
    assert regular.read_text() == "not a folder\n"
    assert not set(ledger_states(ledger)) & {*LIVE_STATES, "committed"}


def _file_size_limit(limit: int):
    def apply() -> None:  # in the child, before exec: writes past `limit` fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.slow
def test_disk_full_is_one_line(tmp_path, small_inputs):
    """The disk fills up while the release is written. RLIMIT_FSIZE makes the kernel refuse
    any write past 1 MB in the child process (EFBIG, as ENOSPC would on a full disk): the
    ledger stays small, the 100,000-row release does not fit."""
    parent = tmp_path / "out"
    parent.mkdir()
    ledger = tmp_path / "ledger.sqlite"
    result = run_release_into(
        parent / "release", small_inputs, ledger, preexec_fn=_file_size_limit(1 << 20)
    )
    check_one_line_failure(result, 1, "File too large (EFBIG)")
    assert list(parent.iterdir()) == []  # no release, no staging folder
    assert not set(ledger_states(ledger)) & {*LIVE_STATES, "committed"}


@pytest.mark.slow
def test_no_space_left_is_one_line(tmp_path, small_inputs):
    """The same on a real full file system: a 256 kB tmpfs mounted in a user and mount
    namespace (`unshare`, no root needed where unprivileged namespaces are allowed)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False).returncode:
        pytest.skip("user namespaces are not available here")
    parent = tmp_path / "small-disk"
    parent.mkdir()
    ledger = tmp_path / "ledger.sqlite"
    # The mount exists only inside the namespace: list what is left there, after the run.
    script = (
        f'mount -t tmpfs -o size=256k tmpfs "{parent}" && "$@"; code=$?; '
        f'ls -A "{parent}" >&2; exit $code'
    )
    result = run_release_into(
        parent / "release", small_inputs, ledger, ["unshare", "-rm", "sh", "-c", script, "sh"]
    )
    line = check_one_line_failure(result, 1, "No space left on device (ENOSPC)")
    assert line.startswith("dppipeline run: error: ")  # the `ls` printed nothing: no leftovers
    assert not set(ledger_states(ledger)) & {*LIVE_STATES, "committed"}


BUG = """
import sys
sys.modules["apache_beam"] = None  # as `cli.main` does for plan: no warning from its import
import dppipeline.reports.plan_text
from dppipeline.cli import main as cli

def render_plan(spec, plan, basic=None):  # a bug whose message quotes a data value
    raise KeyError("TX_AMOUNT=4242.42 of customer 1234567")

dppipeline.reports.plan_text.render_plan = render_plan
sys.exit(cli.main(["plan", "--min-value", "0", "--max-value", "100",
                   "--max-partitions-contributed", "1", "--max-contributions-per-partition", "1"]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("debug", [False, True])
def test_a_bug_is_one_line_without_its_message(debug):
    env = {k: v for k, v in os.environ.items() if k != "DPPIPELINE_DEBUG"}
    if debug:
        env["DPPIPELINE_DEBUG"] = "1"
    result = subprocess.run(
        [sys.executable, "-c", BUG],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    if debug:  # the full traceback, message included, for the one who debugs
        assert result.returncode == 1
        assert "Traceback" in result.stderr
        assert "4242.42" in result.stderr
        return
    line = check_one_line_failure(result, 70)
    assert re.fullmatch(
        r"dppipeline plan: error: internal error \(a bug\): KeyError at "
        r"dppipeline\.cli\.main:\d+; set DPPIPELINE_DEBUG=1 for the traceback",
        line,
    ), line
    assert "4242" not in result.stderr


SPARK_FAILURES = """
import json, os, sys
from pathlib import Path
from dppipeline.cli import main as cli
from dppipeline.engines.spark.spark_session import get_spark

spark = get_spark(app_name="t", master="local[1]", conf={"spark.ui.enabled": "false"})
folder = Path(sys.argv[1])
(folder / "rows.txt").write_text("a\\n")

def lost_file(args):  # a file deleted after Spark listed it
    frame = spark.read.text(str(folder / "rows.txt"))
    os.remove(folder / "rows.txt")
    frame.collect()

failures = {
    "java-bug": lambda args: spark.sql("SELECT raise_error('TX_AMOUNT=4242.42')").collect(),
    "missing-path": lambda args: spark.read.parquet(str(folder / "nowhere")).collect(),
    "lost-file": lost_file,
}
results = {}
for name, failure in failures.items():
    cli.COMMANDS["plan"] = failure
    code = cli.main(["plan"])
    results[name] = code
print(json.dumps(results))
"""


@pytest.mark.usefixtures("spark")
def test_spark_java_errors_are_one_line(tmp_path):
    """Py4J and PySpark errors carry Java traces and messages that can quote data: the line
    names the Java class or Spark's error condition only."""
    env = {k: v for k, v in os.environ.items() if k != "DPPIPELINE_DEBUG"}
    result = subprocess.run(
        [sys.executable, "-c", SPARK_FAILURES, str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    codes = json.loads(result.stdout.strip().splitlines()[-1])
    assert codes == {"java-bug": 70, "missing-path": 1, "lost-file": 1}, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("dppipeline")]
    assert len(lines) == 3, result.stderr[-3000:]
    assert "internal error (a bug, or Spark failed)" in lines[0]
    assert "PATH_NOT_FOUND" in lines[1]
    assert "FAILED_READ_FILE" in lines[2]
    for line in lines:
        assert "4242" not in line
        assert "Traceback" not in line
    assert "Traceback" not in result.stderr


_LAPLACE_SKIPS = ("apache_beam", "dp_accounting.pld", "pyspark", "pipeline_dp", "scipy")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "absent", "present", "stats"),
    [
        ((), (*_LAPLACE_SKIPS, "sqlalchemy"), (), "absent"),
        (("--format", "csv"), (*_LAPLACE_SKIPS, "sqlalchemy"), (), "absent"),
        (
            ("--accounting", "zcdp", "--delta", "1e-6"),
            ("apache_beam", "pyspark", "pipeline_dp"),
            ("dp_accounting.pld",),
            "loaded",
        ),
        (
            ("--noise", "gaussian", "--delta", "1e-6"),
            ("apache_beam", "pyspark", "dp_accounting.pld"),
            ("pipeline_dp",),
            "lazy",
        ),
    ],
    ids=["detected-layout", "named-format", "zcdp", "gaussian"],
)
def test_a_local_run_imports_only_what_it_uses(
    tmp_path, small_inputs, flags, absent, present, stats
):
    """A local run's process never loads Beam or Spark, nor dp_accounting's PLD code unless
    the job's accounting composes with it: together 1.3 s of start-up. Layout detection once
    imported pipeline-dp before the spec was known, which brought the PLD code back (0.8 s).
    A Laplace run loads no pipeline-dp, scipy or (without a ledger) SQLAlchemy at all. For a
    Gaussian run, scipy.stats (0.45 s), which pipeline-dp imports for a function no run calls,
    loads when first used: a zCDP run's accounting uses it (and releases); other runs never
    execute it. (`cli.main` marks what it skips as absent: `sys.modules[name] is None`.)"""
    folder = small_inputs["csv"] if "csv" in flags else small_inputs["parquet"]
    probe = (
        "import atexit, runpy, sys\n"
        "names = ('apache_beam', 'dp_accounting.pld', 'pyspark', 'pipeline_dp', 'scipy',"
        " 'sqlalchemy')\n"
        "atexit.register(lambda: print('LOADED', *[n for n in names if sys.modules.get(n)],"
        " file=sys.stderr))\n"
        "atexit.register(lambda: print('STATS', 'absent' if 'scipy.stats' not in sys.modules"
        " else type(sys.modules['scipy.stats']) is type(sys), file=sys.stderr))\n"
        "runpy.run_module('dppipeline', run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, "run", "--input", folder, "--output", tmp_path / "out",
         "--no-ledger", "--public-partitions", "0..9", "--metrics", "count", *PAIR_BOUNDS,
         *flags],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("LOADED")]
    loaded = set(line.split()[1:])
    assert set(present) <= loaded, loaded  # the probe sees what a run loads
    assert not loaded & set(absent), loaded
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("STATS")]
    expected = "absent" if stats == "absent" else str(stats == "loaded")
    assert line == f"STATS {expected}", line  # never imported, executed, or a LazyLoader's
    assert (tmp_path / "out" / QUERY).exists()


_LIVE_POOL_AT_EXIT = """
import concurrent.futures
import threading
from dppipeline.cli import main as cli
pool = concurrent.futures.ThreadPoolExecutor(1)  # alive at exit, as a library's may be
pool.submit(int).result()
threading.Thread(target=lambda: None).start()  # a plain non-daemon thread too
cli._exit_now(3)
"""


def test_the_cli_exit_ends_with_live_threads_and_keeps_the_code():
    """`_exit_now` (a CLI process's end, without module teardown) ends a process that still
    holds an idle ThreadPoolExecutor and a non-daemon thread, with the given exit code: it
    first hung on the pool's idle worker (an audit's finding)."""
    root = str(REPO)
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run(
        [sys.executable, "-c", _LIVE_POOL_AT_EXIT], check=False, timeout=60, env=env
    )
    assert done.returncode == 3


def test_tune_refuses_an_infinite_epsilon_and_records_nothing(small_inputs, tmp_path):
    """`--tune-epsilon inf` once reserved infinity and left a failed row of epsilon inf: the
    scope was exhausted for ever. Refused now before anything is recorded."""
    ledger = tmp_path / "ledger.sqlite"
    result = run_cli(
        "tune", "--input", small_inputs["parquet"], *BOUNDS, "--partitions", "50",
        "--tune-epsilon", "inf", "--ledger", ledger,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    (line,) = stderr_lines(result)
    assert "--tune-epsilon: must be finite" in line
    assert not ledger.exists() or Ledger(ledger).rows() == []


@pytest.mark.slow
def test_plan_warns_when_the_pre_threshold_exceeds_what_the_noise_needs():
    result = run_cli(
        "plan", *BOUNDS, "--metrics", "count", "--pre-threshold", "40",
        "--partition-selection", "laplace_thresholding",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warning: pre_threshold=40 exceeds the 32 CUSTOMER_ID the noise alone needs" in (
        result.stdout
    )
    quiet = run_cli("plan", *BOUNDS, "--metrics", "count", "--pre-threshold", "2",
                    "--partition-selection", "laplace_thresholding")  # fmt: skip
    assert "warning" not in quiet.stdout
