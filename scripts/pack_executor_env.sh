#!/usr/bin/env bash
# Pack the Python environment the Spark executors need into one relocatable archive:
#
#   scripts/pack_executor_env.sh OUT.tar.gz      (make pack-env: build/executor-env.tar.gz)
#
# It holds dppipeline (a wheel built from this tree) and its runtime dependencies: pipeline-dp,
# python-dp, dp-accounting, numpy, pandas, pyarrow, polars, pyyaml, whatever else pyproject.toml's
# [project.dependencies] lists, and what they need: exactly requirements-runtime.lock (the
# runtime role's lock, `make locks`). Not pyspark (Spark puts its own pyspark.zip on the executors' PYTHONPATH),
# apache-beam or airflow. Ship it with
#
#   spark-submit --archives OUT.tar.gz#env --conf spark.pyspark.python=./env/bin/python \
#       --conf spark.pyspark.driver.python=.venv/bin/python ...
#
# The archive is packed with venv-pack (installed into .venv when missing; plain tar if it
# fails). Like any virtualenv it does not contain Python itself: env/bin/python links to the
# interpreter .venv was made from, which every node needs at the same path
# (PYTHON_PREFIX=/prefix/of/python3.11 when the nodes have it elsewhere, e.g. /usr).
#
# The archive is rebuilt only when its inputs change: requirements-runtime.lock, pyproject.toml, the
# package sources and schemas/, this script, the Python version and PYTHON_PREFIX (their SHA-256
# is kept in OUT.sha256). FORCE=1 rebuilds anyway. PYTHON picks the interpreter (default
# .venv/bin/python).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROG="scripts/pack_executor_env.sh"
# The runtime dependencies, named explicitly (the wheel adds any other that pyproject.toml
# declares); every version comes from the lock.
RUNTIME_DEPS=(pipeline-dp python-dp dp-accounting numpy pandas pyarrow polars pyyaml)
# What the executors' environment must not hold.
EXCLUDED=(pyspark apache-beam apache-airflow)

die() {
    echo "$PROG: error: $*" >&2
    exit 1
}

[[ $# -eq 1 && "$1" != -* ]] || {
    echo "usage: $PROG OUT.tar.gz" >&2
    exit 2
}
case "$1" in
    /*) OUT="$1" ;;
    *) OUT="$PWD/$1" ;;
esac
[[ "$OUT" == *.tar.gz ]] || die "OUT must end in .tar.gz (Spark unpacks .tar.gz, .tgz, .zip, .tar and .jar archives by name)"

PY="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || die "$PY not found: run \`make setup\` first (or set PYTHON to a Python 3.11 with pip)"
LOCK="$ROOT/requirements-runtime.lock"
[[ -f "$LOCK" ]] || die "$LOCK not found"
for dep in "${RUNTIME_DEPS[@]}"; do
    grep -qi -E "^${dep//-/[-_]}==" "$LOCK" || die "requirements-runtime.lock pins no version of $dep"
done

# --- Cache: a hash of everything the archive is made from.
inputs_hash() {
    (
        cd "$ROOT"
        {
            "$PY" -c 'import sys; print(sys.version)'
            echo "PYTHON_PREFIX=${PYTHON_PREFIX:-}"
            find requirements-runtime.lock pyproject.toml scripts/pack_executor_env.sh dppipeline schemas \
                -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 |
                LC_ALL=C sort -z | xargs -0 sha256sum
        } | sha256sum | cut -d' ' -f1
    )
}
HASH="$(inputs_hash)"
if [[ "${FORCE:-0}" != 1 && -f "$OUT" && -f "$OUT.sha256" && "$(cat "$OUT.sha256")" == "$HASH" ]]; then
    echo "$OUT is up to date ($(du -h "$OUT" | cut -f1); inputs sha256 ${HASH:0:12})"
    exit 0
fi

started=$SECONDS
mkdir -p "$(dirname "$OUT")"
WORK="$(mktemp -d "$(dirname "$OUT")/.pack-env.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "building the dppipeline wheel"
# From a copy of the sources, so the build leaves nothing (build/lib, egg-info) in the tree.
mkdir "$WORK/src"
cp "$ROOT/pyproject.toml" "$ROOT/README.md" "$WORK/src/"
(cd "$ROOT" && tar -cf - --exclude=__pycache__ --exclude='*.pyc' dppipeline) | tar -C "$WORK/src" -xf -
"$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$WORK/wheels" "$WORK/src"
WHEEL="$(ls "$WORK"/wheels/dppipeline-*.whl)"

echo "creating a virtualenv with the runtime lock (requirements-runtime.lock)"
"$PY" -m venv "$WORK/env"
ENV_PY="$WORK/env/bin/python"
# Exactly the lock, then the wheel without resolving anything more.
"$ENV_PY" -m pip install --quiet --disable-pip-version-check --no-deps -r "$LOCK"
"$ENV_PY" -m pip install --quiet --disable-pip-version-check --no-deps "$WHEEL"
"$ENV_PY" -m pip check >/dev/null || die "the runtime lock misses a dependency: run make locks"

# The wheel carries dppipeline/spec/schemas/ (pyproject.toml's package-data); check it did.
SITE="$("$ENV_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [[ ! -f "$SITE/dppipeline/spec/schemas/transactions.json" ]]; then
    echo "$PROG: error: the dppipeline wheel lacks spec/schemas/*.json (package-data)" >&2
    exit 1
fi
# Executors need neither pip nor setuptools.
"$ENV_PY" -m pip uninstall --quiet --yes pip setuptools

# Check what went in, from a clean environment and folder (nothing of .venv or the tree visible).
for pkg in "${EXCLUDED[@]}"; do
    if compgen -G "$SITE/${pkg//-/_}-*.dist-info" >/dev/null; then
        die "$pkg ended up in the executor environment"
    fi
done
(cd / && env -i "$ENV_PY" -I -c '
import sys, dppipeline, pipeline_dp, pydp, dp_accounting, numpy, pandas, pyarrow, polars, yaml
from dppipeline.core.mechanisms import release_partitions
from dppipeline.spec.schema import transactions_schema
transactions_schema()
assert dppipeline.__file__.startswith(sys.prefix), (dppipeline.__file__, sys.prefix)
') || die "the new environment cannot import dppipeline and its dependencies"

ensure_venv_pack() {
    "$PY" -c 'import venv_pack' 2>/dev/null && return 0
    echo "installing venv-pack into $("$PY" -c 'import sys; print(sys.prefix)')"
    "$PY" -m pip install --quiet --disable-pip-version-check venv-pack==0.2.0
}

echo "packing with venv-pack"
TMP_OUT="$WORK/executor-env.tar.gz"
PACK_ARGS=(--prefix "$WORK/env" --output "$TMP_OUT" --compress-level 4)
if [[ -n "${PYTHON_PREFIX:-}" ]]; then
    PACK_ARGS+=(--python-prefix "$PYTHON_PREFIX")
fi
if ensure_venv_pack && "$PY" -m venv_pack "${PACK_ARGS[@]}" --quiet; then
    packed_with=venv-pack
else
    # venv-pack rewrites the few absolute paths (the scripts' shebangs) to relative ones. The
    # executors only run bin/python, which a plain tar keeps working: pyvenv.cfg and the
    # python symlink name the base interpreter, which (as with venv-pack) every node needs at
    # the same path.
    echo "$PROG: venv-pack failed; packing the virtualenv with tar (console scripts in bin/ keep absolute shebangs, unused by Spark)" >&2
    rm -f "$TMP_OUT"
    tar -C "$WORK/env" -czf "$TMP_OUT" .
    packed_with=tar
fi

# Relocation check: unpacked elsewhere, in a clean environment, the archive's Python imports
# dppipeline from the archive (only the parts that needs are unpacked: writing, then deleting,
# all 700 MB takes longer than building).
if [[ -z "${PYTHON_PREFIX:-}" ]]; then
    mkdir "$WORK/unpacked"
    tar -C "$WORK/unpacked" -xzf "$TMP_OUT" pyvenv.cfg bin "${SITE#"$WORK/env/"}/dppipeline"
    where="$(cd "$WORK/unpacked" && env -i ./bin/python -I -c 'import dppipeline; print(dppipeline.__file__)')" ||
        die "the unpacked archive cannot import dppipeline"
    [[ "$where" == "$WORK/unpacked/"* ]] || die "the unpacked archive imports dppipeline from $where"
fi

chmod 644 "$TMP_OUT"
mv -f "$TMP_OUT" "$OUT"
echo "$HASH" >"$OUT.sha256"
echo "wrote $OUT ($(du -h "$OUT" | cut -f1), $packed_with, $((SECONDS - started)) s)"
