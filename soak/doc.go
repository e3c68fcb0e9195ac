// Package soak holds the gateway's soak test: two caddy processes built
// with llm_failover share one PostgreSQL (wallet, history, probe leader)
// and serve mixed traffic, JSON and streams of every client API, billed
// and unbilled, through every provider adapter's fake, while faults are
// injected on a schedule (upstream resets, cuts after content, stalls, 5xx
// bursts, 429 with and without Retry-After, malformed frames, a slow
// client, `caddy reload` every few seconds, PostgreSQL restarted once and
// its connections terminated once, one instance killed with -9 and
// restarted). At the end it checks the books request by request, the
// streams, the leases, the audit, the processes' resources and logs.
//
// Everything is in soak_test.go and its helpers: this package has no code
// of its own. caddymain.go (build-ignored) is the main of the race-built
// binary `make test` runs the short soak against:
//
//	go build -race -o caddy-race ./soak/caddymain.go
//
// Environment:
//
//	LLMF_SOAK                 how long traffic runs (default 60s); `make soak` runs 30m
//	LLMF_SOAK_CADDY_BIN       the binary under test (default LLMF_CADDY_BIN)
//	LLMF_SOAK_PORT_BASE       ports base+1..base+5 (default 19600)
//	LLMF_SOAK_OUT             keep the client log, caddy logs and report here
//	CI=true                   a missing prerequisite fails instead of skipping
package soak
