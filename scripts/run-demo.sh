#!/usr/bin/env bash
# Serves Caddyfile.example with ./caddy, creates a funded demo account and
# key on first run, prints a curl to try, and stays in the foreground.
set -euo pipefail
cd "$(dirname "$0")/.."
export XDG_DATA_HOME="${XDG_DATA_HOME:-$PWD/.data}" XDG_CONFIG_HOME="${XDG_CONFIG_HOME:-$PWD/.data/config}"
export FLAKY_API_KEY="${FLAKY_API_KEY:-demo-flaky-key}" OVERLOADED_API_KEY="${OVERLOADED_API_KEY:-demo-overloaded-key}" BACKUP_API_KEY="${BACKUP_API_KEY:-demo-backup-key}"

./caddy run --config Caddyfile.example --adapter caddyfile &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' INT TERM EXIT

for _ in $(seq 100); do
	curl -fsS -o /dev/null localhost:2019/llm_wallet/status 2>/dev/null && break
	kill -0 $pid 2>/dev/null || exit 1
	sleep 0.1
done

keyfile="$XDG_DATA_HOME/demo-key"
if [[ ! -s "$keyfile" ]]; then
	./caddy llm-wallet --address localhost:2019 create-account demo >/dev/null 2>&1 || true
	./caddy llm-wallet --address localhost:2019 credit demo 5 "demo credit" >/dev/null
	# The account the probes are charged to (probe_account demo-probes).
	./caddy llm-wallet --address localhost:2019 create-account demo-probes >/dev/null 2>&1 || true
	./caddy llm-wallet --address localhost:2019 credit demo-probes 1 "probe budget" >/dev/null
	./caddy llm-wallet --address localhost:2019 create-key demo demo | awk '$1=="key"{print $2}' >"$keyfile"
fi
KEY=$(cat "$keyfile")

cat <<MSG

llm_failover is serving Caddyfile.example on http://localhost:8080 (admin on localhost:2019).
The demo account has \$5; its key is: $KEY
Channels: "flaky" answers 503, "overloaded" answers 200 with an error inside
its stream, "backup" is healthy. Every answer below comes from "backup".

  export KEY=$KEY
Each API, in its own format:
  curl -s localhost:8080/v1/chat/completions -H "Authorization: Bearer \$KEY" \\
       -d '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}'
  curl -s localhost:8080/v1/responses -H "Authorization: Bearer \$KEY" \\
       -d '{"model":"gpt-4o-mini","input":"hi"}'
  curl -s localhost:8080/v1/embeddings -H "Authorization: Bearer \$KEY" \\
       -d '{"model":"gpt-4o-mini","input":"hi"}'
  curl -sN localhost:8080/v1/messages -H "x-api-key: \$KEY" -H "anthropic-version: 2023-06-01" \\
       -d '{"model":"claude-sonnet-4","max_tokens":256,"stream":true,"messages":[{"role":"user","content":"hi"}]}'
Where to look:
  status page      http://localhost:8080/status  (what clients got, breakers, incidents, probes, runbooks)
  readiness        curl -s localhost:8080/status/ready
  failovers        the "failover" log lines below; ./caddy llm-failover decisions --since 1h
  breakers         curl -s localhost:2019/llm_failover/channels
  probes           claude-sonnet-4's idle channels every 30 s, charged to demo-probes (status page, "synthetic checks")
  heartbeat        each prober run pings http://127.0.0.1:9509 (its access log lines below); curl -s localhost:2019/llm_failover/jobs
  history          $XDG_DATA_HOME/caddy/llm_failover/history.db: the status page keeps it across restarts
  fallbacks        ./caddy llm-failover drill   (each channel made to fail in turn)
  the ledger       ./caddy llm-wallet usage demo

Ctrl-C stops it.
MSG
wait $pid
