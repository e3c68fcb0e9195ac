#!/usr/bin/env bash
# Throwaway PostgreSQL cluster for the wallet tests.
#
#   bash scripts/pg-test-server.sh start   # prints an export line for LLMF_TEST_POSTGRES_DSN
#   bash scripts/pg-test-server.sh stop
#
# PGTEST_DIR (default /tmp/llmf-pg) and PGTEST_PORT (default 55432) override
# where the cluster lives and listens. Everything runs as the `postgres` OS
# user because PostgreSQL refuses to run as root.
set -euo pipefail

PGTEST_DIR="${PGTEST_DIR:-/tmp/llmf-pg}"
PGTEST_PORT="${PGTEST_PORT:-55432}"
DATA="$PGTEST_DIR/data"
SOCK="$PGTEST_DIR/sock"
LOG="$PGTEST_DIR/postgres.log"
DB=llmf_test

log() { echo "pg-test-server: $*" >&2; }

find_bindir() {
	# Newest major version wins so a machine with several clusters still
	# tests against the most current server.
	local d
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -V | tail -n1 || true)
	if [[ -n "$d" && -x "$d/initdb" ]]; then
		echo "$d"
	fi
}

as_pg() {
	if [[ "$(id -u)" == 0 ]]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

ensure_binaries() {
	BIN=$(find_bindir)
	if [[ -z "$BIN" ]]; then
		if [[ "$(id -u)" != 0 ]]; then
			log "PostgreSQL binaries not found and not root; install postgresql first"
			exit 1
		fi
		log "installing postgresql (apt-get)"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq >&2
		apt-get install -y -qq postgresql >&2
		BIN=$(find_bindir)
		if [[ -z "$BIN" ]]; then
			log "postgresql installed but no initdb under /usr/lib/postgresql/*/bin"
			exit 1
		fi
	fi
	if ! id postgres >/dev/null 2>&1; then
		useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
	fi
}

is_running() {
	[[ -d "$DATA" ]] && as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

psql_cmd() {
	as_pg "$BIN/psql" -h "$SOCK" -p "$PGTEST_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA "$@"
}

start() {
	ensure_binaries
	mkdir -p "$PGTEST_DIR" "$SOCK"
	chown postgres: "$PGTEST_DIR" "$SOCK" 2>/dev/null || true
	if [[ ! -f "$DATA/PG_VERSION" ]]; then
		as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --no-instructions >/dev/null
	fi
	# A server killed with the last session may still be exiting, or have
	# left a stale postmaster.pid: wait until it either answers or is gone,
	# and start it when it is gone.
	local tries
	for tries in $(seq 1 100); do
		if psql_cmd -c "SELECT 1" >/dev/null 2>&1; then
			break
		fi
		if ! is_running; then
			# fsync off: the cluster is disposable and the tests are about
			# concurrency semantics, not durability.
			as_pg "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start \
				-o "-c listen_addresses=127.0.0.1 -p $PGTEST_PORT -c unix_socket_directories=$SOCK -c max_connections=300 -c fsync=off -c full_page_writes=off" >/dev/null || true
		fi
		sleep 0.2
	done
	if ! psql_cmd -c "SELECT 1" >/dev/null 2>&1; then
		log "PostgreSQL did not come up; see $LOG"
		exit 1
	fi
	if [[ "$(psql_cmd -c "SELECT 1 FROM pg_database WHERE datname='$DB'")" != 1 ]]; then
		psql_cmd -c "CREATE DATABASE $DB"
	fi
	echo "export LLMF_TEST_POSTGRES_DSN=postgres://postgres@127.0.0.1:$PGTEST_PORT/$DB?sslmode=disable"
}

stop() {
	BIN=$(find_bindir)
	if [[ -z "$BIN" ]]; then
		log "no PostgreSQL binaries; nothing to stop"
		return 0
	fi
	if is_running; then
		as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null
		log "stopped"
	else
		log "not running"
	fi
}

case "${1:-}" in
start) start ;;
stop) stop ;;
*)
	echo "usage: $0 start|stop" >&2
	exit 2
	;;
esac
