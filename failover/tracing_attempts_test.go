package failover

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// onClose runs a function when an answer's body is closed.
type onClose struct {
	io.ReadCloser
	f func()
}

func (c *onClose) Close() error { err := c.ReadCloser.Close(); c.f(); return err }

type closeHookTransport struct{ f func() }

func (t closeHookTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := http.DefaultTransport.RoundTrip(r)
	if err == nil {
		res.Body = &onClose{ReadCloser: res.Body, f: t.f}
	}
	return res, err
}

// An attempt that fails before it sends anything (here: the gateway's
// memory budget is full when its turn comes) reports nothing of an
// answer: the previous attempt's usage is not its own, on its span or in
// the GenAI token metric.
func TestAttemptSpanDoesNotInheritPreviousUsage(t *testing.T) {
	// Anthropic's stream states the input first, then fails before content.
	broken := fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-x\",\"content\":[],\"usage\":{\"input_tokens\":1234,\"output_tokens\":1}}}\n\n")
		fmt.Fprint(w, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n")
	})
	a, b := upstream(t, broken), upstream(t, fu.OK())
	p := testPlan(t, Options{}, nil,
		testChannel{name: uniqueName("usage-a"), url: a.URL, adapter: new(provider.Anthropic)},
		testChannel{name: uniqueName("usage-b"), url: b.URL, adapter: new(provider.Anthropic)})
	e := testEngine(t, p)
	const all = 1 << 50
	held := false
	p.Channels[0].Transport = closeHookTransport{f: func() {
		if !held {
			held = true
			e.memory.Hold(all)
		}
	}}
	defer func() {
		if held {
			e.memory.Release(all)
		}
	}()

	inputObs := func() uint64 {
		return histogramCount(t, genAITokens.WithLabelValues("chat", "anthropic", "m", "127.0.0.1", "input").(prometheus.Histogram))
	}
	before := inputObs()

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	req := httptest.NewRequest(http.MethodPost, "/v1/messages", bytes.NewReader(fu.MessagesRequest("m", true))).WithContext(ctx)
	serveDirect(e, httptest.NewRecorder(), req)
	span.End()
	if !held {
		t.Fatal("the first channel's answer was never closed")
	}
	if n := inputObs() - before; n != 1 {
		t.Errorf("gen_ai_client_token_usage{input} observed %d times, want 1 (only the first attempt reported input)", n)
	}
	var attempts []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == attrChannel {
				attempts = append(attempts, s)
			}
		}
	}
	if len(attempts) != 2 {
		t.Fatalf("%d attempt spans, want 2", len(attempts))
	}
	attr := func(s sdktrace.ReadOnlySpan, k attribute.Key) (attribute.Value, bool) {
		for _, kv := range s.Attributes() {
			if kv.Key == k {
				return kv.Value, true
			}
		}
		return attribute.Value{}, false
	}
	if v, ok := attr(attempts[0], attrInputTokens); !ok || v.AsInt64() != 1234 {
		t.Errorf("first attempt's input tokens %v (%v), want 1234", v.Emit(), ok)
	}
	if r, _ := attr(attempts[1], attrReason); r.AsString() == "" {
		t.Errorf("second attempt did not fail: %v", attempts[1].Attributes())
	}
	if v, ok := attr(attempts[1], attrInputTokens); ok {
		t.Errorf("the second attempt, which sent nothing, reports %s input tokens (the first attempt's)", v.Emit())
	}
	if v, ok := attr(attempts[1], attrResponseModel); ok {
		t.Errorf("the second attempt, which sent nothing, reports the response model %s", v.Emit())
	}
}

// A hedged request's two attempts are two attempts: the hedge's span is
// number 2, as the request's attempt count says (docs/operations.md:
// llm_failover.attempt is the attempt's number in the request).
func TestHedgeAttemptSpansAreNumbered(t *testing.T) {
	a := upstream(t, fu.SlowFirstToken(2*time.Second).Named("a"))
	b := upstream(t, fu.OKNamed("b"))
	e := testEngine(t, testPlan(t, Options{Hedge: HedgeOptions{Budget: 1}}, func(m *Model) {
		m.Hedge = &HedgeRule{After: 50 * time.Millisecond}
	}, testChannel{name: uniqueName("hn-a"), url: a.URL}, testChannel{name: uniqueName("hn-b"), url: b.URL}))

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(fu.ChatRequest("m", true))).WithContext(ctx)
	w := httptest.NewRecorder()
	serveDirect(e, w, req)
	span.End()
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	numbers := map[int64]string{}
	for _, s := range rec.Ended() {
		var n int64
		kind := ""
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case attrAttempt:
				n = kv.Value.AsInt64()
			case attrKind:
				kind = kv.Value.AsString()
			}
		}
		if kind == "" {
			continue
		}
		if other, dup := numbers[n]; dup {
			t.Errorf("the %s attempt and the %s attempt are both llm_failover.attempt %d", other, kind, n)
		}
		numbers[n] = kind
	}
	if len(numbers) != 2 || numbers[1] != "chain" || numbers[2] != "hedge" {
		t.Errorf("attempt numbers %v, want 1: chain, 2: hedge", numbers)
	}
}

// gen_ai.client.operation.duration with no error_type is a successful
// operation's: a hedged attempt cancelled because the other one won is
// no success, and does not count as one (it would put the cancelled
// attempt's cut-off wait among the successful calls' durations).
func TestHedgeLoserIsNoSuccessfulOperation(t *testing.T) {
	a := upstream(t, fu.SlowFirstToken(2*time.Second).Named("a"))
	b := upstream(t, fu.OKNamed("b"))
	e := testEngine(t, testPlan(t, Options{Hedge: HedgeOptions{Budget: 1}}, func(m *Model) {
		m.Hedge = &HedgeRule{After: 50 * time.Millisecond}
	}, testChannel{name: uniqueName("hl-a"), url: a.URL}, testChannel{name: uniqueName("hl-b"), url: b.URL}))
	durations := func(errorType string) uint64 {
		return histogramCount(t, genAIDuration.WithLabelValues("chat", "openai", "m", "127.0.0.1", errorType).(prometheus.Histogram))
	}
	ok, lost := durations(""), durations(string(outcomeHedgeLost))
	w := httptest.NewRecorder()
	serveDirect(e, w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(fu.ChatRequest("m", true))))
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if n := durations("") - ok; n != 1 {
		t.Errorf("%d successful operations observed, want 1 (the winner)", n)
	}
	if n := durations(string(outcomeHedgeLost)) - lost; n != 1 {
		t.Errorf("%d operations observed with error_type hedge_lost, want 1 (the loser)", n)
	}
}
