"""The engine-neutral DP core: budget split, release and manifest. Never imports pyspark or beam."""
