package streamgate_test

import (
	"io"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/shapes"
	"github.com/llmfailover/caddy-llm-failover/provider"
	. "github.com/llmfailover/caddy-llm-failover/streamgate"
)

// Before any content, a line longer than the hold cap is the channel's
// failure: nothing reaches the client, and the caller can fail over.
func TestRelayOverlongLineBeforeContentFails(t *testing.T) {
	for _, drop := range []bool{false, true} {
		dst := newFakeDown()
		opts := gate(provider.OpenAIChat, Options{GateTimeout: time.Hour})
		if drop {
			opts.Drop = func(Event) bool { return false }
		}
		res, _ := relayWith(t, dst, opts, func(u *upstream) {
			u.send(sse(shapes.ChatRole))
			u.send("data: " + strings.Repeat("x", DefaultMaxEvent)) // no line end yet
			u.send(strings.Repeat("y", 10000))
		})
		if ops, _ := dst.snapshot(); res.Outcome != Oversized || res.Committed || len(ops) != 0 {
			t.Fatalf("drop=%v: res %+v, client saw %v", drop, res, ops)
		}
	}
}

// countDown is a client that keeps nothing: it counts what it is sent.
type countDown struct{ n atomic.Int64 }

func (c *countDown) Commit() error { return nil }
func (c *countDown) Flush() error  { return nil }
func (c *countDown) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	return len(p), nil
}

// After commit, an endless line is forwarded as it arrives and costs the
// relay a bounded amount of memory, in the usage-hiding (Drop) mode too.
func TestRelayEndlessLineAfterCommitIsBounded(t *testing.T) {
	const chunk, chunks = 64 << 10, 320 // 20 MiB in one line
	for _, drop := range []bool{false, true} {
		dst := new(countDown)
		opts := gate(provider.OpenAIChat, Options{MaxHeld: 64 << 10, GateTimeout: time.Hour, IdleTimeout: time.Hour})
		if drop {
			opts.Drop = func(ev Event) bool { return false }
		}
		pr, pw := io.Pipe()
		var grown int64
		go func() {
			var before, now runtime.MemStats
			_, _ = pw.Write([]byte(sse(shapes.ChatContent) + "data: "))
			runtime.GC()
			runtime.ReadMemStats(&before)
			piece := []byte(strings.Repeat("z", chunk))
			for i := range chunks {
				_, _ = pw.Write(piece)
				if i%32 == 31 {
					runtime.GC() // live memory, not garbage yet to collect
					runtime.ReadMemStats(&now)
					grown = max(grown, int64(now.HeapInuse)-int64(before.HeapInuse))
				}
			}
			pw.Close()
		}()
		res := Relay(pr, nil, dst, opts)
		if res.Outcome != Truncated || dst.n.Load() < chunk*chunks {
			t.Fatalf("drop=%v: res %+v, %d bytes forwarded", drop, res, dst.n.Load())
		}
		// The parser keeps at most DefaultMaxEvent (1 MiB) of the line.
		if grown > 4<<20 {
			t.Fatalf("drop=%v: heap grew by %d bytes while a 20 MiB line streamed", drop, grown)
		}
		t.Logf("drop=%v: heap growth %d KiB over a 20 MiB line", drop, grown>>10)
	}
}
