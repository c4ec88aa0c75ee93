#!/usr/bin/env bash
# Starts a private PostgreSQL server for autotune's shared-study tests (and for trying many
# workers on one machine): Debian's postgresql package, a throw-away cluster under /tmp, trust
# auth on 127.0.0.1. Prints the storage URL on its last line. Idempotent.
#   export AUTOTUNE_TEST_POSTGRES=$(bash scripts/start-postgres.sh | tail -1)
set -euo pipefail
port=${AUTOTUNE_PG_PORT:-55432}
data=${AUTOTUNE_PG_DATA:-/tmp/autotune-pg}
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  (apt-get update -qq && apt-get install -y -qq postgresql >/dev/null) 1>&2
fi
bin=$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")
run() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi; }
if [ "$(id -u)" = 0 ]; then mkdir -p "$data" && chown postgres "$data"; fi
if [ ! -f "$data/PG_VERSION" ]; then
  run "$bin/initdb -D $data -U postgres --auth=trust" >/dev/null
fi
if ! run "$bin/pg_ctl -D $data status" >/dev/null 2>&1; then
  run "$bin/pg_ctl -D $data -o \"-p $port -k /tmp -c listen_addresses=127.0.0.1 -c max_connections=200\" -l $data.log -w start" >/dev/null
fi
run "$bin/psql -h 127.0.0.1 -p $port -U postgres -tAc \"SELECT 1 FROM pg_database WHERE datname='autotune'\"" | grep -q 1 \
  || run "$bin/createdb -h 127.0.0.1 -p $port -U postgres autotune"
echo "postgresql://postgres@127.0.0.1:$port/autotune"
