"""Errors a user can act on, and how any failure becomes the CLI's one line.

Exit codes follow the CLI contract: 0 success; 1 input/output error (bad or missing data, an
existing release, a file system refusing a write, a ledger that cannot be used: retryable); 2
usage error (flags, job spec); 3 budget refused by the ledger (do not retry); 70 internal error,
a bug; 75 budget held by a live reservation of another run (EX_TEMPFAIL: retry after the time
it names); 130 interrupted; 143 terminated.

Messages echo what a user typed (a spec value, a filter token, a flag) only through `excerpt`:
short, escaped, on one line, so a megabyte-long identifier or a value with control characters
cannot flood a log or forge a second line. They never quote a cell of the input data.
"""

from __future__ import annotations

import errno
import os
import reprlib
import unicodedata

EXIT_IO = 1
EXIT_USAGE = 2
EXIT_BUDGET = 3
EXIT_BUG = 70  # EX_SOFTWARE in sysexits.h
EXIT_HELD = 75  # EX_TEMPFAIL in sysexits.h

EXCERPT_CHARS = 40  # characters of a user's text an error message quotes at most
LINE_CHARS = 2000  # the longest line `one_line` lets through


class DPPipelineError(Exception):
    """Base class: a message meant for the user, and the exit code it maps to."""

    exit_code = EXIT_IO


class UsageError(DPPipelineError):
    """The command line or the job spec is wrong: fix the invocation, not the data."""

    exit_code = EXIT_USAGE


class SpecError(UsageError):
    """A job spec field breaks a rule; the message names the field and the rule."""

    def __init__(self, field: str, rule: str):
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


class InputError(DPPipelineError):
    """The input data is missing or invalid (names the file, row or field)."""


class OutputError(DPPipelineError):
    """The output location cannot be written as asked (e.g. a release already exists)."""


class BudgetExceededError(DPPipelineError):
    """The ledger refuses the spend (cap exhausted, or a spec that would change the scope's
    cap); nothing was read or spent (exit code 3: do not retry). `remaining_epsilon` and
    `remaining_delta`: what the scope's cap still allows (inf without a cap on it; None when
    the refusal is not about what is left)."""

    exit_code = EXIT_BUDGET

    def __init__(
        self,
        message: str,
        *,
        remaining_epsilon: float | None = None,
        remaining_delta: float | None = None,
    ):
        super().__init__(message)
        self.remaining_epsilon = remaining_epsilon
        self.remaining_delta = remaining_delta


class BudgetHeldError(BudgetExceededError):
    """The spend would fit but for live reservations of other runs that have read nothing yet
    (they may still abort and give their budget back): exit code 75, retry at `retry_at` (the
    latest of their leases, UTC). Nothing was read or spent. A BudgetExceededError, so code
    that catches refusals catches this one too."""

    exit_code = EXIT_HELD

    def __init__(
        self,
        message: str,
        *,
        held_by: str,
        retry_at: str,
        remaining_epsilon: float | None = None,
        remaining_delta: float | None = None,
    ):
        super().__init__(
            message, remaining_epsilon=remaining_epsilon, remaining_delta=remaining_delta
        )
        self.held_by = held_by
        self.retry_at = retry_at


BudgetExceeded = BudgetExceededError  # the public API's name


# --- quoting what a user typed ---------------------------------------------------------------

_SHORT = reprlib.Repr()
_SHORT.maxstring = EXCERPT_CHARS
_SHORT.maxother = EXCERPT_CHARS
_SHORT.maxlong = EXCERPT_CHARS
_SHORT.maxlevel = 2
for _name in ("maxlist", "maxtuple", "maxdict", "maxset", "maxfrozenset", "maxdeque"):
    setattr(_SHORT, _name, 4)


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """`value` as an error message may quote it: Python's repr (quoted, control and other
    non-printable characters escaped), cut after `limit` characters with the full length
    stated, collections cut after a few items and two levels."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... ({len(value):,} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        # repr would need every digit (and refuses above 4,300 of them)
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits"
    try:
        return _SHORT.repr(value)
    except Exception:  # a value whose repr fails (e.g. an int past Python's digit limit)
        return f"a value of type {type(value).__name__}"


def one_line(message: str, limit: int = LINE_CHARS) -> str:
    """The message as one printable line of at most about `limit` characters: the CLI's last
    guard, after every message has quoted user text through `excerpt`."""
    if not message.isprintable():
        message = "".join(ch if ch.isprintable() or ch == " " else _escape(ch) for ch in message)
    if len(message) > limit:
        cut = len(message) - limit
        message = f"{message[: limit // 2]}...({cut:,} characters cut)...{message[-limit // 2 :]}"
    return message


def _escape(ch: str) -> str:
    if unicodedata.category(ch) == "Zs":
        return " "
    return repr(ch)[1:-1]


# --- any failure as one line -----------------------------------------------------------------


def is_failure(exc: BaseException) -> bool:
    """An exception the CLI reports as a failure: any Exception, and a Rust panic from Polars
    (pyo3's PanicException derives from BaseException); not an exit, Ctrl-C or a signal."""
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


def describe_failure(exc: BaseException) -> tuple[int, str]:
    """(exit code, one-line message) for an exception that reached the CLI.

    A DPPipelineError says itself. An OSError names its file and the reason (errno), never
    its free text, which for pyarrow or Polars can carry anything. A Spark (Py4J) error names
    its Java class or error condition, never its message, which can quote data values.
    Anything else is a bug: its type and where it was raised, no message.
    """
    if isinstance(exc, DPPipelineError):
        return exc.exit_code, str(exc)
    spark = _spark_failure(exc)
    if spark is not None:
        return spark
    if isinstance(exc, OSError) and (exc.errno is not None or exc.filename is not None):
        return EXIT_IO, _os_error_line(exc)
    return EXIT_BUG, (
        f"internal error (a bug): {type(exc).__name__} at {_where(exc)}; "
        "set DPPIPELINE_DEBUG=1 for the traceback"
    )


def _os_error_line(exc: OSError) -> str:
    """`PATH: reason (ERRNO)`; the reason is the C library's text for the errno."""
    if exc.errno:
        code = errno.errorcode.get(exc.errno, str(exc.errno))
        reason = f"{os.strerror(exc.errno)} ({code})"
    else:
        reason = type(exc).__name__
    paths = [_path_text(p) for p in (exc.filename, exc.filename2) if p is not None]
    return f"{' -> '.join(paths)}: {reason}" if paths else f"I/O error: {reason}"


def _path_text(path: object) -> str:
    return os.fsdecode(path) if isinstance(path, str | bytes | os.PathLike) else str(path)


def _where(exc: BaseException) -> str:
    """`module:line` of the innermost frame in dppipeline's own code (else the innermost)."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((str(tb.tb_frame.f_globals.get("__name__", "?")), tb.tb_lineno))
        tb = tb.tb_next
    if not frames:
        return "unknown location"
    ours = [f for f in frames if f[0] == "dppipeline" or f[0].startswith("dppipeline.")]
    module, line = (ours or frames)[-1]
    return f"{module}:{line}"


# Java exceptions whose cause is the file system or the network, not our code: exit 1.
_JAVA_IO = ("java.io.", "java.nio.file.", "org.apache.hadoop.fs.", "java.net.")
_SPARK_IO_CONDITIONS = ("FAILED_READ_FILE", "PATH_NOT_FOUND", "UNABLE_TO_INFER_SCHEMA")


def _spark_failure(exc: BaseException) -> tuple[int, str] | None:
    """A Py4J or PySpark error as (exit code, line), or None if `exc` is neither. Looked up
    by module name, so that nothing here imports pyspark."""
    module = type(exc).__module__ or ""
    if not module.startswith(("py4j", "pyspark")):
        return None
    throwable = getattr(exc, "java_exception", None)  # a Py4JJavaError's Java side
    condition = next(
        (
            c
            for obj in (exc, throwable)
            for m in ("getCondition", "getErrorClass")
            if (c := _call(obj, m))
        ),
        None,
    )
    java = _java_classes(exc)
    what = " caused by ".join(java) if java else type(exc).__name__
    if condition:
        what = f"{condition} ({what})"
    io = any(name.startswith(_JAVA_IO) for name in java) or (
        condition is not None and condition.startswith(_SPARK_IO_CONDITIONS)
    )
    if io:
        return EXIT_IO, (
            f"Spark could not read or write a file: {what}; "
            "set DPPIPELINE_DEBUG=1 for the Java trace"
        )
    return EXIT_BUG, (
        f"internal error (a bug, or Spark failed): {what} at {_where(exc)}; "
        "set DPPIPELINE_DEBUG=1 for the traceback"
    )


def _call(obj: object, method: str) -> str | None:
    try:
        value = getattr(obj, method)()
    except Exception:
        return None
    return value if isinstance(value, str) and value else None


def _java_classes(exc: BaseException, depth: int = 6) -> list[str]:
    """Class names of the Java exception behind `exc` and its causes (outermost first)."""
    throwable = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    names: list[str] = []
    try:
        while throwable is not None and len(names) < depth:
            names.append(str(throwable.getClass().getName()))
            throwable = throwable.getCause()
    except Exception:  # the JVM may be gone: the names found so far will do
        pass
    return names
