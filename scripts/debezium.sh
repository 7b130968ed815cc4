#!/usr/bin/env bash
# Debezium's PostgreSQL connector in Kafka Connect standalone, on loopback, without Docker.
#
#   scripts/debezium.sh fetch
#       resolve Kafka Connect (connect-runtime, connect-json: the broker's Kafka version, see
#       scripts/kafka.sh) and Debezium's Postgres plugin archive from Maven Central once, into
#       ~/.cache/lakemirror/debezium-<version>-connect-<kafka version>/ (offline afterwards)
#   scripts/debezium.sh start DIR REST_PORT BOOTSTRAP
#       start a Connect standalone worker writing to the broker at BOOTSTRAP (host:port), its REST
#       API on 127.0.0.1:REST_PORT, source offsets in DIR/offsets.dat; waits for the REST API;
#       pid in DIR/connect.pid, log in DIR/connect.log
#   scripts/debezium.sh register REST_PORT NAME PG_PORT DATABASE TOPIC_PREFIX TABLES
#       register (or update) Debezium's Postgres connector NAME capturing TABLES (comma-separated
#       schema.table) of DATABASE on 127.0.0.1:PG_PORT (user postgres, trust auth, started with
#       `scripts/postgres.sh start PORT DIR --logical`) into topics TOPIC_PREFIX.<schema>.<table>;
#       waits until the connector and its task run. Extra connector settings: DEBEZIUM_EXTRA, a JSON
#       object merged into the configuration.
#   scripts/debezium.sh stop DIR
#
# The converter is the JSON converter WITH schemas (key and value), so events carry their Connect
# types (decimals as base64 bytes with their scale, dates as days, timestamps as micros), which
# lakemirror's decoder reads (sources/debezium.py). Recipe: /work/shared/design/RUNTIME_FACTS.md.
# Needs Java 17+, Maven (fetch only) and python3 (for JSON).
set -euo pipefail

KAFKA_VERSION="${KAFKA_VERSION:-4.1.0}"          # the broker's (scripts/kafka.sh): one Kafka for both
DEBEZIUM_VERSION="${DEBEZIUM_VERSION:-3.7.0.Final}"
LOG4J_VERSION="${LOG4J_VERSION:-2.24.3}"
CACHE="${LAKEMIRROR_DEBEZIUM_HOME:-$HOME/.cache/lakemirror/debezium-$DEBEZIUM_VERSION-connect-$KAFKA_VERSION}"
LIBS="$CACHE/libs"
PLUGINS="$CACHE/plugins"

fetch() {
  if [ -f "$CACHE/.complete" ]; then return 0; fi
  command -v mvn >/dev/null || { echo "debezium.sh: Maven (mvn) is needed once to resolve Kafka Connect and Debezium" >&2; exit 1; }
  local work
  work=$(mktemp -d)
  cat >"$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>lakemirror</groupId><artifactId>kafka-connect</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-json</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
  </dependencies>
</project>
POM
  rm -rf "$LIBS" "$PLUGINS"
  mkdir -p "$LIBS" "$PLUGINS"
  (cd "$work" && mvn -q -B dependency:copy-dependencies -DoutputDirectory="$LIBS" -DincludeScope=runtime)
  # Debezium's own plugin archive: the connector with its dependencies (JDBC driver included).
  (cd "$work" && mvn -q -B dependency:unpack \
    -Dartifact="io.debezium:debezium-connector-postgres:$DEBEZIUM_VERSION:tar.gz:plugin" \
    -DoutputDirectory="$PLUGINS")
  rm -rf "$PLUGINS"/PaxHeaders*   # pax extended headers that Maven's untar leaves as files named like the jars
  ls "$PLUGINS"/debezium-connector-postgres/*.jar >/dev/null 2>&1 || {
    echo "debezium.sh: the plugin archive held no debezium-connector-postgres/ folder" >&2; exit 1; }
  rm -rf "$work"
  touch "$CACHE/.complete"
}

wait_port() {  # PORT PIDFILE LOG WHAT
  for _ in $(seq 1 240); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    kill -0 "$(cat "$2")" 2>/dev/null || { echo "debezium.sh: $4 exited; see $3" >&2; tail -20 "$3" >&2; exit 1; }
    sleep 0.5
  done
  echo "debezium.sh: $4 did not open 127.0.0.1:$1 in 120 s; see $3" >&2
  exit 1
}

start() {
  local dir="$1" port="$2" bootstrap="$3"
  fetch
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  cat >"$dir/worker.properties" <<PROPS
bootstrap.servers=$bootstrap
listeners=http://127.0.0.1:$port
rest.advertised.host.name=127.0.0.1
rest.advertised.port=$port
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=true
value.converter.schemas.enable=true
offset.storage.file.filename=$dir/offsets.dat
offset.flush.interval.ms=1000
plugin.path=$PLUGINS
PROPS
  cat >"$dir/log4j2.properties" <<'LOG'
rootLogger.level=WARN
rootLogger.appenderRef.stdout.ref=STDOUT
appender.stdout.type=Console
appender.stdout.name=STDOUT
appender.stdout.layout.type=PatternLayout
appender.stdout.layout.pattern=[%d] %p %m (%c)%n
logger.debezium.name=io.debezium
logger.debezium.level=INFO
LOG
  nohup java -Xmx512m -Dlog4j2.configurationFile="$dir/log4j2.properties" -cp "$LIBS/*" \
    org.apache.kafka.connect.cli.ConnectStandalone "$dir/worker.properties" >"$dir/connect.log" 2>&1 &
  echo $! >"$dir/connect.pid"
  wait_port "$port" "$dir/connect.pid" "$dir/connect.log" "Kafka Connect"
  # The port opens before the herder is ready: wait for the REST API to answer.
  for _ in $(seq 1 240); do
    python3 - "$port" <<'PY' && return 0
import sys, urllib.request
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/connectors", timeout=2).read()
except Exception:
    sys.exit(1)
PY
    sleep 0.5
  done
  echo "debezium.sh: Kafka Connect's REST API did not answer on 127.0.0.1:$port; see $dir/connect.log" >&2
  exit 1
}

register() {
  local port="$1" name="$2" pg_port="$3" database="$4" prefix="$5" tables="$6"
  python3 - "$port" "$name" "$pg_port" "$database" "$prefix" "$tables" "${DEBEZIUM_EXTRA:-}" <<'PY'
import json, sys, time, urllib.error, urllib.request

port, name, pg_port, database, prefix, tables, extra = sys.argv[1:8]
slot = "lakemirror_" + "".join(c if c.isalnum() else "_" for c in name.lower())
config = {
    "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
    "tasks.max": "1",
    "plugin.name": "pgoutput",
    "database.hostname": "127.0.0.1",
    "database.port": pg_port,
    "database.user": "postgres",
    "database.password": "",
    "database.dbname": database,
    "topic.prefix": prefix,
    "table.include.list": tables,
    "slot.name": slot,
    "publication.name": slot,
    "publication.autocreate.mode": "filtered",
    "snapshot.mode": "initial",
    "skipped.operations": "none",           # the default drops TRUNCATE events
    "provide.transaction.metadata": "true",  # in-transaction order on every event, BEGIN/END on <prefix>.transaction
    "topic.creation.default.replication.factor": "1",
    "topic.creation.default.partitions": "1",
}
if extra:
    config.update(json.loads(extra))
request = urllib.request.Request(f"http://127.0.0.1:{port}/connectors/{name}/config", data=json.dumps(config).encode(),
                                 headers={"Content-Type": "application/json"}, method="PUT")
try:
    urllib.request.urlopen(request, timeout=60).read()
except urllib.error.HTTPError as exc:
    sys.exit(f"debezium.sh: Kafka Connect refused the connector {name}: {exc.code} {exc.read().decode(errors='replace')[:500]}")
deadline, last = time.time() + 120, None
while time.time() < deadline:
    try:
        last = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/connectors/{name}/status", timeout=5).read())
    except urllib.error.URLError:
        time.sleep(0.5)
        continue
    tasks = last.get("tasks") or []
    states = [last["connector"]["state"], *(t["state"] for t in tasks)]
    if "FAILED" in states:
        trace = next((t.get("trace", "") for t in tasks if t["state"] == "FAILED"), last["connector"].get("trace", ""))
        sys.exit(f"debezium.sh: connector {name} failed: {(trace or '').splitlines()[0] if trace else states}")
    if tasks and all(s == "RUNNING" for s in states):
        sys.exit(0)
    time.sleep(0.5)
sys.exit(f"debezium.sh: connector {name} is not running after 120 s: {last}")
PY
}

stop() {
  local dir="$1"
  [ -f "$dir/connect.pid" ] || return 0
  local pid
  pid=$(cat "$dir/connect.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || { rm -f "$dir/connect.pid"; return 0; }; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/connect.pid"
}

case "${1:-}" in
  fetch) fetch ;;
  start) [ $# -eq 4 ] || { echo "usage: $0 start DIR REST_PORT BOOTSTRAP" >&2; exit 2; }; start "$2" "$3" "$4" ;;
  register) [ $# -eq 7 ] || { echo "usage: $0 register REST_PORT NAME PG_PORT DATABASE TOPIC_PREFIX TABLES" >&2; exit 2; }
    register "$2" "$3" "$4" "$5" "$6" "$7" ;;
  stop) [ $# -eq 2 ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
  *) echo "usage: $0 fetch | start DIR REST_PORT BOOTSTRAP | register REST_PORT NAME PG_PORT DATABASE TOPIC_PREFIX TABLES | stop DIR" >&2; exit 2 ;;
esac
