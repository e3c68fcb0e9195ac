package streamgate_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/llmfailover/caddy-llm-failover/internal/shapes"
	"github.com/llmfailover/caddy-llm-failover/provider"
	. "github.com/llmfailover/caddy-llm-failover/streamgate"
)

// With DeferBreak a cut inside an event leaves the client at the last
// whole event, and the error event is handed back instead of written.
func TestRelayDeferBreakCutMidEvent(t *testing.T) {
	dst := newFakeDown()
	whole := antEv("message_start", shapes.AntStart) + antEv("content_block_delta", shapes.AntBlockDelta)
	res, _ := relayWith(t, dst, gate(provider.AnthropicMessages, Options{DeferBreak: true}), func(u *upstream) {
		u.send(whole)
		u.send("event: content_block_delta\ndata: {\"type\":")
		u.pw.CloseWithError(errors.New("unexpected EOF"))
	})
	_, body := dst.snapshot()
	want := provider.AnthropicMessages.ErrorEvent(CodeTruncated, "upstream closed the stream before it was complete; the response is incomplete")
	if res.Outcome != Truncated || string(res.Deferred) != string(want) || body != whole {
		t.Fatalf("res %+v body %q", res, body)
	}
}

// A stream that ends normally is unaffected by DeferBreak.
func TestRelayDeferBreakComplete(t *testing.T) {
	dst := newFakeDown()
	res, _ := relayWith(t, dst, gate(provider.AnthropicMessages, Options{DeferBreak: true}), func(u *upstream) {
		u.send(antEv("message_start", shapes.AntStart) + antEv("content_block_delta", shapes.AntBlockDelta))
		u.send(antEv("message_stop", `{"type":"message_stop"}`))
		u.close()
	})
	_, body := dst.snapshot()
	if res.Outcome != Complete || res.Deferred != nil || !strings.HasSuffix(body, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") {
		t.Fatalf("res %+v body %q", res, body)
	}
}

// With DeferBreak an error event after commit is held back, with what
// follows it, and returned whole.
func TestRelayDeferBreakErrorAfterCommit(t *testing.T) {
	dst := newFakeDown()
	whole := antEv("message_start", shapes.AntStart) + antEv("content_block_delta", shapes.AntBlockDelta)
	errEv := antEv("error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
	res, _ := relayWith(t, dst, gate(provider.AnthropicMessages, Options{DeferBreak: true}), func(u *upstream) {
		u.send(whole)
		u.send(errEv + antEv("content_block_delta", shapes.AntBlockDelta))
		u.close()
	})
	_, body := dst.snapshot()
	if res.Outcome != UpstreamError || !res.Committed || string(res.Deferred) != errEv || body != whole {
		t.Fatalf("res %+v body %q", res, body)
	}
}
