package caddykit

import (
	"strings"
	"testing"
)

func TestResolveNamesWhatIsMissing(t *testing.T) {
	t.Setenv("LLMF_RESOLVE_SET", "sk-secret-value")
	t.Setenv("LLMF_RESOLVE_EMPTY", "")
	if got, err := Resolve("Bearer {env.LLMF_RESOLVE_SET}"); err != nil || got != "Bearer sk-secret-value" {
		t.Fatalf("Resolve = %q, %v", got, err)
	}
	for v, want := range map[string]string{
		"Bearer {env.LLMF_RESOLVE_UNSET}":                       "the environment variable LLMF_RESOLVE_UNSET is not set or empty: set it",
		"{env.LLMF_RESOLVE_EMPTY}":                              "LLMF_RESOLVE_EMPTY is not set",
		"{env.LLMF_RESOLVE_A_UNSET}:{env.LLMF_RESOLVE_B_UNSET}": "LLMF_RESOLVE_A_UNSET, LLMF_RESOLVE_B_UNSET are not set",
		"{http.request.uri}":                                    "cannot be resolved when the config loads",
		"":                                                      "the value is empty",
	} {
		_, err := Resolve(v)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Resolve(%q) = %v, want an error saying %q", v, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "sk-secret-value") {
			t.Errorf("the error shows a secret: %v", err)
		}
	}
}
