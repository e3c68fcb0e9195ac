package integration_test

import (
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// A streaming request to an upstream that accepts the connection and never
// answers fails over after stream_header_timeout; a non-streaming one waits
// header_timeout, which exists for jobs that answer only when done.
func TestStreamHeaderTimeoutFailsStreamsOverSooner(t *testing.T) {
	a := upstream(t, fu.NoHeaders())
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, twoChannels, a.URL, b.URL, "header_timeout 2s\n\t\tstream_header_timeout 300ms")

	began := time.Now()
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", true))
	took := time.Since(began)
	if res.StatusCode != 200 {
		t.Fatalf("stream: status %d: %s", res.StatusCode, body)
	}
	if got := fu.StreamText(mustSSE(t, body)); got != "Hello from backup" {
		t.Errorf("stream text %q", got)
	}
	if took < 300*time.Millisecond || took > 1500*time.Millisecond {
		t.Errorf("stream failed over after %s, want about stream_header_timeout (300ms)", took)
	}

	began = time.Now()
	res, body = post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
	took = time.Since(began)
	if res.StatusCode != 200 {
		t.Fatalf("non-stream: status %d: %s", res.StatusCode, body)
	}
	mustContain(t, body, "Hello from backup")
	if took < 2*time.Second {
		t.Errorf("non-streaming request failed over after %s, before header_timeout (2s)", took)
	}
	eventually(t, 5*time.Second, "the hung upstream requests to end", func() bool { return a.InFlight() == 0 })
}
