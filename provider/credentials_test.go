package provider

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// loadAdapter decodes an adapter's JSON and provisions it as Caddy does
// when it loads a channel's provider module.
func loadAdapter(t *testing.T, name, cfg string) (Adapter, error) {
	t.Helper()
	info, err := caddy.GetModule(Namespace + "." + name)
	if err != nil {
		t.Fatal(err)
	}
	mod := info.New()
	if err := json.Unmarshal([]byte(cfg), mod); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if p, ok := mod.(caddy.Provisioner); ok {
		if err := p.Provision(ctx); err != nil {
			return nil, err
		}
	}
	if v, ok := mod.(caddy.Validator); ok {
		if err := v.Validate(); err != nil {
			return nil, err
		}
	}
	return mod.(Adapter), nil
}

// TestProviderSecretsResolveEnvPlaceholders: docs/providers.md writes
// provider keys as {env.*} placeholders (api_key
// {env.AZURE_OPENAI_API_KEY}); like a channel's header values they are
// resolved when the config loads, and an unset variable is a load error
// naming it, never a literal "{env.X}" sent upstream as the key.
func TestProviderSecretsResolveEnvPlaceholders(t *testing.T) {
	t.Setenv("LLMF_TEST_PROVIDER_KEY", "resolved-key")
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for _, tt := range []struct {
		name, cfg, header, want string
	}{
		{"azure", `{"api_key":"{env.LLMF_TEST_PROVIDER_KEY}"}`, "Api-Key", "resolved-key"},
		{"gemini", `{"api_key":"{env.LLMF_TEST_PROVIDER_KEY}"}`, "Authorization", "Bearer resolved-key"},
		{"bedrock", `{"region":"us-east-1","api_key":"{env.LLMF_TEST_PROVIDER_KEY}"}`, "", ""},
		{"bedrock", `{"region":"us-east-1","access_key_id":"AKIAFAKE","secret_access_key":"{env.LLMF_TEST_PROVIDER_KEY}"}`, "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, err := loadAdapter(t, tt.name, tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			creds := a.(Credentialed).Credentials()
			if !slices.Contains(creds, "resolved-key") || slices.ContainsFunc(creds, func(s string) bool { return strings.Contains(s, "{env.") }) {
				t.Errorf("credentials %q: the placeholder was not resolved", creds)
			}
			if tt.header == "" {
				return
			}
			r := clientRequest(t, "http://gw.local/v1/chat/completions", body, nil)
			out, err := a.NewRequest(context.Background(), Call{API: OpenAIChat, Base: mustURL(t, "https://upstream.example.com"),
				Client: r, Body: []byte(body), Request: mustParse(t, []byte(body)), Header: http.Header{}})
			if err != nil {
				t.Fatal(err)
			}
			if got := out.Header.Get(tt.header); got != tt.want {
				t.Errorf("%s: %q, want %q", tt.header, got, tt.want)
			}
		})
	}
	t.Run("unset", func(t *testing.T) {
		for _, name := range []string{"azure", "gemini"} {
			_, err := loadAdapter(t, name, `{"api_key":"{env.LLMF_TEST_PROVIDER_KEY_UNSET}"}`)
			if err == nil || !strings.Contains(err.Error(), "LLMF_TEST_PROVIDER_KEY_UNSET") {
				t.Errorf("%s: an unset variable loaded: %v", name, err)
			}
		}
	})
}

// A key in the base URL's query is the channel's secret like a header's;
// the query's other parameters (an API version, a date) are not, since
// masking them would mangle answers that mention them.
func TestChannelCredentialsFromBaseQuery(t *testing.T) {
	base := mustURL(t, "https://h.example/v1?api-version=2024-10-21&KEY=query-secret-0123&token=tok-secret-4567")
	got := ChannelCredentials(base, http.Header{"Authorization": {"Bearer header-secret"}}, nil)
	slices.Sort(got)
	want := []string{"Bearer header-secret", "query-secret-0123", "tok-secret-4567"}
	if !slices.Equal(got, want) {
		t.Fatalf("credentials %q, want %q", got, want)
	}
}
