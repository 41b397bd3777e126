"""The spec's closed word lists: every choice a field (or the command line) offers.

One place for the words, so that the fields' rules (`sections.py`, `model.py`) and the CLI's
`choices` (`cli/parser.py`) cannot disagree. Plain tuples and a Literal, nothing imported:
the CLI builds its parser from them without loading pydantic or pyarrow. Each list's first
word is the default (of its field, or of the CLI flag).
"""

from __future__ import annotations

from typing import Literal, get_args

NOISE_KINDS = ("laplace", "gaussian")
ACCOUNTINGS = ("basic", "pld", "zcdp")  # how a job's mechanisms compose (core/accounting.py)
COUNT_NOISES = ("discrete", "continuous")  # integer or real noise on counts (core/discrete.py)
SELECTION_STRATEGIES = ("truncated_geometric", "laplace_thresholding", "gaussian_thresholding")
INPUT_FORMATS = ("parquet", "csv")
INPUT_LAYOUTS = ("daily", "files")
# How Linf bounds a (privacy unit, partition) pair of more rows (bounds.linf_bounding). No
# fixed default: unset, a query scales unless its metrics need kept rows or it bounds a unit's
# total rows (`QuerySpec._resolve_linf_bounding`).
LinfBounding = Literal["sample", "scale"]
LINF_BOUNDINGS: tuple[LinfBounding, ...] = get_args(LinfBounding)
# Input schemas shipped in `spec/schemas/` (`input.schema` by name; `generate --table`).
SHIPPED_SCHEMAS = ("transactions", "book_transactions", "card_payments")
# Engines a job runs on (`run --engine`, `evaluate --engine`, the API's `engine=`).
ENGINES = ("local", "spark", "beam")
