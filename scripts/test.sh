#!/usr/bin/env bash
# The whole test suite; `make test` runs it after building ./caddy.
set -euo pipefail
cd "$(dirname "$0")/.."

# A real PostgreSQL for the wallet tests (started as the postgres user).
eval "$(bash scripts/pg-test-server.sh start)"
export LLMF_TEST_POSTGRES_DSN
# The end-to-end tests drive the xcaddy-built binary.
export LLMF_CADDY_BIN="$PWD/caddy"
# caddytest writes autosave.json and data under XDG dirs: keep them out of $HOME.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export XDG_CONFIG_HOME="$scratch/config" XDG_DATA_HOME="$scratch/data"

go test -race -count=1 -timeout 20m ./...

# Short coverage-guided runs of every fuzzer (the seed corpora already ran above).
FUZZTIME="${FUZZTIME:-10s}" bash scripts/fuzz.sh
