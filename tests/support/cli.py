"""The CLI as a user runs it: `python -m dppipeline ...` in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.file_modes import bound_by_file_modes


def run_cli(
    *args: object,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    python: str = sys.executable,
    bound: bool = False,
    **kwargs,
) -> subprocess.CompletedProcess[str]:
    """`dppipeline ARGS` with this process's environment plus `env`, less DPPIPELINE_DEBUG (a
    traceback would change the one error line tests read); `bound`: as file modes bind a user.
    `timeout` only keeps a hung run from hanging the suite."""
    base = {k: v for k, v in os.environ.items() if k != "DPPIPELINE_DEBUG"}
    argv = [python, "-m", "dppipeline", *map(str, args)]
    return subprocess.run(
        bound_by_file_modes(argv) if bound else argv,
        capture_output=True, text=True, cwd=cwd, env={**base, **(env or {})}, timeout=timeout,
        check=False, **kwargs,
    )  # fmt: skip


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed run wrote to stderr (no traceback, nothing else)."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]
