"""`release(job, data)`: one DP release of in-memory data, by the CLI's rules and code.

The run sequence is `lifecycle.runner`'s (plan before any data, reserve, `reading`, the
engine, manifest, commit), entered through `release_rows`; validation, bounding, noise and
selection are the engines'. The released rows come back as the kind of frame that went in.
"""

from __future__ import annotations

import html
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from dppipeline.api.frames import FrameKind, as_polars, frame_kind, read_dataset
from dppipeline.api.jobs import JobSource, load_job
from dppipeline.core.manifest import Manifest

Frame = TypeVar("Frame")
SHOWN_ROWS = 10  # rows per query a repr shows


@dataclass(frozen=True)
class Release(Generic[Frame]):
    """One release: each query's released rows (`datasets`, the kind of frame that went in)
    and the manifest that states how they were made (budget split, noise, bounds)."""

    datasets: Mapping[str, Frame]
    manifest: Manifest
    run_id: str = field(default="")

    def __getitem__(self, query: str) -> Frame:
        return self.datasets[query]

    def _intervals(self, query: str) -> list[str]:
        entry = self.manifest.queries[query]
        return [
            f"{metric} +-{m.ci95_half_width:.4g} (95%)"
            for metric, m in entry.metrics.items()
            if m.ci95_half_width is not None
        ]

    def _shown(self, query: str) -> Any:
        """The first rows as pandas (a Spark frame: `limit` on the caller's session)."""
        data: Any = self.datasets[query]
        if hasattr(data, "toPandas"):
            return data.limit(SHOWN_ROWS).toPandas()
        if hasattr(data, "to_pandas"):
            return data.head(SHOWN_ROWS).to_pandas()
        return data.head(SHOWN_ROWS)

    def __repr__(self) -> str:
        m = self.manifest
        lines = [f"Release {m.run_id}: epsilon={m.epsilon:g} delta={m.delta:g} ({m.noise})"]
        for query, entry in m.queries.items():
            noise = "; ".join(self._intervals(query)) or "no additive noise"
            lines.append(f"{query}: {entry.released_partitions:,} rows released; {noise}")
            lines.append(self._shown(query).to_string(index=False))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        m = self.manifest
        parts = [
            f"<p><b>Release {html.escape(m.run_id)}</b>: epsilon={m.epsilon:g} "
            f"delta={m.delta:g} ({html.escape(m.noise)})</p>"
        ]
        for query, entry in m.queries.items():
            noise = "; ".join(self._intervals(query)) or "no additive noise"
            parts.append(
                f"<p><b>{html.escape(query)}</b>: {entry.released_partitions:,} rows released; "
                f"{html.escape(noise)}</p>"
            )
            parts.append(self._shown(query).to_html(index=False))
        return "\n".join(parts)


def release(
    job: JobSource,
    data: Frame,
    *,
    ledger: str | Path | Literal[False] | None = None,
    scope: str | None = None,
    dataset_id: str | None = None,
    seed: int | None = None,
    new_release: bool = False,
    output: str | Path | None = None,
    quarantine: str | Path | None = None,
    echo: Callable[[str], None] | None = None,
) -> Release[Frame]:
    """Releases `job` over `data` (a pandas or Polars DataFrame: local engine; a Spark
    DataFrame: Spark engine, in the DataFrame's own session) by the CLI's rules: the same
    validation (bad rows counted and kept aside in the quarantine; above the job's
    max_rejected_fraction an InputError naming the column and rule, nothing released),
    bounding, noise, selection and ledger charge.

    - `ledger`: a ledger URL or SQLite path; unset, the ledger every entry point uses
      (`$DPPIPELINE_LEDGER`, else `state/ledger.sqlite` in `$DPPIPELINE_STATE_DIR`, as
      `dppipeline run`); `False` releases without recording the spend, refused for a job that
      states a scope, cap or window. The spend is reserved before any row is read and
      committed before the rows are returned. `scope` (or the job's budget.scope) names what
      its cap protects and is required with a ledger.
    - `dataset_id`: in-memory data has no file fingerprint, so every call is a new release,
      charged, unless the data is named: the same job over the same `dataset_id` and period is
      then the same release (refused unless `new_release` or `output` kept it).
    - `output`: also publish the release to this folder, as `dppipeline run` does.
    - `seed`: fixes contribution sampling (tests); never the noise.
    """
    spec = load_job(job, budget__scope=scope)
    spec = spec.model_copy(update={"output": None if output is None else str(output)})
    kind = frame_kind(data)
    from dppipeline.lifecycle.ledger_choice import choose_ledger  # noqa: PLC0415
    from dppipeline.lifecycle.runner import InputRows, release_rows  # noqa: PLC0415

    chosen = choose_ledger(ledger, spec, "ledger=False")

    engine, rows = _engine_for(data, kind)
    result = release_rows(
        spec,
        InputRows(rows, dataset_id),
        engine,
        quarantine=quarantine,
        seed=seed,
        echo=echo,
        ledger=chosen,
        new_release=new_release,
    )
    folder = Path(str(result.output))
    spark = getattr(data, "sparkSession", None)
    try:
        datasets = {q: read_dataset(folder / q, kind, spark) for q in result.manifest.queries}
    finally:
        if output is None:
            shutil.rmtree(folder, ignore_errors=True)
    return Release(datasets, result.manifest, result.run_id)


def _engine_for(data: Any, kind: FrameKind) -> tuple[Any, Any]:
    """(engine, rows as it reads them): Spark in the DataFrame's session, else local."""
    from dppipeline.engines.registry import load_engine  # noqa: PLC0415

    if kind == "spark":
        return load_engine("spark", session=data.sparkSession), data
    return load_engine("local"), as_polars(data, kind)
