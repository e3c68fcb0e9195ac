package provider

import "testing"

// Every provider has default prompt-cache rates, and none charges a
// cache read at the full input price.
func TestDefaultCacheRates(t *testing.T) {
	for _, c := range []struct {
		name  string
		a     Adapter
		model string
		want  CacheRates
	}{
		{"anthropic", Anthropic{}, "claude-sonnet-4-5", claudeCacheRates},
		{"bedrock", &Bedrock{}, "us.anthropic.claude-sonnet-4-5-v1:0", claudeCacheRates},
		{"vertex claude", &Vertex{}, "claude-sonnet-4-5@20250929", claudeCacheRates},
		{"vertex gemini", &Vertex{}, "google/gemini-2.5-flash", geminiCacheRates},
		{"openai", OpenAI{}, "gpt-5", openAICacheRates},
		{"azure", &Azure{}, "gpt5-prod", openAICacheRates},
		{"gemini", &Gemini{}, "gemini-2.5-flash", geminiCacheRates},
	} {
		got := DefaultCacheRates(c.a, c.model)
		if got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
		if got.Read <= 0 || got.Read >= 1000 || got.Write < 1000 || got.Write1h < got.Write {
			t.Errorf("%s: implausible rates %+v", c.name, got)
		}
	}
}

// A request asks for a cache write by a cache_control marker; an hour's
// by its ttl; text that mentions either is not one.
func TestCacheWrites(t *testing.T) {
	for _, c := range []struct {
		body           string
		write, write1h bool
	}{
		{`{"messages":[{"role":"user","content":"hi"}]}`, false, false},
		{`{"system":[{"type":"text","text":"long","cache_control":{"type":"ephemeral"}}],"messages":[]}`, true, false},
		{`{"system":[{"type":"text","text":"long","cache_control":{"type":"ephemeral","ttl":"5m"}}],"messages":[]}`, true, false},
		{`{"system":[{"type":"text","text":"long","cache_control":{"type":"ephemeral", "ttl" : "1h"}}],"messages":[]}`, true, true},
		{`{"cache_control":{"type":"ephemeral"},"messages":[]}`, true, false},
		{`{"messages":[{"role":"user","content":"what does \"cache_control\" do?"}]}`, false, false},
	} {
		w, w1h := CacheWrites([]byte(c.body))
		if w != c.write || w1h != c.write1h {
			t.Errorf("%s: %v %v, want %v %v", c.body, w, w1h, c.write, c.write1h)
		}
	}
}
