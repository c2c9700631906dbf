#!/usr/bin/env bash
# Make sure the PostgreSQL and Redis servers the tests use answer; start throwaway ones if not.
#
#   tests/ensure_services.sh [postgres-url] [redis-url]
#
# Defaults: postgres://postgres@127.0.0.1:5432/test and redis://127.0.0.1:6379. When nothing
# answers on an address and the server binaries are installed, a throwaway instance is started
# there (PostgreSQL: initdb with trust auth into a temporary directory; Redis: no persistence);
# they keep running after the tests, for the next run. When the binaries are missing it stops with
# one message naming the Debian packages to install.
set -euo pipefail

PG_URL="${1:-postgres://postgres@127.0.0.1:5432/test}"
REDIS_URL="${2:-redis://127.0.0.1:6379}"

# host and port from scheme://[user[:password]@]host[:port][/...]
address() {
  local rest="${1#*://}"
  rest="${rest%%/*}"
  rest="${rest##*@}"
  local host="${rest%%:*}" port="$2"
  [[ "$rest" == *:* ]] && port="${rest##*:}"
  echo "${host:-127.0.0.1} $port"
}

answers() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

wait_for() {
  for _ in $(seq 1 60); do
    answers "$1" "$2" && return 0
    sleep 0.5
  done
  echo "ensure_services: $3 did not start on $1:$2" >&2
  return 1
}

pg_bin() {
  local found
  found="$(command -v "$1" 2>/dev/null || true)"
  if [[ -z "$found" ]]; then
    found="$(ls -d /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -n 1 || true)"
  fi
  echo "$found"
}

missing=()

read -r pg_host pg_port <<<"$(address "$PG_URL" 5432)"
if ! answers "$pg_host" "$pg_port"; then
  initdb="$(pg_bin initdb)"
  pg_ctl="$(pg_bin pg_ctl)"
  if [[ -z "$initdb" || -z "$pg_ctl" ]]; then
    missing+=("postgresql")
  else
    data="$(mktemp -d /tmp/gateway-test-postgres.XXXXXX)"
    run=()
    if [[ "$(id -u)" == 0 ]]; then
      # initdb and postgres refuse to run as root: use the postgres account when there is one.
      id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
      chown postgres "$data"
      run=(runuser -u postgres --)
    fi
    "${run[@]}" "$initdb" -D "$data/db" -U postgres --auth=trust -E UTF8 >"$data/initdb.log"
    "${run[@]}" "$pg_ctl" -D "$data/db" -l "$data/server.log" -s \
      -o "-h $pg_host -p $pg_port -k $data -c fsync=off -c max_connections=300" start
    wait_for "$pg_host" "$pg_port" PostgreSQL
    echo "ensure_services: started PostgreSQL on $pg_host:$pg_port (data in $data)"
  fi
fi

read -r redis_host redis_port <<<"$(address "$REDIS_URL" 6379)"
if ! answers "$redis_host" "$redis_port"; then
  if ! command -v redis-server >/dev/null 2>&1; then
    missing+=("redis-server")
  else
    redis-server --daemonize yes --bind "$redis_host" --port "$redis_port" --save "" --appendonly no \
      --logfile /tmp/gateway-test-redis.log >/dev/null
    wait_for "$redis_host" "$redis_port" Redis
    echo "ensure_services: started Redis on $redis_host:$redis_port"
  fi
fi

if ((${#missing[@]})); then
  echo "ensure_services: nothing answers for the tests and the servers are not installed;" \
    "install them with: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
