"""A real PostgreSQL server for the tests, from the PostgreSQL 16 binaries the `pgserver` wheel
bundles (a dev dependency: `make setup` installs it; nothing is installed by hand).

It listens on 127.0.0.1 on a free port, with no Unix socket, trusts local connections, and lives
in a temporary folder removed when it stops. PostgreSQL refuses to run as root, which CI is:
then `initdb` and `pg_ctl` run as the unprivileged user `nobody` through `setpriv` (util-linux),
or `runuser` where setpriv is missing. Each pytest-xdist worker starts its own server.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

UNPRIVILEGED = "nobody"


def install_dir() -> Path:
    """pgserver's bundled PostgreSQL (bin, lib, share), found without importing pgserver,
    whose import creates runtime folders and locks."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the pgserver package is not installed (make setup installs it)")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def _binaries(folder: Path) -> Path:
    """The bin folder to run. As root, a copy inside the server's own folder: `nobody` may
    not be able to reach the virtualenv (a checkout under /root is mode 0700). The copy keeps
    the wheel's layout: PostgreSQL finds lib and share beside bin, and the binaries find
    libpq in `$ORIGIN/../../../pgserver.libs`."""
    source = install_dir()
    if os.geteuid() != 0:
        return source / "bin"
    site = folder / "site"
    for part in ("bin", "lib", "share"):
        shutil.copytree(source / part, site / "pgserver" / "pginstall" / part, symlinks=True)
    libs = source.parent.parent / "pgserver.libs"
    if libs.is_dir():
        shutil.copytree(libs, site / "pgserver.libs", symlinks=True)
    return site / "pgserver" / "pginstall" / "bin"


def _as_user(argv: list[str]) -> list[str]:
    """`argv` run as an unprivileged user when this process is root."""
    if os.geteuid() != 0:
        return argv
    user = pwd.getpwnam(UNPRIVILEGED)
    if shutil.which("setpriv"):
        return [
            "setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
            *argv,
        ]  # fmt: skip
    return ["runuser", "-u", UNPRIVILEGED, "--", *argv]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class PostgresServer:
    folder: Path
    port: int

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def new_database(self) -> str:
        """A fresh, empty database; returns its URL (as `--ledger` takes it)."""
        import psycopg

        name = "ledger_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        copied = self.folder / "site" / "pgserver" / "pginstall" / "bin"
        binaries = copied if copied.is_dir() else install_dir() / "bin"
        subprocess.run(
            _as_user([str(binaries / "pg_ctl"), "-D", str(self.folder / "data"), "-m",
                      "immediate", "-w", "stop"]),
            capture_output=True,
            check=False,
            timeout=60,
        )  # fmt: skip
        shutil.rmtree(self.folder, ignore_errors=True)


def start() -> PostgresServer:
    """initdb + pg_ctl start on a free port of 127.0.0.1 (a few tries, in case another
    process takes the port first)."""
    folder = Path(tempfile.mkdtemp(prefix="dppipeline-pg-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam(UNPRIVILEGED)
        os.chown(folder, user.pw_uid, user.pw_gid)
    data = folder / "data"
    binaries = _binaries(folder)
    init = subprocess.run(
        _as_user([str(binaries / "initdb"), "-D", str(data), "-U", "postgres",
                  "--auth=trust", "--encoding=UTF8", "--no-sync"]),
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    if init.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {init.stderr[-2000:]}")
    failure = ""
    for _ in range(5):
        port = _free_port()
        options = f"-h 127.0.0.1 -p {port} -k '' -c fsync=off -c max_connections=60"
        started = subprocess.run(
            _as_user([str(binaries / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"),
                      "-o", options, "-w", "-t", "60", "start"]),
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        if started.returncode == 0:
            return PostgresServer(folder, port)
        failure = started.stderr + (folder / "log").read_text(errors="replace")[-2000:]
    shutil.rmtree(folder, ignore_errors=True)
    raise RuntimeError(f"PostgreSQL did not start: {failure}")


if __name__ == "__main__":  # for tests run by another Python (the Airflow DAG tests)
    import json
    import sys

    if sys.argv[1:2] == ["start"]:
        server = start()
        print(json.dumps({"folder": str(server.folder), "port": server.port,
                          "url": server.new_database()}))  # fmt: skip
    elif sys.argv[1:2] == ["stop"]:
        PostgresServer(Path(sys.argv[2]), 0).stop()
    else:
        raise SystemExit("usage: postgres_server.py start | stop FOLDER")
