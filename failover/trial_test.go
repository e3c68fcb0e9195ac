package failover

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// firstWrite is a client that says when the first bytes of its answer
// were written to it.
type firstWrite struct {
	*httptest.ResponseRecorder
	mu    sync.Mutex
	once  sync.Once
	wrote chan struct{}
}

func (f *firstWrite) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.once.Do(func() { close(f.wrote) })
	return f.ResponseRecorder.Write(p)
}

func (f *firstWrite) WriteHeader(code int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ResponseRecorder.WriteHeader(code)
}

func (f *firstWrite) Flush() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ResponseRecorder.Flush()
}

// A half-open channel's trial whose stream is already delivering content
// to its client has shown the channel answers. It held the channel's one
// trial slot until the whole stream ended, so for the length of a long
// answer every other request of a model served by that channel alone was
// refused with a 503 (no candidate, and no last resort for a channel that
// is not open), although the channel was answering.
func TestCommittedTrialStreamDoesNotKeepTheChannelShut(t *testing.T) {
	resume := make(chan struct{})
	up := upstream(t, fu.OK().WithPauseAfter(1, resume))
	e := testEngine(t, testPlan(t, Options{Breaker: breaker.Config{Cooldown: time.Millisecond}}, nil,
		testChannel{name: uniqueName("trial"), url: up.URL}))
	b := e.channels[0].health.Breaker
	for range 3 {
		b.RecordFailure(time.Now())
	}
	time.Sleep(5 * time.Millisecond) // past the cooldown: half-open
	if st := b.State(time.Now()); st != breaker.HalfOpen {
		t.Fatalf("state %s, want half_open", st)
	}

	trial := &firstWrite{ResponseRecorder: httptest.NewRecorder(), wrote: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(fu.ChatRequest("m", true)))
		serveDirect(e, trial, r)
	}()
	defer func() { <-done }()
	defer close(resume)
	select {
	case <-trial.wrote:
	case <-time.After(10 * time.Second):
		t.Fatal("the trial's stream never reached its client")
	}

	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(fu.ChatRequest("m", false)))
	serveDirect(e, w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("a request while the trial's answer streams: %d %s (breaker %s)", w.Code, w.Body, b.State(time.Now()))
	}
}
