"""For Beam's `--setup_file=./setup.py`: Beam builds an sdist of dppipeline with it and installs
that on every worker, with the dependencies pinned in pyproject.toml. All metadata lives in
pyproject.toml; this file only lets tools that still call `setup.py` find it."""

from setuptools import setup

setup()
