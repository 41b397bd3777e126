#!/usr/bin/env bash
# A one-worker Spark standalone cluster on 127.0.0.1, run from the pyspark installed in .venv,
# for trying spark-submit against a real master (`make spark-cluster`, tests/system/test_spark_cluster.py).
#
#   scripts/spark_cluster.sh start    start the master and one worker; wait until the worker is
#                                     ALIVE in the master's web UI JSON; print the master URL
#   scripts/spark_cluster.sh stop     stop both (TERM, then KILL after a grace period)
#   scripts/spark_cluster.sh status   what runs, the master URL, workers and applications
#
# Settings (environment variables):
#   SPARK_CLUSTER_DIR               state folder: pid files, logs, the worker's work dirs
#                                   (default: build/spark-cluster in the project)
#   SPARK_CLUSTER_PORT              master RPC port (default 7077)
#   SPARK_CLUSTER_WEBUI_PORT        master web UI port (default 8080)
#   SPARK_CLUSTER_WORKER_WEBUI_PORT worker web UI port (default 8081)
#   SPARK_CLUSTER_CORES / _MEMORY   the worker's resources (default 2 cores, 2g)
#   SPARK_CLUSTER_TIMEOUT           seconds to wait for the worker to be ALIVE (default 90)
#   PYTHON                          interpreter whose pyspark is used (default .venv/bin/python);
#                                   SPARK_HOME, when set, is used as is
# stop and status read the ports that start used from the state folder.
#
# Everything binds to 127.0.0.1 only. The daemons run with .venv's bin/ removed from PATH and
# PYTHONPATH, VIRTUAL_ENV and PYSPARK_* unset, so Python on the executors sees only what the
# application ships (--archives ENV.tar.gz#env --conf spark.pyspark.python=./env/bin/python).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROG="scripts/spark_cluster.sh"

die() {
    echo "$PROG: error: $*" >&2
    exit 1
}

abspath() {
    case "$1" in
        /*) printf '%s\n' "$1" ;;
        *) printf '%s\n' "$PWD/$1" ;;
    esac
}

STATE="$(abspath "${SPARK_CLUSTER_DIR:-$ROOT/build/spark-cluster}")"
HOST=127.0.0.1
GRACE=20 # seconds between TERM and KILL on stop

load_settings() {
    # start writes the settings it used; stop and status use those, not the environment.
    if [[ -f "$STATE/cluster.env" ]]; then
        # shellcheck source=/dev/null
        source "$STATE/cluster.env"
    fi
    PORT="${PORT:-${SPARK_CLUSTER_PORT:-7077}}"
    WEBUI_PORT="${WEBUI_PORT:-${SPARK_CLUSTER_WEBUI_PORT:-8080}}"
    WORKER_WEBUI_PORT="${WORKER_WEBUI_PORT:-${SPARK_CLUSTER_WORKER_WEBUI_PORT:-8081}}"
    MASTER_URL="spark://$HOST:$PORT"
    JSON_URL="http://$HOST:$WEBUI_PORT/json/"
}

check_java() {
    local java
    if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
        java="$JAVA_HOME/bin/java"
    elif command -v java >/dev/null 2>&1; then
        java="$(command -v java)"
    elif [[ -n "${JAVA_HOME:-}" ]]; then
        die "Java not found: JAVA_HOME=$JAVA_HOME has no bin/java and no \`java\` is on PATH; Spark needs a JDK 17 or newer"
    else
        die "Java not found: Spark needs a JDK 17 or newer; install one and put \`java\` on PATH or set JAVA_HOME"
    fi
    local version major
    version="$("$java" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n 1)"
    major="${version%%.*}"
    if [[ "$major" == 1 ]]; then # 1.8.0_x
        major="$(echo "$version" | cut -d. -f2)"
    fi
    if [[ ! "$major" =~ ^[0-9]+$ ]]; then
        die "cannot tell the version of $java (\`java -version\` printed no version)"
    fi
    if ((major < 17)); then
        die "$java is Java $version; Spark 4 needs Java 17 or newer"
    fi
}

find_spark_home() {
    if [[ -n "${SPARK_HOME:-}" ]]; then
        [[ -x "$SPARK_HOME/bin/spark-class" ]] || die "SPARK_HOME=$SPARK_HOME has no bin/spark-class"
        return
    fi
    local py="${PYTHON:-$ROOT/.venv/bin/python}"
    [[ -x "$py" ]] || die "$py not found: run \`make setup\` first (or set PYTHON or SPARK_HOME)"
    SPARK_HOME="$("$py" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null)" ||
        die "$py cannot import pyspark: run \`make setup\` (pyspark is in requirements.lock)"
    [[ -x "$SPARK_HOME/bin/spark-class" ]] || die "$SPARK_HOME (pyspark) has no bin/spark-class"
}

# The JSON of the master's web UI on stdout; fails when it does not answer.
master_json() {
    curl --silent --show-error --fail --max-time 5 "$JSON_URL"
}

# Wait until the master's JSON satisfies a Python CONDITION (on `json`, `sys.stdin`), or fail
# (stopping what was started) when a daemon exits or DEADLINE (in $SECONDS) passes.
wait_for() { # WHAT CONDITION DEADLINE TIMEOUT
    local what="$1" condition="$2" deadline="$3" timeout="$4" json
    while ((SECONDS < deadline)); do
        local name
        for name in master worker; do
            if [[ -f "$STATE/$name.pid" ]] && ! is_running "$name"; then
                tail_logs
                stop_all >/dev/null
                die "the Spark $name exited during start-up; logs in $STATE/logs"
            fi
        done
        if json="$(master_json 2>/dev/null)" &&
            python3 -c "import json, sys; sys.exit(0 if $condition else 1)" <<<"$json" 2>/dev/null; then
            return 0
        fi
        sleep 0.5
    done
    tail_logs
    stop_all >/dev/null
    if [[ "$what" == master ]]; then
        die "the master's web UI $JSON_URL did not report ALIVE within ${timeout}s (SPARK_CLUSTER_TIMEOUT); logs in $STATE/logs"
    fi
    die "no ALIVE worker in $JSON_URL after ${timeout}s (SPARK_CLUSTER_TIMEOUT); logs in $STATE/logs"
}

is_running() { # NAME -> 0 when its pid file names a live process started by this script
    local pidfile="$STATE/$1.pid" pid
    [[ -f "$pidfile" ]] || return 1
    pid="$(cat "$pidfile")"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    # The pid may have been reused: check that it is still our Spark daemon.
    tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q "org.apache.spark.deploy" || return 1
}

port_free() { # PORT -> 0 when nothing listens on 127.0.0.1:PORT
    ! (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

# Start NAME (master or worker) in its own session, so `stop` can end it and its children
# (executors, Python workers) as one process group. The pid file holds that group's id.
launch() {
    local name="$1"
    shift
    rm -f "$STATE/$name.pid"
    local clean_path
    clean_path="$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -x -F "$ROOT/.venv/bin" |
        { if [[ -n "${VIRTUAL_ENV:-}" ]]; then grep -v -x -F "$VIRTUAL_ENV/bin"; else cat; fi; } |
        paste -s -d ':')"
    # The inner bash writes its pid ($$, single-quoted on purpose), then becomes the daemon.
    # shellcheck disable=SC2016
    env -u PYTHONPATH -u PYTHONHOME -u VIRTUAL_ENV -u PYSPARK_PYTHON -u PYSPARK_DRIVER_PYTHON \
        -u PYSPARK_SUBMIT_ARGS \
        PATH="$clean_path" SPARK_HOME="$SPARK_HOME" SPARK_LOCAL_IP="$HOST" \
        SPARK_LOG_DIR="$STATE/logs" SPARK_PID_DIR="$STATE" SPARK_LOCAL_DIRS="$STATE/local" \
        setsid bash -c 'echo $$ >"$0"; exec "$@"' "$STATE/$name.pid" \
        "$SPARK_HOME/bin/spark-class" "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null &
    # Wait for the pid file (written by the child right away).
    for _ in $(seq 50); do
        [[ -s "$STATE/$name.pid" ]] && return 0
        sleep 0.1
    done
    die "$name did not start; see $STATE/logs/$name.log"
}

stop_one() { # NAME
    local name="$1" pid
    if ! is_running "$name"; then
        rm -f "$STATE/$name.pid"
        return 0
    fi
    pid="$(cat "$STATE/$name.pid")"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq $((GRACE * 10))); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "$PROG: $name (pid $pid) still running after ${GRACE}s; sending KILL" >&2
    fi
    # The group may still hold executors or Python workers: end them too.
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$STATE/$name.pid"
    echo "stopped $name (pid $pid)"
}

tail_logs() {
    local name
    for name in master worker; do
        if [[ -f "$STATE/logs/$name.log" ]]; then
            echo "--- last lines of $STATE/logs/$name.log" >&2
            tail -n 20 "$STATE/logs/$name.log" >&2
        fi
    done
}

start() {
    check_java
    find_spark_home
    command -v curl >/dev/null 2>&1 || die "curl not found (needed to read the master's web UI)"
    command -v setsid >/dev/null 2>&1 || die "setsid not found (util-linux)"
    mkdir -p "$STATE/logs" "$STATE/work" "$STATE/local"
    if is_running master || is_running worker; then
        load_settings
        if is_running master && is_running worker; then
            echo "already running: $MASTER_URL (web UI http://$HOST:$WEBUI_PORT, state in $STATE)"
            return 0
        fi
        die "a half-started cluster is in $STATE: run \`$PROG stop\` first"
    fi
    rm -f "$STATE/cluster.env"
    load_settings
    local cores="${SPARK_CLUSTER_CORES:-2}" memory="${SPARK_CLUSTER_MEMORY:-2g}"
    local timeout="${SPARK_CLUSTER_TIMEOUT:-90}" port
    for port in "$PORT" "$WEBUI_PORT" "$WORKER_WEBUI_PORT"; do
        port_free "$port" || die "port $port on $HOST is in use; choose others with SPARK_CLUSTER_PORT, SPARK_CLUSTER_WEBUI_PORT, SPARK_CLUSTER_WORKER_WEBUI_PORT"
    done
    printf 'PORT=%s\nWEBUI_PORT=%s\nWORKER_WEBUI_PORT=%s\n' \
        "$PORT" "$WEBUI_PORT" "$WORKER_WEBUI_PORT" >"$STATE/cluster.env"

    # No REST submission server (it would listen on a fixed port, 6066).
    printf 'spark.master.rest.enabled false\n' >"$STATE/spark-defaults.conf"
    local deadline=$((SECONDS + timeout))
    launch master org.apache.spark.deploy.master.Master --properties-file "$STATE/spark-defaults.conf" \
        --host "$HOST" --port "$PORT" --webui-port "$WEBUI_PORT"
    # A worker that registers before the master is leader is only accepted on its retry,
    # 10 s later: start it once the master says ALIVE.
    wait_for master 'json.load(sys.stdin).get("status") == "ALIVE"' "$deadline" "$timeout"
    launch worker org.apache.spark.deploy.worker.Worker "$MASTER_URL" \
        --properties-file "$STATE/spark-defaults.conf" \
        --host "$HOST" --webui-port "$WORKER_WEBUI_PORT" \
        --cores "$cores" --memory "$memory" --work-dir "$STATE/work"
    wait_for worker 'any(w.get("state") == "ALIVE" for w in json.load(sys.stdin).get("workers", []))' \
        "$deadline" "$timeout"
    echo "Spark master: $MASTER_URL  (web UI http://$HOST:$WEBUI_PORT, 1 worker: $cores cores, $memory)"
    echo "state and logs in $STATE; stop with: $PROG stop (or make spark-cluster-stop)"
}

stop_all() {
    stop_one worker
    stop_one master
}

stop() {
    load_settings
    if ! is_running master && ! is_running worker; then
        rm -f "$STATE/master.pid" "$STATE/worker.pid"
        echo "no Spark cluster running (state folder $STATE)"
        return 0
    fi
    stop_all
}

status() {
    load_settings
    local name running=0
    for name in master worker; do
        if is_running "$name"; then
            echo "$name: running (pid $(cat "$STATE/$name.pid"))"
            running=1
        else
            echo "$name: not running"
        fi
    done
    ((running)) || return 3
    local json
    if json="$(master_json 2>/dev/null)"; then
        MASTER_JSON="$json" python3 - <<'EOF_PY'
import json
import os

state = json.loads(os.environ["MASTER_JSON"])
print(f"master URL: {state.get('url')}  status: {state.get('status')}")
for w in state.get("workers", []):
    print(f"worker {w['id']}: {w['state']}, {w['cores']} cores, {w['memory']} MB")
for kind in ("activeapps", "completedapps"):
    for app in state.get(kind, []):
        print(f"application {app['id']} ({app['name']}): {app['state']}")
EOF_PY
    else
        echo "master web UI $JSON_URL does not answer"
        return 1
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    -h | --help | help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0" ;;
    *)
        echo "usage: $PROG start|stop|status (see --help)" >&2
        exit 2
        ;;
esac
