package failover

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/llmfailover/caddy-llm-failover/chain"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// modelsPlan is the plan of an engine with n models, each routed to a
// channel of its own at url: "m" on the first, then "m1" to "m<n-1>".
func modelsPlan(t testing.TB, n int, url string) Plan {
	t.Helper()
	p := testPlan(t, Options{}, nil, testChannel{name: uniqueName("models-"), url: url})
	for i := 1; i < n; i++ {
		name := uniqueName("models-")
		p.Channels = append(p.Channels, testPlan(t, Options{}, nil, testChannel{name: name, url: url}).Channels[0])
		addTestModel(t, &p, fmt.Sprint("m", i), []chain.Route{{Channel: i, Name: name}})
	}
	return p
}

// serveModel runs one JSON request for model "m" through e and fails on
// anything but a 200.
func serveModel(t testing.TB, e *Engine, body []byte) {
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	serveDirect(e, w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
}

// What one request costs as the configuration grows: the same request for
// one model, in engines of 1, 100 and 1,000 models each with a channel of
// its own (issue 31: "no per-request cost that grows with the number of
// models"). TestRequestAllocsFlatInModels checks the allocations; this
// shows the time:
//
//	go test -run '^$' -bench RequestByModels -count 6 ./failover/
func BenchmarkRequestByModels(b *testing.B) {
	up := fu.New(fu.OKNamed("up"))
	defer up.Close()
	body := fu.ChatRequest("m", false)
	for _, n := range []int{1, 100, 1000} {
		// One engine for all the runs of a size: b.Run calls its function
		// more than once, and each would build n channels more.
		e := testEngine(b, modelsPlan(b, n, up.URL))
		b.Run(fmt.Sprint(n, "_models"), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				serveModel(b, e, body)
			}
		})
	}
}

// A request allocates no more in an engine of 1,000 models than in one of
// a single model: nothing on the request's path walks the configuration.
// (Allocations, not time: a timed test would measure the machine.)
func TestRequestAllocsFlatInModels(t *testing.T) {
	up := fu.Start(t, fu.OKNamed("up"))
	body := fu.ChatRequest("m", false)
	allocs := map[int]float64{}
	for _, n := range []int{1, 1000} {
		e := testEngine(t, modelsPlan(t, n, up.URL))
		serveModel(t, e, body) // the connection, pools, lazily made state
		allocs[n] = testing.AllocsPerRun(200, func() { serveModel(t, e, body) })
	}
	// The upstream's and the transport's goroutines allocate on their
	// own schedule, and AllocsPerRun counts the whole process: a few
	// either way is noise, a cost per model would be hundreds.
	if allocs[1000] > allocs[1]+4 {
		t.Fatalf("a request allocates %.0f times with 1,000 models, %.0f with 1", allocs[1000], allocs[1])
	}
	t.Logf("allocations a request: %.0f with 1 model, %.0f with 1,000", allocs[1], allocs[1000])
}
