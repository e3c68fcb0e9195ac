package provider

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestGeminiModule(t *testing.T) {
	checkModule(t, Gemini{}, "gemini")
}

func TestGeminiUnmarshalCaddyfile(t *testing.T) {
	checkCaddyfile(t, func() caddyfile.Unmarshaler { return new(Gemini) }, []caddyfileCase{
		{in: "gemini", want: &Gemini{}},
		{in: "gemini {\n}", want: &Gemini{}},
		{in: "gemini {\n\tapi_key AIza-1\n}", want: &Gemini{APIKey: "AIza-1"}},
		{in: "gemini extra", err: "wrong argument count or unexpected line ending after 'extra'"},
		{in: "gemini {\n\tapi_key\n}", err: "wrong argument count or unexpected line ending after 'api_key'"},
		{in: "gemini {\n\tapi_key a b\n}", err: "wrong argument count or unexpected line ending after 'b'"},
		{in: "gemini {\n\tapi_version v1beta\n}", err: "unrecognized provider option 'api_version'"},
		{in: "gemini {\n\tproject p\n}", err: "unrecognized provider option 'project'"},
	})
}

func TestGeminiServes(t *testing.T) {
	served := map[API]bool{OpenAIChat: true, OpenAIEmbeddings: true, OpenAIModels: true}
	for api := Unknown; api < NumAPIs; api++ {
		if got := (&Gemini{}).Serves(api); got != served[api] {
			t.Errorf("gemini serves %v = %v, want %v", api, got, served[api])
		}
	}
	if got := (&Gemini{}).DefaultBaseURL(); got != "https://generativelanguage.googleapis.com" {
		t.Errorf("default base URL %q", got)
	}
}

func TestGeminiCheckBaseURL(t *testing.T) {
	for base, ok := range map[string]bool{
		"https://generativelanguage.googleapis.com":               true,
		"https://generativelanguage.googleapis.com/v1beta/openai": true,
		"https://proxy.example.com/google":                        true,
		"https://generativelanguage.googleapis.com/v1":            false,
		"https://proxy.example.com/google/v1/":                    false,
	} {
		if err := (&Gemini{}).CheckBaseURL(mustURL(t, base)); (err == nil) != ok {
			t.Errorf("%s: %v, want ok %v", base, err, ok)
		}
	}
}

func TestGeminiNewRequest(t *testing.T) {
	const chat = `{"model":"gemini","messages":[{"role":"user","content":"hi"}],"stream":true}`
	for _, tt := range []struct {
		name, method, base, target, body, upstreamModel string
		api                                             API
		wantURL, wantBody                               string
	}{
		{"chat", http.MethodPost, "https://generativelanguage.googleapis.com", "/v1/chat/completions?a=b&key=client-q", chat, "gemini-2.5-flash", OpenAIChat,
			"https://generativelanguage.googleapis.com/v1beta/openai/chat/completions?a=b",
			`{"model":"gemini-2.5-flash","messages":[{"role":"user","content":"hi"}],"stream":true}`},
		{"base with the prefix", http.MethodPost, "https://generativelanguage.googleapis.com/v1beta/openai", "/v1/chat/completions", chat, "", OpenAIChat,
			"https://generativelanguage.googleapis.com/v1beta/openai/chat/completions", chat},
		{"proxy prefix", http.MethodPost, "https://proxy.example.com/google", "/api/v1/embeddings", `{"model":"e","input":"x"}`, "gemini-embedding-001", OpenAIEmbeddings,
			"https://proxy.example.com/google/v1beta/openai/embeddings", `{"model":"gemini-embedding-001","input":"x"}`},
		{"models", http.MethodGet, "https://generativelanguage.googleapis.com", "/v1/models", "", "", OpenAIModels,
			"https://generativelanguage.googleapis.com/v1beta/openai/models", ""},
	} {
		g := &Gemini{APIKey: "gemini-key"}
		base := mustURL(t, tt.base)
		r := httptest.NewRequest(tt.method, "http://gw.local"+tt.target, strings.NewReader(tt.body))
		r.Header = withClientCredentials(http.Header{"Content-Type": {"application/json"}})
		var req Request
		if tt.body != "" {
			req = mustParse(t, []byte(tt.body))
		}
		out, err := g.NewRequest(context.Background(), Call{
			API: tt.api, Base: base, Client: r, Body: []byte(tt.body), Request: req, UpstreamModel: tt.upstreamModel,
		})
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := out.URL.String(); got != tt.wantURL {
			t.Errorf("%s: URL %s, want %s", tt.name, got, tt.wantURL)
		}
		if out.Method != tt.method || out.Host != base.Host {
			t.Errorf("%s: %s to host %q", tt.name, out.Method, out.Host)
		}
		// AI Studio's OpenAI endpoint takes the key as a bearer token.
		if got := out.Header.Values("Authorization"); len(got) != 1 || got[0] != "Bearer gemini-key" {
			t.Errorf("%s: authorization %q", tt.name, got)
		}
		checkNoClientCredentials(t, tt.name, out.Header)
		if got := sentBody(t, out); got != tt.wantBody {
			t.Errorf("%s: body %s, want %s", tt.name, got, tt.wantBody)
		}
	}
}

// TestGeminiChannelKey: without api_key the adapter sets no
// Authorization (the client's never passes), and a channel's own header
// (x-goog-api-key) reaches the upstream.
func TestGeminiChannelKey(t *testing.T) {
	body := `{"model":"gemini-2.5-flash"}`
	r := clientRequest(t, "http://gw.local/v1/chat/completions", body, clientCredentials)
	out, err := (&Gemini{}).NewRequest(context.Background(), Call{
		API: OpenAIChat, Base: mustURL(t, "https://generativelanguage.googleapis.com"), Client: r, Body: []byte(body),
		Request: mustParse(t, []byte(body)), Header: http.Header{"X-Goog-Api-Key": {"channel-goog-key"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := out.Header["Authorization"]; ok {
		t.Errorf("authorization %q without an api_key", got)
	}
	if got := out.Header.Get("X-Goog-Api-Key"); got != "channel-goog-key" {
		t.Errorf("x-goog-api-key %q", got)
	}
	checkNoClientCredentials(t, "no api_key", out.Header)
}

func TestGeminiNewRequestRefuses(t *testing.T) {
	body := `{"model":"m"}`
	base := mustURL(t, "https://generativelanguage.googleapis.com")
	for _, p := range []string{"/v1/chat/%2e%2e/x", "/v1/../chat/completions", "/v1/chat%2Fcompletions"} {
		r := clientRequest(t, "http://gw.local"+p, body, nil)
		if out, err := (&Gemini{}).NewRequest(context.Background(), Call{API: OpenAIChat, Base: base, Client: r, Body: []byte(body)}); err == nil {
			t.Errorf("%s: built %s", p, out.URL)
		}
	}
	r := clientRequest(t, "http://gw.local/v1/chat/completions", body, nil)
	if _, err := (&Gemini{}).NewRequest(context.Background(), Call{API: OpenAIChat, Client: r, Body: []byte(body)}); err == nil {
		t.Error("a call without a base URL built a request")
	}
}

// TestGeminiResponseBody: Google's error bodies, array-wrapped or not,
// reach the client as OpenAI's; everything else passes as it came.
func TestGeminiResponseBody(t *testing.T) {
	const exhausted = `[{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}]`
	for _, tt := range []struct {
		name        string
		status      int
		contentType string
		body        string
		want        string // "" when the body passes unchanged
	}{
		{"array-wrapped 429", 429, "application/json; charset=UTF-8", exhausted,
			`{"error":{"message":"Resource has been exhausted (e.g. check quota).","type":"rate_limit_exceeded","param":null,"code":"rate_limit_exceeded"}}`},
		{"plain 400", 400, "application/json", `{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT"}}`,
			`{"error":{"message":"API key not valid. Please pass a valid API key.","type":"invalid_request_error","param":null,"code":null}}`},
		{"503", 503, "application/json", `{"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}}`,
			`{"error":{"message":"The model is overloaded.","type":"server_error","param":null,"code":null}}`},
		{"an error without a message", 400, "application/json", `{"detail":"x"}`, ""},
		{"not JSON", 502, "text/html", `<html>Bad Gateway</html>`, ""},
		{"2xx with an error member", 200, "application/json", `{"error":{"message":"not translated"}}`, ""},
		{"2xx stream", 200, "text/event-stream", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", ""},
	} {
		res := &http.Response{
			StatusCode: tt.status, ContentLength: int64(len(tt.body)),
			Header: http.Header{"Content-Type": {tt.contentType}, "Content-Length": {"99"}},
			Body:   io.NopCloser(strings.NewReader(tt.body)),
		}
		got, err := io.ReadAll((&Gemini{}).ResponseBody(res))
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if tt.want == "" {
			if string(got) != tt.body || res.Header.Get("Content-Length") != "99" {
				t.Errorf("%s: changed to %s (content-length %q)", tt.name, got, res.Header.Get("Content-Length"))
			}
			continue
		}
		if string(got) != tt.want {
			t.Errorf("%s: body %s, want %s", tt.name, got, tt.want)
		}
		if res.Header.Get("Content-Length") != "" || res.ContentLength != -1 || res.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: headers %v, length %d after the body changed", tt.name, res.Header, res.ContentLength)
		}
	}
}

func TestGeminiCredentials(t *testing.T) {
	if got := (&Gemini{APIKey: "gemini-key"}).Credentials(); !reflect.DeepEqual(got, []string{"gemini-key"}) {
		t.Errorf("credentials %q", got)
	}
	if got := (&Gemini{}).Credentials(); len(got) != 0 {
		t.Errorf("credentials %q without a key", got)
	}
	got := ChannelCredentials(nil, http.Header{"X-Goog-Api-Key": {"channel-goog-key"}}, &Gemini{APIKey: "gemini-key"})
	if !reflect.DeepEqual(got, []string{"channel-goog-key", "gemini-key"}) {
		t.Errorf("channel credentials %q", got)
	}
}
