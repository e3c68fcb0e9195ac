package integration_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// Hosted providers are reached over TLS, where Caddy's transport offers
// HTTP/2 by ALPN: one connection carries many requests, and a provider
// (or its load balancer) that gives up on one request resets its stream
// (RST_STREAM) instead of closing a connection. These tests run the
// failure kinds of the HTTP/1.1 tests against upstreams that answer over
// TLS and HTTP/2 (faultupstream.NewHTTP2), trusted the way an operator
// trusts a private CA: tls_trust_pool.

// h2Channels is gateChannels with each channel's certificate trusted:
// arguments a's URL, a's certificate file, b's URL, b's, then extra
// lines.
const h2Channels = `
		channel a %s {
			pass_response_header X-Fault-Upstream
			transport http {
				tls_trust_pool file %s
			}
		}
		channel b %s {
			pass_response_header X-Fault-Upstream
			transport http {
				tls_trust_pool file %s
			}
		}
		model m {
			route a cost 1 1 upstream_model from-a
			route b cost 2 2 upstream_model from-b
		}
		model claude {
			route a cost 1 1 upstream_model from-a
			route b cost 2 2 upstream_model from-b
		}
		%s
`

// h2Gateway starts two HTTP/2 upstreams and the gateway in front of them.
func h2Gateway(t *testing.T, primary, backup fu.Behavior, extra string) (a, b *fu.Server) {
	t.Helper()
	a, b = fu.StartHTTP2(t, primary), fu.StartHTTP2(t, backup)
	gateway(t, h2Channels, a.URL, a.CertFile(t), b.URL, b.CertFile(t), extra)
	return a, b
}

// wantHTTP2 fails t unless s's last request came over HTTP/2: a test of
// HTTP/2 that fell back to HTTP/1.1 would test nothing new.
func wantHTTP2(t *testing.T, s *fu.Server) {
	t.Helper()
	if got := s.LastRequest().Proto; got != "HTTP/2.0" {
		t.Fatalf("upstream %s was reached over %q, want HTTP/2.0", s.URL, got)
	}
}

func TestHTTP2UpstreamServes(t *testing.T) {
	a, b := h2Gateway(t, fu.OKNamed("primary"), fu.OKNamed("backup"), "")
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	mustContain(t, body, "Hello from primary")
	wantHTTP2(t, a)
	s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
	okStream(t, s)
	servedBy(t, s, "a", "primary")
	if fs := frames(s.body); fs[len(fs)-1] != "data: [DONE]" {
		t.Fatalf("stream does not end with [DONE]:\n%s", s.body)
	}
	hits(t, a, 2)
	hits(t, b, 0)
}

// Every failure before anything reached the client fails over, and the
// same request is served whole by the backup.
func TestHTTP2UpstreamFailuresFailOver(t *testing.T) {
	json := map[string]fu.Behavior{
		"503":                  fu.Status(503, fu.OpenAIErrorBody("overloaded", "server_error", "")),
		"429":                  fu.Status(429, fu.OpenAIErrorBody("slow down", "requests", "rate_limit_exceeded")),
		"stream reset":         fu.Reset(),
		"truncated body reset": fu.TruncatedJSON(),
	}
	for name, bad := range json {
		t.Run("json/"+name, func(t *testing.T) {
			a, b := h2Gateway(t, bad, fu.OKNamed("backup"), "")
			res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
			if res.StatusCode != 200 {
				t.Fatalf("status %d: %s", res.StatusCode, body)
			}
			mustContain(t, body, "Hello from backup")
			hits(t, a, 1)
			hits(t, b, 1)
			wantHTTP2(t, b)
		})
	}
	stream := map[string]fu.Behavior{
		"503":                   fu.Status(503, fu.OpenAIErrorBody("overloaded", "server_error", "")),
		"stream reset":          fu.Reset(),
		"error after preamble":  fu.ErrorAfterPreamble().Named("primary"),
		"reset after preamble":  resetAfterRole,
		"error as first frame":  fu.ErrorFirstFrame().Named("primary"),
		"reset before any byte": fu.CloseNoResponse(),
	}
	for name, bad := range stream {
		t.Run("stream/"+name, func(t *testing.T) {
			a, b := h2Gateway(t, bad, fu.OKNamed("backup"), "")
			s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
			cleanChatFromBackup(t, s)
			hits(t, a, 1)
			hits(t, b, 1)
		})
	}
}

// resetAfterRole sends a chat stream's role-only chunk, which the stream
// gate holds, and then resets the stream.
var resetAfterRole = fu.BehaviorFunc(func(w http.ResponseWriter, _ *http.Request, _ int64) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, `data: {"id":"c1","object":"chat.completion.chunk","model":"from-a","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n")
	_ = http.NewResponseController(w).Flush()
	panic(http.ErrAbortHandler)
})

// A committed stream whose upstream stream is reset ends with the
// truncation error in the client's dialect, never with [DONE]; with
// stream_resume the backup finishes it.
func TestHTTP2UpstreamResetAfterCommit(t *testing.T) {
	t.Run("truncated", func(t *testing.T) {
		a, b := h2Gateway(t, fu.CutMidStream().Named("primary"), fu.OKNamed("backup"), "")
		s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
		okStream(t, s)
		servedBy(t, s, "a", "primary")
		if got := fu.StreamText(mustSSE(t, s.body)); got != "Hello from" {
			t.Fatalf("text %q:\n%s", got, s.body)
		}
		fs := frames(s.body)
		if last := fs[len(fs)-1]; !strings.HasPrefix(last, `data: {"error":`) || !strings.Contains(last, "stream_truncated") {
			t.Fatalf("last event is not the truncation error: %q\n%s", last, s.body)
		}
		mustNotContain(t, s.body, "[DONE]", "INTERNAL_ERROR", "stream error")
		hits(t, a, 1)
		hits(t, b, 0)
	})
	t.Run("resumed", func(t *testing.T) {
		pieces := resumePieces()
		a, b := h2Gateway(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40),
			fu.OKNamed("backup").WithPieces(pieces[40:]...), "stream_resume continue")
		s := resumePost(t)
		wantText(t, s, strings.Join(pieces, ""))
		if got := count(s.body, ": llm-failover resumed from a on b (prefill)\n"); got != 1 {
			t.Fatalf("%d resume seams, want 1:\n%s", got, s.body)
		}
		mustNotContain(t, s.body, "event: error")
		hits(t, a, 1)
		hits(t, b, 1)
		wantHTTP2(t, b)
	})
}

// Timeouts end the upstream's stream, not only the client's wait: the
// request the gateway gave up on is cancelled at the upstream (RST_STREAM
// CANCEL), and the connection it shared goes on serving.
func TestHTTP2UpstreamAbandonedRequestsAreCancelled(t *testing.T) {
	t.Run("silent before headers", func(t *testing.T) {
		a, _ := h2Gateway(t, fu.NoHeaders(), fu.OKNamed("backup"), "header_timeout 300ms")
		res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
		if res.StatusCode != 200 {
			t.Fatalf("status %d: %s", res.StatusCode, body)
		}
		mustContain(t, body, "Hello from backup")
		eventually(t, 5*time.Second, "the silent upstream request to be cancelled", func() bool { return a.InFlight() == 0 })
	})
	t.Run("stalled after commit", func(t *testing.T) {
		a, b := h2Gateway(t, fu.StallMidStream(10*time.Second).Named("primary"), fu.OKNamed("backup"), "stream_idle_timeout 300ms")
		s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
		okStream(t, s)
		if s.endAt > 5*time.Second {
			t.Fatalf("stream ended after %s; the idle timeout is 300ms", s.endAt)
		}
		fs := frames(s.body)
		if last := fs[len(fs)-1]; !strings.Contains(last, "stream_stalled") {
			t.Fatalf("last event is not the stall error: %q\n%s", last, s.body)
		}
		eventually(t, 2*time.Second, "the stalled upstream request to be cancelled", func() bool { return a.InFlight() == 0 })
		hits(t, b, 0)
		// The connection the stalled stream shared still serves.
		a.Set(fu.OKNamed("primary"))
		res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
		if res.StatusCode != 200 || !strings.Contains(string(body), "Hello from primary") {
			t.Fatalf("after the stall: %d %s", res.StatusCode, body)
		}
		wantHTTP2(t, a)
	})
}

// Many requests at once over the one HTTP/2 connection to each upstream,
// the primary resetting every other stream: each request is served whole,
// by the primary or, after a reset, by the backup.
func TestHTTP2UpstreamConcurrentResets(t *testing.T) {
	const n = 24
	a, b := h2Gateway(t, fu.FailEvery(2, fu.Reset(), fu.OKNamed("primary")), fu.OKNamed("backup"), "")
	errs := make(chan error, n)
	client := &http.Client{Timeout: 30 * time.Second}
	for i := 0; i < n; i++ {
		req := newPost(t, context.Background(), "/v1/chat/completions", fu.ChatRequest("m", false))
		go func() {
			res, err := client.Do(req)
			if err != nil {
				errs <- err
				return
			}
			body, err := io.ReadAll(res.Body)
			res.Body.Close()
			switch {
			case err != nil:
				errs <- err
			case res.StatusCode != 200:
				errs <- fmt.Errorf("status %d: %s", res.StatusCode, body)
			case !strings.Contains(string(body), "Hello from primary") && !strings.Contains(string(body), "Hello from backup"):
				errs <- fmt.Errorf("answer from nobody: %s", body)
			default:
				errs <- nil
			}
		}()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if got := a.Hits() + b.Hits(); got < n {
		t.Fatalf("%d upstream requests for %d clients", got, n)
	}
}
