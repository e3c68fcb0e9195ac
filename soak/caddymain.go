//go:build ignore

// The main xcaddy generates for `xcaddy build --with
// github.com/llmfailover/caddy-llm-failover=.`, built here with plain `go
// build` so that the race detector can be switched on without xcaddy's
// temporary module (which costs a `go mod tidy` and a second module
// cache lookup): `go build -race -o caddy-race ./soak/caddymain.go`. It
// resolves the same caddy version, the one go.mod requires. The build tag
// keeps it out of ./... (nothing in the module may import the handler
// module, see layout_test.go).
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/llmfailover/caddy-llm-failover"
)

func main() {
	caddycmd.Main()
}
