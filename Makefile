# make run   builds ./caddy with xcaddy and serves Caddyfile.example (offline demo)
# make test  runs the whole suite: vet, unit, fuzz seeds, race, in-process
#            Caddy, PostgreSQL, the xcaddy-built binary end to end, official SDKs,
#            and the short soak (a minute, against the race-built ./caddy-race)
# make soak  the long soak: SOAK=30m of mixed traffic and faults against ./caddy
SHELL := /bin/bash
GO ?= go
GOBIN := $(shell $(GO) env GOPATH)/bin
XCADDY := $(GOBIN)/xcaddy
CADDY_VERSION ?= v2.11.9
MODULE := github.com/llmfailover/caddy-llm-failover
# xcaddy asks the module proxy for this module's path although it is
# replaced by the local directory. A proxy that answers 404 (the public one)
# lets Go fall back to the replacement; a proxy that answers 403 does not,
# so `|off` makes any proxy error fall through to the replacement. Other
# modules still come from the proxy as usual.
XCADDY_GOPROXY ?= $(shell $(GO) env GOPROXY | sed 's/,direct$$//')|off
SOURCES := $(shell git ls-files '*.go' 2>/dev/null || find . -name '*.go') go.mod go.sum
FUZZTIME ?= 10s

.PHONY: build run test vet fuzz bench sdk-deps soak clean

build: caddy

caddy: $(SOURCES)
	@test -x $(XCADDY) || $(GO) install github.com/caddyserver/xcaddy/cmd/xcaddy@v0.4.5
	GOPROXY="$(XCADDY_GOPROXY)" $(XCADDY) build $(CADDY_VERSION) --with $(MODULE)=. --output ./caddy
	./caddy list-modules | grep -q llm_failover

run: build
	bash scripts/run-demo.sh

# The binary the short soak runs: the same main xcaddy generates
# (soak/caddymain.go), built with the race detector by plain `go build`,
# which reuses the race-built packages `go test -race` caches: a few
# seconds of linking next to the suite's own compilation.
caddy-race: $(SOURCES) soak/caddymain.go
	$(GO) build -race -o caddy-race ./soak/caddymain.go

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...

sdk-deps:
	cd sdktest && npm ci --no-audit --no-fund --loglevel=error

test: vet build caddy-race sdk-deps
	bash scripts/test.sh

# The long soak (soak/): two gateways on one PostgreSQL of their own under
# mixed traffic and scheduled faults for SOAK, against the release build.
# It prints its report (-v) and keeps it, with the client log and both
# caddy logs, in bench/results/soak-<time>/. Ports 19701-19705, so it can
# run next to `make test` (whose short soak uses 19601-19605).
SOAK ?= 30m
SOAK_TIMEOUT ?= 3h
soak: build
	LLMF_SOAK=$(SOAK) LLMF_SOAK_CADDY_BIN="$(CURDIR)/caddy" LLMF_SOAK_PORT_BASE=19700 \
	LLMF_SOAK_OUT="$(CURDIR)/bench/results/soak-$$(date +%Y%m%d-%H%M%S)" \
	$(GO) test -count=1 -timeout $(SOAK_TIMEOUT) -run '^TestSoak$$' -v ./soak

fuzz:
	FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh

bench: build
	bash bench/run.sh

clean:
	rm -f caddy caddy-race
