package failover

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// Upstreams that misbehave without echoing anything: a status that hung
// or crashed the handler or was passed back, a body or a stream that held
// the request without end, an error served as an answer. Each was a
// defect found by an audit of bad upstream input (helpers in
// echo_test.go).

func raw(resp string) fu.BehaviorFunc {
	return func(w http.ResponseWriter, _ *http.Request, _ int64) {
		conn, buf, _ := http.NewResponseController(w).Hijack()
		defer conn.Close()
		_, _ = buf.WriteString(resp)
		_ = buf.Flush()
	}
}

func wantBackup(t *testing.T, w *httptest.ResponseRecorder, ok bool) {
	t.Helper()
	if !ok {
		t.Fatal("still being served after 10s")
	}
	if w.Code != 200 || !strings.Contains(w.Body.String(), "Hello from backup") {
		t.Fatalf("status %d: %.300s", w.Code, w.Body)
	}
}

// D1: a refusal in an Anthropic stream's error event is quoted unmasked.
func TestSwitchingProtocolsFailsOver(t *testing.T) {
	t.Run("kept open", func(t *testing.T) {
		e := badEngine(t, Options{Deadline: 2 * time.Second}, nil, "", fu.BehaviorFunc(func(w http.ResponseWriter, _ *http.Request, _ int64) {
			w.Header().Set("Connection", "Upgrade")
			w.Header().Set("Upgrade", "websocket")
			w.WriteHeader(http.StatusSwitchingProtocols)
		}), true)
		w, ok := send(e, "/v1/chat/completions", fu.ChatRequest("m", false))
		wantBackup(t, w, ok)
	})
	t.Run("then closed", func(t *testing.T) {
		e := badEngine(t, Options{}, nil, "", raw("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: x\r\nContent-Type: application/json\r\n\r\n{}"), true)
		w, ok := send(e, "/v1/chat/completions", fu.ChatRequest("m", false))
		wantBackup(t, w, ok)
	})
}

// D5: statuses that are neither an answer nor a client error.
func TestOddStatusesFailOver(t *testing.T) {
	for _, line := range []string{"000 Zero", "424 Failed Dependency", "520 Unknown Error", "522 Origin Connection Time-out", "524 A Timeout Occurred", "505 HTTP Version Not Supported", "600 Weird"} {
		t.Run(line, func(t *testing.T) {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("handler panicked: %v", p)
				}
			}()
			e := badEngine(t, Options{}, nil, "", raw("HTTP/1.1 "+line+"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"), true)
			w := httptest.NewRecorder() // synchronously, so that recover sees a panic
			serveDirect(e, w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(fu.ChatRequest("m", false))))
			wantBackup(t, w, true)
		})
	}
}

// The statuses that walk the chain by default (README.md, retry_status in
// docs/configuration.md: 408, 424, 429 and every 5xx) each fail over to
// the next channel.
func TestDefaultRetryStatusesFailOver(t *testing.T) {
	for _, code := range []int{408, 424, 429, 500, 502, 503, 504, 529, 599} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			e := badEngine(t, Options{}, nil, "", fu.Status(code, ""), true)
			w := httptest.NewRecorder()
			serveDirect(e, w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(fu.ChatRequest("m", false))))
			wantBackup(t, w, true)
		})
	}
}

func TestCloudflare5xxCountsAgainstTheChannel(t *testing.T) {
	e := badEngine(t, Options{}, nil, "", raw("HTTP/1.1 522 Origin Connection Time-out\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"), false)
	for range 5 {
		send(e, "/v1/chat/completions", fu.ChatRequest("m", false))
	}
	if s := e.channels[0].health.Breaker.Snapshot(time.Now()); s.FailuresInWindow == 0 {
		t.Fatalf("five 522s, no failure counted: %+v", s)
	}
}

// D6: a 503 whose body stalls after the headers.
func TestStalledRetryableErrorBodyFailsOverPromptly(t *testing.T) {
	e := badEngine(t, Options{}, nil, "", fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(503)
		_, _ = w.Write([]byte(`{"error":{"message":"overloaded`))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}), true)
	w, ok := send(e, "/v1/chat/completions", fu.ChatRequest("m", false))
	wantBackup(t, w, ok)
}

// D7: 200, then ": ping" comments forever.
func TestPingOnlyStreamEnds(t *testing.T) {
	e := badEngine(t, Options{Deadline: 3 * time.Second, StreamGate: 300 * time.Millisecond, StreamIdleTimeout: time.Second}, nil, "",
		fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
			w.Header().Set("Content-Type", "text/event-stream")
			for r.Context().Err() == nil {
				_, _ = w.Write([]byte(": ping\n\n"))
				w.(http.Flusher).Flush()
				time.Sleep(100 * time.Millisecond)
			}
		}), false)
	if _, ok := send(e, "/v1/chat/completions", fu.ChatRequest("m", true)); !ok {
		t.Fatal("ping-only stream still relayed after 10s (deadline 3s, gate 300ms, idle 1s)")
	}
}

// D8: Google's array-wrapped error with a 200.
func TestArrayWrappedErrorWith200FailsOver(t *testing.T) {
	e := badEngine(t, Options{}, nil, "", fu.BehaviorFunc(func(w http.ResponseWriter, _ *http.Request, _ int64) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`[{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED"}}]`))
	}), true)
	w, ok := send(e, "/v1/chat/completions", fu.ChatRequest("m", false))
	wantBackup(t, w, ok)
}
