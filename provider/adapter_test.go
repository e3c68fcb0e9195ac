package provider

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestCheckBaseURL(t *testing.T) {
	for _, tt := range []struct {
		base string
		ok   bool
	}{
		{"https://api.openai.com", true},
		{"https://openrouter.ai/api", true},
		{"https://proxy.example.com/v1beta", true},
		{"https://proxy.example.com/v2", true},
		{"https://api.openai.com/v1", false},
		{"https://api.openai.com/v1/", false},
		{"https://gateway.example.com/openai/v1", false},
	} {
		u, err := url.Parse(tt.base)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range []Adapter{OpenAI{}, Anthropic{}} {
			if err := a.CheckBaseURL(u); (err == nil) != tt.ok {
				t.Errorf("%T.CheckBaseURL(%s) = %v, want ok %v", a, tt.base, err, tt.ok)
			}
		}
	}
}

func TestServes(t *testing.T) {
	for api := Unknown; api < NumAPIs; api++ {
		if !(OpenAI{}).Serves(api) {
			t.Errorf("openai does not serve %v", api)
		}
		want := api == AnthropicMessages || api == AnthropicCountTokens || api == OpenAIModels
		if got := (Anthropic{}).Serves(api); got != want {
			t.Errorf("anthropic serves %v = %v, want %v", api, got, want)
		}
	}
	if (OpenAI{}).DefaultBaseURL() != "" || (Anthropic{}).DefaultBaseURL() != "https://api.anthropic.com" {
		t.Error("default base URLs")
	}
}

// clientRequest is a request as the handler receives it.
func clientRequest(t *testing.T, target, body string, hdr http.Header) *http.Request {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	for k, v := range hdr {
		r.Header[k] = v
	}
	return r
}

func TestNewRequest(t *testing.T) {
	base, _ := url.Parse("https://up.example.com/api/x?key=1")
	body := `{"model":"m","stream":true}`
	r := clientRequest(t, "http://gw.local/v1/chat/completions?Access_Token=client&a=b", body, http.Header{
		"Authorization":   {"Bearer client"},
		"Connection":      {"keep-alive, X-Hop"},
		"X-Hop":           {"1"},
		"X-Forwarded-For": {"10.0.0.1"},
		"Accept-Encoding": {"gzip"},
		"X-Custom":        {"dropped"},
		"X-Passed":        {"by the operator"},
		"Openai-Beta":     {"assistants=v2"},
		"Anthropic-Beta":  {"not for OpenAI paths"},
		"Cookie":          {"session=1"},
		"User-Agent":      {"client-sdk/1.0"},
	})
	req, _ := OpenAIChat.ParseRequest([]byte(body))
	out, err := OpenAI{}.NewRequest(context.Background(), Call{
		API: OpenAIChat, Base: base, Client: r, Body: []byte(body), Request: req,
		UpstreamModel: "upstream-m", Header: http.Header{"Authorization": {"Bearer channel"}}, PassHeader: []string{"x-passed"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := out.URL.String(); got != "https://up.example.com/api/x/v1/chat/completions?key=1&a=b" {
		t.Errorf("URL %s", got)
	}
	if out.Host != "up.example.com" || out.RequestURI != "" {
		t.Errorf("Host %q RequestURI %q", out.Host, out.RequestURI)
	}
	for k, want := range map[string]string{
		"Authorization": "Bearer channel", "X-Custom": "", "Openai-Beta": "assistants=v2", "X-Passed": "by the operator",
		"X-Hop": "", "X-Forwarded-For": "", "Accept-Encoding": "", "Connection": "", "Anthropic-Beta": "", "Cookie": "",
	} {
		if got := out.Header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	if ua, ok := out.Header["User-Agent"]; !ok || len(ua) != 1 || ua[0] != "" {
		t.Errorf("User-Agent %q: want an empty one so Go sends none", ua)
	}
	for _, p := range []string{"/v1/chat/%2e%2e/x", "/v1/../x", "/v1/chat%2Fcompletions"} {
		u := clientRequest(t, "http://gw.local"+p, body, nil)
		if _, err := (OpenAI{}).NewRequest(context.Background(), Call{API: OpenAIChat, Base: base, Client: u, Body: []byte(body)}); err == nil {
			t.Errorf("%s: built a request", p)
		}
	}
	got, _ := io.ReadAll(out.Body)
	if string(got) != `{"model":"upstream-m","stream":true}` || out.ContentLength != int64(len(got)) {
		t.Errorf("body %s (length %d)", got, out.ContentLength)
	}
	again, _ := out.GetBody()
	if b, _ := io.ReadAll(again); string(b) != string(got) {
		t.Errorf("GetBody replays %s", b)
	}
	if r.Header.Get("Authorization") != "Bearer client" {
		t.Error("the client's request was changed")
	}
	if _, err := (OpenAI{}).NewRequest(context.Background(), Call{Client: r}); err == nil {
		t.Error("a call without a base URL built a request")
	}
}

func TestAnthropicNewRequestAddsVersion(t *testing.T) {
	base, _ := url.Parse("https://api.anthropic.com")
	body := []byte(`{"model":"claude","max_tokens":10}`)
	for _, tt := range []struct {
		name           string
		client, header http.Header
		want           string
	}{
		{"none", nil, nil, anthropicVersion},
		{"client's", http.Header{"Anthropic-Version": {"2024-10-22"}}, nil, "2024-10-22"},
		{"channel's", http.Header{"Anthropic-Version": {"2024-10-22"}}, http.Header{"Anthropic-Version": {"2025-01-01"}}, "2025-01-01"},
	} {
		r := clientRequest(t, "http://gw.local/v1/messages", string(body), tt.client)
		out, err := Anthropic{}.NewRequest(context.Background(), Call{API: AnthropicMessages, Base: base, Client: r, Body: body, Header: tt.header})
		if err != nil {
			t.Fatal(err)
		}
		if got := out.Header.Get("Anthropic-Version"); got != tt.want {
			t.Errorf("%s: anthropic-version %q, want %q", tt.name, got, tt.want)
		}
		if got := out.URL.String(); got != "https://api.anthropic.com/v1/messages" {
			t.Errorf("%s: URL %s", tt.name, got)
		}
	}
}

func TestCopyResponseHeader(t *testing.T) {
	src := http.Header{
		"Content-Type": {"text/event-stream"}, "Connection": {"X-Hop"}, "X-Hop": {"1"},
		"Transfer-Encoding": {"chunked"}, "Content-Length": {"9"}, "X-Request-Id": {"r1"},
		"Openai-Processing-Ms": {"12"}, "Request-Id": {"req_1"},
		"Set-Cookie": {"__cf_bm=x"}, "Strict-Transport-Security": {"max-age=0"},
		"Access-Control-Allow-Origin": {"*"}, "Alt-Svc": {`h3=":443"`},
		"Openai-Organization": {"org-secret"}, "Anthropic-Organization-Id": {"org"}, "Openai-Project": {"proj"},
		"X-Ratelimit-Remaining-Tokens": {"99"}, "Anthropic-Ratelimit-Requests-Limit": {"50"}, "X-Vendor": {"v"},
	}
	dst := http.Header{}
	OpenAI{}.CopyResponseHeader(dst, src)
	want := http.Header{"Content-Type": {"text/event-stream"}, "X-Request-Id": {"r1"}, "Openai-Processing-Ms": {"12"}, "Request-Id": {"req_1"}}
	if !reflect.DeepEqual(dst, want) {
		t.Errorf("copied %v, want %v", dst, want)
	}
	(&Extras{Response: []string{"x-vendor"}, RateLimit: true}).CopyResponse(dst, src)
	for _, k := range []string{"X-Vendor", "X-Ratelimit-Remaining-Tokens", "Anthropic-Ratelimit-Requests-Limit"} {
		if dst.Get(k) == "" {
			t.Errorf("extra %s not copied", k)
		}
	}
	if len(dst) != len(want)+3 {
		t.Errorf("extras copied more: %v", dst)
	}
	if !(OpenAI{}).IsStream(src) || (OpenAI{}).IsJSON(src) {
		t.Error("event stream not recognised")
	}
	if !(Anthropic{}).IsJSON(http.Header{"Content-Type": {"application/problem+json"}}) {
		t.Error("+json not recognised")
	}
	if !IsLineStream(OpenAI{}, http.Header{"Content-Type": {"application/x-ndjson"}}) || IsLineStream(OpenAI{}, src) {
		t.Error("NDJSON not told apart")
	}
}

func TestAnthropicRequestHeaders(t *testing.T) {
	r := clientRequest(t, "http://gw.local/v1/messages", "{}", http.Header{
		"Anthropic-Beta": {"prompt-caching"}, "Openai-Beta": {"x"}, "X-Api-Key": {"client"}, "Idempotency-Key": {"k1"},
	})
	base, _ := url.Parse("https://api.anthropic.com")
	out, err := Anthropic{}.NewRequest(context.Background(), Call{API: AnthropicMessages, Base: base, Client: r, Body: []byte("{}")})
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"Anthropic-Beta": "prompt-caching", "Openai-Beta": "", "X-Api-Key": "", "Idempotency-Key": "k1"} {
		if got := out.Header.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
}

func TestUnmarshalCaddyfile(t *testing.T) {
	for in, ok := range map[string]bool{
		"anthropic":                   true,
		"anthropic {\n}":              true,
		"anthropic extra":             false,
		"anthropic {\n\tversion 1\n}": false,
	} {
		err := new(Anthropic).UnmarshalCaddyfile(caddyfile.NewTestDispenser(in))
		if (err == nil) != ok {
			t.Errorf("%q: %v, want ok %v", in, err, ok)
		}
	}
}

func TestAskUsage(t *testing.T) {
	ask := []byte(`{"model":"m","stream":true}`)
	for _, tt := range []struct {
		name string
		api  API
		body string
		ask  bool
	}{
		{"chat stream", OpenAIChat, string(ask), true},
		{"chat stream asking usage", OpenAIChat, `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, false},
		// A client that did not ask for usage does not decide whether
		// the gateway can bill: a reasoning model's reasoning shows only
		// in the usage report.
		{"chat stream refusing usage", OpenAIChat, `{"model":"m","stream":true,"stream_options":{"include_usage":false}}`, true},
		{"chat stream with other options", OpenAIChat, `{"model":"m","stream":true,"stream_options":{"include_obfuscation":false}}`, true},
		{"chat stream with empty options", OpenAIChat, `{"model":"m","stream":true,"stream_options":{ }}`, true},
		{"chat not streamed", OpenAIChat, `{"model":"m"}`, false},
		{"responses stream", OpenAIResponses, string(ask), false},
		{"anthropic stream", AnthropicMessages, string(ask), false},
	} {
		req, err := tt.api.ParseRequest([]byte(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		out, hide := tt.api.AskUsage([]byte(tt.body), req)
		if tt.ask != (hide != nil) || tt.ask != (string(out) != tt.body) {
			t.Errorf("%s: AskUsage = %s, hide %v", tt.name, out, hide != nil)
		}
		if tt.ask {
			if r, _ := tt.api.ParseRequest(out); !r.IncludeUsage {
				t.Errorf("%s: %s does not ask for usage", tt.name, out)
			}
		}
	}
}
