#!/usr/bin/env bash
# Starts a private PostgreSQL server for autotune's shared-study tests (and for trying many
# workers on one machine): Debian's postgresql package, a throw-away cluster in its own folder,
# trust auth on 127.0.0.1. Prints the storage URL on its last line. Idempotent: a cluster that runs
# already is reused, on the port it was started on.
#   export AUTOTUNE_TEST_POSTGRES=$(bash scripts/start-postgres.sh | tail -1)
#   bash scripts/start-postgres.sh --stop        # stops it and removes its folder
# AUTOTUNE_PG_DATA: the cluster's folder (default /tmp/autotune-pg); AUTOTUNE_PG_PORT: its port (default
# a free one, chosen when the cluster is first started and kept in $AUTOTUNE_PG_DATA.port), so two
# checkouts' clusters (.ci/run gives each run its own folder) never meet on one port.
set -euo pipefail
data=${AUTOTUNE_PG_DATA:-/tmp/autotune-pg}
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  [ "${1:-}" != --stop ] || exit 0
  export DEBIAN_FRONTEND=noninteractive
  (apt-get update -qq && apt-get install -y -qq postgresql >/dev/null) 1>&2
fi
bin=$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")
run() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi; }
if [ "${1:-}" = --stop ]; then
  if [ -f "$data/PG_VERSION" ]; then
    run "$bin/pg_ctl -D $data status" >/dev/null 2>&1 && run "$bin/pg_ctl -D $data -m fast -w stop" >/dev/null
  fi
  rm -rf "$data" "$data.log" "$data.port"
  exit 0
fi
[ $# -eq 0 ] || { echo "start-postgres.sh: unknown argument '$1' (none, or --stop)" >&2; exit 2; }
if [ "$(id -u)" = 0 ]; then mkdir -p "$data" && chown postgres "$data"; else mkdir -p "$data"; fi
if [ ! -f "$data/PG_VERSION" ]; then
  run "$bin/initdb -D $data -U postgres --auth=trust" >/dev/null
fi
if [ -s "$data.port" ]; then
  port=$(cat "$data.port")
else
  port=${AUTOTUNE_PG_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
  echo "$port" > "$data.port"
fi
if ! run "$bin/pg_ctl -D $data status" >/dev/null 2>&1; then
  run "$bin/pg_ctl -D $data -o \"-p $port -k /tmp -c listen_addresses=127.0.0.1 -c max_connections=200\" -l $data.log -w start" >/dev/null
fi
run "$bin/psql -h 127.0.0.1 -p $port -U postgres -tAc \"SELECT 1 FROM pg_database WHERE datname='autotune'\"" | grep -q 1 \
  || run "$bin/createdb -h 127.0.0.1 -p $port -U postgres autotune"
echo "postgresql://postgres@127.0.0.1:$port/autotune"
