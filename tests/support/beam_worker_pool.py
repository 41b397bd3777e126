"""Beam workers that are separate processes, for the tests: Beam's external worker pool (the
`worker_pool_main` servicer) on 127.0.0.1, started as its own process and stopped with the
tests.

A pipeline run with `--runner=PortableRunner --job_endpoint=embed --environment_type=EXTERNAL
--environment_config=127.0.0.1:PORT` asks the pool for an SDK worker; the pool starts it as a
new process with the pool's environment, so the worker reaches an object store with what the
pool was given, never with the launcher's state, as on a cluster. Like the boot program of
Beam's SDK container (`--worker_pool`), the pool starts each worker through `boot`: it fetches
the job's pipeline options from the runner's provisioning service and runs Beam's
`sdk_worker_main`, which configures Beam's file systems with them (a worker started bare, as
`worker_pool_main` alone does, has none: its S3 file system fails with "Must provide one of
client or options").

`python tests/support/beam_worker_pool.py` runs the pool and prints its port; `... boot --id=...` is
the worker's boot, as the pool calls it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class WorkerPool:
    process: subprocess.Popen[str]
    port: int
    log: Path

    def pipeline_args(self) -> list[str]:
        """Beam pipeline options that run a job on this pool. Beam's embedded job service
        (`job_endpoint=embed`) asks for one SDK worker per job, whatever
        `--direct_num_workers` says; that worker runs bundles on several threads."""
        return [
            "--runner=PortableRunner",
            "--job_endpoint=embed",
            "--environment_type=EXTERNAL",
            f"--environment_config=127.0.0.1:{self.port}",
        ]

    def workers_started(self) -> list[str]:
        """The ids of the SDK worker processes the pool has started, from its log."""
        lines = self.log.read_text().splitlines()
        return [line.split("--id=")[1].split("'")[0] for line in lines if "--id=" in line]

    def stop(self) -> None:
        self.process.terminate()  # the pool stops its worker processes on the way out
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start(log: Path, environment: dict[str, str]) -> WorkerPool:
    """The pool, its workers given `environment` on top of this process's."""
    boot = log.with_name("boot.sh")  # the pool runs one executable, with the boot's arguments
    boot.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{__file__}" boot "$@"\n')
    boot.chmod(0o755)
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, __file__, str(boot)], stdout=subprocess.PIPE, stderr=sink,
            text=True, env={**os.environ, **environment},
        )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()  # the port, once the server listens
    if not line.strip().isdigit():
        process.kill()
        process.wait()
        raise RuntimeError(f"the Beam worker pool did not start: {log.read_text()[-2000:]}")
    return WorkerPool(process, int(line), log)


def _serve(boot: str) -> None:
    import logging
    import threading

    import grpc
    from apache_beam.portability.api import beam_fn_api_pb2_grpc
    from apache_beam.runners.worker.worker_pool_main import (
        BeamFnExternalWorkerPoolServicer,
        kill_process_gracefully,
    )
    from apache_beam.utils import thread_pool_executor

    logging.basicConfig(level=logging.WARNING)  # the servicer logs each worker it starts
    pool = BeamFnExternalWorkerPoolServicer(use_process=True, container_executable=boot)
    server = grpc.server(thread_pool_executor.shared_unbounded_instance())
    port = server.add_insecure_port("127.0.0.1:0")
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(pool, server)
    server.start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    print(port, flush=True)
    stopped.wait()
    server.stop(grace=None)
    for worker in list(pool._worker_processes.values()):
        kill_process_gracefully(worker)


def _boot(args: list[str]) -> None:
    """What the SDK container's boot does, less artifact staging (the worker runs in this
    virtualenv): the worker's settings from the provisioning service, then sdk_worker_main."""
    import json

    import grpc
    from apache_beam.portability.api import beam_provision_api_pb2, beam_provision_api_pb2_grpc
    from google.protobuf import json_format

    flags = dict(arg.removeprefix("--").split("=", 1) for arg in args)
    with grpc.insecure_channel(flags["provision_endpoint"]) as channel:
        info = (
            beam_provision_api_pb2_grpc.ProvisionServiceStub(channel)
            .GetProvisionInfo(
                beam_provision_api_pb2.GetProvisionInfoRequest(),
                metadata=[("worker_id", flags["id"])],
            )
            .info
        )
    os.environ.update(
        WORKER_ID=flags["id"],
        PIPELINE_OPTIONS=json.dumps(json_format.MessageToDict(info.pipeline_options)),
        CONTROL_API_SERVICE_DESCRIPTOR=f'url: "{flags["control_endpoint"]}"',
        LOGGING_API_SERVICE_DESCRIPTOR=f'url: "{flags["logging_endpoint"]}"',
        RUNNER_CAPABILITIES=" ".join(info.runner_capabilities),
    )
    os.execv(sys.executable, [sys.executable, "-m", "apache_beam.runners.worker.sdk_worker_main"])


if __name__ == "__main__":
    if sys.argv[1] == "boot":
        _boot(sys.argv[2:])
    else:
        _serve(sys.argv[1])
