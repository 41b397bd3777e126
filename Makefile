# dppipeline: every target creates the virtualenv first when needed.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= demo

.DEFAULT_GOAL := help
.PHONY: help setup demo test lint bench clean check-java spark-cluster spark-cluster-stop pack-env

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

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
	$(PY) -m bench.beam_engine

clean:  ## remove generated data and caches (keeps .venv)
	rm -rf $(DEMO) .pytest_cache .ruff_cache bench/data

# A local Spark standalone cluster and the executors' Python environment: see README.md,
# "Submitting to a Spark cluster". SPARK_CLUSTER_DIR, SPARK_CLUSTER_PORT, ... override the
# defaults (scripts/spark_cluster.sh --help).
spark-cluster: setup check-java  ## start a Spark master + worker on 127.0.0.1, print the master URL
	@scripts/spark_cluster.sh start

spark-cluster-stop:  ## stop the cluster of make spark-cluster
	@scripts/spark_cluster.sh stop

pack-env: setup  ## pack dppipeline + its runtime deps for executors: build/executor-env.tar.gz
	@scripts/pack_executor_env.sh build/executor-env.tar.gz
