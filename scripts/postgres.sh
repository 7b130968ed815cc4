#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster on 127.0.0.1, for tests and benchmarks. Idempotent.
#
#   scripts/postgres.sh start PORT DATA_DIR   # initdb if DATA_DIR is new, start, wait until ready
#   scripts/postgres.sh stop  PORT DATA_DIR   # fast shutdown (no-op when not running)
#   scripts/postgres.sh status PORT DATA_DIR  # exit 0 when it accepts connections
#
# The cluster trusts local connections (user `postgres`, no password) and listens on loopback only,
# with its socket in DATA_DIR. Run as root it runs the server as the `postgres` user (PostgreSQL
# refuses to run as root); otherwise as the calling user. PG_BIN overrides the binaries' folder.
set -euo pipefail

usage() { echo "usage: $0 start|stop|status PORT DATA_DIR" >&2; exit 2; }
[ $# -eq 3 ] || usage
cmd=$1 port=$2 data=$3
case "$port" in ''|*[!0-9]*) echo "postgres.sh: PORT must be a number, got '$port'" >&2; exit 2;; esac

bin=${PG_BIN:-}
if [ -z "$bin" ]; then
  for candidate in /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin; do
    [ -x "$candidate/pg_ctl" ] && { bin=$candidate; break; }
  done
fi
[ -n "$bin" ] && [ -x "$bin/pg_ctl" ] || {
  echo "postgres.sh: PostgreSQL server binaries not found; run scripts/install-services.sh (Debian: postgresql-15)" >&2
  exit 1
}

run_as=()
if [ "$(id -u)" -eq 0 ]; then
  run_as=(runuser -u postgres --)
  command -v runuser >/dev/null 2>&1 || run_as=(su postgres -s /bin/bash -c)
fi
as_owner() {  # run a command as the cluster's owner
  if [ ${#run_as[@]} -eq 0 ]; then "$@"
  elif [ "${run_as[0]}" = su ]; then "${run_as[@]}" "$(printf '%q ' "$@")"
  else "${run_as[@]}" "$@"; fi
}

ready() { "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -t 1 >/dev/null 2>&1; }

case "$cmd" in
  start)
    mkdir -p "$data"
    data=$(cd "$data" && pwd)
    [ "$(id -u)" -eq 0 ] && chown postgres: "$data" && chmod 700 "$data"
    if [ ! -f "$data/PG_VERSION" ]; then
      as_owner "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --no-instructions >"$data.initdb.log" 2>&1 || {
        cat "$data.initdb.log" >&2; exit 1; }
    fi
    if as_owner "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; then
      ready && exit 0
    else
      as_owner "$bin/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $data -c fsync=off" start >/dev/null || {
        tail -20 "$data/server.log" >&2; exit 1; }
    fi
    for _ in $(seq 1 120); do ready && exit 0; sleep 0.5; done
    echo "postgres.sh: the server in $data did not accept connections on 127.0.0.1:$port" >&2; exit 1
    ;;
  stop)
    [ -f "$data/PG_VERSION" ] || exit 0
    if as_owner "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; then
      as_owner "$bin/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null
    fi
    ;;
  status)
    ready
    ;;
  *) usage ;;
esac
