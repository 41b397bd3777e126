"""Failpoints: crash a run on purpose at a named stage, the way databases test crash recovery.

`DPPIPELINE_FAILPOINT=<stage>:<action>[,<stage>:<action>...]`, checked at the run's stage
boundaries (tests only; unset, a check costs one dictionary lookup):

    reserved   budget reserved, nothing read yet
    reading    ledger says `reading`; the engine is about to read the first byte
    written    the engine wrote the release's data into staging; no manifest yet (mid-write)
    staged     the complete release (manifest included) is in staging, on disk; not committed
    uploading  (an output on a store) one of the staged files is uploaded under the run's
               prefix, the others not yet: mid-write on the store
    committed  the ledger row is committed; nothing published yet
    exchanged  mid-publication: the new release is in place (or, without RENAME_EXCHANGE, the
               old one has been moved aside and the new one not yet renamed in)
    published  the release is published; clean-up and progress lines not done

Actions: `kill` (SIGKILL: no clean-up at all), `term` (SIGTERM), `int` (SIGINT), `stop`
(SIGSTOP: the run pauses there until a SIGCONT, for a test to act meanwhile), each sent by the
process to itself, or `error` (an unexpected exception: a bug).
"""

from __future__ import annotations

import os
import signal

from dppipeline import settings

STAGES = settings.FAILPOINT_STAGES
_SIGNALS = {
    "kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT, "stop": signal.SIGSTOP,
}  # fmt: skip


class FailpointError(RuntimeError):
    """The `error` action: stands for a bug at that stage."""


def failpoint(stage: str) -> None:
    """Triggers the action set for `stage` in $DPPIPELINE_FAILPOINT, if any."""
    points = settings.failpoints()
    if not points:
        return
    assert stage in STAGES, stage
    for name, action in points:
        if name != stage:
            continue
        if action == "error":
            raise FailpointError(f"failpoint {stage}")
        os.kill(os.getpid(), _SIGNALS[action])
