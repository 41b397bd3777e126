"""Row validation rules and the reject policy, shared by every engine.

A row is rejected when a column the schema marks non-nullable is null or does not parse as its
type, or when the value column is not a finite number. Rejected rows are counted and written to
a quarantine folder (never inside the release); above `max_rejected_fraction` the run fails and
names the first bad file and row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dppipeline.errors import InputError

# Per-row position wording: CSV rows by line (header = line 1), Parquet rows by 1-based index.
ROW_WORD = {"csv": "line", "parquet": "row"}


@dataclass(frozen=True)
class RejectedRow:
    """Where the first rejected row is, and why."""

    file: str
    row: int
    reason: str
    fmt: str

    def describe(self) -> str:
        return f"{self.file} {ROW_WORD.get(self.fmt, 'row')} {self.row}: {self.reason}"


@dataclass(frozen=True)
class RejectSummary:
    """Counts for the operator's log and the run check; never published in a release."""

    rows_read: int
    rows_rejected: int
    first: RejectedRow | None
    quarantine: Path | None = None

    @property
    def fraction(self) -> float:
        return self.rows_rejected / self.rows_read if self.rows_read else 0.0


def check_rejected_fraction(summary: RejectSummary, max_fraction: float) -> None:
    """Fails the run when too many rows were rejected, naming the first bad one."""
    if summary.rows_read == 0:
        raise InputError("the selected input partitions hold no rows")
    if summary.rows_rejected and summary.fraction > max_fraction:
        assert summary.first is not None
        where = f"; rejected rows in {summary.quarantine}" if summary.quarantine else ""
        raise InputError(
            f"rejected {summary.rows_rejected:,} of {summary.rows_read:,} rows "
            f"({summary.fraction:.4%}), above max_rejected_fraction {max_fraction:g}; "
            f"first: {summary.first.describe()}{where}"
        )
