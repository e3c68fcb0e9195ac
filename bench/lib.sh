# Shared by bench/latency.sh and bench/scale.sh (sourced, after NAME is
# set): failing with a message, a work directory removed at exit with the
# processes started into PIDS (and the commands in AT_EXIT run), and
# waiting for a port to answer.

die() { echo "$NAME: $*" >&2; exit 1; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/llmf-$NAME.XXXXXX")"
PIDS=()
# AT_EXIT: commands run at exit after the processes end, e.g. putting back
# a machine setting the run changed.
AT_EXIT=()
cleanup() {
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
	for cmd in "${AT_EXIT[@]}"; do eval "$cmd" || true; done
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_port PORT: until something answers on 127.0.0.1:PORT (10 s at most).
wait_port() {
	for _ in $(seq 200); do
		(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
		sleep 0.05
	done
	die "port $1 never answered"
}
