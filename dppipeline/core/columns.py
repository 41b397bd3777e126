"""The columns of the exact aggregate table every engine hands to `core.release`: names only,
so that code running beside the data (Spark's Python workers, Beam's DoFns) imports no noise
library to name them."""

AGGREGATE_COLUMNS = ("privacy_id_count", "count", "sum")
CENTRED_SQUARES = "centred_squares"  # sum of (x - mid)^2 over kept rows (variance only)
VALUES = "values"  # the kept clipped values, one array per partition (percentiles, max, min)
AGGREGATE_DTYPES = {"privacy_id_count": "int64", "count": "int64", "sum": "float64"}
DISTINCT_PREFIX = "count_distinct_"  # mechanism (and column) of a count_distinct(COLUMN)
