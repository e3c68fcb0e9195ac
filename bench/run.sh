#!/usr/bin/env bash
# Load benchmark: llm_failover against plain reverse_proxy, in one Caddy.
#
# Starts the fake upstream (bench/upstream) and ONE Caddy serving three
# sites on loopback: site A proxies with `reverse_proxy` (flush_interval -1),
# site B with `llm_failover` (one channel, one model, no wallet), site C
# with the same `llm_failover` plus a prepaid wallet (`llm_wallet { store
# sqlite }`, or PostgreSQL with BENCH_WALLET=postgres). The script creates the wallet's
# account and API key through Caddy's admin API, and the load generator
# sends that key to site C. Access logs are off. Then, for non-streaming
# and streaming requests, it runs the closed-loop load generator
# (bench/load) REPS times per target, alternating A B C A B C ..., and
# prints medians, ratios and differences (bench/report): llm_failover
# against reverse_proxy (B/A), and wallet on against wallet off (C/B).
# Besides requests/s, latency and Caddy's CPU per request, each run reads
# Caddy's /debug/vars around its measured window: the bytes and objects
# the process allocated per request, and its collections per 1,000.
# With BENCH_INSTANCES=N (PostgreSQL only), N-1 more Caddy processes serve
# sites B and C (C on the same database), and each repetition also loads
# all N at once with the clients split over them, site B (the control:
# what the machine gives N processes with no database) and then site C:
# each fleet against one instance.
#
# Caddy is pinned to CPU 0 with GOMAXPROCS=1 (the "on one core" target);
# the load generator and the upstream share CPU 1. Pinning is skipped when
# taskset is missing or the machine has fewer than 2 CPUs (BENCH_PIN=0
# skips it too).
#
# It builds no Caddy: `make bench` builds ./caddy first. Environment:
#   CADDY_BIN        Caddy with llm_failover (default: ./caddy at the repo root)
#   BENCH_REPS       runs per target and mode (default 5)
#   BENCH_DURATION   measured time of one run (default 5s)
#   BENCH_WARMUP     discarded warm-up before each run (default 1s)
#   BENCH_CONC       concurrent clients (default 16)
#   BENCH_MODES      "json stream" (default both)
#   BENCH_CHUNKS     content chunks per SSE stream (default 20)
#   BENCH_EVENT_DELAY upstream delay before each SSE event (default 0); e.g.
#                    1ms measures time to first byte below saturation
#   BENCH_ROLE_CHUNK 1: streams start with a role-only chunk, as real
#                    providers' do; the stream gate holds it until the
#                    first content chunk, one event delay later
#   BENCH_WALLET     site C's wallet store: "sqlite" (default; a fresh
#                    file under the work directory), "postgres" (needs
#                    LLMF_TEST_POSTGRES_DSN, e.g. from
#                    scripts/pg-test-server.sh start; target
#                    llm_failover+wallet_pg) or "off" (no site C: A and B
#                    only, as before)
#   BENCH_FAILOVER   1 (or status): site C is no wallet but the path where
#                    every request fails over once (target
#                    llm_failover+failover_once): its first channel answers
#                    503 (the upstream's /fail path), its second serves, and
#                    its breaker never opens (failures 64 in a 1ms window),
#                    so each request pays a failed attempt, its log line and
#                    journal entry and a second attempt. "refused": the
#                    first channel's port refuses connections instead
#                    (target llm_failover+failover_refused). Needs
#                    BENCH_WALLET=off or unset.
#   BENCH_INSTANCES  with BENCH_WALLET=postgres: run sites B and C on this
#                    many Caddy processes (default 1, at most 9), site C's
#                    sharing the database, instance k pinned to CPU (k-1)
#                    mod CPUs; targets <N>xllm_failover and <N>x<site C's
#                    target>, instance k labelled /k; the one-instance
#                    runs of each site are its baseline
#   BENCH_PG_PID     PostgreSQL's postmaster, whose CPU time (with its
#                    backends') is measured per request; default: found in
#                    /proc from the DSN's port (a server on this machine)
#   BENCH_PORT       first of the ports used (default 18080): +1 site A,
#                    +2 site B, +3 site C, +10 upstream, +19 Caddy admin;
#                    instance k >= 2 of BENCH_INSTANCES: +20+k site C,
#                    +30+k its admin, +40+k site B
#   BENCH_PROFILE    "json", "stream" or both: after the runs, take a 10 s
#                    CPU profile of Caddy during an llm_failover load (and,
#                    with a wallet, another during an llm_failover+wallet
#                    load) of each mode named and save it beside the
#                    results (go tool pprof -top FILE)
#   BENCH_UPSTREAM   h1 (default) or h2c: every site reaches the upstream
#                    over HTTP/2 without TLS ("transport http { versions
#                    h2c }"), as Caddy reaches a hosted provider over TLS
#                    (HTTP/2 by ALPN): many requests share one connection
#   BENCH_OUT        results directory (default bench/results)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

CADDY_BIN="${CADDY_BIN:-$ROOT/caddy}"
REPS="${BENCH_REPS:-5}"
DURATION="${BENCH_DURATION:-5s}"
WARMUP="${BENCH_WARMUP:-1s}"
CONC="${BENCH_CONC:-16}"
MODES="${BENCH_MODES:-json stream}"
CHUNKS="${BENCH_CHUNKS:-20}"
EVENT_DELAY="${BENCH_EVENT_DELAY:-0}"
ROLE_CHUNK="${BENCH_ROLE_CHUNK:-0}"
PORT="${BENCH_PORT:-18080}"
PROFILE="${BENCH_PROFILE:-}"
WALLET="${BENCH_WALLET:-sqlite}"
FAILOVER="${BENCH_FAILOVER:-0}"
INSTANCES="${BENCH_INSTANCES:-1}"
UPSTREAM="${BENCH_UPSTREAM:-h1}"
OUT="${BENCH_OUT:-$ROOT/bench/results}"
GO="${GO:-go}"

PORT_A=$((PORT + 1))
PORT_B=$((PORT + 2))
PORT_C=$((PORT + 3))
PORT_UP=$((PORT + 10))
PORT_ADMIN=$((PORT + 19))
# Every target sends the upstream a key, as a real channel does: the
# gateway then masks it in everything an answer carries (a look for the
# key in every event), a cost a keyless channel would not show.
UPSTREAM_KEY="sk-proj-bench$(printf '%040d' 7)"

die() { echo "bench: $*" >&2; exit 1; }

[ -x "$CADDY_BIN" ] || die "no Caddy binary at $CADDY_BIN (run 'make bench', or set CADDY_BIN)"
"$CADDY_BIN" list-modules 2>/dev/null | grep -q '^http.handlers.llm_failover$' ||
	die "$CADDY_BIN has no http.handlers.llm_failover module"
command -v curl >/dev/null || die "curl is needed"
case "$WALLET" in
sqlite) TARGET_C=llm_failover+wallet ;;
postgres)
	TARGET_C=llm_failover+wallet_pg
	[ -n "${LLMF_TEST_POSTGRES_DSN:-}" ] ||
		die "BENCH_WALLET=postgres needs LLMF_TEST_POSTGRES_DSN (bash scripts/pg-test-server.sh start prints it)"
	;;
off) TARGET_C="" ;;
*) die "BENCH_WALLET: want sqlite, postgres or off, got '$WALLET'" ;;
esac
case "$FAILOVER" in
0) ;;
1 | status) FAILOVER=status TARGET_C=llm_failover+failover_once ;;
refused) TARGET_C=llm_failover+failover_refused ;;
*) die "BENCH_FAILOVER: want 0, 1 (status) or refused, got '$FAILOVER'" ;;
esac
if [ "$FAILOVER" != 0 ]; then
	[ "${BENCH_WALLET:-off}" = off ] || die "BENCH_FAILOVER=$FAILOVER takes site C: set BENCH_WALLET=off (or leave it unset)"
	WALLET=off
fi
# TRANSPORT: the upstream transport's block inside reverse_proxy and each
# channel (empty: Caddy's default, HTTP/1.1 to an http:// upstream).
case "$UPSTREAM" in
h1) TRANSPORT="" ;;
h2c) TRANSPORT="transport http {
			versions h2c
		}" ;;
*) die "BENCH_UPSTREAM: want h1 or h2c, got '$UPSTREAM'" ;;
esac
# HAS_WALLET: site C is the wallet's (the load sends it an API key).
HAS_WALLET=""
[ -z "$TARGET_C" ] || [ "$WALLET" = off ] || HAS_WALLET=1
TARGETS="reverse_proxy llm_failover $TARGET_C"
case "$INSTANCES" in
[1-9]) ;;
*) die "BENCH_INSTANCES: want 1 to 9, got '$INSTANCES'" ;;
esac
# FLEETS: the targets also run on all the instances at once: site C, and
# site B without a wallet as the control (what the machine itself allows
# N processes, with no shared database).
FLEET_TARGET="" FLEETS=""
if [ "$INSTANCES" -gt 1 ]; then
	[ "$WALLET" = postgres ] || die "BENCH_INSTANCES=$INSTANCES needs BENCH_WALLET=postgres: the instances share the wallet's database"
	[ "$CONC" -ge "$INSTANCES" ] || die "BENCH_CONC=$CONC is fewer clients than BENCH_INSTANCES=$INSTANCES"
	FLEET_TARGET="${INSTANCES}x$TARGET_C"
	FLEETS="llm_failover $TARGET_C"
fi
# Sites B's and C's ports and the admin port of every instance (index 1
# is the Caddy that also serves A).
PORTS_B=("" "$PORT_B") PORTS_C=("" "$PORT_C") PORTS_ADMIN=("" "$PORT_ADMIN")
for k in $(seq 2 "$INSTANCES"); do
	PORTS_C[k]=$((PORT + 20 + k)) PORTS_ADMIN[k]=$((PORT + 30 + k)) PORTS_B[k]=$((PORT + 40 + k))
done
for p in "$PORT_A" "$PORT_B" "$PORT_UP" "$((PORT + 9))" "${PORTS_C[@]:1}" "${PORTS_ADMIN[@]:1}" "${PORTS_B[@]:2}"; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
		die "port $p is already in use (set BENCH_PORT)"
	fi
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/llmf-bench.XXXXXX")"
PIDS=()
cleanup() {
	for pid in "${PIDS[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${PIDS[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# CPU pinning.
PIN_CADDY=() PIN_LOAD=() PINNING="none" PINNED=""
if [ "${BENCH_PIN:-1}" != 0 ] && command -v taskset >/dev/null && [ "$(nproc --all)" -ge 2 ] &&
	taskset -c 0 true 2>/dev/null && taskset -c 1 true 2>/dev/null; then
	PIN_CADDY=(taskset -c 0) PIN_LOAD=(taskset -c 1) PINNED=1
	PINNING="caddy on CPU 0 (GOMAXPROCS=1); load generator and upstream on CPU 1"
	[ "$INSTANCES" = 1 ] ||
		PINNING="$PINNING; site C's instance k of $INSTANCES on CPU (k-1) mod $(nproc --all) (GOMAXPROCS=1 each)"
else
	PINNING="none (taskset missing, fewer than 2 CPUs, or BENCH_PIN=0); caddy GOMAXPROCS=1"
fi
# pin_instance K: the taskset prefix of site C's instance K, or nothing.
pin_instance() {
	[ -z "$PINNED" ] || echo "taskset -c $((($1 - 1) % $(nproc --all)))"
}

echo "bench: building the upstream, load generator and report tools"
"$GO" build -o "$WORK/upstream" ./bench/upstream
"$GO" build -o "$WORK/load" ./bench/load
"$GO" build -o "$WORK/report" ./bench/report

# Site C's wallet (a global llm_wallet option). The price makes every
# request a real charge (a model without one is billed at 0 and settles as
# a release); it changes no work but the arithmetic. The account and its
# key are made through the admin API once Caddy is up.
case "$WALLET" in
sqlite) WALLET_STORE="store sqlite $WORK/wallet.db" ;;
postgres) WALLET_STORE="store postgres {env.LLMF_TEST_POSTGRES_DSN}" ;;
esac
WALLET_OPTION=""
if [ -n "$HAS_WALLET" ]; then
	WALLET_OPTION="llm_wallet {
		$WALLET_STORE
	}"
fi

cat >"$WORK/Caddyfile" <<EOF
{
	admin 127.0.0.1:$PORT_ADMIN
	auto_https off
	persist_config off
	skip_install_trust
	grace_period 1s
	$WALLET_OPTION
}

# Site A: the baseline.
http://127.0.0.1:$PORT_A {
	bind 127.0.0.1
	reverse_proxy 127.0.0.1:$PORT_UP {
		flush_interval -1
		header_up Authorization "Bearer $UPSTREAM_KEY"
		$TRANSPORT
	}
}

EOF
site_b() { # site_b PORT: the handler under test, defaults otherwise (stream gate on)
	cat <<EOF

# Site B: the handler under test, defaults otherwise (stream gate on).
http://127.0.0.1:$1 {
	bind 127.0.0.1
	llm_failover {
		channel up http://127.0.0.1:$PORT_UP {
			header Authorization "Bearer $UPSTREAM_KEY"
			$TRANSPORT
		}
		model m {
			route up
		}
	}
}
EOF
}
site_b "$PORT_B" >>"$WORK/Caddyfile"

site_c() { # site_c PORT: site B plus a prepaid wallet
	cat <<EOF

# Site C: site B plus a prepaid wallet ($WALLET).
http://127.0.0.1:$1 {
	bind 127.0.0.1
	llm_failover {
		channel up http://127.0.0.1:$PORT_UP {
			header Authorization "Bearer $UPSTREAM_KEY"
			$TRANSPORT
		}
		model m {
			route up
			price 3 15
		}
		wallet
	}
}
EOF
}
# The failing channel: the upstream's 503 path, or a port nothing listens on.
DOWN_URL="http://127.0.0.1:$PORT_UP/fail"
[ "$FAILOVER" != refused ] || DOWN_URL="http://127.0.0.1:$((PORT + 9))"
site_failover() { # site_failover PORT: every request fails over once
	cat <<EOF

# Site C: every request fails over once (BENCH_FAILOVER=$FAILOVER).
http://127.0.0.1:$1 {
	bind 127.0.0.1
	llm_failover {
		channel down $DOWN_URL {
			$TRANSPORT
		}
		channel backup http://127.0.0.1:$PORT_UP {
			header Authorization "Bearer $UPSTREAM_KEY"
			$TRANSPORT
		}
		model m {
			route down cost 1 1
			route backup cost 2 2
		}
		breaker {
			failures 64
			window 1ms
		}
	}
}
EOF
}
if [ "$FAILOVER" != 0 ]; then
	site_failover "$PORT_C" >>"$WORK/Caddyfile"
elif [ -n "$TARGET_C" ]; then
	site_c "$PORT_C" >>"$WORK/Caddyfile"
fi
# The other instances of sites B and C: the same wallet, nothing else.
for k in $(seq 2 "$INSTANCES"); do
	{
		cat <<EOF
{
	admin 127.0.0.1:${PORTS_ADMIN[k]}
	auto_https off
	persist_config off
	skip_install_trust
	grace_period 1s
	$WALLET_OPTION
}
EOF
		site_b "${PORTS_B[k]}"
		site_c "${PORTS_C[k]}"
	} >"$WORK/Caddyfile.$k"
done

GOMAXPROCS=1 "${PIN_LOAD[@]}" "$WORK/upstream" -listen "127.0.0.1:$PORT_UP" -chunks "$CHUNKS" \
	-event-delay "$EVENT_DELAY" -role-chunk="$([ "$ROLE_CHUNK" = 1 ] && echo true || echo false)" \
	2>"$WORK/upstream.log" &
PIDS+=($!)
# Caddy keeps its data and config under $WORK, never under $HOME.
XDG_DATA_HOME="$WORK/data" XDG_CONFIG_HOME="$WORK/config" GOMAXPROCS=1 \
	"${PIN_CADDY[@]}" "$CADDY_BIN" run --config "$WORK/Caddyfile" --adapter caddyfile \
	>"$WORK/caddy.log" 2>&1 &
CADDY_PID=$!
PIDS+=("$CADDY_PID")
CADDY_PIDS=("" "$CADDY_PID")
for k in $(seq 2 "$INSTANCES"); do
	# shellcheck disable=SC2046 # the taskset prefix, or nothing
	XDG_DATA_HOME="$WORK/data.$k" XDG_CONFIG_HOME="$WORK/config.$k" GOMAXPROCS=1 \
		$(pin_instance "$k") "$CADDY_BIN" run --config "$WORK/Caddyfile.$k" --adapter caddyfile \
		>"$WORK/caddy.$k.log" 2>&1 &
	CADDY_PIDS[k]=$!
	PIDS+=("${CADDY_PIDS[k]}")
done

URL_A="http://127.0.0.1:$PORT_A/v1/chat/completions"
URL_B="http://127.0.0.1:$PORT_B/v1/chat/completions"
URL_C="http://127.0.0.1:$PORT_C/v1/chat/completions"
URLS_B=("") URLS_C=("")
for k in $(seq 1 "$INSTANCES"); do
	URLS_B[k]="http://127.0.0.1:${PORTS_B[k]}/v1/chat/completions"
	URLS_C[k]="http://127.0.0.1:${PORTS_C[k]}/v1/chat/completions"
done
BODY_JSON='{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello in one short sentence."}],"max_tokens":64,"temperature":0.2}'
BODY_STREAM='{"model":"m","stream":true,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello in one short sentence."}],"max_tokens":64,"temperature":0.2}'

url_of() { # url_of TARGET
	case "$1" in
	reverse_proxy) echo "$URL_A" ;;
	llm_failover) echo "$URL_B" ;;
	*) echo "$URL_C" ;;
	esac
}

# wait_until PID COMMAND...: runs COMMAND every 0.1 s, for up to 10 s,
# until it succeeds; fails at once when process PID has exited.
wait_until() {
	local pid=$1 _
	shift
	for _ in $(seq 1 100); do
		"$@" 2>/dev/null && return 0
		kill -0 "$pid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}
caddy_ready() {
	curl -fsS -o /dev/null "http://127.0.0.1:$PORT_ADMIN/config/" &&
		curl -fsS -o /dev/null -d "$BODY_JSON" "$URL_A" &&
		curl -fsS -o /dev/null -d "$BODY_JSON" "$URL_B"
}
if ! wait_until "$CADDY_PID" caddy_ready; then
	echo "--- caddy.log" >&2
	tail -n 30 "$WORK/caddy.log" >&2 || true
	echo "--- upstream.log" >&2
	cat "$WORK/upstream.log" >&2 || true
	die "Caddy or the upstream did not come up"
fi

# The wallet's account, its money and its API key, through the admin API
# (walletapp/admin.go). The key's secret stays in $WORK. On PostgreSQL the
# database may keep the account of an earlier run: 409 on creation is fine.
ADMIN="http://127.0.0.1:$PORT_ADMIN/llm_wallet"
AUTH=()
if [ -n "$HAS_WALLET" ]; then
	code="$(curl -sS -o "$WORK/account.json" -w '%{http_code}' -d '{"id":"bench"}' "$ADMIN/accounts")"
	case "$code" in
	201 | 409) ;;
	*) die "creating the wallet account: HTTP $code: $(cat "$WORK/account.json")" ;;
	esac
	curl -fsS -o /dev/null -d '{"amount":"1000000","note":"bench"}' "$ADMIN/accounts/bench/credit" ||
		die "crediting the wallet account failed"
	curl -fsS -o "$WORK/key.json" -d '{"label":"bench"}' "$ADMIN/accounts/bench/keys" ||
		die "creating the wallet API key failed"
	KEY="$(sed -n 's/.*"key": *"\([^"]*\)".*/\1/p' "$WORK/key.json")"
	[ -n "$KEY" ] || die "no key in the admin API's answer: $(cat "$WORK/key.json")"
	AUTH=(-H "Authorization: Bearer $KEY")
	curl -fsS -o /dev/null -H "Authorization: Bearer $KEY" -d "$BODY_JSON" "$URL_C" ||
		die "$URL_C: the wallet site refused a request with the bench key"
	code="$(curl -sS -o /dev/null -w '%{http_code}' -d "$BODY_JSON" "$URL_C")"
	[ "$code" = 401 ] || die "$URL_C: a request without a key got HTTP $code, want 401 (is the wallet on?)"
fi
# The other instances answer with the key the first one made: one wallet.
for k in $(seq 2 "$INSTANCES"); do
	if ! wait_until "${CADDY_PIDS[k]}" curl -fsS -o /dev/null "${AUTH[@]}" -d "$BODY_JSON" "${URLS_C[k]}"; then
		tail -n 30 "$WORK/caddy.$k.log" >&2 || true
		die "instance $k of site C (${URLS_C[k]}) did not serve the bench key"
	fi
	curl -fsS -o /dev/null -d "$BODY_JSON" "${URLS_B[k]}" || die "instance $k of site B (${URLS_B[k]}) did not answer"
done

# PostgreSQL's CPU per request: the postmaster of the DSN's port, known by
# the postmaster.pid in its data directory (its cwd), and its backends.
PG_PID="${BENCH_PG_PID:-}"
if [ "$WALLET" = postgres ] && [ -z "$PG_PID" ]; then
	pg_port="$(echo "$LLMF_TEST_POSTGRES_DSN" | sed -nE 's#^[a-z]+://[^/]*:([0-9]+)(/.*)?$#\1#p')"
	pg_port="${pg_port:-5432}"
	for d in /proc/[0-9]*; do
		[ "$(cat "$d/comm" 2>/dev/null)" = postgres ] || continue
		pidfile="$d/cwd/postmaster.pid"
		if [ "$(sed -n 1p "$pidfile" 2>/dev/null)" = "${d#/proc/}" ] && [ "$(sed -n 4p "$pidfile" 2>/dev/null)" = "$pg_port" ]; then
			PG_PID="${d#/proc/}"
			break
		fi
	done
fi
DB_ARGS=()
[ -z "$PG_PID" ] || DB_ARGS=(-db-pid "$PG_PID")

# Smoke check: every target answers both modes in full.
for target in $TARGETS; do
	url="$(url_of "$target")" hdr=()
	[ "$target" != "$TARGET_C" ] || hdr=("${AUTH[@]}")
	curl -fsS "${hdr[@]}" -d "$BODY_STREAM" "$url" | grep -q '^data: \[DONE\]' || die "$url: stream did not end with [DONE]"
done

compact() { tr -d '\n\t' | sed 's/  */ /g'; }
reserved_zero() { case "$1" in *'"reserved": "0"'* | *'"reserved":"0"'*) return 0 ;; esac; return 1; }
[ -z "$HAS_WALLET" ] || WALLET_BEFORE="$(curl -fsS "$ADMIN/accounts/bench" | compact)"

load() { # load TARGET BODY LABEL [extra args]
	local target=$1 body=$2 label=$3 extra=()
	shift 3
	[ "$target" != "$TARGET_C" ] || extra=("${AUTH[@]}")
	GOMAXPROCS=1 "${PIN_LOAD[@]}" "$WORK/load" -url "$(url_of "$target")" -body "$body" -c "$CONC" \
		-label "$label" -json -cpu-pid "$CADDY_PID" -vars "http://127.0.0.1:$PORT_ADMIN/debug/vars" "${DB_ARGS[@]}" "${extra[@]}" "$@"
}

fleet_load() { # fleet_load TARGET BODY MODE [extra args]: TARGET (site B or C) on every instance at once, the clients split evenly
	local target=$1 body=$2 mode=$3 k c rc=0 pids=() db url auth
	shift 3
	for k in $(seq 1 "$INSTANCES"); do
		c=$((CONC / INSTANCES + (k <= CONC % INSTANCES ? 1 : 0)))
		url="${URLS_B[k]}" auth=()
		[ "$target" != "$TARGET_C" ] || url="${URLS_C[k]}" auth=("${AUTH[@]}")
		# The database serves them all: one load measures it, over the
		# same window as the others.
		db=()
		[ "$k" != 1 ] || [ "$target" != "$TARGET_C" ] || db=("${DB_ARGS[@]}")
		GOMAXPROCS=1 "${PIN_LOAD[@]}" "$WORK/load" -url "$url" -body "$body" -c "$c" \
			-label "$mode ${INSTANCES}x$target/$k" -json -cpu-pid "${CADDY_PIDS[k]}" "${db[@]}" "${auth[@]}" "$@" >"$WORK/fleet.$k" &
		pids+=($!)
	done
	for k in "${pids[@]}"; do
		wait "$k" || rc=1
	done
	for k in $(seq 1 "$INSTANCES"); do
		cat "$WORK/fleet.$k"
	done
	return $rc
}

mkdir -p "$OUT"
STAMP="$(date -u +%Y-%m-%dT%H%M%SZ)"
RAW="$OUT/$STAMP.jsonl"
TXT="$OUT/$STAMP.txt"
: >"$RAW"
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"

echo "bench: warming up" >&2
for mode in $MODES; do
	body=$BODY_JSON
	[ "$mode" = stream ] && body=$BODY_STREAM
	for target in $TARGETS; do
		load "$target" "$body" warm -d 2s -warmup 0s >/dev/null 2>&1
	done
	for target in $FLEETS; do
		fleet_load "$target" "$body" warm -d 2s -warmup 0s >/dev/null 2>&1
	done
done

for mode in $MODES; do
	body=$BODY_JSON
	[ "$mode" = stream ] && body=$BODY_STREAM
	for i in $(seq 1 "$REPS"); do
		for target in $TARGETS; do
			printf 'bench: %-6s %-22s run %d/%d: ' "$mode" "$target" "$i" "$REPS" >&2
			load "$target" "$body" "$mode $target" -d "$DURATION" -warmup "$WARMUP" >>"$RAW" ||
				die "load run failed: $mode $target"
		done
		for target in $FLEETS; do
			printf 'bench: %-6s %-22s run %d/%d:\n' "$mode" "${INSTANCES}x$target" "$i" "$REPS" >&2
			fleet_load "$target" "$body" "$mode" -d "$DURATION" -warmup "$WARMUP" >>"$RAW" ||
				die "load run failed: $mode ${INSTANCES}x$target"
		done
	done
done
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
if [ -n "$HAS_WALLET" ]; then
	# Every reservation must have been settled: nothing left reserved
	# (settlement follows the answer, so give the last ones a moment).
	for _ in $(seq 1 50); do
		WALLET_AFTER="$(curl -fsS "$ADMIN/accounts/bench" | compact)"
		! reserved_zero "$WALLET_AFTER" || break
		sleep 0.1
	done
	WALLET_LEDGER="$(curl -fsS "$ADMIN/accounts/bench/usage?limit=1" | compact)"
	# And the books balance: every balance is its credits minus its
	# charges, every reserved amount its live reservations.
	WALLET_AUDIT="$(curl -fsS "$ADMIN/audit" | compact)"
fi

{
	echo "llm_failover load benchmark, $STAMP"
	echo "commit:      $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
	echo "caddy:       $("$CADDY_BIN" version 2>/dev/null | cut -d' ' -f1) ($CADDY_BIN)"
	echo "go:          $("$GO" env GOVERSION)"
	echo "machine:     $(nproc --all) CPUs, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ //' || uname -m), $(uname -sr)"
	echo "load avg:    $LOAD_BEFORE before, $LOAD_AFTER after (1/5/15 min)"
	echo "pinning:     $PINNING"
	echo "load:        bench/load (Go, closed loop), $CONC clients, keep-alive, ${DURATION} measured after ${WARMUP} warm-up, $REPS runs per target alternating $(echo $TARGETS $(for t in $FLEETS; do echo "${INSTANCES}x$t"; done) | sed 's/ /, /g')"
	echo "upstream:    bench/upstream over $UPSTREAM, JSON answer $(curl -fsS -d "$BODY_JSON" "$URL_A" | wc -c) bytes; SSE $CHUNKS content chunks + finish + [DONE], event delay $EVENT_DELAY, role-only first chunk: $([ "$ROLE_CHUNK" = 1 ] && echo yes || echo no)"
	echo "targets:     reverse_proxy (flush_interval -1) vs llm_failover (1 channel, stream gate on, no wallet); both send the upstream a key; access logs off"
	if [ "$FAILOVER" != 0 ]; then
		echo "             $TARGET_C: two channels, the first $([ "$FAILOVER" = refused ] && echo "refusing connections" || echo "answering 503") (breaker never opens): every request fails over once"
	fi
	if [ -n "$HAS_WALLET" ]; then
		echo "             $TARGET_C: llm_failover + wallet $WALLET (price 3 15, API key per request); the load sends Authorization: Bearer <key>"
		[ -z "$FLEET_TARGET" ] ||
			echo "             $FLEET_TARGET: site C on $INSTANCES Caddy processes sharing the database, loaded together, $CONC clients split evenly; ${INSTANCES}xllm_failover: site B on the same processes, the machine's own scaling with no database"
		if [ "$WALLET" = postgres ]; then
			echo "postgres:    $([ -n "$PG_PID" ] && echo "postmaster pid $PG_PID; CPU of it and its backends per request (all the server did in the window)" || echo "CPU not measured (set BENCH_PG_PID to a local postmaster)")"
		fi
		echo "wallet:      account bench before $WALLET_BEFORE"
		echo "             after  $WALLET_AFTER"
		echo "             newest ledger row $(echo "$WALLET_LEDGER" | sed -n 's/.*"entries": *\[ *\({[^}]*}\).*/\1/p')"
		echo "             audit $WALLET_AUDIT"
	fi
	"$WORK/report" "$RAW" || echo "(some runs had errors; see above)"
	echo
	echo "Targets: llm_failover >= 0.9x reverse_proxy requests/s on one core; < 0.2 ms added p50"
	echo "latency; stream time to first byte within 1 ms of reverse_proxy."
	[ -z "$HAS_WALLET" ] || echo "Wallet: must not become the gateway's bottleneck (see bench/README.md)."
	echo "raw runs:    $RAW"
} >"$TXT"

for mode in $PROFILE; do
	body=$BODY_JSON
	[ "$mode" = stream ] && body=$BODY_STREAM
	for target in llm_failover $TARGET_C; do
		PROF="$OUT/$STAMP-$mode-$target.pprof"
		echo "bench: profiling Caddy for 10 s under an $target $mode load" >&2
		load "$target" "$body" profile -d 12s -warmup 0s >/dev/null 2>&1 &
		lp=$!
		sleep 1
		curl -fsS -o "$PROF" "http://127.0.0.1:$PORT_ADMIN/debug/pprof/profile?seconds=10" || die "could not fetch the profile"
		wait "$lp" || true
		echo "profile:     $PROF (go tool pprof -top $PROF)" >>"$TXT"
	done
done

echo
cat "$TXT"

# A benchmark that lost money is a failed one: after the load, nothing may
# stay reserved and the audit must be clean.
if [ -n "$HAS_WALLET" ]; then
	reserved_zero "$WALLET_AFTER" || die "after the runs the account still has money reserved: $WALLET_AFTER"
	case "$WALLET_AUDIT" in
	*'"clean": true'* | *'"clean":true'*) ;;
	*) die "the wallet's audit is not clean: $WALLET_AUDIT" ;;
	esac
fi
