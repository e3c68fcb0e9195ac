package failover

import (
	"testing"

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
