#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests (issue 17): a new cluster under a temp folder,
# listening on a free loopback port only, trust auth, durability off (fsync, full pages: a test
# server that dies is thrown away anyway), run as an unprivileged user.
#
#   tests/services/postgres.sh start DIR   initdb + start under DIR; prints
#                                          `export RUNYARD_TEST_POSTGRES_URL=...` for eval
#   tests/services/postgres.sh stop DIR    stop it (fast shutdown) and delete DIR
#
# Needs Debian's `postgresql` package (or any PostgreSQL >= 13 whose initdb/pg_ctl are on PATH or
# under /usr/lib/postgresql/*/bin). As root, the server runs as the `postgres` system user the
# package creates (PostgreSQL refuses to run as root); otherwise as the calling user.
set -euo pipefail

cmd="${1:-}"; dir="${2:-}"
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop DIR" >&2; exit 2
fi
log() { echo "[postgres.sh] $*" >&2; }

bindir() {
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)"
  if [ -z "$d" ] || [ ! -x "$d/initdb" ]; then
    log "no PostgreSQL found (initdb): install Debian's postgresql package (apt-get install -y postgresql)"
    exit 1
  fi
  echo "$d"
}

as_owner() {  # run a command as the server's unprivileged owner
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

case "$cmd" in
  start)
    BIN="$(bindir)"
    mkdir -p "$dir"
    if [ "$(id -u)" -eq 0 ]; then
      chown postgres: "$dir"; chmod 0700 "$dir"
      runuser -u postgres -- test -w "$dir" \
        || { log "the postgres user cannot reach $dir: choose a DIR whose parents others may enter (chmod o+x)"; exit 1; }
    fi
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    as_owner "$BIN/initdb" -D "$dir/data" -U runyard --auth=trust -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; exit 1; }
    # 200 connections: the tests run schedulers, UIs and ranks of several installations at once.
    as_owner "$BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start -o \
      "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir -c max_connections=200 \
       -c fsync=off -c synchronous_commit=off -c full_page_writes=off" >&2 \
      || { cat "$dir/server.log" >&2; exit 1; }
    log "PostgreSQL $("$BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (data $dir/data)"
    echo "export RUNYARD_TEST_POSTGRES_URL=postgresql+psycopg://runyard@127.0.0.1:$port/postgres"
    ;;
  stop)
    if [ -d "$dir/data" ]; then
      BIN="$(bindir)"
      as_owner "$BIN/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || log "pg_ctl stop failed (already stopped?)"
    fi
    rm -rf "$dir"
    ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
