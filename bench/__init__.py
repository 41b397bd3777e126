"""Benchmarks: kept out of the test suite because they measure speed, not correctness."""
