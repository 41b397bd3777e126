"""dppipeline: differentially private per-partition statistics over partitioned transaction data."""

__version__ = "0.1.0"
