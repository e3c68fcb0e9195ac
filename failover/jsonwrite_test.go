package failover

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// A client that stops reading a whole (non-streaming) answer, TCP open,
// is timed out by stream_idle_timeout's write deadline as a stream's is
// (docs/security.md: it "covers every committed answer ... and a client
// that stops reading"): otherwise the handler blocks in Write for ever,
// holding the answer's bytes against max_held_bytes, the goroutine and
// the request's reservation.
func TestClientThatStopsReadingAWholeAnswerIsTimedOut(t *testing.T) {
	up := upstream(t, fu.OK().WithPieces(strings.Repeat("x", 16<<20)))
	e := testEngine(t, testPlan(t, Options{StreamIdleTimeout: 500 * time.Millisecond}, nil,
		testChannel{name: uniqueName("jsonwrite"), url: up.URL}))
	returned := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(returned)
		serveDirect(e, w, r)
	}))
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096) // a small window fills fast
	}
	b := fu.ChatRequest("m", false)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("status %v: %v", res, err)
	}
	// Read nothing more, keep the connection open.
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		conn.Close()
		<-returned
		t.Fatal("the handler was still writing a whole answer to a client that stopped reading 10s later (stream_idle_timeout 500ms)")
	}
}
