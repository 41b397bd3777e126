"""Input and release on an object store (issue 19): a real S3-compatible server on 127.0.0.1
(moto's server mode, `tests/support/s3_server.py`), the CLI run as a user runs it, in a subprocess
that finds the server through AWS_ENDPOINT_URL and AWS_* credentials.

A release on a store is published without rename (`lifecycle/store_publication`): the run's
files go under `OUT/_runs/<run_id>/`, then one small object `OUT/RELEASE.json` names the run. The
tests read it back the way the docs tell a partner to (pandas over pyarrow's S3 client),
and kill runs at every stage boundary to check that no partial release is ever visible and
that the ledger's charge rules hold.
"""

from __future__ import annotations

import json
import re
import signal

import numpy as np
import pandas as pd
import pytest
from support.cli import run_cli

from dppipeline.ledger import CHARGED_STATES, Ledger
from dppipeline.ledger import tables as ledger_tables
from dppipeline.storage.releases import POINTER_NAME, RUNS_FOLDER

BOUNDS = ["--min-value", "0", "--max-value", "150", "--max-partitions-contributed", "50",
          "--max-contributions-per-partition", "100"]  # fmt: skip
JOB = [*BOUNDS, "--metrics", "count,sum,mean", "--public-partitions", "0..59"]
PAST = "2000-01-01T00:00:00.000000+00:00"


def read_release(uri: str, dataset: str = "terminal_stats") -> pd.DataFrame:
    """The object-store guide's recipe: follow the pointer, read the run's dataset with pandas."""
    import pyarrow.fs as pafs

    s3, _ = pafs.FileSystem.from_uri(uri)
    base = uri.removeprefix("s3://")
    with s3.open_input_stream(f"{base}/RELEASE.json") as pointer:
        run_id = json.loads(pointer.read())["run_id"]
    return pd.read_parquet(f"{base}/_runs/{run_id}/{dataset}", filesystem=s3)


def pointer(s3, uri: str) -> dict | None:
    keys = s3.keys(uri)
    return json.loads(s3.read(f"{uri}/{POINTER_NAME}")) if POINTER_NAME in keys else None


def run_folders(s3, uri: str) -> list[str]:
    return sorted({k.split("/")[1] for k in s3.keys(uri) if k.startswith(RUNS_FOLDER + "/")})


def expire(ledger: Ledger, run_id: str) -> None:
    """The crashed run's lease runs out (as time would make it, without waiting)."""
    table = ledger_tables.releases
    with ledger._engine.begin() as conn:
        conn.execute(table.update().where(table.c.run_id == run_id).values(lease_expires_at=PAST))


@pytest.fixture
def bucket(s3, small_inputs, request) -> str:
    """A fresh bucket holding the small parquet input under `tx/`."""
    name = "t-" + str(abs(hash(request.node.nodeid)) % 10**10)
    uri = s3.new_bucket(name)
    s3.upload(small_inputs["parquet"], f"{uri}/tx")
    return uri


def assert_same_release(uri: str, folder) -> None:
    """The `terminal_stats` release published at `uri` on the store, read back with pandas,
    equals the one in the local `folder` at a huge epsilon: the same columns, terminals
    0..59, count and sum within 2 x 8 noise standard deviations of the local manifest."""
    from_store = read_release(uri).sort_values("TERMINAL_ID", ignore_index=True)
    from_disk = pd.read_parquet(folder / "terminal_stats")
    from_disk = from_disk.sort_values("TERMINAL_ID", ignore_index=True)
    manifest = json.loads((folder / "manifest.json").read_text())
    metrics = manifest["queries"]["terminal_stats"]["metrics"]
    assert list(from_store.columns) == list(from_disk.columns)
    assert from_store["TERMINAL_ID"].tolist() == from_disk["TERMINAL_ID"].tolist()
    assert from_store["TERMINAL_ID"].tolist() == list(range(60))
    for metric in ("count", "sum"):
        tolerance = 2 * 8 * metrics[metric]["noise_stddev"]
        np.testing.assert_allclose(from_store[metric], from_disk[metric], rtol=0, atol=tolerance)
    assert from_disk["count"].sum() > 1000  # not two empty releases


@pytest.mark.parametrize("engine", ["local", "beam"])
def test_a_release_from_s3_to_s3_equals_the_same_jobs_local_release(
    s3, bucket, tmp_path, small_inputs, engine
):
    """At a huge epsilon the release read back from S3 with pandas equals the release of the
    same job from local disk to local disk (the noise is below the tolerance, computed from
    the manifest's noise standard deviation: 8 std, a failure rate under 1e-14 per cell).
    The local engine reads through pyarrow.fs, Beam's workers through Beam's file systems
    (its S3 client finds the server as boto3 does)."""
    huge = ["--epsilon", "1e7"]
    remote = run_cli("run", "--engine", engine, "--input", f"{bucket}/tx", "--output",
                     f"{bucket}/release", *JOB, *huge,
                     "--ledger", f"sqlite:///{tmp_path / 'l.sqlite'}")  # fmt: skip
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout.strip() == f"{bucket}/release"
    run_id = pointer(s3, f"{bucket}/release")["run_id"]
    written = json.loads(s3.read(f"{bucket}/release/_runs/{run_id}/manifest.json"))
    assert written["engine"] == engine
    local = run_cli("run", "--input", small_inputs["parquet"], "--output", tmp_path / "rel",
                    *JOB, *huge, "--no-ledger")  # fmt: skip
    assert local.returncode == 0, local.stderr

    assert_same_release(f"{bucket}/release", tmp_path / "rel")


def test_the_store_layout_rerun_overwrite_and_check_release(s3, bucket, tmp_path):
    """One pointer and one run folder; a rerun of the same release draws no new noise and
    writes nothing; `--overwrite --new-release` publishes a new run and removes the old one;
    `check-release` reads a release on the store and names a missing file."""
    ledger = f"sqlite:///{tmp_path / 'l.sqlite'}"
    out = f"{bucket}/release"
    args = ["run", "--input", f"{bucket}/tx", "--output", out, *JOB, "--epsilon", "1",
            "--ledger", ledger]  # fmt: skip
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    (row,) = Ledger(ledger).rows()
    assert pointer(s3, out) == {
        "format": 1, "run_id": row.run_id, "replaces": None,
        "files": ["terminal_stats/part-00000.parquet", "manifest.json"],
    }  # fmt: skip
    assert row.output == out and row.state == "committed"
    before = {k: s3.read(f"{out}/{k}") for k in s3.keys(out)}

    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    assert "no new noise drawn, nothing spent" in again.stderr
    assert {k: s3.read(f"{out}/{k}") for k in s3.keys(out)} == before
    assert len(Ledger(ledger).rows()) == 1

    refused = run_cli(*args, "--new-release")
    assert refused.returncode != 0
    assert "already exists; pass --overwrite" in refused.stderr.strip().splitlines()[-1]

    replaced = run_cli(*args, "--new-release", "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    rows = Ledger(ledger).rows()
    assert [r.state for r in rows] == ["committed", "committed"]
    assert pointer(s3, out)["run_id"] == rows[1].run_id
    assert pointer(s3, out)["replaces"] == row.run_id
    assert run_folders(s3, out) == [rows[1].run_id]  # the replaced run's files are gone

    checked = run_cli("check-release", out, "--ledger", ledger)
    assert checked.returncode == 0, checked.stderr
    assert f"{out}: valid release of run {rows[1].run_id}" in checked.stdout
    reported = run_cli("report", out, "--ledger", ledger, "--output", tmp_path / "report")
    assert reported.returncode == 0, reported.stderr
    assert rows[1].run_id in (tmp_path / "report" / "index.html").read_text()
    s3.delete(f"{out}/_runs/{rows[1].run_id}/terminal_stats/part-00000.parquet")
    broken = run_cli("check-release", out)
    assert broken.returncode != 0 and "Traceback" not in broken.stderr
    assert broken.stderr.strip() == (
        f"dppipeline check-release: error: {out}: terminal_stats/part-00000.parquet, listed in "
        "RELEASE.json, is missing"
    )


def test_a_foreign_folder_and_secrets_in_uris_are_refused(s3, bucket, tmp_path):
    """A run never writes into a store folder holding other objects, and a URI carrying
    credentials is refused before anything is read: the location would be recorded."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.txt").write_text("someone else's")
    s3.upload(tmp_path / "notes", f"{bucket}/busy")
    busy = run_cli("run", "--input", f"{bucket}/tx", "--output", f"{bucket}/busy", *JOB,
                   "--epsilon", "1", "--no-ledger")  # fmt: skip
    assert busy.returncode == 1, busy.stderr
    assert "holds README.txt, not part of a release" in busy.stderr
    assert s3.keys(f"{bucket}/busy") == ["README.txt"]

    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
    leaky = f"s3://AKIAEXAMPLE:{secret}@{bucket.removeprefix('s3://')}/tx"
    refused = run_cli("run", "--input", leaky, "--output", f"{bucket}/out", *JOB,
                      "--epsilon", "1", "--no-ledger")  # fmt: skip
    assert refused.returncode != 0
    assert "Traceback" not in refused.stderr
    assert "credentials in a URI are refused" in refused.stderr
    assert secret not in refused.stderr + refused.stdout
    assert s3.keys(f"{bucket}/out") == []


STAGES = ["reading", "staged", "uploading", "committed", "exchanged", "published"]
CELLS = [(stage, True) for stage in STAGES] + [("uploading", False), ("committed", False)]


@pytest.mark.parametrize(("stage", "replacing"), CELLS,
                         ids=[f"{s}-{'replace' if r else 'first'}" for s, r in CELLS])  # fmt: skip
def test_a_kill_at_every_stage_leaves_the_old_or_the_new_release_and_a_rerun_heals(
    s3, bucket, tmp_path, stage, replacing
):
    """SIGKILL (no clean-up at all) at each stage boundary of a run publishing to S3. Then:
    the pointer names the old release or, once the run committed and wrote it, the new one,
    complete (`check-release` passes); never a partial one. The budget charged is never below
    what was read. Once the dead run's lease runs out, the same command succeeds: it
    publishes the committed run without drawing again, or returns the key's release, or
    releases anew, and leaves exactly one run folder."""
    ledger_url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    out = f"{bucket}/release"
    args = ["run", "--input", f"{bucket}/tx", "--output", out, "--overwrite", *JOB,
            "--epsilon", "1", "--ledger", ledger_url]  # fmt: skip
    old_id = None
    if replacing:
        assert run_cli(*args).returncode == 0
        old_id = pointer(s3, out)["run_id"]
        args.append("--new-release")

    crashed = run_cli(*args, env={"DPPIPELINE_FAILPOINT": f"{stage}:kill"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    ledger = Ledger(ledger_url)
    row = ledger.rows()[-1]
    new_id = row.run_id
    assert new_id != old_id
    committed = STAGES.index(stage) >= STAGES.index("committed")
    assert row.state == ("committed" if committed else "reading")
    assert row.state in CHARGED_STATES or row.state == "reading"  # reading: charged when settled
    visible = pointer(s3, out)
    if STAGES.index(stage) >= STAGES.index("exchanged"):
        assert visible["run_id"] == new_id
    else:
        assert (visible or {}).get("run_id") == old_id
    if visible is not None:
        done = run_cli("check-release", out, "--ledger", ledger_url)
        assert done.returncode == 0, done.stderr

    expire(ledger, new_id)
    rerun = run_cli(*[a for a in args if a != "--new-release"])
    assert rerun.returncode == 0, rerun.stderr
    rows = Ledger(ledger_url).rows()
    final = pointer(s3, out)["run_id"]
    if committed:
        assert final == new_id  # rolled forward or already published: never drawn again
        assert [r.state for r in rows][-1] == "committed" and rows[-1].run_id == new_id
    elif replacing:  # the key's committed release is the old one: returned, not drawn again
        assert (rows[-1].run_id, rows[-1].state) == (new_id, "failed")  # charged
        assert final == old_id and "no new noise drawn" in rerun.stderr
    else:
        assert rows[-2].run_id == new_id and rows[-2].state == "failed"  # charged
        assert rows[-1].state == "committed" and final == rows[-1].run_id
    assert run_folders(s3, out) == [final]
    assert run_cli("check-release", out, "--ledger", ledger_url).returncode == 0


def test_rejected_rows_go_to_a_quarantine_on_the_store_never_into_the_release(
    s3, small_inputs, tmp_path
):
    """A CSV input on S3 with one bad row and `--quarantine s3://.../quarantine`: the row is
    counted, kept aside in `<quarantine>/<run_id>/rejected.parquet` on the store (nothing left
    on local disk) and never published; a quarantine inside the release's folder is refused
    before anything is read."""
    from support.data import with_one_bad_row

    uri = s3.new_bucket("quarantined")
    with_one_bad_row(small_inputs, tmp_path / "csv")
    s3.upload(tmp_path / "csv", f"{uri}/tx")
    args = ["run", "--input", f"{uri}/tx", "--format", "csv", "--output", f"{uri}/release",
            *JOB, "--epsilon", "1", "--no-ledger"]  # fmt: skip

    inside = run_cli(*args, "--quarantine", f"{uri}/release/q")
    assert inside.returncode != 0 and "Traceback" not in inside.stderr
    assert f"output {uri}/release holds the quarantine folder" in inside.stderr
    assert s3.keys(uri + "/release") == []

    done = run_cli(*args, "--quarantine", f"{uri}/ops/quarantine")
    assert done.returncode == 0, done.stderr
    run_id = pointer(s3, f"{uri}/release")["run_id"]
    assert "rejected 1 (kept aside in " + f"{uri}/ops/quarantine/{run_id})" in done.stderr
    assert s3.keys(f"{uri}/ops/quarantine") == [f"{run_id}/rejected.parquet"]
    rejected = pd.read_parquet(
        f"{uri.removeprefix('s3://')}/ops/quarantine/{run_id}/rejected.parquet",
        filesystem=s3.filesystem(),
    )
    assert len(rejected) == 1 and "abc" in rejected.to_string()
    assert not any("rejected" in k for k in s3.keys(f"{uri}/release"))
    assert not list((tmp_path / "state").rglob("*.parquet"))  # shipped, not left behind


@pytest.mark.parametrize("engine", ["local", "spark", "beam"])
def test_file_uris_are_local_paths_on_every_engine(small_inputs, tmp_path, engine, request):
    """`file://` input, output and key file: the same release as plain paths (Spark reads them
    through Hadoop's `file:` FileSystem, Beam through its local file system)."""
    from support.data import release_small
    from support.engines import engine_named

    keys = tmp_path / "keys.csv"
    keys.write_text("TERMINAL_ID\n" + "\n".join(map(str, range(60))) + "\n")
    released, manifest = release_small(
        {"parquet": f"file://{small_inputs['parquet']}"}, tmp_path / "out",
        engine_named(engine, request), **{
            "output": f"file://{tmp_path / 'out' / 'release'}",
            "partition_selection.public_partitions": f"file://{keys}",
            "budget.epsilon": 1e7,
        },
    )  # fmt: skip
    assert released["TERMINAL_ID"].tolist() == list(range(60))
    assert manifest["queries"]["terminal_stats"]["released_partitions"] == 60
    assert (tmp_path / "out" / "release" / "manifest.json").is_file()  # published by rename
    rows = len(pd.read_parquet(small_inputs["parquet"]))  # bounds keep every row
    assert abs(released["count"].sum() - rows) < 1, (released["count"].sum(), rows)


def test_beam_workers_in_other_processes_write_the_release_and_rejects_to_the_store(
    s3, small_inputs, tmp_path
):
    """Beam with its workers in separate processes (DirectRunner multi_processing), CSV input
    with one bad row on S3, release and quarantine on S3: the workers write the run's files
    and their rejected rows under `OUT/_runs/<run_id>/` through Beam's file systems (the
    launcher stages nothing on its disk), the launcher reads the rejects back from there,
    and the published run holds the release and manifest only (no scratch files)."""
    from support.data import with_one_bad_row

    uri = s3.new_bucket("workers")
    with_one_bad_row(small_inputs, tmp_path / "csv")
    s3.upload(tmp_path / "csv", f"{uri}/tx")
    done = run_cli(
        "run", "--engine", "beam", "--input", f"{uri}/tx", "--format", "csv",
        "--output", f"{uri}/release", "--quarantine", f"{uri}/ops/q", *JOB, "--epsilon", "1",
        "--no-ledger", "--direct_running_mode=multi_processing", "--direct_num_workers=2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run_id = pointer(s3, f"{uri}/release")["run_id"]
    published = s3.keys(f"{uri}/release/_runs/{run_id}")
    assert published[0] == "manifest.json" and len(published) > 1
    assert all(re.fullmatch(r"terminal_stats/part-\d{5}\.parquet", k) for k in published[1:])
    assert pointer(s3, f"{uri}/release")["files"] == [*published[1:], "manifest.json"]
    assert s3.keys(f"{uri}/ops/q") == [f"{run_id}/rejected.parquet"]
    assert "rejected 1 (kept aside in" in done.stderr
    assert not [p for p in (tmp_path / "state").rglob("*") if p.is_file()]  # nothing staged


def test_beam_scratch_with_raw_rows_is_never_under_a_store_release(tmp_path):
    """Workers' raw rejected rows go to an operator-only place: for an output on a store, the
    quarantine's run folder (on a store) or a private local folder, never the run's folder
    under the release prefix, where a crash would leave them beside published files."""
    from dppipeline.engines.base import ReleaseJob
    from dppipeline.engines.beam.engine import _scratch_folder
    from dppipeline.storage import Location

    run = Location.of("s3://bank/release/_runs/20260101T000000Z-0badc0de")
    quarantine = tmp_path / "state" / "quarantine" / "20260101T000000Z-0badc0de"
    shipped = Location.of("s3://ops/quarantine/20260101T000000Z-0badc0de")
    job = ReleaseJob.__new__(ReleaseJob)  # only the two quarantine fields are read
    object.__setattr__(job, "quarantine", quarantine)
    object.__setattr__(job, "quarantine_shipped_to", shipped)
    assert _scratch_folder(job, run) == "s3://ops/quarantine/20260101T000000Z-0badc0de/_scratch"
    object.__setattr__(job, "quarantine_shipped_to", None)
    local = _scratch_folder(job, run)
    assert local == str(quarantine.parent / "_scratch-20260101T000000Z-0badc0de")
    assert not local.startswith("s3://bank/release")
    assert _scratch_folder(job, tmp_path / "staging") == str(tmp_path / "staging" / "_scratch")


def test_the_readmes_spark_reader_follows_the_pointer(s3, bucket, tmp_path, spark):
    """The object-store guide's Spark snippet, run on a copy of a store release on local disk (this
    Spark has no s3a connector): the pointer's run, read by Spark, equals what pandas reads
    from the store."""
    import pyarrow.fs as pafs

    out = f"{bucket}/release"
    done = run_cli("run", "--input", f"{bucket}/tx", "--output", out, *JOB, "--epsilon", "1",
                   "--no-ledger")  # fmt: skip
    assert done.returncode == 0, done.stderr
    copy = tmp_path / "copy"
    pafs.copy_files(out.removeprefix("s3://"), str(copy), source_filesystem=s3.filesystem(),
                    destination_filesystem=pafs.LocalFileSystem())  # fmt: skip

    release = f"file://{copy}"
    run_id = spark.read.json(f"{release}/RELEASE.json", multiLine=True).first()["run_id"]
    released = spark.read.parquet(f"{release}/_runs/{run_id}/terminal_stats")

    assert run_id == pointer(s3, out)["run_id"]
    by_spark = released.toPandas().sort_values("TERMINAL_ID", ignore_index=True)
    by_pandas = read_release(out).sort_values("TERMINAL_ID", ignore_index=True)
    pd.testing.assert_frame_equal(by_spark, by_pandas, check_dtype=False)


@pytest.mark.parametrize("engine", ["local", "beam"])
def test_a_corrupt_file_on_the_store_fails_the_run_naming_it(s3, small_inputs, tmp_path, engine):
    """A truncated Parquet file on S3: one line naming the file, a non-zero exit, nothing
    published and no run folder left under the output."""
    import shutil

    uri = s3.new_bucket(f"corrupt-{engine}")
    shutil.copytree(small_inputs["parquet"], tmp_path / "tx")
    bad = sorted((tmp_path / "tx").rglob("*.parquet"))[1]
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    s3.upload(tmp_path / "tx", f"{uri}/tx")
    failed = run_cli("run", "--engine", engine, "--input", f"{uri}/tx", "--output",
                     f"{uri}/release", *JOB, "--epsilon", "1", "--no-ledger")  # fmt: skip
    assert failed.returncode == 1, failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    assert "Traceback" not in failed.stderr
    name = bad.relative_to(tmp_path / "tx").as_posix()
    assert last.startswith(f"dppipeline run: error: {uri}/tx/{name}: cannot read as parquet"), last
    assert s3.keys(f"{uri}/release") == []


def test_spark_reaches_a_store_through_hadoops_filesystem_api(spark, small_inputs, tmp_path):
    """`viewfs://`, a Hadoop scheme pyarrow cannot open, mounted on local folders by the
    session's Hadoop configuration: the Spark engine lists the input, reads footers, uploads
    the release and writes the pointer through Hadoop's FileSystem API (what a cluster's
    `s3a://` or `gs://` connector plugs into), and releases what the same job releases from
    plain paths; the local engine, which has no Hadoop, fails with one line."""
    import uuid

    from dppipeline.errors import DPPipelineError
    from dppipeline.lifecycle.runner import run_job
    from dppipeline.spec.model import build_spec

    cluster = f"bank{uuid.uuid4().hex[:8]}"
    (tmp_path / "out").mkdir()
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    conf.set(f"fs.viewfs.mounttable.{cluster}.link./tx", f"file://{small_inputs['parquet']}")
    conf.set(f"fs.viewfs.mounttable.{cluster}.link./out", f"file://{tmp_path / 'out'}")
    values = {
        "input.path": f"viewfs://{cluster}/tx", "output": f"viewfs://{cluster}/out/release",
        "metrics": ["count", "sum"], "bounds.max_partitions_contributed": 50,
        "bounds.max_contributions_per_partition": 100, "bounds.min_value": 0.0,
        "bounds.max_value": 150.0, "partition_selection.public_partitions": "0..59",
        "budget.epsilon": 1e7,
    }  # fmt: skip
    result = run_job(build_spec({}, values), "spark", echo=lambda _: None)

    pointer_file = json.loads((tmp_path / "out" / "release" / "RELEASE.json").read_text())
    assert pointer_file["run_id"] == result.run_id
    run = tmp_path / "out" / "release" / "_runs" / result.run_id
    released = pd.read_parquet(run / "terminal_stats").sort_values("TERMINAL_ID")
    rows = pd.read_parquet(small_inputs["parquet"])
    truth = rows.groupby("TERMINAL_ID").size().reindex(range(60), fill_value=0)
    np.testing.assert_allclose(released["count"], truth.to_numpy(), atol=0.01)

    with pytest.raises(DPPipelineError) as refused:
        run_job(build_spec({}, {**values, "output": str(tmp_path / "local")}), "local",
                echo=lambda _: None)  # fmt: skip
    assert f"viewfs://{cluster}/tx" in str(refused.value)
    assert "\n" not in str(refused.value)

    other = f"{cluster}csv"  # a new mount table: Hadoop caches a file system per authority
    conf.set(f"fs.viewfs.mounttable.{other}.link./csv", f"file://{small_inputs['csv']}")
    csv = {**values, "input.path": f"viewfs://{other}/csv", "input.format": "csv",
           "output": str(tmp_path / "csv-release")}  # fmt: skip
    with pytest.raises(DPPipelineError, match="reads CSV input from local or mounted paths"):
        run_job(build_spec({}, csv), "spark", echo=lambda _: None)
    assert not (tmp_path / "csv-release").exists()


def test_spark_without_the_schemes_connector_says_which_jars(s3, bucket, spark, tmp_path):
    """This Spark has no hadoop-aws: `s3://` input fails before reading, in one line that
    names the scheme and the jars a cluster needs; nothing is written."""
    from dppipeline.errors import DPPipelineError
    from dppipeline.lifecycle.runner import run_job
    from dppipeline.spec.model import build_spec

    values = {"input.path": f"{bucket}/tx", "output": str(tmp_path / "out"),
              "metrics": ["count"], "partition_selection.public_partitions": "0..59",
              "bounds.max_partitions_contributed": 1,
              "bounds.max_contributions_per_partition": 1}  # fmt: skip
    with pytest.raises(DPPipelineError) as refused:
        run_job(build_spec({}, values), "spark", echo=lambda _: None)
    message = str(refused.value)
    assert message == (
        f"cannot list input folder {bucket}/tx: this Spark has no Hadoop FileSystem for scheme "
        "'s3' (S3: s3a:// with hadoop-aws and the AWS SDK bundle on the classpath; GCS: gs:// "
        "with the gcs-connector jar)"
    )
    assert not (tmp_path / "out").exists()
