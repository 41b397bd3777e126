"""Where a release is published: a local folder (atomic rename) or a store (run folder and a
pointer written last). The runner runs one sequence over either (`ReleaseTarget`); each step
that differs lives here, so a check added to one place is a check of every run.
"""

from __future__ import annotations

import datetime as dt
import shutil
import uuid
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dppipeline.core.manifest import Manifest
from dppipeline.errors import DPPipelineError, InputError, OutputError
from dppipeline.lifecycle.manifests import read_manifest
from dppipeline.lifecycle.publication import (
    check_release_target,
    fsync_tree,
    heal,
    make_staging,
    output_lock,
    publish,
    refuse_unsafe_target,
    remove_release,
)
from dppipeline.lifecycle.store_publication import (
    check_store_target,
    discard_staging,
    heal_store,
    make_store_staging,
    publish_to_store,
    refuse_unsafe_store_target,
    run_files,
    store_lock,
    upload_run,
)
from dppipeline.storage import Location, StorageError
from dppipeline.storage.releases import RUNS_FOLDER, published_run_id

if TYPE_CHECKING:  # SQLAlchemy: imported only for a run with a ledger
    from dppipeline.ledger import LedgerRow

Fate = Callable[[str, dict | None], str]


def new_run_id() -> str:
    """`YYYYMMDDTHHMMSSZ-<8 hex>`: sortable by start time, unique, in every folder name."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


class ReleaseTarget(Protocol):
    """One output's publication steps, in the order the runner takes them."""

    where: Path | Location  # what the run reports as its output

    @property
    def recorded_as(self) -> str:
        """The output as the ledger records it (a resolved path, or the URI)."""

    def display(self) -> str: ...

    def lock(self) -> AbstractContextManager[Any]:
        """Held from healing to publication: one run at a time per output."""

    def heal(self, fate: Fate) -> Iterable[str]:
        """Finish or undo what crashed runs left (one line per action)."""

    def check(self, overwrite: bool) -> None:
        """Before the reservation: the output may be written (and replaced with `overwrite`)."""

    def probe(self, run_id: str) -> None:
        """Before the reservation: what publication will write can be written (credentials,
        the bucket, permissions), so that such a failure charges nothing."""

    def existing(self, row: LedgerRow, overwrite: bool) -> Manifest:
        """The committed release `row` at this output (no noise drawn, nothing spent)."""

    def staging(self, run_id: str, engine_writes_to_stores: bool) -> Path | Location:
        """Where the engine writes the run's release before it is published."""

    def last_look(self, overwrite: bool) -> None:
        """After staging, before the commit: still revocable."""

    def staged_files(self, staging: Path | Location, run_id: str) -> list[str]:
        """The run's files in place for publication (uploaded from local staging if needed)."""

    def publish(self, staging: Path | Location, run_id: str, files: list[str]) -> None:
        """Make the committed run the visible release (an OutputError when it fails)."""

    def discard(self, staging: Path | Location) -> None:
        """An uncommitted run's files, removed."""


class FolderTarget:
    """A local folder: the release is staged beside it and renamed into place."""

    def __init__(self, output: Path, guard: dict[str, Any]):
        self.where = output
        self._guard = guard
        refuse_unsafe_target(output, **guard)

    @property
    def recorded_as(self) -> str:
        return str(self.where.resolve())

    def display(self) -> str:
        return str(self.where)

    def lock(self) -> AbstractContextManager[Any]:
        return output_lock(self.where)

    def heal(self, fate: Fate) -> Iterable[str]:
        return heal(self.where, fate)

    def check(self, overwrite: bool) -> None:
        check_release_target(self.where, overwrite, **self._guard)

    def probe(self, run_id: str) -> None:
        """The parent is written by the output lock and the staging folder is made before
        any row is read: both already fail uncharged."""
        return None

    def existing(self, row: LedgerRow, overwrite: bool) -> Manifest:
        """Copied byte for byte if it was published elsewhere and this folder does not hold
        a copy yet."""
        output, published = self.where, Path(row.output)
        if published_run_id(published) != row.run_id:
            raise InputError(
                f"this release (run {row.run_id}) was published to {published}, which no longer "
                "holds it; pass --new-release to draw new noise and spend the budget again"
            )
        if published.resolve() != output.resolve() and published_run_id(output) != row.run_id:
            self.check(overwrite)
            copy_id = new_run_id()
            with output_lock(published):  # no run replaces it while it is copied
                staging = make_staging(output, copy_id)
                try:
                    shutil.copytree(
                        published,
                        staging,
                        dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("_PUBLISHED", "._PUBLISHED.tmp"),
                    )
                    fsync_tree(staging)
                    publish(output, staging, copy_id)
                except BaseException:
                    remove_release(staging)
                    raise
        return read_manifest(output)

    def staging(self, run_id: str, engine_writes_to_stores: bool) -> Path:
        return make_staging(self.where, run_id)

    def last_look(self, overwrite: bool) -> None:
        self.check(overwrite)

    def staged_files(self, staging: Path | Location, run_id: str) -> list[str]:
        return []  # the folder is renamed whole

    def publish(self, staging: Path | Location, run_id: str, files: list[str]) -> None:
        assert isinstance(staging, Path)
        try:
            publish(self.where, staging, run_id)
        except (OSError, DPPipelineError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise OutputError(
                f"run {run_id} is committed but publishing it to {self.where} failed "
                f"({why}); the next run to {self.where} publishes it"
            ) from None

    def discard(self, staging: Path | Location) -> None:
        assert isinstance(staging, Path)
        remove_release(staging)


class StoreTarget:
    """A store without atomic rename (`store_publication`): the run's files under
    `OUT/_runs/<run_id>/`, made visible by the pointer written last."""

    def __init__(self, output: Location, *, input_path: str | None, quarantine: Location | None):
        self.where = output
        self._input_path = input_path
        refuse_unsafe_store_target(output, input_path=input_path, quarantine=quarantine)

    @property
    def recorded_as(self) -> str:
        return self.where.uri

    def display(self) -> str:
        return self.where.display()

    def lock(self) -> AbstractContextManager[Any]:
        return store_lock(self.where)

    def heal(self, fate: Fate) -> Iterable[str]:
        return heal_store(self.where, fate)

    def check(self, overwrite: bool) -> None:
        check_store_target(self.where, overwrite, input_path=self._input_path)

    def probe(self, run_id: str) -> None:
        """A probe object written under `OUT/_runs/` (where the run writes anyway; a name no
        run folder has) and removed: a missing bucket, missing or read-only credentials
        fail here, before the reservation."""
        probe = self.where.join(RUNS_FOLDER, f".write-probe-{run_id}")
        try:
            probe.write_bytes(b"")
            probe.delete_file()
        except StorageError as exc:
            reason = str(exc).split(": ", 1)[-1]
            raise OutputError(
                f"output {self.where.display()}: cannot write there ({reason}); checked "
                "before reading, nothing was charged"
            ) from None

    def existing(self, row: LedgerRow, overwrite: bool) -> Manifest:
        """Only where it was published: a store release is never copied."""
        output = self.where
        if row.output != output.uri or published_run_id(output) != row.run_id:
            raise InputError(
                f"this release (run {row.run_id}) was published to "
                f"{Location.of(row.output).display()}, not {output.display()}; "
                "pass --new-release to draw new noise and spend the budget again"
            )
        return read_manifest(output)

    def staging(self, run_id: str, engine_writes_to_stores: bool) -> Path | Location:
        """Beam's workers write the run's folder on the store themselves; the other engines
        stage on local disk and the runner uploads."""
        if engine_writes_to_stores:
            return self.where.join(RUNS_FOLDER, run_id)
        return make_store_staging(run_id)

    def last_look(self, overwrite: bool) -> None:
        return None  # the pointer is the only write that shows: nothing to revoke here

    def staged_files(self, staging: Path | Location, run_id: str) -> list[str]:
        if isinstance(staging, Location):
            return run_files(staging)
        return upload_run(self.where, staging, run_id)

    def publish(self, staging: Path | Location, run_id: str, files: list[str]) -> None:
        try:
            publish_to_store(self.where, staging, run_id, files)
        except OutputError as exc:
            raise OutputError(
                f"run {run_id} is committed but publishing it to {self.where.display()} failed "
                f"({exc}); the next run to {self.where.display()} publishes it"
            ) from None

    def discard(self, staging: Path | Location) -> None:
        discard_staging(staging)
