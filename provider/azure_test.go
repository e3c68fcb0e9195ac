package provider

import (
	"context"
	"net/http"
	"reflect"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestAzureModule(t *testing.T) {
	checkModule(t, Azure{}, "azure")
}

func TestAzureUnmarshalCaddyfile(t *testing.T) {
	checkCaddyfile(t, func() caddyfile.Unmarshaler { return new(Azure) }, []caddyfileCase{
		{in: "azure", want: &Azure{}},
		{in: "azure {\n}", want: &Azure{}},
		{in: "azure {\n\tapi_key sk-1\n}", want: &Azure{APIKey: "sk-1"}},
		{in: "azure {\n\tapi_version 2024-10-21\n\tapi_key sk-1\n}", want: &Azure{APIVersion: "2024-10-21", APIKey: "sk-1"}},
		{in: "azure {\n\tapi_version v1\n}", want: &Azure{APIVersion: "v1"}},
		{in: "azure extra", err: "wrong argument count or unexpected line ending after 'extra'"},
		{in: "azure {\n\tapi_key\n}", err: "wrong argument count or unexpected line ending after 'api_key'"},
		{in: "azure {\n\tapi_version 2024-10-21 v1\n}", err: "wrong argument count or unexpected line ending after 'v1'"},
		{in: "azure {\n\tdeployment gpt4o\n}", err: "unrecognized provider option 'deployment'"},
		{in: "azure {\n\tregion eastus\n}", err: "unrecognized provider option 'region'"},
	})
}

func TestAzureServes(t *testing.T) {
	served := map[API]bool{OpenAIChat: true, OpenAIResponses: true, OpenAICompletions: true, OpenAIEmbeddings: true, OpenAIModels: true}
	for api := Unknown; api < NumAPIs; api++ {
		if got := (&Azure{}).Serves(api); got != served[api] {
			t.Errorf("azure serves %v = %v, want %v", api, got, served[api])
		}
	}
	if got := (&Azure{}).DefaultBaseURL(); got != "" {
		t.Errorf("default base URL %q: every Azure resource has its own host", got)
	}
}

func TestAzureCheckBaseURL(t *testing.T) {
	for _, tt := range []struct {
		version, base string
		ok            bool
	}{
		{"", "https://r.openai.azure.com", true},
		{"v1", "https://r.openai.azure.com", true},
		{"", "https://r.openai.azure.com/openai/v1", true},
		{"v1", "https://r.openai.azure.com/openai/v1/", true},
		{"", "https://proxy.example.com/azure", true},
		{"", "https://proxy.example.com/v1", false},
		{"", "https://proxy.example.com/azure/v1/", false},
		{"2024-10-21", "https://r.openai.azure.com", true},
		{"2024-10-21", "https://r.openai.azure.com/openai", true},
		{"2025-04-01-preview", "https://r.openai.azure.com", true},
		{"2024-10-21", "https://r.openai.azure.com/openai/v1", false},
		{"2024-10-21", "https://proxy.example.com/v1", false},
		{"latest", "https://r.openai.azure.com", false},
		{"v2", "https://r.openai.azure.com", false},
		{"2024-10", "https://r.openai.azure.com", false},
		{"2024-10-21-beta", "https://r.openai.azure.com", false},
		{"x2024-10-21", "https://r.openai.azure.com", false},
	} {
		a := &Azure{APIVersion: tt.version}
		if err := a.CheckBaseURL(mustURL(t, tt.base)); (err == nil) != tt.ok {
			t.Errorf("api_version %q, base %s: %v, want ok %v", tt.version, tt.base, err, tt.ok)
		}
	}
}

func TestAzureNewRequest(t *testing.T) {
	const chat = `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`
	for _, tt := range []struct {
		name, version, base, target, body, upstreamModel string
		api                                              API
		wantURL, wantBody                                string
	}{
		{"v1 by default", "", "https://r.openai.azure.com", "/v1/chat/completions?a=b", chat, "gpt4o-prod", OpenAIChat,
			"https://r.openai.azure.com/openai/v1/chat/completions?a=b", `{"model":"gpt4o-prod","messages":[{"role":"user","content":"hi"}]}`},
		{"v1 base ending in /openai/v1", "v1", "https://r.openai.azure.com/openai/v1", "/v1/chat/completions", chat, "gpt4o-prod", OpenAIChat,
			"https://r.openai.azure.com/openai/v1/chat/completions", `{"model":"gpt4o-prod","messages":[{"role":"user","content":"hi"}]}`},
		{"v1 behind a proxy prefix", "", "https://proxy.example.com/azure", "/v1/responses", `{"model":"gpt-4o","input":"hi"}`, "", OpenAIResponses,
			"https://proxy.example.com/azure/openai/v1/responses", `{"model":"gpt-4o","input":"hi"}`},
		{"v1 client path with a prefix", "", "https://r.openai.azure.com", "/openai/v1/embeddings", `{"model":"e","input":"x"}`, "emb", OpenAIEmbeddings,
			"https://r.openai.azure.com/openai/v1/embeddings", `{"model":"emb","input":"x"}`},
		{"dated", "2024-10-21", "https://r.openai.azure.com", "/v1/chat/completions", chat, "gpt4o-prod", OpenAIChat,
			"https://r.openai.azure.com/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21",
			`{"model":"gpt4o-prod","messages":[{"role":"user","content":"hi"}]}`},
		{"dated keeps the client's query", "2025-04-01-preview", "https://r.openai.azure.com", "/v1/chat/completions?a=b&api-key=client-q", chat, "gpt4o-prod", OpenAIChat,
			"https://r.openai.azure.com/openai/deployments/gpt4o-prod/chat/completions?a=b&api-version=2025-04-01-preview",
			`{"model":"gpt4o-prod","messages":[{"role":"user","content":"hi"}]}`},
		{"dated base ending in /openai", "2024-10-21", "https://r.openai.azure.com/openai", "/v1/completions", `{"model":"davinci","prompt":"x"}`, "", OpenAICompletions,
			"https://r.openai.azure.com/openai/deployments/davinci/completions?api-version=2024-10-21", `{"model":"davinci","prompt":"x"}`},
		{"dated deployment from the client's model", "2024-10-21", "https://proxy.example.com/azure", "/v1/embeddings", `{"input":"x","model":"text-embedding-3-small"}`, "", OpenAIEmbeddings,
			"https://proxy.example.com/azure/openai/deployments/text-embedding-3-small/embeddings?api-version=2024-10-21",
			`{"input":"x","model":"text-embedding-3-small"}`},
		{"dated deployment escaped", "2024-10-21", "https://r.openai.azure.com", "/v1/chat/completions", chat, "team/gpt 4o", OpenAIChat,
			"https://r.openai.azure.com/openai/deployments/team%2Fgpt%204o/chat/completions?api-version=2024-10-21",
			`{"model":"team/gpt 4o","messages":[{"role":"user","content":"hi"}]}`},
	} {
		a := &Azure{APIVersion: tt.version, APIKey: "azure-key"}
		base := mustURL(t, tt.base)
		if err := a.CheckBaseURL(base); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		r := clientRequest(t, "http://gw.local"+tt.target, tt.body, withClientCredentials(http.Header{"Content-Type": {"application/json"}}))
		req, err := tt.api.ParseRequest([]byte(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		out, err := a.NewRequest(context.Background(), Call{
			API: tt.api, Base: base, Client: r, Body: []byte(tt.body), Request: req, UpstreamModel: tt.upstreamModel,
		})
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := out.URL.String(); got != tt.wantURL {
			t.Errorf("%s: URL %s, want %s", tt.name, got, tt.wantURL)
		}
		if out.Method != http.MethodPost || out.Host != base.Host {
			t.Errorf("%s: %s to host %q", tt.name, out.Method, out.Host)
		}
		if got := out.Header.Get("Api-Key"); got != "azure-key" {
			t.Errorf("%s: api-key %q", tt.name, got)
		}
		if got := out.Header.Get("Content-Type"); got != "application/json" {
			t.Errorf("%s: content-type %q", tt.name, got)
		}
		checkNoClientCredentials(t, tt.name, out.Header)
		if got := sentBody(t, out); got != tt.wantBody {
			t.Errorf("%s: body %s, want %s", tt.name, got, tt.wantBody)
		}
	}
}

// TestAzureNewRequestOnTheWire sends a dated request to a loopback
// upstream: the deployment stays one escaped path segment and the key
// arrives as api-key, alone.
func TestAzureNewRequestOnTheWire(t *testing.T) {
	up := newRecorder(t)
	a := &Azure{APIVersion: "2024-10-21", APIKey: "azure-key"}
	body := `{"model":"gpt-4o","stream":true}`
	r := clientRequest(t, "http://gw.local/v1/chat/completions", body, clientCredentials)
	out, err := a.NewRequest(context.Background(), Call{
		API: OpenAIChat, Base: mustURL(t, up.URL), Client: r, Body: []byte(body), Request: mustParse(t, []byte(body)), UpstreamModel: "team/gpt 4o",
	})
	if err != nil {
		t.Fatal(err)
	}
	got := up.send(t, out)
	if want := "/openai/deployments/team%2Fgpt%204o/chat/completions?api-version=2024-10-21"; got.uri != want {
		t.Errorf("upstream asked for %s, want %s", got.uri, want)
	}
	if got.method != http.MethodPost {
		t.Errorf("method %s", got.method)
	}
	if k := got.header.Values("Api-Key"); len(k) != 1 || k[0] != "azure-key" {
		t.Errorf("api-key %q", k)
	}
	checkNoClientCredentials(t, "on the wire", got.header)
	if got.body != `{"model":"team/gpt 4o","stream":true}` {
		t.Errorf("body %s", got.body)
	}
}

// TestAzureChannelCredentials: without api_key the adapter sets no
// api-key (the client's never passes), and a channel's own header (an
// Entra ID token) reaches the upstream.
func TestAzureChannelCredentials(t *testing.T) {
	body := `{"model":"gpt-4o"}`
	r := clientRequest(t, "http://gw.local/v1/chat/completions", body, clientCredentials)
	out, err := (&Azure{}).NewRequest(context.Background(), Call{
		API: OpenAIChat, Base: mustURL(t, "https://r.openai.azure.com"), Client: r, Body: []byte(body), Request: mustParse(t, []byte(body)),
		Header: http.Header{"Authorization": {"Bearer entra-token"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := out.Header.Get("Authorization"); got != "Bearer entra-token" {
		t.Errorf("authorization %q", got)
	}
	if got, ok := out.Header["Api-Key"]; ok {
		t.Errorf("api-key %q without an api_key", got)
	}
	checkNoClientCredentials(t, "no api_key", out.Header)
}

func TestAzureNewRequestRefuses(t *testing.T) {
	body := `{"model":"gpt-4o"}`
	base := mustURL(t, "https://r.openai.azure.com")
	for _, a := range []*Azure{{}, {APIVersion: "2024-10-21"}} {
		for _, p := range []string{"/v1/chat/%2e%2e/x", "/v1/../chat/completions", "/v1/chat%2Fcompletions"} {
			r := clientRequest(t, "http://gw.local"+p, body, nil)
			if out, err := a.NewRequest(context.Background(), Call{API: OpenAIChat, Base: base, Client: r, Body: []byte(body)}); err == nil {
				t.Errorf("api_version %q, %s: built %s", a.APIVersion, p, out.URL)
			}
		}
		r := clientRequest(t, "http://gw.local/v1/chat/completions", body, nil)
		if _, err := a.NewRequest(context.Background(), Call{API: OpenAIChat, Client: r, Body: []byte(body)}); err == nil {
			t.Errorf("api_version %q: a call without a base URL built a request", a.APIVersion)
		}
	}
}

func TestAzureCredentials(t *testing.T) {
	if got := (&Azure{APIKey: "azure-key", APIVersion: "2024-10-21"}).Credentials(); !reflect.DeepEqual(got, []string{"azure-key"}) {
		t.Errorf("credentials %q", got)
	}
	if got := (&Azure{APIVersion: "2024-10-21"}).Credentials(); len(got) != 0 {
		t.Errorf("credentials %q without a key", got)
	}
	got := ChannelCredentials(nil, http.Header{"Anthropic-Version": {"x"}}, &Azure{APIKey: "azure-key"})
	if !reflect.DeepEqual(got, []string{"azure-key"}) {
		t.Errorf("channel credentials %q", got)
	}
}

// TestAzureDatedResponses: with a dated api_version, Azure serves the
// Responses API at <base>/openai/responses?api-version=<date>, the
// deployment named by "model" in the body, not under
// /openai/deployments/<deployment>/ (Microsoft's REST example; the
// official openai-python AzureOpenAI client keeps /responses out of its
// deployment-scoped endpoints).
func TestAzureDatedResponses(t *testing.T) {
	body := `{"model":"gpt-4o","input":"hi"}`
	r := clientRequest(t, "http://gw.local/v1/responses", body, nil)
	out, err := (&Azure{APIVersion: "2025-04-01-preview", APIKey: "azure-key"}).NewRequest(context.Background(), Call{
		API: OpenAIResponses, Base: mustURL(t, "https://r.openai.azure.com"), Client: r, Body: []byte(body),
		Request: mustParse(t, []byte(body)), UpstreamModel: "gpt4o-prod",
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := out.URL.String(), "https://r.openai.azure.com/openai/responses?api-version=2025-04-01-preview"; got != want {
		t.Errorf("URL %s, want %s", got, want)
	}
	if got := sentBody(t, out); got != `{"model":"gpt4o-prod","input":"hi"}` {
		t.Errorf("body %s", got)
	}
}
