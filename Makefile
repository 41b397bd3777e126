# dppipeline: every target creates the virtualenv first when needed.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= demo
LINTED := dppipeline tests bench jobs airflow_dags tests_airflow scripts
# make test-fast: no JVM, no server, nothing slow (markers in pyproject.toml, applied by
# tests/conftest.py, which also fails a test that starts Java under this selection).
FAST   := not spark and not beam and not postgres and not s3 and not slow

.DEFAULT_GOAL := help
.PHONY: help setup demo test test-fast lint bench clean check-java spark-cluster spark-cluster-stop pack-env airflow-setup airflow-demo airflow-test locks

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

# Airflow lives in its own virtualenv (its pins clash with nothing of ours, and .venv stays lean);
# its tasks run the jobs with .venv's Python.
AIRFLOW_VENV  ?= .venv-airflow
AIRFLOW_STAMP := $(AIRFLOW_VENV)/.installed

$(AIRFLOW_STAMP): requirements-airflow.lock
	$(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(AIRFLOW_VENV)/bin/python -m pip install --quiet -r requirements-airflow.lock
	@touch $(AIRFLOW_STAMP)

airflow-setup: $(AIRFLOW_STAMP)  ## create .venv-airflow (Airflow 3 + Spark/Beam providers, pinned)

airflow-test: setup airflow-setup check-java  ## the DAG tests on a real Airflow (dag.test)
	cd tests_airflow && ../$(AIRFLOW_VENV)/bin/python -m pytest -q -p no:cacheprovider .

airflow-demo: setup airflow-setup check-java  ## run the Spark DAG for 3 generated days, print the releases
	$(AIRFLOW_VENV)/bin/python scripts/airflow_demo.py

check-java:
	@command -v java >/dev/null || { echo "error: Java not found: Spark needs a JDK 17 or newer on PATH (or JAVA_HOME set)" >&2; exit 1; }

demo: setup  ## generate sample data and run the default job on the local engine
	$(PY) -m dppipeline generate --output $(DEMO)/transactions --days 30 --format parquet
	$(PY) -m dppipeline run --config jobs/configs/terminal_stats.yaml --engine local \
	    --input $(DEMO)/transactions --output $(DEMO)/release --overwrite
	@echo "release written to $(DEMO)/release (read it with: pandas.read_parquet('$(DEMO)/release/terminal_stats'))"

test: setup airflow-setup  ## lint, then the whole test suite (then the Airflow DAG tests)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy
	$(PY) -m pytest -n 2 -q
	$(MAKE) --no-print-directory airflow-test

test-fast: setup  ## the tests that need no JVM, no server and little time (a few minutes)
	$(PY) -m pytest -m "$(FAST)" -n 2 -q

lint: setup  ## ruff, the layer contracts (import-linter) and mypy --strict on spec and core
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy
	$(VENV)/bin/ruff format --check $(LINTED)

bench: setup  ## benchmarks against PipelineDP and a non-private baseline; noise per accounting
	$(PY) -m bench.local_engine
	$(PY) -m bench.spark_engine
	$(PY) -m bench.beam_engine --sizes 1M,5M  # issue 35 targets both sizes
	$(PY) -m bench.accounting
	$(PY) -m bench.summary

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

locks:  ## rewrite requirements-runtime.lock and requirements-beam-worker.lock from requirements.lock
	@scripts/lock_roles.sh
