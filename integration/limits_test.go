package integration_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

const oneChannel = `
		channel a %s
		model m {
			route a
		}
		auth off
		%s`

// A committed answer that is not SSE (NDJSON here) and then goes silent
// ends at stream_idle_timeout, and releases the upstream.
func TestIdleTimeoutCoversNDJSON(t *testing.T) {
	a := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = io.WriteString(w, `{"n":1}`+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	gateway(t, oneChannel, a.URL, "stream_idle_timeout 500ms")
	start := time.Now()
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", true))
	if res.StatusCode != 200 || !strings.HasPrefix(string(body), `{"n":1}`) {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("silent stream held for %s", el)
	}
	eventually(t, 5*time.Second, "the upstream to be released", func() bool { return a.InFlight() == 0 })
}

// A client that stops reading, TCP open, is timed out by the write
// deadline: the upstream is released instead of held for ever.
func TestClientThatStopsReadingIsTimedOut(t *testing.T) {
	chunk := `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 4096) + `"}}]}` + "\n\n"
	a := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "text/event-stream")
		for r.Context().Err() == nil {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}))
	gateway(t, oneChannel, a.URL, "stream_idle_timeout 1s")
	conn, err := net.Dial("tcp", fmt.Sprintf("localhost:%d", httpPort))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096) // a small window fills fast
	}
	b := fu.ChatRequest("m", true)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("status %v: %v", res, err)
	}
	// Read nothing more, keep the connection open.
	eventually(t, 20*time.Second, "the upstream to be released", func() bool { return a.InFlight() == 0 })
}

// A body trickled a byte every 300 ms is cut at request_body_timeout.
func TestSlowRequestBodyIsCut(t *testing.T) {
	a := upstream(t, fu.OK())
	gateway(t, oneChannel, a.URL, "request_body_timeout 1s")
	conn, err := net.Dial("tcp", fmt.Sprintf("localhost:%d", httpPort))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	b := fu.ChatRequest("m", false)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(b))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, c := range b {
			if _, err := conn.Write([]byte{c}); err != nil {
				return
			}
			time.Sleep(300 * time.Millisecond)
		}
	}()
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if el := time.Since(start); el > 8*time.Second {
		t.Fatalf("slow body held for %s", el)
	}
	// The body was slow, not wrong: a 408, which the official SDKs retry
	// (docs/errors.md), never a 400 that tells the client to fix it.
	if err != nil || res.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("answer %v, %v: want 408", res, err)
	}
	conn.Close()
	<-done
	hits(t, a, 0)
}

// Beyond max_held_bytes an answer is not buffered: 503, and the channel
// is not blamed for it.
func TestHeldBytesCap(t *testing.T) {
	a := upstream(t, fu.OKNamed(strings.Repeat("big", 2000)))
	gatewayWith(t, failoverOption("max_held_bytes 1KiB"), oneChannel, a.URL, "")
	for range 4 {
		res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
		if res.StatusCode != 503 {
			t.Fatalf("status %d: %s", res.StatusCode, body)
		}
	}
	// Four refusals and the channel is still closed (3 failures open it).
	hits(t, a, 4)
	if failoverapp.HeldBytes() != 0 {
		t.Fatalf("%d bytes still counted as held", failoverapp.HeldBytes())
	}
}
