package failover

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// What a hedged model's request costs when no hedge is sent (its first
// channel answers before hedge_after): its attempt runs on a copy of the
// exchange, on a goroutine of its own, with a race to claim. Compare the
// two: the difference is what hedge_after costs every request.
func BenchmarkHedgedModelRequest(b *testing.B) {
	a := fu.New(fu.OKNamed("a"))
	defer a.Close()
	c := fu.New(fu.OKNamed("c"))
	defer c.Close()
	body := fu.ChatRequest("m", false)
	for _, tc := range []struct {
		name  string
		hedge *HedgeRule
	}{{"not hedged", nil}, {"hedge_after 10s, not sent", &HedgeRule{After: 10 * time.Second}}} {
		b.Run(tc.name, func(b *testing.B) {
			e := testEngine(b, testPlan(b, Options{}, func(m *Model) { m.Hedge = tc.hedge },
				testChannel{name: uniqueName("hb-a"), url: a.URL}, testChannel{name: uniqueName("hb-c"), url: c.URL}))
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				serveDirect(e, w, r)
				if w.Code != 200 {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}
