"""A real S3-compatible server for the tests: moto's server mode (a dev dependency `make setup`
installs), started as its own process on 127.0.0.1 on a free port and stopped with the tests.

Clients find it the way they find any S3 endpoint: `AWS_ENDPOINT_URL` and the `AWS_*`
credentials in the environment, which pyarrow, boto3 and the CLI processes the tests start all
read. Each pytest-xdist worker starts its own server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # no instance-role lookup on a machine that has none
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class S3Server:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def environment(self) -> dict[str, str]:
        return {**ENVIRONMENT, "AWS_ENDPOINT_URL": self.endpoint}

    def new_bucket(self, name: str) -> str:
        """An empty bucket; returns `s3://name`."""
        import pyarrow.fs as pafs

        creator = pafs.S3FileSystem(
            access_key=ENVIRONMENT["AWS_ACCESS_KEY_ID"],
            secret_key=ENVIRONMENT["AWS_SECRET_ACCESS_KEY"],
            region=ENVIRONMENT["AWS_DEFAULT_REGION"],
            endpoint_override=self.endpoint,
            allow_bucket_creation=True,
        )
        creator.create_dir(name)
        return f"s3://{name}"

    def filesystem(self):  # -> pyarrow.fs.S3FileSystem
        """A client of this server, whatever the environment says."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            access_key=ENVIRONMENT["AWS_ACCESS_KEY_ID"],
            secret_key=ENVIRONMENT["AWS_SECRET_ACCESS_KEY"],
            region=ENVIRONMENT["AWS_DEFAULT_REGION"],
            endpoint_override=self.endpoint,
        )

    def upload(self, folder: Path, uri: str) -> None:
        """Every file under a local folder, copied to `uri` (keys keep the relative paths)."""
        import pyarrow.fs as pafs

        pafs.copy_files(str(folder), uri.removeprefix("s3://"),
                        source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=self.filesystem())  # fmt: skip

    def delete(self, uri: str) -> None:
        self.filesystem().delete_file(uri.removeprefix("s3://"))

    def read(self, uri: str) -> bytes:
        with self.filesystem().open_input_stream(uri.removeprefix("s3://")) as stream:
            return bytes(stream.read())

    def keys(self, uri: str) -> list[str]:
        """The object keys under `uri`, relative to it, sorted."""
        import pyarrow.fs as pafs

        fs, path = self.filesystem(), uri.removeprefix("s3://").rstrip("/")
        found = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
        return sorted(f.path[len(path) + 1 :] for f in found if f.type == pafs.FileType.File)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start(timeout: float = 60.0, python: str = sys.executable) -> S3Server:
    """The server, run by `python` (a virtualenv with moto: the Airflow tests pass the
    project's)."""
    port = _free_port()
    process = subprocess.Popen(
        [python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **ENVIRONMENT},
    )
    server = S3Server(process, port)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{server.endpoint}/moto-api/", timeout=2):
                return server
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"the moto S3 server exited with {process.returncode}") from None
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"the moto S3 server did not answer on port {port}") from None
            time.sleep(0.2)
