#!/bin/bash
# First start: a cluster in $PGDATA owned by postgres (UTF-8: psycopg hands SQL_ASCII text back as bytes), the POSTGRES_USER superuser with
# POSTGRES_PASSWORD, the POSTGRES_DB database, password logins from anywhere. Then the server, as
# the container's main process.
set -euo pipefail
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" && chown postgres:postgres "$PGDATA" && chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"    # exec, no parent: signals reach postgres
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD (the password of POSTGRES_USER)}"
  pw=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pw"
  "$bin/initdb" -D "$PGDATA" -U "$user" --pwfile="$pw" --auth-local=trust --auth-host=scram-sha-256 \
      --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pw"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  if [ "$db" != postgres ]; then
    "$bin/pg_ctl" -D "$PGDATA" -o "-c listen_addresses='' -k /tmp" -w start >/dev/null
    "$bin/createdb" -h /tmp -U "$user" "$db"
    "$bin/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
  fi
  echo "autotune-postgres: made the cluster in $PGDATA, user $user, database $db"
fi
exec "$bin/postgres" -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/tmp -c max_connections=200 "$@"
