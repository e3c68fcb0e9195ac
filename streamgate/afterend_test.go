package streamgate_test

import (
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/shapes"
	"github.com/llmfailover/caddy-llm-failover/provider"
	. "github.com/llmfailover/caddy-llm-failover/streamgate"
)

// Once the stream's normal end is seen no content is due, but the stream
// must still end: an upstream that sends its finish_reason and then only
// keep-alives, never [DONE] nor a close, must not hold the client, the
// upstream connection and the request for ever. Pings reset IdleTimeout,
// so without a bound on what follows the end nothing ends it.
func TestRelayPingsAfterTheEndDoNotHoldTheStreamForEver(t *testing.T) {
	const idle = 300 * time.Millisecond
	dst := newFakeDown()
	u := newUpstream()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		u.send(sse(shapes.ChatRole) + sse(shapes.ChatContent) + sse(shapes.ChatFinish))
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := u.pw.Write([]byte(": keep-alive\n\n")); err != nil {
				return
			}
		}
	}()
	done := make(chan Result, 1)
	opts := gate(provider.OpenAIChat, Options{StallFloor: stallFloor, IdleTimeout: idle, DeferBreak: true})
	go func() { done <- Relay(u.pr, u.cancel, dst, opts) }()
	select {
	case res := <-done:
		u.pr.Close()
		// The end was seen: nothing is appended, the stream is complete.
		if res.Outcome != Complete || res.Deferred != nil {
			t.Fatalf("res %+v", res)
		}
	case <-time.After(5 * time.Second):
		u.pr.Close()
		<-done
		t.Fatalf("a stream that ended and then only pinged was still relayed after 5s (stream_idle_timeout %s)", idle)
	}
}
