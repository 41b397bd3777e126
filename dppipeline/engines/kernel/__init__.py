"""The Polars/numpy kernel every engine runs: the local engine in process, Beam's workers
and Spark's `mapInArrow`. Reading and validation, task rows, contribution bounding and the
sampling priority (`sampling.py`) every engine must reproduce, and the release file."""
