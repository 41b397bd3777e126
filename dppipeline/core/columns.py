"""The columns of the exact aggregate table every engine hands to `core.mechanisms`, and the form
of its kept values: here, not in `core.mechanisms`, so that code running beside the data (Spark's
Python workers, Beam's DoFns) imports no noise library to name them."""

import numpy as np
import pandas as pd

AGGREGATE_COLUMNS = ("privacy_id_count", "count", "sum")
CENTRED_SQUARES = "centred_squares"  # sum of (x - mid)^2 over kept rows (variance only)
VALUES = "values"  # the kept clipped values, one array per partition (percentiles, max, min)
AGGREGATE_DTYPES = {"privacy_id_count": "int64", "count": "int64", "sum": "float64"}
DISTINCT_PREFIX = "count_distinct_"  # mechanism (and column) of a count_distinct(COLUMN)


def value_arrays(values: pd.Series) -> list[np.ndarray]:
    """Kept values per partition as float arrays; a partition without any (a missing value
    after a join, or an empty list) gets an empty array."""
    return [
        np.asarray(v, dtype=np.float64) if isinstance(v, np.ndarray | list) else np.zeros(0)
        for v in values
    ]
