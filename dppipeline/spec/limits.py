"""The spec's numeric limits: what PyDP, pipeline-dp and float64 sums accept, found by trying.

Found with PyDP 1.1.5 / pipeline-dp 0.3.1 (see the field docs; `core/planner.py` checks each
mechanism of a plan against PyDP as well). The constrained types (`constraints.py`) enforce
them and the field descriptions (`sections.py`, `model.py`) quote them.
"""

from __future__ import annotations

MIN_EPSILON = 2.0**-50  # PyDP refuses a mechanism's epsilon below 2^-50 (~8.9e-16)
MIN_DELTA = 1e-100  # a non-zero delta below: PyDP's selection probabilities turn inf or 0
MAX_DELTA = 1e-3  # above it (epsilon, delta)-DP no longer protects a customer in a thousand
MAX_INT_PARAM = 2**31 - 1  # PyDP takes L0, Linf and pre_threshold as a C++ int
MAX_SCOPE_CHARS = 200  # a ledger scope is echoed on every `[ledger]` line and stored per row
MAX_ABS_BOUND = 1e15  # clipping bounds: sums stay finite, sensitivities far from PyDP's limits
MIN_BOUND_WIDTH = 1e-100  # max - min: PyDP's Gaussian hangs on sensitivities near 1e-308
MAX_WINDOW_DAYS = 36_525  # 100 years of data days
MAX_RANGE_KEYS = 1_000_000  # public keys an 'A..B' range may list
MAX_NAME_CHARS = 100  # job, query and column names (a release folder is named after them)
MAX_BUCKET_EDGES = 1000  # edges of one `bucket(COLUMN, ...)` key
