#!/usr/bin/env bash
# How the gateway's cost grows with the work (issue 31, "Scaling"):
#   1. idle streams: N streams open at once, each waiting for its first
#      token (the upstream sends headers, then nothing for a while), through
#      reverse_proxy and through llm_failover, each in a fresh Caddy: the
#      RSS each open stream adds, and whether all are served once the
#      tokens come;
#   2. a long stream: one stream of 100,000 events through llm_failover,
#      Caddy's RSS sampled every 100 ms (it must stay flat);
#   3. many models: configs of 1, 100 and 1,000 models (each with its own
#      channel) loaded in turn into one Caddy, SCALE_ROUNDS rounds (default
#      5) interleaved: the time of each `POST /load` (a reload), the RSS
#      after it, and the CPU a request of one model costs (closed loop, 8
#      clients, 2 s), medians over the rounds.
# Caddy runs with GOMAXPROCS=2 here (the scaling figures are memory and
# reload time, not one-core capacity). It builds no Caddy: `make bench`.
#   CADDY_BIN     Caddy with llm_failover (default ./caddy)
#   SCALE_TARGETS the idle-stream targets (default "reverse_proxy llm_failover
#                 llm_failover+512MiB"; also llm_failover+1KiB_buffers: the
#                 channel transport's buffers at 1 KiB; and
#                 reverse_proxy+h2c_upstream, llm_failover+h2c_upstream: the
#                 upstream reached over HTTP/2 without TLS, as hosted
#                 providers are over TLS)
#   SCALE_STREAMS open streams per run (default "1000 9000": this machine's
#                 20,000 open files per process caps Caddy, which holds two
#                 sockets per stream, below 10,000)
#   SCALE_CLIENTS h1 (default: each stream on a connection of its own) or
#                 h2c (HTTP/2 without TLS, up to 250 streams a connection:
#                 Caddy then holds about one socket per stream, so 10,000
#                 fit)
#   SCALE_PARTS   which parts run (default "streams long models")
#   BENCH_PORT    first port (default 18280)
#   BENCH_OUT     results directory (default bench/results)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CADDY_BIN="${CADDY_BIN:-$ROOT/caddy}"
STREAMS="${SCALE_STREAMS:-1000 9000}"
PORT="${BENCH_PORT:-18280}"
OUT="${BENCH_OUT:-$ROOT/bench/results}"
GO="${GO:-go}"
PORT_SITE=$((PORT + 1)) PORT_UP=$((PORT + 10)) PORT_LONG=$((PORT + 11)) PORT_ADMIN=$((PORT + 19))
NAME=scale
PARTS=" ${SCALE_PARTS:-streams long models} "
part() { [[ "$PARTS" == *" $1 "* ]]; }
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
[ -x "$CADDY_BIN" ] || die "no Caddy binary at $CADDY_BIN (run 'make bench', or set CADDY_BIN)"

"$GO" build -o "$WORK/upstream" ./bench/upstream
"$GO" build -o "$WORK/load" ./bench/load

RES="$OUT/scale-$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$RES"
REPORT="$RES/summary.md"
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ); machine: $(nproc --all) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); open files per process: $(ulimit -n)"
	echo "caddy: $("$CADDY_BIN" version); GODEBUG: ${GODEBUG:-unset}; clients: ${SCALE_CLIENTS:-h1}"
	echo
} >"$REPORT"

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

# caddy_start CADDYFILE: runs Caddy on it, sets CADDY.
caddy_start() {
	XDG_DATA_HOME="$WORK/data" XDG_CONFIG_HOME="$WORK/config" GOMAXPROCS=2 \
		"$CADDY_BIN" run --config "$1" --adapter caddyfile >>"$WORK/caddy.log" 2>&1 &
	CADDY=$!
	PIDS+=("$CADDY")
	wait_port "$PORT_ADMIN"
	wait_port "$PORT_SITE"
}
caddy_stop() {
	kill "$CADDY" 2>/dev/null || true
	wait "$CADDY" 2>/dev/null || true
}
global() { # GLOBAL_EXTRA: more global options
	cat <<EOF
{
	admin 127.0.0.1:$PORT_ADMIN
	auto_https off
	persist_config off
	skip_install_trust
	grace_period 1s
	${GLOBAL_EXTRA:-}
	${SERVERS_EXTRA:-}
}
EOF
}

if part streams; then
	# 1. Idle streams: the first token comes 40 s after the headers.
	"$WORK/upstream" -listen "127.0.0.1:$PORT_UP" -first-token-delay 40s 2>"$WORK/upstream.log" &
	PIDS+=($!)
	wait_port "$PORT_UP"
	{
		echo "## Idle streams (each waiting 40 s for its first token)"
		echo
		echo "| proxy | streams | most open at the upstream | RSS before (MiB) | RSS with them open (MiB) | KiB per open stream | answered (200) | completed ([DONE]) | refused (other status) | failed |"
		echo "|---|---|---|---|---|---|---|---|---|---|"
	} >>"$REPORT"
	BODY='{"model":"m","stream":true,"messages":[{"role":"user","content":"Say hello."}]}'
	CLIENTS="${SCALE_CLIENTS:-h1}" HOLD_FLAGS=() SERVERS_EXTRA="" LABEL=""
	case "$CLIENTS" in
	h1) ;;
	h2c)
		HOLD_FLAGS=(-h2c) LABEL=" (h2c clients)"
		SERVERS_EXTRA="servers {
			protocols h1 h2c
		}"
		;;
	*) die "SCALE_CLIENTS is h1 or h2c, not $CLIENTS" ;;
	esac
	# llm_failover+512MiB: the same with a memory budget (max_held_bytes) of
	# 512 MiB: the default 256 MiB counts 32 KiB for each stream waiting in
	# the gate, so it refuses (503 gateway_overloaded) the streams past 8,192.
	for target in ${SCALE_TARGETS:-reverse_proxy llm_failover llm_failover+512MiB}; do
		for n in $STREAMS; do
			GLOBAL_EXTRA=""
			[ "$target" != llm_failover+512MiB ] || GLOBAL_EXTRA="llm_failover {
			max_held_bytes 512MiB
		}"
			{
				global
				GLOBAL_EXTRA=""
				echo "http://127.0.0.1:$PORT_SITE {"
				echo "	bind 127.0.0.1"
				# The transport to the upstream: net/http's defaults (HTTP/1.1
				# here, one connection a stream), buffers of 1 KiB instead of
				# 4 KiB each, or HTTP/2 without TLS, many streams a connection,
				# as a channel to a hosted provider over TLS speaks.
				transport=""
				case "$target" in
				*+1KiB_buffers) transport="transport http {
				read_buffer 1KiB
				write_buffer 1KiB
			}" ;;
				*+h2c_upstream) transport="transport http {
				versions h2c
			}" ;;
				esac
				case "$target" in
				reverse_proxy*)
					printf '\treverse_proxy 127.0.0.1:%s {\n\t\tflush_interval -1\n\t\t%s\n\t}\n' "$PORT_UP" "$transport"
					;;
				*)
					printf '\tllm_failover {\n\t\tchannel up http://127.0.0.1:%s {\n\t\t\t%s\n\t\t}\n\t\tmodel m {\n\t\t\troute up\n\t\t}\n\t\tauth off\n\t}\n' "$PORT_UP" "$transport"
					;;
				esac
				echo "}"
			} >"$WORK/Caddyfile.streams"
			caddy_start "$WORK/Caddyfile.streams"
			sleep 1
			before=$(rss_kb "$CADDY")
			"$WORK/load" -url "http://127.0.0.1:$PORT_SITE/v1/chat/completions" -body "$BODY" -hold "$n" "${HOLD_FLAGS[@]}" -d 60s >"$WORK/hold.json" &
			HOLD=$!
			# Until every stream is open at the upstream, or 30 s: the most
			# that were open at once, and Caddy's RSS then.
			open=0 with=0
			for _ in $(seq 300); do
				now=$(curl -s "http://127.0.0.1:$PORT_UP/stats")
				if [ "$now" -gt "$open" ]; then
					open=$now
					with=$(rss_kb "$CADDY")
				fi
				[ "$now" -ge "$n" ] && break
				sleep 0.1
			done
			sleep 2
			[ "$(curl -s "http://127.0.0.1:$PORT_UP/stats")" -lt "$open" ] || with=$(rss_kb "$CADDY")
			wait "$HOLD" || true
			answered=$(sed -n 's/.*"answered":\([0-9]*\).*/\1/p' "$WORK/hold.json")
			refused=$(sed -n 's/.*"refused":\([0-9]*\).*/\1/p' "$WORK/hold.json")
			failed=$(sed -n 's/.*"failed":\([0-9]*\).*/\1/p' "$WORK/hold.json")
			completed=$(sed -n 's/.*"completed":\([0-9]*\).*/\1/p' "$WORK/hold.json")
			caddy_stop
			per=$(awk -v a="$before" -v b="$with" -v n="$open" 'BEGIN { printf "%.1f", (b - a) / n }')
			printf '| %s | %s | %s | %.1f | %.1f | %s | %s | %s | %s | %s |\n' "$target$LABEL" "$n" "$open" \
				"$(echo "$before / 1024" | bc -l)" "$(echo "$with / 1024" | bc -l)" "$per" "$answered" "$completed" "$refused" "$failed" >>"$REPORT"
			for _ in $(seq 100); do [ "$(curl -s "http://127.0.0.1:$PORT_UP/stats")" = 0 ] && break; sleep 0.1; done
		done
	done
fi

if part long; then
	# 2. A long stream: 100,000 events.
	"$WORK/upstream" -listen "127.0.0.1:$PORT_LONG" -chunks 100000 2>"$WORK/upstream-long.log" &
	PIDS+=($!)
	wait_port "$PORT_LONG"
	{
		global
		printf 'http://127.0.0.1:%s {\n\tbind 127.0.0.1\n\tllm_failover {\n\t\tchannel up http://127.0.0.1:%s\n\t\tmodel m {\n\t\t\troute up\n\t\t}\n\t\tauth off\n\t}\n}\n' "$PORT_SITE" "$PORT_LONG"
	} >"$WORK/Caddyfile.long"
	caddy_start "$WORK/Caddyfile.long"
	sleep 1
	before=$(rss_kb "$CADDY")
	curl -sN -o "$WORK/long.sse" -H 'Content-Type: application/json' -d "$BODY" "http://127.0.0.1:$PORT_SITE/v1/chat/completions" &
	CURL=$!
	max=$before samples=0
	while kill -0 "$CURL" 2>/dev/null; do
		r=$(rss_kb "$CADDY")
		[ "$r" -gt "$max" ] && max=$r
		samples=$((samples + 1))
		sleep 0.1
	done
	events=$(grep -c '^data: ' "$WORK/long.sse" || true)
	after=$(rss_kb "$CADDY")
	caddy_stop
	{
		echo
		echo "## A long stream through llm_failover"
		echo
		echo "$events events ($(du -h "$WORK/long.sse" | cut -f1)) in one stream; Caddy's RSS before $((before / 1024)) MiB, at most $((max / 1024)) MiB over $samples samples every 100 ms, $((after / 1024)) MiB after."
	} >>"$REPORT"
fi

if part models; then
	# 3. Many models, each with its own channel, loaded in turn.
	models_config() { # models_config M
		global
		echo "http://127.0.0.1:$PORT_SITE {"
		echo "	bind 127.0.0.1"
		echo "	llm_failover {"
		for i in $(seq 0 $(($1 - 1))); do
			printf '\t\tchannel c%d http://127.0.0.1:%s\n\t\tmodel m%d {\n\t\t\troute c%d\n\t\t}\n' "$i" "$PORT_UP2" "$i" "$i"
		done
		echo "		auth off"
		echo "	}"
		echo "}"
	}
	PORT_UP2=$((PORT + 12))
	"$WORK/upstream" -listen "127.0.0.1:$PORT_UP2" 2>"$WORK/upstream-models.log" &
	PIDS+=($!)
	wait_port "$PORT_UP2"
	models_config 1 >"$WORK/Caddyfile.m1"
	caddy_start "$WORK/Caddyfile.m1"
	ROUNDS="${SCALE_ROUNDS:-5}"
	{
		echo
		echo "## Many models (each with its own channel), loaded in turn into one Caddy"
		echo
		echo "$ROUNDS rounds, each loading 1, 100 and 1,000 models in turn and loading model m0 for 2 s (8 clients) after each: medians, then every round's CPU figure."
		echo
		echo "| models | POST /load (ms) | RSS after (MiB) | requests/s | server CPU µs/request | every round |"
		echo "|---|---|---|---|---|---|"
	} >>"$REPORT"
	declare -A TOOK RSS RPS CPU
	for m in 1 100 1000; do
		models_config "$m" >"$WORK/Caddyfile.m$m"
	done
	median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
	for round in $(seq "$ROUNDS"); do
		for m in 1 100 1000; do
			start=$(date +%s%N)
			curl -sf -X POST -H 'Content-Type: text/caddyfile' --data-binary "@$WORK/Caddyfile.m$m" "http://127.0.0.1:$PORT_ADMIN/load" >/dev/null ||
				die "loading $m models failed"
			TOOK[$m]="${TOOK[$m]:-} $((($(date +%s%N) - start) / 1000000))"
			sleep 0.5
			RSS[$m]="${RSS[$m]:-} $(rss_kb "$CADDY")"
			"$WORK/load" -url "http://127.0.0.1:$PORT_SITE/v1/chat/completions" -body '{"model":"m0","messages":[{"role":"user","content":"Say hello."}]}' \
				-c 8 -d 2s -warmup 0.5s -json -cpu-pid "$CADDY" >"$WORK/m$m.json" 2>/dev/null
			RPS[$m]="${RPS[$m]:-} $(sed -n 's/.*"rps":\([0-9.]*\).*/\1/p' "$WORK/m$m.json")"
			CPU[$m]="${CPU[$m]:-} $(sed -n 's/.*"server_cpu_us_per_request":\([0-9.]*\).*/\1/p' "$WORK/m$m.json")"
		done
	done
	for m in 1 100 1000; do
		printf '| %s | %s | %.1f | %.0f | %.1f | %s |\n' "$m" "$(echo "${TOOK[$m]}" | median)" "$(echo "$(echo "${RSS[$m]}" | median) / 1024" | bc -l)" \
			"$(echo "${RPS[$m]}" | median)" "$(echo "${CPU[$m]}" | median)" "$(echo "${CPU[$m]}" | sed 's/^ //')" >>"$REPORT"
	done
	caddy_stop
fi
cat "$REPORT"
echo "scale: results in $RES"
