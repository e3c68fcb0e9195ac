package failover

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// A request whose model or limits an upstream could read otherwise than
// the gateway routes and bills it by is refused before anything is sent:
// a repeated max_tokens ending in null once let a client be billed for
// 16 tokens while the upstream wrote 5,000, and a "MODEL" key routed one
// model while a Go upstream ran another. Found by an audit of client
// input.
func TestAmbiguousRequestIsRefused(t *testing.T) {
	up := upstream(t, fu.OK())
	e := testEngine(t, testPlan(t, Options{}, nil, testChannel{name: uniqueName("amb"), url: up.URL}))
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":16,"max_tokens":null}`,
		`{"model":"m","MODEL":"expensive-model","messages":[{"role":"user","content":"hi"}]}`,
	} {
		w := httptest.NewRecorder()
		serveDirect(e, w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `"error"`) || !strings.Contains(w.Body.String(), "ambiguous") {
			t.Errorf("%s: status %d: %s", body, w.Code, w.Body)
		}
	}
	hits(t, up, 0)
}
