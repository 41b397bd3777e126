"""Settings read from the environment: every variable the package reads (or sets), in one place.

`VARIABLES` is the registry: each variable's name, default, what it does, who reads it and the
rule a value must follow; docs/reference/environment.md is its table for operators (a test keeps
the two equal). Each variable is read through a function below, at call time (never cached at
import), so that a test or an operator changing the environment between two runs of one process
is seen by the second. A value that breaks its rule is a `UsageError` of one line naming the
variable and the rule (the CLI: exit 2, no traceback); `validate` checks them all, and the CLI
calls it before any command so that a bad value fails before the ledger is touched.

The ledger and the state folder are decided here for every entry point (the CLI, the Python API,
the Beam transform, the Airflow tasks through the CLI), so a release from any of them is charged
to the same ledger.

Two variables are written, by named functions only (`export_debug_statistics`,
`default_pyspark_python`): the environment is how a setting reaches the whole run, every module
of this process (the engines read `debug_statistics` instead of taking a flag) and the processes
it starts (Spark's Python workers take PYSPARK_PYTHON). Nothing else in dppipeline touches
`os.environ`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dppipeline.errors import UsageError

LEDGER_VARIABLE = "DPPIPELINE_LEDGER"
STATE_DIR_VARIABLE = "DPPIPELINE_STATE_DIR"
DEBUG_STATISTICS_VARIABLE = "DPPIPELINE_DEBUG_STATISTICS"
PYSPARK_PYTHON_VARIABLE = "PYSPARK_PYTHON"

DEFAULT_STATE_DIR = "state"
DEFAULT_LEDGER_TIMEOUT_SECONDS = 10.0
DEFAULT_LEASE_SECONDS = 120.0
DEFAULT_DRIVER_RELEASE_MAX_PARTITIONS = 1_000_000
# JVM options of a Spark session started here (local mode: the driver JVM runs the tasks). The
# throughput collector: bounding boxes every value it collects, and G1 (Java's default) was
# slower (docs/explanation/engines.md).
DEFAULT_SPARK_JAVA_OPTIONS = "-XX:+UseParallelGC"
DEFAULT_SPARK_MASTER = "local[*]"
DEFAULT_SPARK_LOG_LEVEL = "WARN"
SPARK_LOG_LEVELS = ("ALL", "DEBUG", "ERROR", "FATAL", "INFO", "OFF", "TRACE", "WARN")
# A run's stage boundaries where a failpoint may stop it (lifecycle/failpoints.py says what
# each one is), and what it can do there.
FAILPOINT_STAGES = (
    "reserved", "reading", "written", "staged", "uploading", "committed", "exchanged", "published",
)  # fmt: skip
FAILPOINT_ACTIONS = ("kill", "term", "int", "stop", "error")


@dataclass(frozen=True)
class Variable:
    """One environment variable: what an operator needs to know, and the rule its value obeys.

    `rule` is the text of the one-line error (`<name> <rule>`), None for free text; `check`
    raises that error for a bad value (None: nothing to check)."""

    name: str
    default: str
    meaning: str
    readers: str
    rule: str | None = None
    check: Callable[[], object] | None = None


def _text(name: str) -> str | None:
    """The variable's value; None when unset or empty (an empty value means the default)."""
    return os.environ.get(name) or None


def _flag(name: str) -> bool:
    """A switch: on when set to anything but empty or `0`."""
    return os.environ.get(name, "") not in ("", "0")


def _bad(name: str) -> UsageError:
    return UsageError(f"{name} {VARIABLES[name].rule}")


def _seconds(name: str, default: float) -> float:
    text = _text(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise _bad(name) from None
    if not (value > 0 and math.isfinite(value)):
        raise _bad(name)
    return value


# --- where the operator's state and the ledger live ---------------------------------------


def state_dir() -> Path:
    """The operator's state folder: $DPPIPELINE_STATE_DIR, default ./state."""
    return Path(_text(STATE_DIR_VARIABLE) or DEFAULT_STATE_DIR)


def default_ledger() -> str:
    """$DPPIPELINE_LEDGER, else ledger.sqlite in the state folder."""
    return _text(LEDGER_VARIABLE) or os.path.join(state_dir(), "ledger.sqlite")


# --- the ledger: lock waits, leases, host ids ---------------------------------------------


def ledger_timeout() -> float:
    """$DPPIPELINE_LEDGER_TIMEOUT: seconds to wait for a lock or a connection."""
    return _seconds("DPPIPELINE_LEDGER_TIMEOUT", DEFAULT_LEDGER_TIMEOUT_SECONDS)


def lease_seconds() -> float:
    """$DPPIPELINE_LEASE_SECONDS: how long a reservation lives without a renewal."""
    return _seconds("DPPIPELINE_LEASE_SECONDS", DEFAULT_LEASE_SECONDS)


def renew_seconds() -> float:
    """$DPPIPELINE_LEASE_RENEW_SECONDS, default a sixth of the lease; shorter than the lease, or
    a live run's reservation would expire between two renewals."""
    lease = lease_seconds()
    renew = _seconds("DPPIPELINE_LEASE_RENEW_SECONDS", lease / 6)
    if renew >= lease:
        raise UsageError(f"{_bad('DPPIPELINE_LEASE_RENEW_SECONDS')} ({lease:g} s)")
    return renew


def host_id() -> str | None:
    """$DPPIPELINE_HOST_ID; None: the ledger makes one (hostname and a per-process id)."""
    return _text("DPPIPELINE_HOST_ID")


# --- engines --------------------------------------------------------------------------------


def driver_release_max_partitions() -> int:
    """$DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS: above this many partitions the Spark engine
    releases on the executors (0: always)."""
    name = "DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS"
    text = _text(name)
    if text is None:
        return DEFAULT_DRIVER_RELEASE_MAX_PARTITIONS
    try:
        value = int(text)
    except ValueError:
        raise _bad(name) from None
    if value < 0:
        raise _bad(name)
    return value


def spark_master() -> str:
    """$DPPIPELINE_SPARK_MASTER: the master of a Spark session started in-process."""
    return _text("DPPIPELINE_SPARK_MASTER") or DEFAULT_SPARK_MASTER


def spark_java_options() -> str:
    """$DPPIPELINE_SPARK_JAVA_OPTIONS (set but empty: no options), else the default."""
    return os.environ.get("DPPIPELINE_SPARK_JAVA_OPTIONS", DEFAULT_SPARK_JAVA_OPTIONS)


def spark_log_level() -> str:
    """$DPPIPELINE_SPARK_LOG_LEVEL: the Spark driver's log level (Spark's own names)."""
    name = "DPPIPELINE_SPARK_LOG_LEVEL"
    level = _text(name) or DEFAULT_SPARK_LOG_LEVEL
    if level.upper() not in SPARK_LOG_LEVELS:
        raise _bad(name)
    return level


def java_home() -> Path | None:
    """$JAVA_HOME: where Spark finds Java when `java` is not on PATH."""
    text = _text("JAVA_HOME")
    return Path(text) if text else None


def launched_by_spark_submit() -> bool:
    """Is this process a driver started by spark-submit (or the pyspark shell)? They set
    PYSPARK_GATEWAY_PORT; the master and resources are then theirs."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def default_pyspark_python(executable: str) -> None:
    """Python workers of a local Spark session use `executable` (this interpreter and its
    packages) unless $PYSPARK_PYTHON says otherwise. Spark reads the variable when it starts
    its workers, so it is written to this process's environment."""
    os.environ.setdefault(PYSPARK_PYTHON_VARIABLE, executable)


# --- the operator channel and tests ---------------------------------------------------------


def debug() -> bool:
    """$DPPIPELINE_DEBUG: a failure shows its traceback instead of one line."""
    return _flag("DPPIPELINE_DEBUG")


def debug_statistics() -> bool:
    """$DPPIPELINE_DEBUG_STATISTICS: data-dependent figures are logged, marked NOT PRIVATE."""
    return _flag(DEBUG_STATISTICS_VARIABLE)


def export_debug_statistics(enabled: bool) -> None:
    """The CLI's --debug-statistics, for the whole process and those it starts: every module
    reads `debug_statistics` instead of receiving a flag. A CLI run without the flag turns it
    off, whatever the environment said."""
    if enabled:
        os.environ[DEBUG_STATISTICS_VARIABLE] = "1"
    else:
        os.environ.pop(DEBUG_STATISTICS_VARIABLE, None)


def publish_no_exchange() -> bool:
    """$DPPIPELINE_PUBLISH_NO_EXCHANGE: publish as if renameat2(RENAME_EXCHANGE) were missing
    (two renames), for tests."""
    return _flag("DPPIPELINE_PUBLISH_NO_EXCHANGE")


def failpoints() -> tuple[tuple[str, str], ...]:
    """$DPPIPELINE_FAILPOINT as (stage, action) pairs, in order; () when unset."""
    name = "DPPIPELINE_FAILPOINT"
    text = _text(name)
    if text is None:
        return ()
    pairs = []
    for item in text.split(","):
        stage, _, action = item.strip().partition(":")
        if stage not in FAILPOINT_STAGES or action not in FAILPOINT_ACTIONS:
            raise _bad(name)
        pairs.append((stage, action))
    return tuple(pairs)


# --- the registry ---------------------------------------------------------------------------


def _variables(*variables: Variable) -> dict[str, Variable]:
    return {v.name: v for v in variables}


VARIABLES: dict[str, Variable] = _variables(
    Variable(
        STATE_DIR_VARIABLE, "`./state`",
        "The operator's state folder: the default ledger, quarantined rows, locks, staging, "
        "the Beam transform's records.",
        "`run`, `tune`, `budget`, `check-release`, `report`, the Python API, the Beam "
        "transform",
    ),
    Variable(
        LEDGER_VARIABLE, "`$DPPIPELINE_STATE_DIR/ledger.sqlite`",
        "The budget ledger (a path or a `sqlite:///` / `postgresql://` URL) when `--ledger` "
        "is not given.",
        "`run`, `tune`, `budget`, `check-release`, `report`, the Python API, the Beam "
        "transform",
    ),
    Variable(
        "DPPIPELINE_LEDGER_TIMEOUT", "`10`",
        "Seconds to wait for the ledger's lock or connection while no other process makes "
        "progress.",
        "every command that opens the ledger",
        "must be a positive number of seconds", ledger_timeout,
    ),
    Variable(
        "DPPIPELINE_LEASE_SECONDS", "`120`",
        "How long a reservation lives without a renewal before `budget repair` may settle it.",
        "`run`, `tune`, `budget repair`",
        "must be a positive number of seconds", lease_seconds,
    ),
    Variable(
        "DPPIPELINE_LEASE_RENEW_SECONDS", "a sixth of the lease",
        "How often a running job renews its lease.",
        "`run`, `tune`",
        "must be a positive number of seconds shorter than the lease", renew_seconds,
    ),
    Variable(
        "DPPIPELINE_HOST_ID", "`<hostname>/<random per process>`",
        "This process's host id, recorded in the ledger's rows for operators.",
        "every command that writes the ledger",
    ),
    Variable(
        "DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS", "`1000000`",
        "Above this many partitions the Spark engine releases on the executors instead of the "
        "driver (`0`: always on the executors).",
        "`run --engine spark`",
        "must be a non-negative integer", driver_release_max_partitions,
    ),
    Variable(
        "DPPIPELINE_SPARK_MASTER", f"`{DEFAULT_SPARK_MASTER}`",
        "Master of a Spark session started in-process (not under spark-submit).",
        "Spark engine",
    ),
    Variable(
        "DPPIPELINE_SPARK_JAVA_OPTIONS", f"`{DEFAULT_SPARK_JAVA_OPTIONS}`",
        "JVM options of a Spark session started in-process (set but empty: none).",
        "Spark engine",
    ),
    Variable(
        "DPPIPELINE_SPARK_LOG_LEVEL", f"`{DEFAULT_SPARK_LOG_LEVEL}`",
        "Log level of the Spark driver.",
        "Spark engine",
        f"must be one of {', '.join(SPARK_LOG_LEVELS)}", spark_log_level,
    ),
    Variable(
        "JAVA_HOME", "unset (`java` on PATH)",
        "Where Spark finds Java 17+; checked before a session starts.",
        "Spark engine",
    ),
    Variable(
        "PYSPARK_GATEWAY_PORT", "unset",
        "Set by spark-submit and the pyspark shell: the master and resources are theirs, and "
        "the session's own master and JVM options are not applied.",
        "Spark engine",
    ),
    Variable(
        PYSPARK_PYTHON_VARIABLE, "this interpreter (local sessions)",
        "Python of Spark's workers; a local session sets it to the driver's interpreter when "
        "unset (written, not only read).",
        "Spark engine",
    ),
    Variable(
        "DPPIPELINE_DEBUG", "unset",
        "Set (not `0`): a failure shows its traceback instead of one line.",
        "every command",
    ),
    Variable(
        DEBUG_STATISTICS_VARIABLE, "unset",
        "Set (not `0`): data-dependent figures are logged, marked NOT PRIVATE. The CLI sets it "
        "from `--debug-statistics` (and clears it without the flag).",
        "`run` (Spark and Beam engines), the Python API",
    ),
    Variable(
        "DPPIPELINE_PUBLISH_NO_EXCHANGE", "unset",
        "Set (not `0`): publish with two renames, as on a system without "
        "renameat2(RENAME_EXCHANGE). Tests only.",
        "`run`",
    ),
    Variable(
        "DPPIPELINE_FAILPOINT", "unset",
        "`<stage>:<action>[,...]`: the run stops on purpose at that stage (crash tests only; "
        "see docs/explanation/operations.md).",
        "`run`, the Python API",
        f"must be <stage>:<action>[,...] with a stage of {', '.join(FAILPOINT_STAGES)} and an "
        f"action of {', '.join(FAILPOINT_ACTIONS)}",
        failpoints,
    ),
)  # fmt: skip


def validate() -> None:
    """Checks every variable that has a rule: the first bad one is a UsageError."""
    for variable in VARIABLES.values():
        if variable.check is not None:
            variable.check()
