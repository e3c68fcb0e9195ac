package failover

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/latency"
)

// A stream's headers come at once and its first token soon after; a whole
// (non-streaming) answer's headers and content come when all of its
// output is generated. A channel that mostly streams learns deadlines of
// a second or two; they must not cut the same channel's non-streaming
// answers of the same size, which are healthy and answered in full (the
// cut attempt is never learned from, so they would be cut for good).
func TestLearnedStreamDeadlinesDoNotCutWholeAnswers(t *testing.T) {
	up := upstream(t, fu.OKNamed("a"))
	cfg := latency.Config{Floor: 150 * time.Millisecond, MinSamples: 5}.WithDefaults()
	e := testEngine(t, testPlan(t, Options{Adaptive: &cfg}, nil, testChannel{name: uniqueName("ad-a"), url: up.URL}))
	for range 10 {
		w := httptest.NewRecorder()
		serveDirect(e, w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(fu.ChatRequest("m", true))))
		if w.Code != http.StatusOK {
			t.Fatalf("stream: status %d: %s", w.Code, w.Body)
		}
	}
	// The same prompt, not streamed: its answer takes 600 ms to generate,
	// headers included.
	up.Set(fu.SlowFirstToken(600 * time.Millisecond).Named("a"))
	w := httptest.NewRecorder()
	began := time.Now()
	serveDirect(e, w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(fu.ChatRequest("m", false))))
	if w.Code != http.StatusOK {
		t.Errorf("a healthy 600 ms non-streaming answer got %d after %s (cut by the deadline learned from streams): %s",
			w.Code, time.Since(began).Round(time.Millisecond), w.Body)
	}
}
