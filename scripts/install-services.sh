#!/usr/bin/env bash
# Installs the Debian packages that the deployment tests run for real, idempotently:
#   - prometheus: `promtool check rules` / `promtool test rules` on deploy/prometheus, and the server
#     for the scrape test.
#   - chromium: the status page served at `GET /` is rendered headless (screenshot and DOM) by
#     tests/unit/test_status_page.py.
#   - postgresql-15: the Postgres sink's tests (scripts/postgres.sh starts a throwaway cluster).
#   - maven: scripts/kafka.sh resolves the Kafka broker's jars with it (the Kafka source's test).
# Does nothing when every tool is already there. Needs root (or sudo) and Debian's apt; it refreshes
# the package lists only when they do not know the packages yet. The packages' own daemons are not
# started: the tests start what they need on loopback ports.
set -euo pipefail

declare -A tool_of=([prometheus]=promtool [chromium]=chromium [postgresql-15]=pg_ctlcluster [maven]=mvn)
missing=()
for pkg in "${!tool_of[@]}"; do
  command -v "${tool_of[$pkg]}" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-services: apt-get not found; install ${missing[*]} with your package manager" >&2; exit 1
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-services: run as root to install ${missing[*]}" >&2; exit 1; }
  as_root=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive

# Keep maintainer scripts from starting the packages' services (policy-rc.d exit 101 = "not allowed"),
# unless the machine already has a policy of its own.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | "${as_root[@]}" tee "$policy" >/dev/null
  "${as_root[@]}" chmod 755 "$policy"
  trap '"${as_root[@]}" rm -f "$policy"' EXIT
fi

for pkg in "${missing[@]}"; do
  if ! apt-cache policy "$pkg" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    "${as_root[@]}" apt-get update -qq
    break
  fi
done
echo "install-services: installing ${missing[*]}"
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
for pkg in "${missing[@]}"; do
  command -v "${tool_of[$pkg]}" >/dev/null 2>&1 || { echo "install-services: $pkg installed no ${tool_of[$pkg]}" >&2; exit 1; }
done
