"""The spec's sections: input, budget, contribution bounds and partition selection.

Each is a frozen pydantic model of constrained fields (`constraints.py`) whose descriptions are the
field reference (`dppipeline spec-doc`); an unknown key is an error naming the known ones.
Cross-field rules of one section are its `model_validator`s; rules that span sections are
the query's or the job's (`model.py`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dppipeline.errors import excerpt
from dppipeline.spec.constraints import (
    COLUMN_NAME,
    Bound,
    BoundValue,
    CapDelta,
    CapEpsilon,
    Day,
    Delta,
    Epsilon,
    Fraction,
    InputFormat,
    InputLayout,
    KeySources,
    OptionalColumn,
    PathText,
    PreThreshold,
    SchemaSource,
    Scope,
    SelectionStrategy,
    WindowDays,
    broken,
)
from dppipeline.spec.limits import (
    MAX_ABS_BOUND,
    MAX_INT_PARAM,
    MAX_SCOPE_CHARS,
    MAX_WINDOW_DAYS,
    MIN_BOUND_WIDTH,
)
from dppipeline.spec.vocabulary import (
    INPUT_FORMATS,
    INPUT_LAYOUTS,
    SELECTION_STRATEGIES,
    SHIPPED_SCHEMAS,
    LinfBounding,
)

# The L0 x Linf pair; `max_contributions` replaces both (a query takes one kind, never a mix).
PER_PARTITION_BOUNDS = ("max_partitions_contributed", "max_contributions_per_partition")
TOTAL_BOUNDS = ("max_contributions",)


class Section(BaseModel):
    """A spec section: frozen; an unknown key is an error naming the key and the known ones."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=False)

    @model_validator(mode="before")
    @classmethod
    def _known_keys_only(cls, raw: Any) -> Any:
        if not isinstance(raw, Mapping):
            if isinstance(raw, cls):
                return raw
            raise broken("must be a mapping")
        known = set(cls.model_fields)
        unknown = sorted((k for k in raw if k not in known), key=str)
        if unknown:
            key = unknown[0]
            short = isinstance(key, str) and COLUMN_NAME.fullmatch(key) and len(key) <= 40
            raise broken(
                f"unknown field (known: {', '.join(sorted(known))})",
                at=key if short else excerpt(key),
            )
        return raw


warnings.filterwarnings(  # `input.schema` is the field's name in every spec
    "ignore", message='Field name "schema" in "InputSpec" shadows', category=UserWarning
)


class InputSpec(Section):
    """Where the input is, what its columns are and which days to read."""

    path: PathText = Field(
        None, description="Input folder, or file with layout files (required here or as --input)."
    )
    format: InputFormat = Field(
        INPUT_FORMATS[0],
        description=(
            "parquet: DIR/date=YYYY-MM-DD/*.parquet; csv: DIR/YYYY-MM-DD.csv. Unset: detected "
            "from the folder (a folder holding both layouts is refused)."
        ),
    )
    # `schema` shadows pydantic's deprecated BaseModel.schema(): it is the field's name in specs
    schema: SchemaSource = Field(  # type: ignore[assignment]
        SHIPPED_SCHEMAS[0],
        description=(
            "Input columns: a shipped schema (transactions, book_transactions, "
            "card_payments), a .json schema file, or a list of {name, type} columns "
            "(types int64, float64, string, timestamp[us]; optional nullable, role: "
            "event_time)."
        ),
    )
    time_column: OptionalColumn = Field(
        None,
        description=(
            "The timestamp column time keys, date filters and daily partitions are about; "
            "default: the schema's event_time column (TX_DATETIME)."
        ),
    )
    layout: InputLayout = Field(
        INPUT_LAYOUTS[0],
        description=(
            "daily: one file or folder per day (see format); files: one file, or a folder of "
            "files (any names, subfolders included), read whole and filtered to "
            "[start_date, end_date] by the time column (both dates required)."
        ),
    )
    start_date: Day = Field(
        None, description="First day to read, inclusive (YYYY-MM-DD); default: all."
    )
    end_date: Day = Field(
        None, description="Last day to read, inclusive (YYYY-MM-DD); default: all."
    )
    max_rejected_fraction: Fraction = Field(
        0.001, description="Fail the run when more than this share of rows is rejected."
    )
    quarantine: PathText = Field(
        None,
        description=(
            "Operator-only folder for rejected rows (default $DPPIPELINE_STATE_DIR/quarantine);"
            " never inside or beside the release."
        ),
    )

    @model_validator(mode="after")
    def _days_in_order(self) -> InputSpec:
        if self.start_date and self.end_date and self.start_date > self.end_date:
            raise broken(
                f"must not be after input.end_date ({self.start_date} > {self.end_date})",
                at="start_date",
            )
        if self.layout == "files" and (self.start_date is None or self.end_date is None):
            raise broken(
                "layout files needs start_date and end_date: the release's period, charged "
                "to the ledger before any row is read",
                at="start_date" if self.start_date is None else "end_date",
            )
        return self


class BudgetSpec(Section):
    """The privacy budget of the whole run: all metrics and partition selection together."""

    epsilon: Epsilon = Field(
        1.0,
        description=(
            "Total epsilon of the release, finite and >= 2^-50 (~8.9e-16); smaller = more "
            "noise. Each mechanism's share must be >= 2^-50 too (PyDP's minimum), and Gaussian "
            "noise needs a share <= 709.78 (above it PyDP's sigma collapses to zero)."
        ),
    )
    delta: Delta = Field(
        1e-6,
        description=(
            "Total delta: 0, or in [1e-100, 0.001]; needed (> 0) for Gaussian noise or private "
            "selection (below 1e-100 PyDP's selection probabilities break down)."
        ),
    )
    scope: Scope = Field(
        None,
        description=(
            "Ledger scope: the dataset and privacy unit the cap protects, at most "
            f"{MAX_SCOPE_CHARS} printable characters (default <input folder name>/<privacy_unit>)."
        ),
    )
    cap_epsilon: CapEpsilon = Field(
        None, description="Ledger cap on the scope's total epsilon, finite, >= 0 (unset: no cap)."
    )
    cap_delta: CapDelta = Field(
        None, description="Ledger cap on the scope's total delta, in [0, 1] (unset: no cap)."
    )
    window_days: WindowDays = Field(
        None,
        description=(
            f"Caps hold per rolling window of this many data days, 1 to {MAX_WINDOW_DAYS:,} "
            "(unset: all time)."
        ),
    )


class BoundsSpec(Section):
    """Contribution bounds: what one privacy unit may change, hence the noise scale."""

    max_partitions_contributed: Bound | None = Field(
        None,
        description=(
            "L0: partitions kept per privacy unit (sampled uniformly when more); an integer "
            f"from 1 to {MAX_INT_PARAM:,} (PyDP's C++ int), with percentiles to "
            f"{MAX_INT_PARAM // 4:,} (its quantile tree multiplies L0 by its height, 4). "
            "Required (or max_contributions) for a query with partition keys."
        ),
    )
    max_contributions_per_partition: Bound | None = Field(
        None,
        description=(
            "Linf: rows kept per privacy unit and partition (sampled uniformly); an integer "
            f"from 1 to {MAX_INT_PARAM:,} (PyDP's C++ int). Required (or max_contributions) "
            "unless the query's only metric is privacy_id_count."
        ),
    )
    max_contributions: Bound | None = Field(
        None,
        description=(
            "Rows kept per privacy unit across all partitions (sampled uniformly), instead of "
            "L0 and Linf (setting it with either is an error); an integer from 1 to "
            f"{MAX_INT_PARAM:,}. Unset: L0 and Linf bound."
        ),
    )
    linf_bounding: LinfBounding | None = Field(
        None,
        description=(
            "How Linf bounds a (privacy unit, partition) pair of more rows: `scale` keeps "
            "them all, counts min(rows, Linf) and scales the clipped sum by min(1, Linf / "
            "rows): the same sensitivity as sampling, no sampling variance, faster "
            "(docs/explanation/bounding.md); `sample` keeps Linf of its rows (uniformly). "
            "`scale` is not allowed with percentiles, max, min, count_distinct or "
            "max_contributions. Unset: `scale` where allowed, else `sample` (per query; "
            "`plan` and the manifest say which)."
        ),
    )
    min_value: BoundValue = Field(
        None,
        description=(
            "Values are clipped to [min_value, max_value] (sum, mean, variance, ...); both "
            f"within +-{MAX_ABS_BOUND:g}, so that float64 sums stay finite and sensitivities "
            "stay far below what PyDP refuses (~1e306) or hangs on."
        ),
    )
    max_value: BoundValue = Field(
        None,
        description=(
            f"Upper clipping bound, at least {MIN_BOUND_WIDTH:g} above min_value (the "
            "variance's sensitivity, width^2/8, must stay far above the ~1e-308 on which "
            "PyDP's Gaussian hangs); required for every metric of the value."
        ),
    )

    @model_validator(mode="after")
    def _a_range(self) -> BoundsSpec:
        if self.max_contributions is not None and self.linf_bounding == "scale":
            raise broken(
                "scale bounds the rows of each (unit, partition) pair; max_contributions "
                "bounds a unit's total rows: use sample with it",
                at="linf_bounding",
            )
        if self.max_contributions is not None:
            pair = [f for f in PER_PARTITION_BOUNDS if f in self.model_fields_set]
            if pair:
                raise broken(
                    f"must not be set with bounds.{pair[0]}: max_contributions bounds a unit's "
                    "total rows instead of L0 x Linf (use one kind)",
                    at="max_contributions",
                )
        low, high = self.min_value, self.max_value
        if low is None or high is None:
            if low is not high:
                missing = "min_value" if low is None else "max_value"
                raise broken("min_value and max_value must be set together", at=missing)
            return self
        if low > high:
            raise broken(f"must be <= bounds.max_value ({low} > {high})", at="min_value")
        if low == high:
            raise broken(
                f"must be < bounds.max_value (both {low}): an empty range carries no information",
                at="min_value",
            )
        if high - low < MIN_BOUND_WIDTH:
            raise broken(
                f"must be at least {MIN_BOUND_WIDTH:g} above bounds.min_value (PyDP's Gaussian "
                f"noise hangs on tinier sensitivities), got [{low:g}, {high:g}]",
                at="max_value",
            )
        return self


class SelectionSpec(Section):
    """Which partitions are released: a public key list, or private selection from the data."""

    public_partitions: KeySources = Field(
        None,
        description=(
            "Public keys: a file (one key per line, or a CSV with the key columns), an "
            "integer range 'A..B', a list [k1, k2, ...] (one key column), or per key column a "
            "file, range, list or 'input_range' (every time bucket of the input days), whose "
            "product is the key set. Every listed key is released, no other. Unset: private "
            "selection."
        ),
    )
    strategy: SelectionStrategy = Field(
        SELECTION_STRATEGIES[0],
        description="Private selection: truncated_geometric, laplace_ or gaussian_thresholding.",
    )
    pre_threshold: PreThreshold = Field(
        None,
        description=(
            "Private selection: never release a partition with fewer privacy units; an "
            f"integer from 1 to {MAX_INT_PARAM:,} (PyDP's C++ int)."
        ),
    )

    @property
    def is_public(self) -> bool:
        return self.public_partitions is not None
