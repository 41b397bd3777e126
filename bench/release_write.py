"""How the Spark engine gets a large release from the executors into its one file.

The release on the executors (`engines.spark.aggregate.release_on_executors`) must end as one
`part-00000.parquet` with rows in key order (`engines.kernel.release_file`). Five ways,
each in its own process on Spark `local[2]` over N synthetic aggregates (one per partition,
private selection at epsilon 1 that keeps them all: 1,000 customers each; shuffled first):

- `stream` (the engine's): sort, release with `mapInArrow` (one job on every core, kept where
  it ran by `localCheckpoint`), stream the Arrow batches to the driver task by task
  (`toLocalIterator`), write them with one `ReleaseWriter`;
- `stream-serial`: the same without the checkpoint (`toLocalIterator` then runs the release a
  task or two at a time);
- `stream-persist`: the same with `persist` + `count` instead of the checkpoint (the cached
  plan keeps the sort's un-coalesced partitions);
- `collect`: the same released batches collected at once, then written;
- `spark-write`: the old way, Spark writes `part-<uuid>` files from the executors (no order);
  normalising those into one sorted file would add a pass over them.

Reported per way: wall time of the write (Spark job included) and the peak resident memory of
the Python driver and of the whole process tree (the JVM runs the executors in local mode),
sampled by psutil. Run: `python -m bench.release_write [--partitions 200000,1000000,3000000]`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil


def run_one(way: str, partitions: int, out: Path) -> dict[str, float]:
    """One way, in this process: returns seconds and peak memory (MB)."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    from dppipeline.core.tasks import plan_tasks
    from dppipeline.engines.base import ReleaseJob
    from dppipeline.engines.kernel.release_file import RELEASE_FILE, ReleaseWriter
    from dppipeline.engines.spark.aggregate import release_on_executors, released_batches
    from dppipeline.engines.spark.spark_session import get_spark
    from dppipeline.lifecycle.runner import make_plan
    from dppipeline.spec.model import build_spec

    spark = get_spark(master="local[2]", conf={"spark.ui.enabled": "false"})
    spec = build_spec(
        {},
        {
            "input.path": "unused",
            "output": "unused",
            "metrics": ["count", "sum", "privacy_id_count"],
            "bounds.min_value": 0.0,
            "bounds.max_value": 100.0,
        },
    )
    plan = make_plan(spec)
    job = ReleaseJob(spec, plan, plan_tasks(spec, plan, []), days=[], quarantine=out / "q")
    query = plan.queries[0].name
    aggregates = (
        spark.range(partitions)
        .select(
            F.col("id").alias("TERMINAL_ID"),
            F.lit(1000).cast("long").alias("privacy_id_count"),
            F.lit(2000).cast("long").alias("count"),
            (F.col("id") % 1000).cast("double").alias("sum"),
        )
        .orderBy(F.rand(1))
        .localCheckpoint()  # the aggregates exist before the clock starts
    )
    me = psutil.Process()
    peaks = {"driver": me.memory_info().rss, "tree": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            tree = [me, *me.children(recursive=True)]
            rss = {p.pid: p.memory_info().rss for p in tree if p.is_running()}
            peaks["driver"] = max(peaks["driver"], rss[me.pid])
            peaks["tree"] = max(peaks["tree"], sum(rss.values()))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    before = me.memory_info().rss
    started = time.monotonic()
    target = out / "release"
    target.mkdir()
    rows = 0
    if way == "spark-write":
        chunks = release_on_executors(aggregates, job, query, None)
        chunks.write.parquet(str(target / "spark"))
    else:
        chunks = release_on_executors(aggregates, job, query, None)
        with ReleaseWriter(target / RELEASE_FILE, job.release_schema(query)) as writer:
            if way == "stream":
                for batch in released_batches(chunks):
                    writer.write(batch)
            elif way == "stream-persist":
                kept = chunks.persist()
                kept.count()
                for row in kept.toLocalIterator(prefetchPartitions=True):
                    writer.write(pa.ipc.open_stream(row[0]).read_all())
            elif way == "stream-serial":
                for row in chunks.toLocalIterator(prefetchPartitions=True):
                    writer.write(pa.ipc.open_stream(row[0]).read_all())
            else:
                tables = [pa.ipc.open_stream(r[0]).read_all() for r in chunks.collect()]
                writer.write(pa.concat_tables(tables))
        rows = writer.rows
    seconds = time.monotonic() - started
    done.set()
    sampler.join()
    return {
        "seconds": round(seconds, 1),
        "rows": rows,
        "driver_growth_mb": round((peaks["driver"] - before) / 2**20),
        "driver_peak_mb": round(peaks["driver"] / 2**20),
        "tree_peak_mb": round(peaks["tree"] / 2**20),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="200000,1000000,3000000")
    parser.add_argument("--ways", default="stream,stream-serial,collect,spark-write")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # way, partitions (a child)
    args = parser.parse_args()
    if args.one:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(run_one(args.one[0], int(args.one[1]), Path(tmp))))
        return
    for n in (int(x) for x in args.partitions.split(",")):
        for way in args.ways.split(","):
            done = subprocess.run(
                [sys.executable, "-m", "bench.release_write", "--one", way, str(n)],
                capture_output=True,
                text=True,
                check=False,
            )
            result = done.stdout.strip().splitlines()[-1] if done.returncode == 0 else "failed"
            print(f"{n:>9,} partitions  {way:<12} {result}", flush=True)
            if done.returncode:
                print(done.stderr[-2000:], file=sys.stderr)


if __name__ == "__main__":
    main()
