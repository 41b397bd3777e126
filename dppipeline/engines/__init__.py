"""Engines read, validate, clip, bound and aggregate; the DP release itself lives in `core`."""
