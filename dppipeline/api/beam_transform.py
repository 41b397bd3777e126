"""`ReleaseTransform`: a release as a composite PTransform in the caller's Beam pipeline.

The ledger charge happens when the transform is expanded (when the caller applies it), not
when the pipeline runs: the caller may run the pipeline at any time, and anything it runs
may read rows, so the spend is reserved, marked `reading` and committed at expansion, before
any row can be read (the conservative rule: a pipeline that never runs stays charged).

One charge, one draw of noise: the pipeline may be run again (or launched again as a
template), so the release is kept in a record the first time it is made and every later
execution returns the same rows (`engines/beam/record.py`). A new release means a new
transform, and a new charge.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import apache_beam as beam

from dppipeline.api.jobs import JobSource, load_job
from dppipeline.core.manifest import Manifest


class ReleaseTransform(beam.PTransform[Any, dict[str, Any]]):
    """rows (dicts or beam.Row with the job's input columns) -> {query: PCollection of
    released rows as dicts}. The same validation (rejected rows kept aside in the quarantine;
    above max_rejected_fraction the pipeline fails with an InputError before any released
    row leaves the transform), bounding, noise and selection as `dppipeline run`; `manifest`
    is set once the transform is applied.

    `ledger`, `scope`, `dataset_id`, `seed`, `new_release`, `quarantine`: as for
    `dppipeline.release` (the same ledger by default); the budget is charged at expansion and
    every run of the pipeline returns the same release (module docstring).
    """

    def __init__(
        self,
        job: JobSource,
        *,
        ledger: str | Path | Literal[False] | None = None,
        scope: str | None = None,
        dataset_id: str | None = None,
        seed: int | None = None,
        new_release: bool = False,
        quarantine: str | Path | None = None,
        echo: Callable[[str], None] | None = None,
        label: str | None = None,
    ):
        super().__init__(label)
        from dppipeline.lifecycle.ledger_choice import choose_ledger  # noqa: PLC0415

        self.job = load_job(job, budget__scope=scope).model_copy(update={"output": None})
        self._ledger = choose_ledger(ledger, self.job, "ledger=False")
        self._dataset_id, self._seed = dataset_id, seed
        self._new_release, self._quarantine, self._echo = new_release, quarantine, echo
        self.manifest: Manifest | None = None
        self.run_id: str | None = None

    def expand(self, rows: Any) -> dict[str, Any]:
        import shutil  # noqa: PLC0415

        from dppipeline.engines.registry import load_engine  # noqa: PLC0415
        from dppipeline.lifecycle.runner import InputRows, release_rows  # noqa: PLC0415

        result = release_rows(
            self.job,
            InputRows(rows, self._dataset_id),
            load_engine("beam"),
            quarantine=self._quarantine,
            seed=self._seed,
            echo=self._echo,
            ledger=self._ledger,
            new_release=self._new_release,
        )
        shutil.rmtree(Path(str(result.output)), ignore_errors=True)  # the staged manifest
        self.manifest, self.run_id = result.manifest, result.run_id
        assert result.datasets is not None
        return dict(result.datasets)
