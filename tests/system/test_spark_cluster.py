"""spark-submit to a real Spark standalone cluster (one master, one worker, on 127.0.0.1).

The cluster comes from `scripts/spark_cluster.sh`, the executors' Python environment from
`scripts/pack_executor_env.sh` (cached in build/executor-env.tar.gz; the first pack takes about
a minute), and the job is `jobs/spark_terminal_stats.py`, submitted as
docs/how-to/spark-cluster.md says:

    spark-submit --master spark://127.0.0.1:PORT --deploy-mode client \\
        --archives build/executor-env.tar.gz#env --conf spark.pyspark.python=./env/bin/python \\
        --conf spark.pyspark.driver.python=.venv/bin/python jobs/spark_terminal_stats.py ...

with DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS=0, so the DP release runs on the executors
(mapInArrow), which then need dppipeline and its dependencies from the archive. The worker runs
without .venv on PATH or PYTHONPATH: an executor that found dppipeline would have it from the
archive, and a probe application checks exactly where it came from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support import REPO as ROOT

CLUSTER_SCRIPT = ROOT / "scripts" / "spark_cluster.sh"
PACK_SCRIPT = ROOT / "scripts" / "pack_executor_env.sh"
EXECUTOR_ENV = ROOT / "build" / "executor-env.tar.gz"
JOB = ROOT / "jobs" / "spark_terminal_stats.py"
CONFIG = ROOT / "jobs" / "configs" / "terminal_stats.yaml"
BANK_CONFIG = ROOT / "jobs" / "configs" / "bank_partner_release.yaml"
PUBLIC_KEYS = list(range(50))


def _java_missing() -> bool:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return False
    return shutil.which("java") is None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.spark,  # spark-submit to a standalone cluster
    pytest.mark.skipif(
        _java_missing(), reason="a Spark cluster needs Java 17+ (no `java` on PATH, no JAVA_HOME)"
    ),
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or shutil.which("curl") is None,
        reason="scripts/spark_cluster.sh needs Linux (setsid, /proc) and curl",
    ),
]


@dataclass(frozen=True)
class Cluster:
    state: Path
    master_url: str
    json_url: str

    def master_json(self) -> dict:
        with urllib.request.urlopen(self.json_url, timeout=10) as response:
            return json.load(response)


def free_ports(n: int) -> list[int]:
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def submit_env(state: Path) -> dict[str, str]:
    """The driver's environment: nothing of this pytest process's own PySpark set-up, and the
    privacy-budget ledger in `state` (not ./state of the working tree)."""
    drop = {
        "DPPIPELINE_LEDGER",
        "PYSPARK_PYTHON",
        "PYSPARK_DRIVER_PYTHON",
        "PYSPARK_GATEWAY_PORT",
        "PYSPARK_GATEWAY_SECRET",
        "PYSPARK_SUBMIT_ARGS",
        "DPPIPELINE_DEBUG",
    }
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1", DPPIPELINE_STATE_DIR=str(state)
    )
    return env


def spark_submit(
    cluster: Cluster, archive: Path, workdir: Path, app: Path, *args: object, **env: str
) -> subprocess.CompletedProcess[str]:
    """spark-submit from `workdir` (the driver's working folder), with `env` added to the
    driver's environment."""
    command = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master", cluster.master_url,
        "--deploy-mode", "client",
        "--archives", f"{archive}#env",
        "--conf", "spark.pyspark.python=./env/bin/python",
        # Not PYSPARK_DRIVER_PYTHON: the conf spark.pyspark.python would win over it.
        "--conf", f"spark.pyspark.driver.python={sys.executable}",
        "--conf", "spark.executor.extraJavaOptions=-XX:+UseParallelGC",
        "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.driver.bindAddress=127.0.0.1",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.executor.memory=1g",
        str(app),
        *map(str, args),
    ]  # fmt: skip
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=workdir,
        env={**submit_env(workdir / "state"), **env},
        timeout=300,
        check=False,
    )


def app_id(submitted: subprocess.CompletedProcess[str]) -> str:
    found = re.search(r"app ID (app-\d+-\d+)", submitted.stderr)
    assert found, "no application id in the driver's log:\n" + submitted.stderr[-3000:]
    return found.group(1)


def wait_for_app_state(cluster: Cluster, application: str, state: str) -> dict:
    """The master's record of an application once it reaches `state` (it unregisters as the
    driver exits)."""
    deadline = time.monotonic() + 20
    seen: dict = {}
    while time.monotonic() < deadline:
        master = cluster.master_json()
        for app in master.get("activeapps", []) + master.get("completedapps", []):
            if app["id"] == application:
                seen = app
                if app["state"] == state:
                    return app
        time.sleep(0.5)
    raise AssertionError(f"{application} not {state} in {cluster.json_url}: {seen or 'absent'}")


def describe(run: subprocess.CompletedProcess[str]) -> str:
    out, err = run.stdout[-3000:], run.stderr[-6000:]
    return f"exit {run.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """A master and a worker on free ports, state in a temporary folder; always stopped."""
    state = tmp_path_factory.mktemp("spark-cluster")
    port, webui, worker_webui = free_ports(3)
    env = {
        **os.environ,
        "SPARK_CLUSTER_DIR": str(state),
        "SPARK_CLUSTER_PORT": str(port),
        "SPARK_CLUSTER_WEBUI_PORT": str(webui),
        "SPARK_CLUSTER_WORKER_WEBUI_PORT": str(worker_webui),
        "SPARK_CLUSTER_TIMEOUT": "90",
        "PYTHON": sys.executable,
    }
    try:
        started = subprocess.run(
            [str(CLUSTER_SCRIPT), "start"],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
            check=False,
        )
        assert started.returncode == 0, describe(started)
        assert f"spark://127.0.0.1:{port}" in started.stdout
        yield Cluster(state, f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{webui}/json/")
    finally:
        stopped = subprocess.run(
            [str(CLUSTER_SCRIPT), "stop"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        # Each application unpacks the ~700 MB environment in the worker's work folder.
        shutil.rmtree(state / "work", ignore_errors=True)
        assert stopped.returncode == 0, describe(stopped)
        for name in ("master", "worker"):
            assert not (state / f"{name}.pid").exists(), f"{name} pid file left behind"


@pytest.fixture(scope="module")
def executor_env() -> Path:
    """The packed executor environment (rebuilt only when requirements.lock or the package
    sources change)."""
    packed = subprocess.run(
        [str(PACK_SCRIPT), str(EXECUTOR_ENV)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=900,
        check=False,
    )
    assert packed.returncode == 0, describe(packed)
    return EXECUTOR_ENV


@pytest.fixture(scope="module")
def public_keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("public") / "terminals.csv"
    path.write_text("TERMINAL_ID\n" + "".join(f"{k}\n" for k in PUBLIC_KEYS))
    return path


def check_release(submitted: subprocess.CompletedProcess[str], output: Path) -> None:
    """Exit 0, a manifest, exactly the public keys in key order, in the one file every path
    writes (the progress lines do not say where the release ran: that depends on the
    data)."""
    assert submitted.returncode == 0, describe(submitted)

    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["engine"] == "spark"
    query = manifest["queries"]["terminal_stats"]  # the job's one query, named after it
    assert query["partition_selection"]["public_partitions_count"] == len(PUBLIC_KEYS)

    dataset = output / "terminal_stats"
    # Released on the executors, streamed to the driver in key order: the one file the driver
    # writes on either path (no `_SUCCESS`, no Spark part files).
    assert sorted(p.name for p in dataset.iterdir()) == ["part-00000.parquet"]
    table = pq.read_table(dataset)
    assert table.num_rows == len(PUBLIC_KEYS)
    assert table.column("TERMINAL_ID").to_pylist() == sorted(PUBLIC_KEYS)
    assert set(table.column_names) == {"TERMINAL_ID", "count", "sum", "mean"}


def check_unpacked_env(cluster: Cluster, application: str) -> None:
    """The archive as the worker unpacked it for `application`, run by hand from a clean
    environment: dppipeline comes from inside it."""
    env_dirs = sorted((cluster.state / "work" / application).glob("*/env"))
    assert env_dirs, f"no unpacked env in {cluster.state / 'work' / application}"
    executor_dir = env_dirs[0].parent
    where = subprocess.run(
        ["env", "-i", "./env/bin/python", "-I", "-c",
         "import dppipeline; print(dppipeline.__file__)"],
        capture_output=True,
        text=True,
        cwd=executor_dir,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert where.returncode == 0, describe(where)
    assert Path(where.stdout.strip()).resolve().is_relative_to(executor_dir.resolve() / "env")


PROBE = """
import json, os, sys
from pyspark.sql import SparkSession

def where(_):
    import dppipeline.core.mechanisms
    yield {
        "module": dppipeline.core.mechanisms.__file__,
        "executable": sys.executable,
        "prefix": sys.prefix,
        "cwd": os.getcwd(),
        "path": sys.path,
    }

spark = SparkSession.builder.appName("dppipeline-probe").getOrCreate()
found = spark.sparkContext.parallelize(range(2), 2).mapPartitions(where).collect()
print("PROBE " + json.dumps(found))
spark.stop()
"""


def check_executor_imports(cluster: Cluster, archive: Path, workdir: Path) -> None:
    """A probe application: where the executors' Python and dppipeline come from. The
    unpacked archive, never .venv (whose site-packages the worker cannot see) nor the tree."""
    probe = workdir / "probe.py"
    probe.write_text(PROBE)
    submitted = spark_submit(cluster, archive, workdir, probe)
    assert submitted.returncode == 0, describe(submitted)
    wait_for_app_state(cluster, app_id(submitted), "FINISHED")
    line = next(ln for ln in submitted.stdout.splitlines() if ln.startswith("PROBE "))
    found = json.loads(line.removeprefix("PROBE "))
    assert len(found) == 2
    # This interpreter's (.venv's) site-packages.
    site_dirs = [Path(p).resolve() for p in site.getsitepackages()]
    for executor in found:
        cwd = Path(executor["cwd"])
        unpacked = cwd.resolve() / "env"
        assert Path(executor["prefix"]).resolve() == unpacked, executor
        assert Path(executor["module"]).resolve().is_relative_to(unpacked), executor
        assert Path(executor["executable"]).parent.resolve() == unpacked / "bin", executor
        # Spark puts its own Python code (pyspark.zip, py4j's zip, spark-core's jar, from
        # SPARK_HOME) on the path; nothing else of the driver's environment or the source tree.
        entries = [
            (cwd / p).resolve() for p in executor["path"] if not p.endswith((".zip", ".jar"))
        ]
        leaked = [p for p in entries if p == ROOT or any(p.is_relative_to(d) for d in site_dirs)]
        assert not leaked, executor


def test_spark_submit_to_a_standalone_cluster(
    cluster, executor_env, small_inputs, public_keys, tmp_path
):
    """One test, so that `pytest -n 2` runs it in one worker: separate tests could land in
    two workers, each starting its own cluster."""
    workdir = tmp_path / "job"
    workdir.mkdir()
    output = workdir / "release"
    submitted = spark_submit(
        cluster,
        executor_env,
        workdir,
        JOB,
        "--config", CONFIG,
        "--input", small_inputs["parquet"],
        "--output", output,
        "--public-partitions", public_keys,
        DPPIPELINE_DRIVER_RELEASE_MAX_PARTITIONS="0",  # release on the executors
    )  # fmt: skip
    check_release(submitted, output)

    application = app_id(submitted)
    app = wait_for_app_state(cluster, application, "FINISHED")
    assert app["name"] == "dppipeline"
    assert [w["state"] for w in cluster.master_json()["workers"]] == ["ALIVE"]

    check_unpacked_env(cluster, application)
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    check_executor_imports(cluster, executor_env, probe_dir)
    check_multi_query_job(cluster, executor_env, small_inputs["parquet"], tmp_path / "bank")


def check_multi_query_job(cluster: Cluster, archive: Path, inputs: Path, workdir: Path) -> None:
    """The bank's multi-query job: its queries are bounded in one pass on the executors, whose
    Python (from the archive) runs the bounding code; every query's dataset is written."""
    from dppipeline.spec.model import load_spec

    queries = len(load_spec(BANK_CONFIG).queries)
    assert queries > 1
    workdir.mkdir()
    output = workdir / "release"
    submitted = spark_submit(
        cluster, archive, workdir, JOB, "--config", BANK_CONFIG, "--input", inputs,
        "--output", output,
    )  # fmt: skip
    assert submitted.returncode == 0, describe(submitted)
    progress = submitted.stdout + submitted.stderr
    assert f"{queries} queries: bounding contributions in one pass" in progress, describe(submitted)
    manifest = json.loads((output / "manifest.json").read_text())
    assert len(manifest["queries"]) == queries
    tables = {name: pq.read_table(output / name) for name in manifest["queries"]}
    assert tables["mean_ticket_per_terminal"].num_rows > 0  # public terminals: all released
    wait_for_app_state(cluster, app_id(submitted), "FINISHED")
