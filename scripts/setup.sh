#!/usr/bin/env bash
# Installs everything lakemirror needs on a fresh machine, idempotently:
#   - checks Python >= 3.11 and Java >= 17 (with a message saying what to install),
#   - creates .venv and installs lakemirror with its pinned dependencies and its test and dev extras,
#   - resolves Delta's jars from Maven Central once into the local cache (~/.cache/lakemirror),
#     and hadoop-aws with the AWS SDK bundle (about 690 MB, for s3a:// locations and the
#     object-storage tests), so that every later run, test and demo starts offline,
#   - installs the Debian packages of scripts/install-services.sh (apt-get, as root or with sudo) when
#     their tools are missing; LAKEMIRROR_SKIP_SYSTEM_PACKAGES=1 skips this step.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null; then
  echo "setup: $PY not found; install Python 3.11 or newer" >&2; exit 1
fi
"$PY" - <<'PYEOF' || { echo "setup: Python 3.11 or newer is required" >&2; exit 1; }
import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)
PYEOF
if ! command -v java >/dev/null; then
  echo "setup: Java 17 is required (Debian: apt-get install openjdk-17-jre-headless)" >&2; exit 1
fi
java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
if [ "${java_major:-0}" -lt 17 ]; then
  echo "setup: Java $java_major found; Spark 4 needs Java 17 or newer" >&2; exit 1
fi

stamp=.venv/.lakemirror-installed
want=$(cat pyproject.toml | sha256sum | cut -c1-16)
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e '.[test,dev]'
  echo "$want" > "$stamp"
fi
# The product's modules and the tests' helpers compiled once: Python reads a .pyc even where
# PYTHONDONTWRITEBYTECODE keeps it from writing one, so no start of the daemon compiles them again.
.venv/bin/python -m compileall -q -j 0 lakemirror daemon supervisor sinks sources checkpoints tools bench tests >/dev/null
# fetch-jars resolves only the groups not cached yet (a machine set up before the s3 group gets it alone).
.venv/bin/lakemirror fetch-jars --check >/dev/null 2>&1 || .venv/bin/lakemirror fetch-jars
# The driver JVM's class archive (daemon/class_archive.py), recorded once per JVM, Spark and Delta's jars:
# every embedded session (the daemon's, the tests') maps it and starts sooner. Without it they start as before.
.venv/bin/lakemirror build-class-archive >/dev/null || echo "setup: could not record the JVM's class archive; sessions start without it" >&2
# Debian packages the deployment tests run for real (promtool); their tests are skipped if this fails.
if [ "${LAKEMIRROR_SKIP_SYSTEM_PACKAGES:-0}" = 1 ]; then
  echo "setup: LAKEMIRROR_SKIP_SYSTEM_PACKAGES=1: not installing the Debian packages of scripts/install-services.sh; the tests that need them are skipped" >&2
else
  [ ! -x scripts/install-services.sh ] || scripts/install-services.sh || echo "setup: could not install the Debian packages of scripts/install-services.sh; the tests that need them are skipped" >&2
fi
# The Kafka broker of the Kafka source's integration test (scripts/kafka.sh): its jars once, like Delta's.
scripts/kafka.sh fetch || echo "setup: could not resolve the Kafka broker's jars (needs mvn); the Kafka source's test is skipped" >&2
# Kafka Connect and Debezium's Postgres connector (scripts/debezium.sh), for the Debezium end-to-end test
# and `lakemirror demo --source debezium`: resolved once into the same cache.
scripts/debezium.sh fetch || echo "setup: could not resolve Kafka Connect and Debezium (needs mvn); the Debezium end-to-end test is skipped" >&2
