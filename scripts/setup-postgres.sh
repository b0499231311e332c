#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tracking-server tests and benchmark (and a local try-out).
#
#   scripts/setup-postgres.sh install       install Debian's postgresql if initdb is missing (root + apt-get)
#   scripts/setup-postgres.sh start [DIR]   initdb in DIR (default: a new /tmp/dapo-pg.XXXXXX), start it on
#                                           127.0.0.1 and a free port (or $DAPO_PG_PORT); prints export lines
#   scripts/setup-postgres.sh stop DIR      stop the cluster started in DIR, by the pid in its postmaster.pid
#   scripts/setup-postgres.sh status DIR    exit 0 running, 3 stopped
#
# `start` creates the role `dapo` (CREATEDB) with a random password (in DIR/password, mode 600) owning the
# database `mlflow`, and prints (last lines of stdout; progress goes to stderr):
#   export DAPO_PG_DIR=DIR
#   export DAPO_PG_URI=postgresql://dapo@127.0.0.1:PORT/mlflow      (no password in it)
#   export DAPO_PG_PASSWORD_FILE=DIR/password
# TCP connections need the password (scram-sha-256); only 127.0.0.1 listens. The unix socket
# lives in DIR/sock (mode 700). PostgreSQL refuses to run as root, so as root every server
# command runs as the `postgres` user (runuser); as anyone else, as that user.
# `stop` signals only the postmaster whose pid DIR/data/postmaster.pid names (after checking
# /proc/PID/comm), SIGINT (fast shutdown), then SIGQUIT/SIGKILL if it lingers; DIR is left
# for the caller to remove.
set -euo pipefail

log() { echo "[setup-postgres] $*" >&2; }
die() { log "error: $*"; exit 1; }

bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; return; fi
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
  return 1
}

install_pg() {
  if bindir >/dev/null; then log "PostgreSQL binaries in $(bindir)"; return; fi
  [ "$(id -u)" = 0 ] || die "initdb not found and not root: install Debian's postgresql package (apt-get install postgresql)"
  command -v apt-get >/dev/null || die "initdb not found and no apt-get: install PostgreSQL (initdb, pg_ctl) first"
  log "installing postgresql (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q postgresql >&2 || { apt-get update -q >&2 && apt-get install -y -q postgresql >&2; }
  bindir >/dev/null || die "postgresql installed but initdb not found under /usr/lib/postgresql/*/bin"
}

# run a server command as the cluster's owner
as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pid_of() {  # the postmaster pid of DIR, if it is running
  local f="$1/data/postmaster.pid" pid
  [ -f "$f" ] || return 1
  pid=$(head -1 "$f")
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = postgres ] || return 1
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 1
  echo "$pid"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_pg() {
  local dir="${1:-}" bin port pw
  install_pg
  bin=$(bindir)
  if [ -z "$dir" ]; then dir=$(mktemp -d /tmp/dapo-pg.XXXXXX); fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if pid_of "$dir" >/dev/null; then die "a cluster is already running in $dir (pid $(pid_of "$dir"))"; fi
  [ ! -e "$dir/data" ] || die "$dir/data exists (stopped cluster?): remove it or give another DIR"
  port=${DAPO_PG_PORT:-$(free_port)}
  mkdir -p "$dir/data" "$dir/sock"
  chmod 700 "$dir/data" "$dir/sock"
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || die "no 'postgres' user to run the server as (PostgreSQL refuses root)"
    chmod 755 "$dir"
    chown postgres: "$dir/data" "$dir/sock"
    touch "$dir/server.log"; chown postgres: "$dir/server.log"
  fi
  log "initdb $dir/data"
  as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
    -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
  log "starting on 127.0.0.1:$port"
  as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir/sock -c shared_buffers=32MB -c max_connections=200" \
    start >&2 || { tail -20 "$dir/server.log" >&2; die "pg_ctl start failed"; }
  pw=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
  (umask 077; printf '%s\n' "$pw" > "$dir/password")
  # the password goes through stdin, never a command line
  printf "CREATE ROLE dapo LOGIN CREATEDB PASSWORD '%s';\nCREATE DATABASE mlflow OWNER dapo;\n" "$pw" |
    as_owner "$bin/psql" -q -v ON_ERROR_STOP=1 -h "$dir/sock" -p "$port" -U postgres -d postgres >&2 \
    || { stop_pg "$dir"; die "could not create role/database"; }
  log "running: pid $(pid_of "$dir"), data $dir/data, log $dir/server.log"
  echo "export DAPO_PG_DIR=$dir"
  echo "export DAPO_PG_URI=postgresql://dapo@127.0.0.1:$port/mlflow"
  echo "export DAPO_PG_PASSWORD_FILE=$dir/password"
}

stop_pg() {
  local dir="${1:?usage: stop DIR}" pid i
  pid=$(pid_of "$dir") || { log "no cluster running in $dir"; return 0; }
  log "stopping postmaster $pid ($dir)"
  kill -INT "$pid" 2>/dev/null || true          # fast shutdown: ends sessions, checkpoints, exits
  for i in $(seq 1 300); do pid_of "$dir" >/dev/null || { log "stopped"; return 0; }; sleep 0.1; done
  log "still running after 30 s: SIGQUIT"
  kill -QUIT "$pid" 2>/dev/null || true
  for i in $(seq 1 50); do pid_of "$dir" >/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

cmd="${1:-}"; shift || true
case "$cmd" in
  install) install_pg ;;
  start) start_pg "${1:-}" ;;
  stop) stop_pg "${1:-}" ;;
  status) d="${1:?usage: status DIR}"; if p=$(pid_of "$d"); then echo "running (pid $p)"; else echo stopped; exit 3; fi ;;
  *) echo "usage: $0 install | start [DIR] | stop DIR | status DIR" >&2; exit 2 ;;
esac
