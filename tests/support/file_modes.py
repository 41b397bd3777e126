"""Commands that meet file modes as an unprivileged user does, from any checkout.

Root ignores file modes, so a test about a read-only file runs its command without the
capabilities that let root ignore them (removed from the bounding set by `setpriv`:
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER). The command stays root: it reads the
checkout and its virtualenv wherever they are, including a checkout in a private `mktemp -d`
folder (mode 0700) that the user `nobody` cannot enter (issue 32 case 10: a test that ran the CLI
as `nobody` failed there with "No module named dppipeline"); but a file or folder without its
owner's write bit refuses it, as it would refuse its owner. Other users run commands as they are.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

WITHOUT = "-dac_override,-dac_read_search,-fowner"


def bound_by_file_modes(argv: list[str]) -> list[str]:
    """`argv` as a command that file modes bind (unchanged when this process is not root);
    skips the test, saying why, where root cannot drop those capabilities."""
    if os.geteuid() != 0:
        return argv
    if not _can_drop():
        pytest.skip("running as root, and setpriv cannot drop CAP_DAC_OVERRIDE here")
    return ["setpriv", f"--bounding-set={WITHOUT}", *argv]


@functools.cache
def _can_drop() -> bool:
    """Does a command started through setpriv fail to write a file without write bits?"""
    if shutil.which("setpriv") is None:
        return False
    with tempfile.TemporaryDirectory() as folder:
        probe = Path(folder) / "probe"
        probe.write_text("")
        probe.chmod(0o444)
        done = subprocess.run(
            ["setpriv", f"--bounding-set={WITHOUT}", "sh", "-c", f"echo x >> {probe}"],
            capture_output=True, check=False, timeout=60,
        )  # fmt: skip
        return done.returncode != 0 and probe.read_text() == ""
