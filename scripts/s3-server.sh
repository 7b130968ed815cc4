#!/usr/bin/env bash
# A local S3-compatible server on loopback (moto's server, from the `moto[server]` test extra), for
# the object-storage tests and for trying lakemirror against s3a:// by hand.
#
#   scripts/s3-server.sh start [PORT]   start it (default port 9000), wait until it answers, print its URL
#   scripts/s3-server.sh stop [PORT]    stop the server started for PORT
#   scripts/s3-server.sh status [PORT]  exit 0 if it answers
#
# The pid and log files live in $LAKEMIRROR_S3_RUN_DIR (default: ${TMPDIR:-/tmp}/lakemirror-s3).
# Its data lives in memory only: a stopped server forgets every bucket.
set -euo pipefail
cd "$(dirname "$0")/.."

cmd=${1:-}
port=${2:-${LAKEMIRROR_S3_PORT:-9000}}
run_dir=${LAKEMIRROR_S3_RUN_DIR:-${TMPDIR:-/tmp}/lakemirror-s3}
pid_file=$run_dir/moto-$port.pid
log_file=$run_dir/moto-$port.log
url=http://127.0.0.1:$port
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

answers() {
  "$PY" - "$url" <<'PYEOF'
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen(sys.argv[1] + "/moto-api/", timeout=1).close()
except urllib.error.HTTPError:
    pass  # any HTTP answer means the server is up
except OSError:
    sys.exit(1)
PYEOF
}

running_pid() {
  [ -f "$pid_file" ] || return 1
  local pid; pid=$(cat "$pid_file")
  kill -0 "$pid" 2>/dev/null && echo "$pid"
}

case "$cmd" in
  start)
    mkdir -p "$run_dir"
    if running_pid >/dev/null && answers; then echo "$url"; exit 0; fi
    if ! "$PY" -c "import moto.server" 2>/dev/null; then
      echo "s3-server: moto's server is not installed; run \`make setup\` (it installs the test extra, moto[server])" >&2
      exit 1
    fi
    if answers; then
      echo "s3-server: something else already answers on $url; pick another port" >&2; exit 1
    fi
    nohup "$PY" -m moto.server -H 127.0.0.1 -p "$port" >"$log_file" 2>&1 &
    echo $! >"$pid_file"
    for _ in $(seq 1 100); do
      if answers; then echo "$url"; exit 0; fi
      if ! running_pid >/dev/null; then
        echo "s3-server: moto exited while starting; see $log_file: $(tail -1 "$log_file")" >&2; exit 1
      fi
      sleep 0.1
    done
    echo "s3-server: no answer on $url after 10 s; see $log_file" >&2
    exit 1
    ;;
  stop)
    if pid=$(running_pid); then
      kill "$pid"
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$pid_file"
    ;;
  status)
    answers
    ;;
  *)
    echo "usage: $0 start|stop|status [PORT]" >&2; exit 2
    ;;
esac
