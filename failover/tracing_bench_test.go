package failover

import (
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// What tracing and the GenAI metrics add to one request of one attempt
// when the request is not traced: the span check at entry, the calls on
// a nil trace, and the three GenAI metric observations (the only part that
// works). Compare with the request's whole cost (BenchmarkStreamTTFB,
// about 350 µs on this machine).
func BenchmarkUntracedRequestOverhead(b *testing.B) {
	base, _ := url.Parse("http://127.0.0.1:8080")
	ch := &Channel{Name: "a", Base: base, Adapter: provider.OpenAI{}}
	route := &chain.Route{Name: "a"}
	r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	x := newExchange(httptest.NewRecorder(), r, provider.OpenAIChat, modeChain)
	x.req = provider.Request{Model: "m", Stream: true}
	x.meter = x.api.NewMeter()
	x.committedAt = time.Now()
	res := attemptResult{verdict: served}
	b.ReportAllocs()
	for b.Loop() {
		traceRequest(x, 0)
		x.trace.parsed(x)
		x.trace.refusedWith(0)
		countGenAI(x, ch, route, res, time.Millisecond)
		x.trace.endAttempt(x, res, nil)
		x.trace.end(x)
	}
}
