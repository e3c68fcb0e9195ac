// Command upstream serves the benchmarks' fake LLM provider
// (bench/upstream/fake) on its own: what its paths answer is described
// there.
//
//	go run ./bench/upstream -listen 127.0.0.1:18090 -chunks 20 -event-delay 0
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"os"

	"github.com/llmfailover/caddy-llm-failover/bench/upstream/fake"
)

func main() {
	var cfg fake.Config
	listen := flag.String("listen", "127.0.0.1:18090", "address to listen on (loopback only)")
	flag.IntVar(&cfg.Chunks, "chunks", 20, "content chunks per SSE stream (plus a finish chunk and [DONE])")
	flag.BoolVar(&cfg.RoleChunk, "role-chunk", false, "send a role-only chunk before the first content chunk, as real providers do (the stream gate holds it until content arrives)")
	flag.DurationVar(&cfg.EventDelay, "event-delay", 0, "sleep before each SSE event (0: none)")
	flag.DurationVar(&cfg.FirstTokenDelay, "first-token-delay", 0, "send a stream's headers at once, then wait this long before its first event: streams waiting for their first token (bench/scale.sh)")
	flag.Parse()
	u, err := fake.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "upstream: listening on %s (json %d bytes, stream %d events)\n", ln.Addr(), u.CompletionLen(), u.Events())
	log.Fatal(u.Serve(ln))
}
