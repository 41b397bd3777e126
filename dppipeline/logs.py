"""The operator channel: what a run may say besides its release, and how.

Everything a run prints goes through `logging` under the `dppipeline` logger; the CLI installs
one handler (`configure`), a library caller or Airflow keeps its own. Progress lines may carry
only data-independent facts (the spec, paths, timings, the ledger's state) and the two numbers a
run may publish about its raw input: rows read and rows rejected. Released figures (the count of
released partitions) are part of the release.

Any other data-dependent figure (partitions aggregated before selection, pairs kept after
bounding) is a debug statistic: it goes through `statistic`, which drops it unless the operator
asked for `--debug-statistics`, and marks every such line NOT PRIVATE.
"""

from __future__ import annotations

import logging
import sys

from dppipeline import settings

log = logging.getLogger("dppipeline")

# An environment variable, not a module flag: the Python API and Beam/Spark launchers read it
# too, and processes this one starts inherit it (settings.export_debug_statistics).
DEBUG_STATISTICS = settings.DEBUG_STATISTICS_VARIABLE
NOT_PRIVATE = "NOT PRIVATE (debug statistics): "


def statistic(logger: logging.Logger, message: str) -> None:
    """A data-dependent figure for debugging: emitted, marked, only under --debug-statistics."""
    if settings.debug_statistics():
        logger.warning(NOT_PRIVATE + message)


class _StderrHandler(logging.Handler):
    """Writes to the current `sys.stderr` (captured streams included); a reader that went away
    (`run ... 2>&1 | head`) silences it instead of failing the run or printing a traceback."""

    def __init__(self, formatter: logging.Formatter) -> None:
        super().__init__()
        self.setFormatter(formatter)
        self._closed = False

    def emit(self, record: logging.LogRecord) -> None:
        if self._closed:
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except (BrokenPipeError, ConnectionResetError, ValueError):
            self._closed = True  # ValueError: the stream was closed


class _Format(logging.Formatter):
    """Progress as plain lines; warnings and errors with their level; -v adds the logger."""

    def __init__(self, verbose: bool) -> None:
        super().__init__()
        self._verbose = verbose

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if self._verbose:
            return f"{record.levelname} {record.name}: {message}"
        if record.levelno >= logging.WARNING and not message.startswith(NOT_PRIVATE):
            return f"{record.levelname.lower()}: {message}"
        return message


def _install(logger: logging.Logger, handler: logging.Handler, level: int) -> None:
    for existing in [h for h in logger.handlers if isinstance(h, _StderrHandler)]:
        logger.removeHandler(existing)
    logger.addHandler(handler)
    logger.setLevel(level)


def configure(
    *, verbose: bool = False, quiet: bool = False, debug_statistics: bool = False
) -> None:
    """The CLI's handlers: dppipeline's progress at INFO (`-q`: warnings only, `-v`: debug);
    other libraries' warnings, named. Their debug output only with `-v --debug-statistics`:
    it is raw data (Beam logs every element it processes at DEBUG, customer ids and sampling
    priorities included; py4j every answer from the JVM)."""
    settings.export_debug_statistics(debug_statistics)
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    _install(log, _StderrHandler(_Format(verbose)), level)
    log.propagate = False  # one line per message, whatever the root logger holds
    others = _StderrHandler(_Format(verbose=True))
    # pipeline-dp imports apache_beam when it is installed, which warns about GCP extras.
    others.addFilter(lambda record: "apitools" not in record.getMessage())
    library_debug = verbose and debug_statistics
    _install(logging.getLogger(), others, logging.DEBUG if library_debug else logging.WARNING)
