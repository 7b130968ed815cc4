#!/usr/bin/env bash
# A Spark Connect server for `runtime.mode: connect`, built from open-source parts only:
# pyspark's own spark-connect jar, Delta's cached jars (`lakemirror fetch-jars`) and Delta's SQL
# extension and catalog. No delta-connect-server plugin (Maven Central does not serve it), so
# lakemirror talks to this server in SQL only (sinks/merge/connect_apply.py).
#
#   scripts/connect-server.sh start [PORT [LOG_DIR]]   start on 127.0.0.1:PORT; returns once it listens
#   scripts/connect-server.sh stop  [PORT [LOG_DIR]]   stop the server the pid file names
#   scripts/connect-server.sh status [PORT [LOG_DIR]]  exit 0 when it runs and listens
#
# Environment (arguments win): LAKEMIRROR_CONNECT_PORT (15002), LAKEMIRROR_CONNECT_LOG_DIR
# (.lakemirror-connect in the project), LAKEMIRROR_CONNECT_HOST (127.0.0.1),
# LAKEMIRROR_CONNECT_MASTER (local[2]), LAKEMIRROR_CONNECT_MEMORY (1g), LAKEMIRROR_CONNECT_WAIT
# (seconds to wait for the port, 180), LAKEMIRROR_CONNECT_WORKER_WAIT (120s), LAKEMIRROR_CONNECT_CONF (extra "key=value" confs, one a line;
# a spark.hadoop.fs.s3a.* one also loads hadoop-aws, for tables on S3).
#
# The server's Python workers run foreachBatch functions (lakemirror's batch apply) ON THE SERVER:
# PYSPARK_PYTHON is the project's .venv python, which has lakemirror and Connect's extras
# (pandas < 3, grpcio, grpcio-status, googleapis-common-protos, zstandard; pyproject.toml).
# Tuned as the daemon's own local session is (daemon/spark.py) for a small server: two shuffle
# partitions, Delta's snapshots rebuilt in two partitions (Delta's default 50 is for large tables on
# many cores: 50 tasks a snapshot), and the FAIR scheduler, so that one table's MERGE does not queue
# behind another's.
# Start is idempotent: a server already listening under the same pid file is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

cmd=${1:-}
port=${2:-${LAKEMIRROR_CONNECT_PORT:-15002}}
log_dir=${3:-${LAKEMIRROR_CONNECT_LOG_DIR:-$root/.lakemirror-connect}}
host=${LAKEMIRROR_CONNECT_HOST:-127.0.0.1}
master=${LAKEMIRROR_CONNECT_MASTER:-local[2]}
memory=${LAKEMIRROR_CONNECT_MEMORY:-1g}
wait_s=${LAKEMIRROR_CONNECT_WAIT:-180}
python=${LAKEMIRROR_CONNECT_PYTHON:-$root/.venv/bin/python}
# How long the server waits for a foreachBatch Python worker to connect back (Spark's default, 15 s,
# is shorter than a worker's start on a busy 2-core machine: pyspark, pandas, pyarrow and grpc imports).
# Workers connect back over a Unix domain socket: over loopback TCP, the second and later workers of
# a server here timed out connecting back (CANNOT_OPEN_SOCKET), and every query start needs one.
worker_wait=${LAKEMIRROR_CONNECT_WORKER_WAIT:-120s}
pid_file="$log_dir/connect-server-$port.pid"
log_file="$log_dir/connect-server-$port.log"

die() { echo "connect-server: $*" >&2; exit 1; }

case "$port" in ''|*[!0-9]*) die "the port must be a number, got '$port'";; esac

listening() {
  "$python" - "$host" "$port" <<'PYEOF'
import socket, sys
s = socket.socket()
s.settimeout(0.5)
sys.exit(0 if s.connect_ex((sys.argv[1], int(sys.argv[2]))) == 0 else 1)
PYEOF
}

running_pid() {  # the pid of the pid file, if that process is alive
  [ -f "$pid_file" ] || return 1
  local pid
  pid=$(cat "$pid_file")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

start() {
  [ -x "$python" ] || die "no Python at $python; run \`make setup\` first (or set LAKEMIRROR_CONNECT_PYTHON)"
  command -v java >/dev/null || die "Java 17 is required (Debian: apt-get install openjdk-17-jre-headless)"
  mkdir -p "$log_dir"
  if pid=$(running_pid); then
    if listening; then echo "connect-server: already running (pid $pid) on $host:$port"; return 0; fi
    echo "connect-server: pid $pid is starting; waiting for $host:$port"
  else
    if listening; then die "$host:$port is taken by another process; choose another port"; fi
    local spark_home jars
    spark_home=$("$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
    [ -f "$spark_home/jars/spark-connect_2.13-4.2.0.jar" ] || die "pyspark's spark-connect jar is not in $spark_home/jars"
    jars=$("$python" -c 'from lakemirror.daemon.jars import jar_paths; print(",".join(jar_paths()))') \
      || die "Delta's jars are not cached; run \`make setup\` (or \`lakemirror fetch-jars\`) once"
    local extra=() s3=""
    while IFS= read -r line; do
      [ -n "$line" ] && extra+=(--conf "$line")
      case "$line" in spark.hadoop.fs.s3a.*) s3=1;; esac
    done <<< "${LAKEMIRROR_CONNECT_CONF:-}"
    # An s3a conf means tables on S3: hadoop-aws and its AWS SDK bundle (the cached `s3` jar group).
    if [ -n "$s3" ]; then
      jars="$jars,$("$python" -c 'from lakemirror.daemon.jars import jar_paths; print(",".join(jar_paths(group="s3")))')" \
        || die "hadoop-aws is not cached; run \`make setup\` (or \`lakemirror fetch-jars\`) once"
    fi
    # The driver JVM's class archive that `make setup` records (daemon/class_archive.py), where there is one:
    # the server's JVM maps it and starts sooner. LAKEMIRROR_CONNECT_CLASS_ARCHIVE=0 starts without it.
    local sharing=""
    if [ "${LAKEMIRROR_CONNECT_CLASS_ARCHIVE:-1}" != 0 ]; then
      sharing=$("$python" -c 'from lakemirror.daemon.class_archive import recorded_java_options; print(recorded_java_options())' 2>/dev/null) || sharing=""
    fi
    # setsid: the server outlives this script and is not killed with the caller's process group.
    SPARK_HOME="$spark_home" PYSPARK_PYTHON="$python" PYSPARK_DRIVER_PYTHON="$python" \
      setsid "$spark_home/bin/spark-submit" \
        --master "$master" \
        --driver-memory "$memory" \
        --class org.apache.spark.sql.connect.service.SparkConnectServer \
        --name lakemirror-connect-server \
        --jars "$jars" \
        --conf "spark.connect.grpc.binding.address=$host" \
        --conf "spark.connect.grpc.binding.port=$port" \
        --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \
        --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog \
        --conf spark.ui.enabled=false \
        --conf spark.sql.shuffle.partitions=2 \
        --conf spark.default.parallelism=2 \
        --conf spark.databricks.delta.snapshotPartitions=2 \
        --conf spark.scheduler.mode=FAIR \
        --conf spark.sql.session.timeZone=UTC \
        --conf spark.sql.streaming.stopTimeout=120s \
        --conf spark.log.structuredLogging.enabled=false \
        --conf "spark.python.authenticate.socketTimeout=$worker_wait" \
        --conf spark.python.unix.domain.socket.enabled=true \
        --conf "spark.driver.extraJavaOptions=${sharing:+$sharing }-Dlog4j2.configurationFile=$root/daemon/log4j2.properties" \
        --conf "spark.executorEnv.PYSPARK_PYTHON=$python" \
        "${extra[@]}" \
        spark-internal </dev/null >"$log_file" 2>&1 &
    echo $! > "$pid_file"
  fi
  local waited=0
  until listening; do
    if ! running_pid >/dev/null; then
      rm -f "$pid_file"
      tail -n 20 "$log_file" >&2 || true
      die "the server exited before listening; its log: $log_file"
    fi
    [ "$waited" -lt "$wait_s" ] || die "the server did not listen on $host:$port within ${wait_s}s; its log: $log_file"
    sleep 1; waited=$((waited + 1))
  done
  echo "connect-server: listening on sc://$host:$port (pid $(cat "$pid_file"), log $log_file)"
}

stop() {
  local pid
  if ! pid=$(running_pid); then rm -f "$pid_file"; echo "connect-server: not running on port $port"; return 0; fi
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 30); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$pid_file"
  echo "connect-server: stopped (pid $pid)"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  status) if pid=$(running_pid) && listening; then echo "connect-server: running (pid $pid) on $host:$port"; else echo "connect-server: not running on port $port"; exit 1; fi ;;
  *) die "usage: scripts/connect-server.sh start|stop|status [PORT [LOG_DIR]]" ;;
esac
