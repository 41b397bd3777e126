"""Synthetic card transactions (`dppipeline generate`), the demo's and the tests' input."""
