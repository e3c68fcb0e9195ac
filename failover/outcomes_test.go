package failover

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// The history's input tokens are every class the upstream reported, and
// its cache reads the part read from the prompt cache; nothing without a
// meter or a reported input.
func TestReportedInput(t *testing.T) {
	meter := func(api provider.API, body string) *provider.Meter {
		m := api.NewMeter()
		m.Body([]byte(body))
		return m
	}
	for _, tc := range []struct {
		name        string
		m           *provider.Meter
		all, cached int64
	}{
		{"no meter", nil, 0, 0},
		{"anthropic", meter(provider.AnthropicMessages, `{"type":"message","content":[{"type":"text","text":"Hi"}],`+
			`"usage":{"input_tokens":25,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":3}}`), 2125, 2000},
		{"openai", meter(provider.OpenAIChat, `{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"}}],`+
			`"usage":{"prompt_tokens":900,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":512}}}`), 900, 512},
		{"unreported", meter(provider.OpenAIChat, `{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"}}]}`), 0, 0},
	} {
		if all, cached := reportedInput(tc.m); all != tc.all || cached != tc.cached {
			t.Errorf("%s: %d input, %d cache read; want %d, %d", tc.name, all, cached, tc.all, tc.cached)
		}
	}
}

// requests_total says how each request ended as its client saw it, as the
// status page's model windows do: a committed stream that broke off is
// "broken", not "served", and is counted once.
func TestRequestsTotalCountsHowRequestsEnded(t *testing.T) {
	count := func(outcome string) float64 { return testutil.ToFloat64(requestsTotal.WithLabelValues("m", outcome)) }
	for _, tc := range []struct {
		name     string
		answer   fu.Behavior
		stream   bool
		outcome  string
		notCount string
	}{
		{"served", fu.OK(), true, "served", "broken"},
		{"broken", fu.CutMidStream(), true, "broken", "served"},
		// An upstream's error passed back (a channel whose key is wrong
		// answers 401 to everyone): the page counts a client error, never
		// a success; nor may requests_total count it served.
		{"passed", fu.Status(401, fu.OpenAIErrorBody("Incorrect API key provided", "invalid_request_error", "invalid_api_key")),
			false, "passed", "served"},
	} {
		e := testEngine(t, testPlan(t, Options{}, nil, testChannel{name: uniqueName(tc.name), url: upstream(t, tc.answer).URL}))
		before, other := count(tc.outcome), count(tc.notCount)
		if _, ok := send(e, "/v1/chat/completions", fu.ChatRequest("m", tc.stream)); !ok {
			t.Fatalf("%s: no answer", tc.name)
		}
		if d := count(tc.outcome) - before; d != 1 {
			t.Errorf("%s: requests_total{outcome=%q} rose by %v, want 1", tc.name, tc.outcome, d)
		}
		if d := count(tc.notCount) - other; d != 0 {
			t.Errorf("%s: requests_total{outcome=%q} rose by %v, want 0", tc.name, tc.notCount, d)
		}
	}
}
