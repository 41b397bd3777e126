"""`Session`: interactive releases over one dataset under one cap, as Tumult's Session.

Every `session.release(...)` is a release by `dppipeline.release`: recorded in the ledger
like a run (reserved before any row is read, committed before its rows come back) in the
session's scope, whose cap the ledger stores and enforces. The cap is the job spec's cap
fields: stored for a scope without one, refused (BudgetExceeded) when it differs from a
stored one, as for any job (`dppipeline budget set-cap` changes it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic

from dppipeline.api.frame_release import Frame, Release, release
from dppipeline.api.jobs import JobSource, job_fields, load_job


@dataclass(frozen=True)
class Budget:
    """A privacy budget: epsilon and delta (0 for pure DP)."""

    epsilon: float
    delta: float = 0.0


def query(
    *,
    metrics: Sequence[str] = ("count",),
    group_by: Sequence[str] = (),
    value: str | None = None,
    filter: str | None = None,
    min_value: float | None = None,
    max_value: float | None = None,
    max_partitions_contributed: int | None = None,
    max_contributions_per_partition: int | None = None,
    max_contributions: int | None = None,
    public_keys: str | Sequence[Any] | Mapping[str, Any] | None = None,
    name: str = "query",
) -> dict[str, Any]:
    """A job of one query, as a dict of spec fields (`load_job`, `release`, `Session`):
    `metrics` per partition of `group_by` (no columns: one global total) over the rows
    `filter` keeps; bounds as in a job spec (L0 and Linf must be stated for a release, or
    max_contributions; see the job spec); `public_keys` as
    partition_selection.public_partitions (unset: private selection). Budget fields are left
    to the caller (`Session.release` sets them)."""
    bounds = {
        "min_value": min_value,
        "max_value": max_value,
        "max_partitions_contributed": max_partitions_contributed,
        "max_contributions_per_partition": max_contributions_per_partition,
        "max_contributions": max_contributions,
    }
    entry: dict[str, Any] = {"name": name, "partition_by": list(group_by), "metrics": list(metrics)}
    if filter is not None:
        entry["filter"] = filter
    if public_keys is not None:
        entry["partition_selection"] = {"public_partitions": public_keys}
    job: dict[str, Any] = {
        "name": name,
        "bounds": {k: v for k, v in bounds.items() if v is not None},
        "queries": [entry],
    }
    if value is not None:
        job["value"] = value
    return job


class Session(Generic[Frame]):
    """Releases over `data` (a pandas, Polars or Spark DataFrame) spending from `scope` in
    `ledger` (unset: the ledger every entry point uses, `$DPPIPELINE_LEDGER` else
    `state/ledger.sqlite`), under `cap` (a Budget, or an epsilon for pure DP). `defaults`:
    dotted spec fields every job of the session gets unless it sets them (e.g.
    `{"noise": "gaussian"}`).
    `dataset_id`: names the data, so that the same job again is the same release (see
    `dppipeline.release`); by default every release is new and charged."""

    def __init__(
        self,
        data: Frame,
        *,
        ledger: str | Path | None = None,
        scope: str,
        cap: Budget | float,
        defaults: Mapping[str, Any] | None = None,
        dataset_id: str | None = None,
        seed: int | None = None,
    ):
        from dppipeline.settings import default_ledger  # noqa: PLC0415

        self.data = data
        self.ledger, self.scope = ledger or default_ledger(), scope
        self.cap = cap if isinstance(cap, Budget) else Budget(float(cap), 0.0)
        self._defaults = dict(defaults or {})
        self._dataset_id, self._seed = dataset_id, seed

    def release(
        self, job: JobSource, *, epsilon: float | None = None, delta: float | None = None
    ) -> Release[Frame]:
        """Releases `job` (a `query(...)`, a dict, YAML or JobSpec) at `epsilon`/`delta` (unset:
        the job's budget); BudgetExceeded, carrying what is left, when the scope's cap
        refuses it (nothing read, nothing spent)."""
        spec = load_job(job)
        fields = spec.model_fields_set
        base = {k: v for k, v in self._defaults.items() if k.split(".")[0] not in fields}
        overrides = {
            **base,
            "budget.epsilon": epsilon,
            "budget.delta": 0.0 if delta is None and epsilon is not None else delta,
            "budget.scope": self.scope,
            "budget.cap_epsilon": self.cap.epsilon,
            "budget.cap_delta": self.cap.delta,
        }
        from dppipeline.spec.model import build_spec  # noqa: PLC0415

        spec = build_spec(job_fields(spec), overrides, source="session job")
        return release(
            spec, self.data, ledger=self.ledger, dataset_id=self._dataset_id, seed=self._seed
        )

    def remaining(self) -> Budget:
        """What the scope's cap still allows (by the ledger's rules: every charged release
        counts, by sums or composed, whichever is smaller)."""
        from dppipeline.ledger import (  # noqa: PLC0415
            CAP_TOLERANCE,
            BudgetPolicy,
            Ledger,
            left_of,
        )

        requested = BudgetPolicy(self.cap.epsilon, self.cap.delta)
        with Ledger(self.ledger) as book:
            policy = book.effective_policy(self.scope, requested)
            epsilon, delta = left_of(policy, book.composed(self.scope, policy))

        def snapped(left: float, cap: float | None) -> float:
            """Nothing left once the spend is within the ledger's tolerance of the cap."""
            return 0.0 if cap is not None and left <= cap * CAP_TOLERANCE else left

        return Budget(snapped(epsilon, policy.cap_epsilon), snapped(delta, policy.cap_delta))
