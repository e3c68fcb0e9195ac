package failover

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// halfOpenedLogged counts the logged moves of channel to half_open.
func halfOpenedLogged(logs *observer.ObservedLogs, channel string) int {
	n := 0
	for _, e := range logs.FilterMessage("breaker state changed").All() {
		f := e.ContextMap()
		if f["channel"] == channel && f["to"] == "half_open" {
			n++
		}
	}
	return n
}

// A recovering channel's move from open to half_open is reported once,
// by whoever is admitted first after its cooldown (the ticket's
// HalfOpened). When that admission is a hedge's that is then not sent
// (over the hedge budget, or a second reservation refused), the ticket is
// given back without reporting it, and nobody else will: the channel's
// recovery never reaches the log, the channel_state event or
// breaker_transitions_total.
func TestHedgeNotSentStillReportsTheChannelHalfOpen(t *testing.T) {
	a := upstream(t, fu.SlowFirstToken(300*time.Millisecond).Named("a"))
	b := upstream(t, fu.OKNamed("b"))
	bName := uniqueName("hb-b")
	e := testEngine(t, testPlan(t, Options{Hedge: HedgeOptions{Budget: 0.01}, Breaker: breaker.Config{Cooldown: time.Millisecond}},
		func(m *Model) { m.Hedge = &HedgeRule{After: 50 * time.Millisecond} },
		testChannel{name: uniqueName("hb-a"), url: a.URL}, testChannel{name: bName, url: b.URL}))
	br := e.channels[1].health.Breaker
	for range 3 {
		br.RecordFailure(time.Now())
	}
	core, logs := observer.New(zap.InfoLevel)
	e.logger = zap.New(core)
	time.Sleep(5 * time.Millisecond) // past the cooldown: half-open, not yet reported

	w := httptest.NewRecorder()
	serveDirect(e, w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(fu.ChatRequest("m", true))))
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	hits(t, b, 0) // the hedge was due, but over its budget
	if st := br.State(time.Now()); st != breaker.HalfOpen {
		t.Fatalf("b is %s, want half_open", st)
	}
	if n := halfOpenedLogged(logs, bName); n != 1 {
		t.Errorf("b's move to half_open was reported %v times, want 1", n)
	}
}
