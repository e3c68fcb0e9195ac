# make run   builds ./caddy with xcaddy and serves Caddyfile.example (offline demo)
# make test  runs the whole suite: vet, unit, fuzz seeds, race, in-process
#            Caddy, PostgreSQL, the xcaddy-built binary end to end, official SDKs
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

.PHONY: build run test vet fuzz bench sdk-deps clean

build: caddy

caddy: $(SOURCES)
	@test -x $(XCADDY) || $(GO) install github.com/caddyserver/xcaddy/cmd/xcaddy@v0.4.5
	GOPROXY="$(XCADDY_GOPROXY)" $(XCADDY) build $(CADDY_VERSION) --with $(MODULE)=. --output ./caddy
	./caddy list-modules | grep -q llm_failover

run: build
	bash scripts/run-demo.sh

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...

sdk-deps:
	cd sdktest && npm ci --no-audit --no-fund --loglevel=error

test: vet build sdk-deps
	bash scripts/test.sh

fuzz:
	FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh

bench: build
	bash bench/run.sh

clean:
	rm -f caddy
