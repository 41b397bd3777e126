"""Beam on a runner whose workers are separate processes (issue 19): the portable runner with an
external worker pool (`tests/support/beam_worker_pool.py`), input and output on the S3 server
(`tests/support/s3_server.py`). The pool's SDK worker is a process the pool starts with the
pool's own environment, so it reads, validates and writes through Beam's file systems on the
store with no state of the launcher's; the CLI runs as a user runs it.

Beam's Dask runner (2.77) cannot run this pipeline: it sends a ParDo's tagged outputs into its
main output, computes only the graph's last sink and reports no metrics
(docs/how-to/beam-runners.md).
"""

from __future__ import annotations

import json
import re
import shutil
import struct

import pytest
from support import beam_worker_pool
from support.cli import run_cli
from test_object_store import JOB, assert_same_release, pointer

pytestmark = pytest.mark.beam  # Beam on the portable runner and its worker pool

EPSILON = ["--epsilon", "1e7"]


@pytest.fixture(scope="module")
def worker_pool(s3_server, tmp_path_factory):
    """One pool for the module, its workers pointed at the S3 server by their environment."""
    pool = beam_worker_pool.start(
        tmp_path_factory.mktemp("pool") / "pool.log", s3_server.environment
    )
    yield pool
    pool.stop()


def test_a_release_on_the_worker_pool_equals_the_direct_runners(
    s3, worker_pool, small_inputs, tmp_path
):
    """S3 to S3 on the pool's worker process, at a huge epsilon: the release read back with
    pandas equals the in-memory DirectRunner's release of the same job from local disk (the
    noise is below the tolerance, 8 noise standard deviations from the manifest: a failure
    rate under 1e-14 per cell), and the rows counted by the workers' metrics are the same."""
    uri = s3.new_bucket("pool-release")
    s3.upload(small_inputs["parquet"], f"{uri}/tx")
    started = len(worker_pool.workers_started())
    remote = run_cli("run", "--engine", "beam", "--input", f"{uri}/tx", "--output",
                     f"{uri}/release", "--quarantine", f"{uri}/ops/quarantine", *JOB, *EPSILON,
                     "--no-ledger", *worker_pool.pipeline_args())  # fmt: skip
    assert remote.returncode == 0, remote.stderr
    assert "on PortableRunner" in remote.stderr
    assert len(worker_pool.workers_started()) > started  # the pool's worker ran it
    local = run_cli("run", "--engine", "beam", "--input", small_inputs["parquet"], "--output",
                    tmp_path / "rel", *JOB, *EPSILON, "--no-ledger")  # fmt: skip
    assert local.returncode == 0, local.stderr

    def rows_read(stderr: str) -> str:
        return re.findall(r"read [\d,]+ rows; rejected \d+", stderr)[0]

    assert rows_read(remote.stderr) == rows_read(local.stderr)
    run_id = pointer(s3, f"{uri}/release")["run_id"]
    assert json.loads(s3.read(f"{uri}/release/_runs/{run_id}/manifest.json"))["engine"] == "beam"
    assert_same_release(f"{uri}/release", tmp_path / "rel")
    assert s3.keys(f"{uri}/ops/quarantine") == []  # the workers' scratch folder is removed


def overwrite_pages(data: bytes) -> bytes:
    """Every byte between the leading magic and the footer set to 0xFF: the footer (what the
    launcher reads) is intact, no page can be read."""
    footer = struct.unpack("<I", data[-8:-4])[0]
    end = len(data) - 8 - footer
    return data[:4] + b"\xff" * (end - 4) + data[end:]


DAMAGE = {
    "truncated": lambda data: data[: len(data) // 2],  # found by the launcher's footer check
    "pages": overwrite_pages,  # found only by the worker that reads the row group
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_an_unreadable_file_fails_the_run_on_the_worker_pool_naming_it(
    s3, worker_pool, small_inputs, tmp_path, damage
):
    """A Parquet file on S3 that cannot be read: exit 1, one line naming the file, no
    traceback, nothing published, the scratch folder on the store removed. With its pages
    overwritten the footer is intact, so the launcher lists it and only the pool's worker
    process finds out; its report goes through the store, never through the launcher."""
    uri = s3.new_bucket(f"pool-{damage}")
    shutil.copytree(small_inputs["parquet"], tmp_path / "tx")
    bad = sorted((tmp_path / "tx").rglob("*.parquet"))[1]
    bad.write_bytes(DAMAGE[damage](bad.read_bytes()))
    s3.upload(tmp_path / "tx", f"{uri}/tx")
    failed = run_cli("run", "--engine", "beam", "--input", f"{uri}/tx", "--output",
                     f"{uri}/release", "--quarantine", f"{uri}/ops/quarantine", *JOB, *EPSILON,
                     "--no-ledger", *worker_pool.pipeline_args())  # fmt: skip
    assert failed.returncode == 1, failed.stderr
    assert "Traceback" not in failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    name = bad.relative_to(tmp_path / "tx").as_posix()
    assert last.startswith(f"dppipeline run: error: {uri}/tx/{name}: cannot read as parquet: ")
    assert ("pipeline done" in failed.stderr) == (damage == "pages")  # who found it
    assert s3.keys(f"{uri}/release") == []
    assert s3.keys(f"{uri}/ops/quarantine") == []
