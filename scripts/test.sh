#!/usr/bin/env bash
# The whole test suite; `make test` runs it after building ./caddy.
set -euo pipefail
cd "$(dirname "$0")/.."

# A real PostgreSQL for the wallet tests (started as the postgres user).
eval "$(bash scripts/pg-test-server.sh start)"
export LLMF_TEST_POSTGRES_DSN
# The end-to-end tests drive the xcaddy-built binary.
export LLMF_CADDY_BIN="$PWD/caddy"
# The short soak (soak/) drives the race-built one (`make caddy-race`), so
# that a data race in either gateway fails it; it starts a PostgreSQL
# cluster of its own, which it restarts.
if [[ ! -x caddy-race ]]; then
	go build -race -o caddy-race ./soak/caddymain.go
fi
export LLMF_SOAK_CADDY_BIN="$PWD/caddy-race"
# caddytest writes autosave.json and data under XDG dirs: keep them out of $HOME.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export XDG_CONFIG_HOME="$scratch/config" XDG_DATA_HOME="$scratch/data"

go test -race -count=1 -timeout 20m ./...

# Short coverage-guided runs of every fuzzer (the seed corpora already ran
# above): 7s each keeps CI inside its 15 minutes on 2 cores; run
# `make fuzz FUZZTIME=60s` (or one target, longer) after
# changing a parser.
FUZZTIME="${FUZZTIME:-7s}" bash scripts/fuzz.sh
