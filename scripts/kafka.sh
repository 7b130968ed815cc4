#!/usr/bin/env bash
# A real single-node Kafka broker (KRaft: broker and controller in one JVM) on loopback, without Docker.
#
#   scripts/kafka.sh fetch                    resolve the broker's jars from Maven Central once, into
#                                             ~/.cache/lakemirror/kafka-<version>/libs (offline afterwards)
#   scripts/kafka.sh start DIR PORT CPORT     format DIR as the broker's storage and start it on
#                                             127.0.0.1:PORT (controller on CPORT); waits for the port;
#                                             pid in DIR/kafka.pid, log in DIR/kafka.log
#   scripts/kafka.sh stop DIR                 stop the broker started in DIR
#
# Recipe: /work/shared/design/RUNTIME_FACTS.md (Kafka). Needs Java 17+ and Maven.
set -euo pipefail

KAFKA_VERSION="${KAFKA_VERSION:-4.1.0}"
LOG4J_VERSION="${LOG4J_VERSION:-2.24.3}"
CACHE="${LAKEMIRROR_KAFKA_HOME:-$HOME/.cache/lakemirror/kafka-$KAFKA_VERSION}"
LIBS="$CACHE/libs"

fetch() {
  if [ -f "$LIBS/.complete" ]; then return 0; fi
  command -v mvn >/dev/null || { echo "kafka.sh: Maven (mvn) is needed once to resolve the broker's jars" >&2; exit 1; }
  local work
  work=$(mktemp -d)
  cat >"$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>lakemirror</groupId><artifactId>kafka-broker</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
  </dependencies>
</project>
POM
  mkdir -p "$LIBS"
  (cd "$work" && mvn -q -B dependency:copy-dependencies -DoutputDirectory="$LIBS" -DincludeScope=runtime)
  rm -rf "$work"
  touch "$LIBS/.complete"
}

start() {
  local dir="$1" port="$2" cport="$3"
  fetch
  mkdir -p "$dir/data"
  cat >"$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
PROPS
  cat >"$dir/log4j2.properties" <<'LOG'
rootLogger.level=WARN
rootLogger.appenderRef.stdout.ref=STDOUT
appender.stdout.type=Console
appender.stdout.name=STDOUT
appender.stdout.layout.type=PatternLayout
appender.stdout.layout.pattern=[%d] %p %m (%c)%n
LOG
  if [ ! -f "$dir/data/meta.properties" ]; then
    # A cluster id is URL-safe base64; one starting with '-' would be read as an option: draw again.
    java -cp "$LIBS/*" kafka.tools.StorageTool format -t "$(python3 -c 'import base64,uuid
i = "-"
while i.startswith("-"): i = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
print(i)')" \
      -c "$dir/server.properties" >"$dir/format.log" 2>&1
  fi
  nohup java -Xmx512m -Dlog4j2.configurationFile="$dir/log4j2.properties" -cp "$LIBS/*" kafka.Kafka \
    "$dir/server.properties" >"$dir/kafka.log" 2>&1 &
  echo $! >"$dir/kafka.pid"
  for _ in $(seq 1 120); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    kill -0 "$(cat "$dir/kafka.pid")" 2>/dev/null || { echo "kafka.sh: the broker exited; see $dir/kafka.log" >&2; tail -20 "$dir/kafka.log" >&2; exit 1; }
    sleep 0.5
  done
  echo "kafka.sh: the broker did not open 127.0.0.1:$port in 60 s; see $dir/kafka.log" >&2
  exit 1
}

stop() {
  local dir="$1"
  [ -f "$dir/kafka.pid" ] || return 0
  local pid
  pid=$(cat "$dir/kafka.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || { rm -f "$dir/kafka.pid"; return 0; }; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/kafka.pid"
}

case "${1:-}" in
  fetch) fetch ;;
  start) [ $# -eq 4 ] || { echo "usage: $0 start DIR PORT CONTROLLER_PORT" >&2; exit 2; }; start "$2" "$3" "$4" ;;
  stop) [ $# -eq 2 ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
  *) echo "usage: $0 fetch | start DIR PORT CONTROLLER_PORT | stop DIR" >&2; exit 2 ;;
esac
