# dppipeline: every target creates the virtualenv first when needed.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= demo

.DEFAULT_GOAL := help
.PHONY: help setup demo test lint bench clean check-java

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): requirements.lock pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

setup: $(STAMP)  ## create .venv with the pinned dependencies

check-java:
	@command -v java >/dev/null || { echo "error: Java not found: Spark needs a JDK 17 or newer on PATH (or JAVA_HOME set)" >&2; exit 1; }

demo: setup  ## generate sample data and run the default job on the local engine
	$(PY) -m dppipeline generate --output $(DEMO)/transactions --days 30 --format parquet
	$(PY) -m dppipeline run --config jobs/configs/terminal_stats.yaml --engine local \
	    --input $(DEMO)/transactions --output $(DEMO)/release --overwrite
	@echo "release written to $(DEMO)/release (read it with: pandas.read_parquet('$(DEMO)/release/terminal_stats'))"

test: setup  ## lint, then the whole test suite
	$(VENV)/bin/ruff check dppipeline tests bench jobs
	$(PY) -m pytest -n 2 -q

lint: setup  ## ruff
	$(VENV)/bin/ruff check dppipeline tests bench jobs
	$(VENV)/bin/ruff format --check dppipeline tests bench jobs

bench: setup  ## benchmarks against PipelineDP and a non-private baseline
	$(PY) -m bench.local_engine
	$(PY) -m bench.spark_engine

clean:  ## remove generated data and caches (keeps .venv)
	rm -rf $(DEMO) .pytest_cache .ruff_cache bench/data
