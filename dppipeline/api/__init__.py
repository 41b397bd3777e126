"""The Python API: jobs, plans and releases over DataFrames and PCollections (issue 22).

`dppipeline` re-exports the public names lazily (`dppipeline.__getattr__`), so that
`import dppipeline` stays cheap. Everything else in the package is private and may change.
"""

from __future__ import annotations

import logging
import sys


def _import_pipeline_dp_quietly() -> None:
    """pipeline-dp imports apache_beam when it is installed, and Beam's import calls
    `logging.warning` about missing GCP extras on the root logger, which in a notebook that
    configured no logging also installs a root handler (`basicConfig`). The first import runs
    with a NullHandler and a filter on the root logger, both removed after: the warning is
    dropped and the caller's logging is left as it was."""
    if "pipeline_dp" in sys.modules:
        return
    root = logging.getLogger()
    guard = logging.NullHandler()

    def not_apitools(record: logging.LogRecord) -> bool:
        return "apitools" not in record.getMessage()

    root.addHandler(guard)
    root.addFilter(not_apitools)
    try:
        import pipeline_dp  # noqa: F401, PLC0415
    finally:
        root.removeFilter(not_apitools)
        root.removeHandler(guard)


_import_pipeline_dp_quietly()
