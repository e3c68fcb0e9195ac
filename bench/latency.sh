#!/usr/bin/env bash
# Fixed-rate latency benchmark: the latency a gateway adds at a constant
# request rate, measured the way peers publish it (open loop, no
# coordinated omission), against the upstream read directly and plain
# reverse_proxy in the same run.
#
# Starts ONE Caddy serving, on loopback: site A `reverse_proxy` (flush_interval -1), site B
# `llm_failover` (one channel, defaults), site F `llm_failover` where every
# request fails over once (its first channel answers 503, its breaker never
# opens), and sites G and H where every request fails over once from a
# connection reset and from an in-stream error frame (BENCH_TARGETS picks
# them), and sites W and P billing every request to a wallet (embedded
# SQLite; PostgreSQL when BENCH_PG_DSN is set). Caddy is pinned to CPU 0
# with GOMAXPROCS=1; the load generator and the fake upstream share CPU 1
# (this machine has two cores; peers pin the generator apart, which is not
# possible here), in ONE process: each run of bench/load serves the fake
# provider (bench/upstream/fake) itself (-upstream), so that the two take
# turns as goroutines of one runtime, not as processes the kernel switches
# between every few milliseconds. For each mode (json,
# stream) and rate, each target runs REPS times, alternating direct A B F
# direct A B F, each run an open loop (bench/load -rate) of DURATION after
# WARMUP at that rate. bench/latency then prints, per rate, the latency
# each target adds to the direct run of the same repetition (p50, p90,
# p99, p99.9; time to first byte for streams) and draws it.
#
# It builds no Caddy: `make bench` builds ./caddy first. Environment:
#   CADDY_BIN       Caddy with llm_failover (default ./caddy)
#   BENCH_RATES     rates in requests per second (default "250 500 1000 1500 2000 3000")
#   BENCH_MODES     "json stream" (default both)
#   BENCH_REPS      repetitions per target and rate (default 3)
#   BENCH_DURATION  measured time of one run (default 5s)
#   BENCH_WARMUP    discarded warm-up before each run (default 1s)
#   BENCH_CHUNKS    content chunks per stream (default 20)
#   BENCH_TARGETS   targets to run (default "direct go_floor reverse_proxy
#                   llm_failover llm_failover+failover_once"; go_floor is
#                   bench/floorproxy, the standard library's reverse proxy
#                   and nothing else, pinned like Caddy: the least any Go
#                   proxy adds on this machine; also
#                   llm_failover+reset_once, llm_failover+error_frame_once,
#                   llm_failover+wallet_sqlite, llm_failover+wallet_postgres)
#   BENCH_PG_DSN    the PostgreSQL of site P's wallet (wallet_postgres)
#   BENCH_PORT      first port (default 18180): +1 A, +2 B, +3 F, +8 go_floor, +10 upstream, +19 admin
#   BENCH_OUT       results directory (default bench/results)
#   BENCH_HALT_POLL guest halt polling for the run, in ns (default: leave the
#                   machine's setting). In a VM whose kernel idles with the
#                   haltpoll cpuidle driver, an idle vCPU polls this long
#                   before it halts; a halted vCPU is woken through the
#                   hypervisor, which at a fixed rate below the knee is most
#                   of a request's tail (bench/README.md). Needs root;
#                   the setting is put back at exit.
# Results: $BENCH_OUT/latency-<stamp>/ holds results.jsonl (one JSON line
# per run), q/<mode>-<target>-<rate>-<rep>.txt (each run's quantile
# ladder: every half percent and the tail), summary.md and latency.svg.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CADDY_BIN="${CADDY_BIN:-$ROOT/caddy}"
RATES="${BENCH_RATES:-250 500 1000 1500 2000 3000}"
MODES="${BENCH_MODES:-json stream}"
REPS="${BENCH_REPS:-3}"
DURATION="${BENCH_DURATION:-5s}"
WARMUP="${BENCH_WARMUP:-1s}"
CHUNKS="${BENCH_CHUNKS:-20}"
PORT="${BENCH_PORT:-18180}"
OUT="${BENCH_OUT:-$ROOT/bench/results}"
GO="${GO:-go}"

NAME=latency
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
[ -x "$CADDY_BIN" ] || die "no Caddy binary at $CADDY_BIN (run 'make bench', or set CADDY_BIN)"
PORT_A=$((PORT + 1)) PORT_B=$((PORT + 2)) PORT_F=$((PORT + 3)) PORT_G=$((PORT + 4)) PORT_H=$((PORT + 5))
PORT_W=$((PORT + 6)) PORT_P=$((PORT + 7)) PORT_FLOOR=$((PORT + 8)) PORT_UP=$((PORT + 10)) PORT_ADMIN=$((PORT + 19))
for p in "$PORT_A" "$PORT_B" "$PORT_F" "$PORT_G" "$PORT_H" "$PORT_W" "$PORT_P" "$PORT_FLOOR" "$PORT_UP" "$PORT_ADMIN"; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
		die "port $p is already in use (set BENCH_PORT)"
	fi
done


# How an idle vCPU waits: what wakes it again is on every request's path
# at a fixed rate (bench/README.md, "The tail taken apart").
HALT_POLL_FILE=/sys/module/haltpoll/parameters/guest_halt_poll_ns
IDLING="$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo unknown) cpuidle driver"
if [ -n "${BENCH_HALT_POLL:-}" ]; then
	[ -w "$HALT_POLL_FILE" ] || die "BENCH_HALT_POLL needs the haltpoll cpuidle driver and root ($HALT_POLL_FILE)"
	case "$BENCH_HALT_POLL" in '' | *[!0-9]*) die "BENCH_HALT_POLL is a number of nanoseconds" ;; esac
	HALT_POLL_WAS="$(cat "$HALT_POLL_FILE")"
	AT_EXIT+=("echo $HALT_POLL_WAS >$HALT_POLL_FILE")
	echo "$BENCH_HALT_POLL" >"$HALT_POLL_FILE"
	IDLING+=", guest halt polling $BENCH_HALT_POLL ns for this run (BENCH_HALT_POLL; the machine's: $HALT_POLL_WAS ns)"
elif [ -r "$HALT_POLL_FILE" ]; then
	IDLING+=", guest halt polling $(cat "$HALT_POLL_FILE") ns"
fi

PIN_CADDY=() PIN_LOAD=() PINNING="none (taskset missing or fewer than 2 CPUs)"
if command -v taskset >/dev/null && [ "$(nproc --all)" -ge 2 ]; then
	PIN_CADDY=(taskset -c 0) PIN_LOAD=(taskset -c 1)
	PINNING="caddy on CPU 0 (GOMAXPROCS=1); load generator and upstream on CPU 1, one process"
fi

"$GO" build -o "$WORK/load" ./bench/load
"$GO" build -o "$WORK/latency" ./bench/latency
"$GO" build -o "$WORK/floorproxy" ./bench/floorproxy

# site PORT BODY: a loopback site on PORT whose llm_failover block is BODY.
site() {
	printf 'http://127.0.0.1:%s {\n\tbind 127.0.0.1\n\tllm_failover {\n%s\n\t}\n}\n' "$1" "$2"
}
# billed WALLET: one channel, billed to WALLET.
billed() {
	printf '\t\tchannel up http://127.0.0.1:%s\n\t\tmodel m {\n\t\t\troute up cost 1 1\n\t\t}\n\t\twallet %s' "$PORT_UP" "$1"
}
# failing_once PATH: every request fails over once, from the upstream's
# PATH (its breaker never opens) to the backup.
failing_once() {
	printf '\t\tchannel down http://127.0.0.1:%s%s\n\t\tchannel backup http://127.0.0.1:%s\n\t\tmodel m {\n\t\t\troute down cost 1 1\n\t\t\troute backup cost 2 2\n\t\t}\n\t\tbreaker {\n\t\t\tfailures 64\n\t\t\twindow 1ms\n\t\t}' "$PORT_UP" "$1" "$PORT_UP"
}
# Site P's wallet, on PostgreSQL, only with BENCH_PG_DSN.
PG_WALLET="" PG_SITE=""
if [ -n "${BENCH_PG_DSN:-}" ]; then
	PG_WALLET="	llm_wallet pg {
		store postgres {env.BENCH_PG_DSN}
	}"
	PG_SITE="$(site "$PORT_P" "$(billed pg)")"
fi
cat >"$WORK/Caddyfile" <<EOF
{
	admin 127.0.0.1:$PORT_ADMIN
	auto_https off
	persist_config off
	skip_install_trust
	grace_period 1s
	llm_wallet default {
		store sqlite
	}
$PG_WALLET
}
http://127.0.0.1:$PORT_A {
	bind 127.0.0.1
	reverse_proxy 127.0.0.1:$PORT_UP {
		flush_interval -1
	}
}
$(site "$PORT_B" "		channel up http://127.0.0.1:$PORT_UP
		model m {
			route up
		}")
$(site "$PORT_F" "$(failing_once /fail)")
$(site "$PORT_G" "$(failing_once /reset)")
$(site "$PORT_H" "$(failing_once /errorframe)")
$(site "$PORT_W" "$(billed default)")
$PG_SITE
EOF

XDG_DATA_HOME="$WORK/data" XDG_CONFIG_HOME="$WORK/config" GOMAXPROCS=1 \
	"${PIN_CADDY[@]}" "$CADDY_BIN" run --config "$WORK/Caddyfile" --adapter caddyfile >"$WORK/caddy.log" 2>&1 &
CADDY_PID=$!
PIDS+=("$CADDY_PID")
GOMAXPROCS=1 "${PIN_CADDY[@]}" "$WORK/floorproxy" -listen "127.0.0.1:$PORT_FLOOR" -upstream "http://127.0.0.1:$PORT_UP" 2>"$WORK/floorproxy.log" &
FLOOR_PID=$!
PIDS+=("$FLOOR_PID")
for p in "$PORT_A" "$PORT_B" "$PORT_F" "$PORT_G" "$PORT_H" "$PORT_W" "$PORT_FLOOR"; do
	wait_port "$p"
done

# A wallet account with ample money and its key, in each wallet, through
# the admin API (walletapp/admin.go); the key's secret stays in $WORK.
declare -A AUTH=()
wallet_key() { # wallet-name target
	local admin="http://127.0.0.1:$PORT_ADMIN/llm_wallet/$1" code
	code="$(curl -sS -o "$WORK/account.json" -w '%{http_code}' -d '{"id":"bench"}' "$admin/accounts")"
	case "$code" in
	201 | 409) ;;
	*) die "creating the $1 wallet's account: HTTP $code: $(cat "$WORK/account.json"); caddy: $(tail -n 5 "$WORK/caddy.log")" ;;
	esac
	curl -fsS -o /dev/null -d '{"amount":"1000000","note":"bench"}' "$admin/accounts/bench/credit" || die "crediting the $1 wallet failed"
	curl -fsS -o "$WORK/key.json" -d '{"label":"bench"}' "$admin/accounts/bench/keys" || die "creating the $1 wallet's key failed"
	AUTH[$2]="Authorization: Bearer $(sed -n 's/.*"key": *"\([^"]*\)".*/\1/p' "$WORK/key.json")"
}
command -v curl >/dev/null || die "curl is needed"
# The listeners answer a moment before the config's apps are the admin
# API's active ones.
for _ in $(seq 50); do
	curl -fsS -o /dev/null "http://127.0.0.1:$PORT_ADMIN/llm_wallet/default/status" && break
	sleep 0.2
done
wallet_key default llm_failover+wallet_sqlite
if [ -n "${BENCH_PG_DSN:-}" ]; then
	wait_port "$PORT_P"
	wallet_key pg llm_failover+wallet_postgres
fi

STAMP="$(date -u +%Y%m%d-%H%M%S)"
RES="$OUT/latency-$STAMP"
mkdir -p "$RES/q"
declare -A URL=(
	[direct]="http://127.0.0.1:$PORT_UP/v1/chat/completions"
	[go_floor]="http://127.0.0.1:$PORT_FLOOR/v1/chat/completions"
	[reverse_proxy]="http://127.0.0.1:$PORT_A/v1/chat/completions"
	[llm_failover]="http://127.0.0.1:$PORT_B/v1/chat/completions"
	[llm_failover+failover_once]="http://127.0.0.1:$PORT_F/v1/chat/completions"
	[llm_failover+reset_once]="http://127.0.0.1:$PORT_G/v1/chat/completions"
	[llm_failover+error_frame_once]="http://127.0.0.1:$PORT_H/v1/chat/completions"
	[llm_failover+wallet_sqlite]="http://127.0.0.1:$PORT_W/v1/chat/completions"
	[llm_failover+wallet_postgres]="http://127.0.0.1:$PORT_P/v1/chat/completions"
)
TARGETS="${BENCH_TARGETS:-direct go_floor reverse_proxy llm_failover llm_failover+failover_once}"
{
	echo "date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "machine: $(nproc --all) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
	echo "idling:  $IDLING"
	echo "gc:      caddy and the floor proxy with GOGC=${GOGC:-100, the default}${GOMEMLIMIT:+, GOMEMLIMIT=$GOMEMLIMIT}"
	echo "pinning: $PINNING"
	echo "load:    bench/load -rate -upstream (open loop, requests sent within microseconds of when due, latency from then; GOGC=400; the fake upstream in the same process), ${DURATION} after ${WARMUP} warm-up, $REPS repetitions alternating $TARGETS"
	echo "rates:   $RATES; modes: $MODES; stream chunks: $CHUNKS"
	echo "caddy:   $("$CADDY_BIN" version)"
} >"$RES/setup.txt"
cat "$RES/setup.txt"

for mode in $MODES; do
	stream=false
	[ "$mode" = stream ] && stream=true
	body="{\"model\":\"m\",\"stream\":$stream,\"messages\":[{\"role\":\"user\",\"content\":\"Say hello.\"}]}"
	for rate in $RATES; do
		for rep in $(seq "$REPS"); do
			for target in $TARGETS; do
				extra=()
				if [ -n "${AUTH[$target]:-}" ]; then
					extra=(-H "${AUTH[$target]}")
				fi
				# The proxy's CPU over the measured window.
				case "$target" in
				direct) ;;
				go_floor) extra+=(-cpu-pid "$FLOOR_PID") ;;
				*) extra+=(-cpu-pid "$CADDY_PID" -vars "http://127.0.0.1:$PORT_ADMIN/debug/vars") ;;
				esac
				"${PIN_LOAD[@]}" "$WORK/load" -upstream "127.0.0.1:$PORT_UP" -upstream-chunks "$CHUNKS" -url "${URL[$target]}" "${extra[@]}" -body "$body" -rate "$rate" -d "$DURATION" -warmup "$WARMUP" \
					-json -label "$mode $target $rate" -quantiles "$RES/q/$mode-$target-$rate-$rep.txt" >>"$RES/results.jsonl"
			done
		done
	done
done

"$WORK/latency" -svg "$RES/latency.svg" "$RES/results.jsonl" | tee "$RES/summary.md"
echo "latency: results in $RES"
