package failoverapp

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/llmfailover/caddy-llm-failover/history"
)

// A window's JSON carries its input and cache-read tokens and their
// share; without input tokens the share is absent, never 0 or NaN.
func TestWindowCacheReadShare(t *testing.T) {
	for _, tc := range []struct {
		c    history.Counts
		want string
	}{
		{history.Counts{Attempts: 2, Successes: 2, InputTokens: 1000, CacheReadTokens: 250},
			`"input_tokens":1000,"cache_read_tokens":250,"cache_read_share":0.25}`},
		{history.Counts{Attempts: 1, Successes: 1, InputTokens: 40},
			`"input_tokens":40,"cache_read_tokens":0,"cache_read_share":0}`},
		{history.Counts{Attempts: 1, Successes: 1}, `"input_tokens":0,"cache_read_tokens":0}`},
		{history.Counts{}, `"input_tokens":0,"cache_read_tokens":0}`},
	} {
		b, err := json.Marshal(windowOf(tc.c))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(string(b), tc.want) {
			t.Errorf("%+v: %s, want it to end %s", tc.c, b, tc.want)
		}
	}
}
