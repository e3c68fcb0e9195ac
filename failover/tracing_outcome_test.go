package failover

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// tracedServe serves one request under a recording span and returns the
// gateway's span (the one named llm_failover ...) and every span ended.
func tracedServe(t *testing.T, e *Engine, path string, body []byte, hdr ...string) (*httptest.ResponseRecorder, sdktrace.ReadOnlySpan, []sdktrace.ReadOnlySpan) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)).WithContext(ctx)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	serveDirect(e, w, req)
	span.End()
	var gw sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if strings.HasPrefix(s.Name(), "llm_failover") {
			gw = s
		}
	}
	if gw == nil {
		t.Fatal("no gateway span")
	}
	return w, gw, rec.Ended()
}

// A stream the upstream cut after content reached the client is no
// successful request: the client read an answer that ends in an error
// (requests_total says broken, the history counts it down). The gateway's
// span says so too, or a search for failed requests in the trace store
// never finds the cut streams, the ones clients complain about.
func TestTracingCutStreamIsNoSuccessfulRequest(t *testing.T) {
	a := upstream(t, fu.CutMidStream().Named("a"))
	b := upstream(t, fu.OKNamed("b"))
	e := testEngine(t, testPlan(t, Options{}, nil,
		testChannel{name: uniqueName("cut-a"), url: a.URL}, testChannel{name: uniqueName("cut-b"), url: b.URL}))
	w, gw, _ := tracedServe(t, e, "/v1/chat/completions", fu.ChatRequest("m", true))
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "data:") {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	hits(t, b, 0) // committed: nothing to fail over to
	if gw.Status().Code != codes.Error {
		t.Errorf("gateway span of a stream cut mid-answer has status %v %q, want Error (attributes %v)",
			gw.Status().Code, gw.Status().Description, gw.Attributes())
	}
}

// A hedged request is answered exactly as an unhedged one: when the attempt
// that won is refused by the upstream in-stream (an Anthropic error event
// before any content, which the gateway answers itself), the gateway's
// span records the refusal as it does without a hedge.
func TestTracingHedgedRefusalMarksTheRequestSpan(t *testing.T) {
	refusal := fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"prompt is too long\"}}\n\n"))
	})
	for _, hedged := range []bool{false, true} {
		name := map[bool]string{false: "unhedged", true: "hedged"}[hedged]
		t.Run(name, func(t *testing.T) {
			var first fu.Behavior = refusal
			if hedged {
				first = fu.SlowFirstToken(2 * time.Second).Named("a")
			}
			a, b := upstream(t, first), upstream(t, refusal)
			e := testEngine(t, testPlan(t, Options{Hedge: HedgeOptions{Budget: 1}}, func(m *Model) {
				if hedged {
					m.Hedge = &HedgeRule{After: 50 * time.Millisecond}
				}
			}, testChannel{name: uniqueName("hr-a"), url: a.URL, adapter: new(provider.Anthropic)},
				testChannel{name: uniqueName("hr-b"), url: b.URL, adapter: new(provider.Anthropic)}))
			w, gw, _ := tracedServe(t, e, "/v1/messages", fu.MessagesRequest("m", true), "anthropic-version", "2023-06-01")
			if w.Code != http.StatusBadRequest {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if gw.Status().Code != codes.Error {
				t.Errorf("gateway span of a request answered 400 has status %v, want Error (attributes %v)", gw.Status().Code, gw.Attributes())
			}
		})
	}
}

// Span names are what trace stores index and group by, so they must come
// from a small set: a client must not mint one per request by naming a
// model the gateway does not serve (a random name each time, or one as
// long as the body allows). A request for such a model is refused 404;
// its span is the operation's, and what it asked for is bounded.
func TestTracingUnknownModelDoesNotNameTheSpan(t *testing.T) {
	up := upstream(t, fu.OK())
	e := testEngine(t, testPlan(t, Options{}, nil, testChannel{name: uniqueName("um-a"), url: up.URL}))
	invented := "invented-" + strings.Repeat("x", 64<<10)
	w, gw, _ := tracedServe(t, e, "/v1/chat/completions", fu.ChatRequest(invented, false))
	if w.Code != http.StatusNotFound {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	hits(t, up, 0)
	if strings.Contains(gw.Name(), "invented-") {
		t.Errorf("the gateway span of a request for a model nobody serves is named after it (%d bytes): %.60q…", len(gw.Name()), gw.Name())
	}
	for _, kv := range gw.Attributes() {
		if n := len(kv.Value.Emit()); n > 1024 {
			t.Errorf("span attribute %s is %d bytes of the client's choosing", kv.Key, n)
		}
	}
}
