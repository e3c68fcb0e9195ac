package provider

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"
	"golang.org/x/oauth2"
)

func TestVertexModule(t *testing.T) {
	checkModule(t, Vertex{}, "vertex")
}

func TestVertexUnmarshalCaddyfile(t *testing.T) {
	checkCaddyfile(t, func() caddyfile.Unmarshaler { return new(Vertex) }, []caddyfileCase{
		{in: "vertex", want: &Vertex{}},
		{in: "vertex {\n\tproject my-proj\n\tregion us-east5\n}", want: &Vertex{Project: "my-proj", Region: "us-east5"}},
		{in: "vertex {\n\tproject my-proj\n\tregion global\n\tcredentials_file /etc/caddy/sa.json\n}",
			want: &Vertex{Project: "my-proj", Region: "global", CredentialsFile: "/etc/caddy/sa.json"}},
		{in: "vertex my-proj", err: "wrong argument count or unexpected line ending after 'my-proj'"},
		{in: "vertex {\n\tproject\n}", err: "wrong argument count or unexpected line ending after 'project'"},
		{in: "vertex {\n\tregion us-east5 europe-west1\n}", err: "wrong argument count or unexpected line ending after 'europe-west1'"},
		{in: "vertex {\n\tapi_key k\n}", err: "unrecognized provider option 'api_key'"},
		{in: "vertex {\n\tlocation us-east5\n}", err: "unrecognized provider option 'location'"},
	})
}

func TestVertexServes(t *testing.T) {
	for api := Unknown; api < NumAPIs; api++ {
		want := api == AnthropicMessages || api == OpenAIChat
		if got := (&Vertex{}).Serves(api); got != want {
			t.Errorf("vertex serves %v = %v, want %v", api, got, want)
		}
	}
	for region, want := range map[string]string{
		"":            "",
		"global":      "https://aiplatform.googleapis.com",
		"us-east5":    "https://us-east5-aiplatform.googleapis.com",
		"europe-west": "https://europe-west-aiplatform.googleapis.com",
	} {
		if got := (&Vertex{Project: "p", Region: region}).DefaultBaseURL(); got != want {
			t.Errorf("region %q: default base URL %q, want %q", region, got, want)
		}
	}
}

func TestVertexCheckBaseURL(t *testing.T) {
	for _, tt := range []struct {
		project, region, base string
		ok                    bool
	}{
		{"p", "us-east5", "https://us-east5-aiplatform.googleapis.com", true},
		{"p", "global", "https://aiplatform.googleapis.com", true},
		{"p", "us-east5", "https://proxy.example.com/vertex", true},
		{"", "us-east5", "https://us-east5-aiplatform.googleapis.com", false},
		{"p", "", "https://us-east5-aiplatform.googleapis.com", false},
		{"p", "us-east5", "https://us-east5-aiplatform.googleapis.com/v1", false},
		{"p", "us-east5", "https://proxy.example.com/vertex/v1", false},
	} {
		v := &Vertex{Project: tt.project, Region: tt.region}
		if err := v.CheckBaseURL(mustURL(t, tt.base)); (err == nil) != tt.ok {
			t.Errorf("project %q, region %q, base %s: %v, want ok %v", tt.project, tt.region, tt.base, err, tt.ok)
		}
	}
}

// tokenFunc is an oauth2.TokenSource made of a function.
type tokenFunc func() (*oauth2.Token, error)

func (f tokenFunc) Token() (*oauth2.Token, error) { return f() }

// provisionedVertex is a Vertex whose token keeper hands out token.
func provisionedVertex(t *testing.T, project, region, token string) *Vertex {
	t.Helper()
	v := &Vertex{Project: project, Region: region}
	v.tokens = newTokenKeeper(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: token}), zap.NewNop())
	t.Cleanup(func() { _ = v.Cleanup() })
	return v
}

func TestVertexNewRequest(t *testing.T) {
	const claude = `{"model":"claude-sonnet-4-5","max_tokens":10,"anthropic_version":"2023-06-01","messages":[{"role":"user","content":"hi"}]}`
	const claudeStream = `{"model":"claude-sonnet-4-5","stream":true,"max_tokens":10,"messages":[]}`
	const chat = `{"model":"gemini-2.5-flash","messages":[{"role":"user","content":"hi"}],"stream":true}`
	const models = "/v1/projects/my-proj/locations/us-east5/publishers/anthropic/models/"
	for _, tt := range []struct {
		name, region, base, target, body, upstreamModel string
		api                                             API
		wantURL, wantBody                               string
	}{
		{"claude", "us-east5", "https://us-east5-aiplatform.googleapis.com", "/v1/messages?beta=true", claude, "claude-sonnet-4-5@20250929", AnthropicMessages,
			"https://us-east5-aiplatform.googleapis.com" + models + "claude-sonnet-4-5@20250929:rawPredict",
			`{"max_tokens":10,"messages":[{"role":"user","content":"hi"}],"anthropic_version":"vertex-2023-10-16"}`},
		{"claude stream", "us-east5", "https://us-east5-aiplatform.googleapis.com", "/v1/messages", claudeStream, "claude-sonnet-4-5@20250929", AnthropicMessages,
			"https://us-east5-aiplatform.googleapis.com" + models + "claude-sonnet-4-5@20250929:streamRawPredict",
			`{"stream":true,"max_tokens":10,"messages":[],"anthropic_version":"vertex-2023-10-16"}`},
		{"claude, the client's model", "us-east5", "https://us-east5-aiplatform.googleapis.com", "/v1/messages", claude, "", AnthropicMessages,
			"https://us-east5-aiplatform.googleapis.com" + models + "claude-sonnet-4-5:rawPredict",
			`{"max_tokens":10,"messages":[{"role":"user","content":"hi"}],"anthropic_version":"vertex-2023-10-16"}`},
		{"claude, model escaped", "us-east5", "https://us-east5-aiplatform.googleapis.com", "/v1/messages", claude, "a/b c", AnthropicMessages,
			"https://us-east5-aiplatform.googleapis.com" + models + "a%2Fb%20c:rawPredict",
			`{"max_tokens":10,"messages":[{"role":"user","content":"hi"}],"anthropic_version":"vertex-2023-10-16"}`},
		{"claude, global", "global", "https://aiplatform.googleapis.com", "/v1/messages", claude, "claude-opus-4-1@20250805", AnthropicMessages,
			"https://aiplatform.googleapis.com/v1/projects/my-proj/locations/global/publishers/anthropic/models/claude-opus-4-1@20250805:rawPredict",
			`{"max_tokens":10,"messages":[{"role":"user","content":"hi"}],"anthropic_version":"vertex-2023-10-16"}`},
		{"claude, proxy prefix", "us-east5", "https://proxy.example.com/vertex", "/v1/messages", claude, "claude-sonnet-4-5@20250929", AnthropicMessages,
			"https://proxy.example.com/vertex" + models + "claude-sonnet-4-5@20250929:rawPredict",
			`{"max_tokens":10,"messages":[{"role":"user","content":"hi"}],"anthropic_version":"vertex-2023-10-16"}`},
		{"openai chat", "us-east5", "https://us-east5-aiplatform.googleapis.com", "/v1/chat/completions?a=b", chat, "google/gemini-2.5-flash", OpenAIChat,
			"https://us-east5-aiplatform.googleapis.com/v1/projects/my-proj/locations/us-east5/endpoints/openapi/chat/completions?a=b",
			`{"model":"google/gemini-2.5-flash","messages":[{"role":"user","content":"hi"}],"stream":true}`},
		{"openai chat, global", "global", "https://aiplatform.googleapis.com", "/v1/chat/completions", chat, "", OpenAIChat,
			"https://aiplatform.googleapis.com/v1/projects/my-proj/locations/global/endpoints/openapi/chat/completions", chat},
	} {
		v := provisionedVertex(t, "my-proj", tt.region, "ya29.static")
		base := mustURL(t, tt.base)
		if err := v.CheckBaseURL(base); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		r := clientRequest(t, "http://gw.local"+tt.target, tt.body, withClientCredentials(http.Header{
			"Content-Type": {"application/json"}, "Anthropic-Version": {"2023-06-01"}, "Anthropic-Beta": {"prompt-caching-2024-07-31"},
		}))
		out, err := v.NewRequest(context.Background(), Call{
			API: tt.api, Base: base, Client: r, Body: []byte(tt.body), Request: mustParse(t, []byte(tt.body)), UpstreamModel: tt.upstreamModel,
			Header: http.Header{"Anthropic-Beta": {"context-1m-2025-08-07"}, "Authorization": {"Bearer channel-stale"}},
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
		if got := out.Header.Values("Authorization"); len(got) != 1 || got[0] != "Bearer ya29.static" {
			t.Errorf("%s: authorization %q, want the access token alone", tt.name, got)
		}
		// On Claude's path, Vertex answers 400 to a beta it does not know
		// and takes the version in the body: none of Anthropic's own
		// headers are sent, not even the channel's. OpenAI chat never
		// forwards the client's.
		for _, k := range []string{"Anthropic-Beta", "Anthropic-Version", "X-Api-Key"} {
			got, ok := out.Header[k]
			if tt.api == OpenAIChat && k == "Anthropic-Beta" {
				ok = slices.Contains(got, "prompt-caching-2024-07-31")
			}
			if ok {
				t.Errorf("%s: %s %q sent", tt.name, k, got)
			}
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

func TestVertexNewRequestRefuses(t *testing.T) {
	body := `{"model":"claude","max_tokens":1}`
	base := mustURL(t, "https://us-east5-aiplatform.googleapis.com")
	call := func(p string) Call {
		return Call{API: AnthropicMessages, Base: base, Client: clientRequest(t, "http://gw.local"+p, body, nil), Body: []byte(body), Request: mustParse(t, []byte(body))}
	}
	if _, err := (&Vertex{Project: "p", Region: "us-east5"}).NewRequest(context.Background(), call("/v1/messages")); !errors.Is(err, errNotProvisioned) {
		t.Errorf("before Provision: %v", err)
	}
	v := provisionedVertex(t, "p", "us-east5", "ya29.static")
	for _, p := range []string{"/v1/%2e%2e/messages", "/v1/../messages", "/v1%2Fmessages"} {
		if out, err := v.NewRequest(context.Background(), call(p)); err == nil {
			t.Errorf("%s: built %s", p, out.URL)
		}
	}
	c := call("/v1/messages")
	c.Base = nil
	if _, err := v.NewRequest(context.Background(), c); err == nil {
		t.Error("a call without a base URL built a request")
	}
}

// TestVertexTokenErrors: without a valid token no request is built.
func TestVertexTokenErrors(t *testing.T) {
	body := `{"model":"claude","max_tokens":1}`
	for name, src := range map[string]oauth2.TokenSource{
		"refused":     tokenFunc(func() (*oauth2.Token, error) { return nil, errors.New("invalid_grant: account disabled") }),
		"empty token": tokenFunc(func() (*oauth2.Token, error) { return &oauth2.Token{}, nil }),
	} {
		v := &Vertex{Project: "p", Region: "us-east5", tokens: newTokenKeeper(src, zap.NewNop())}
		out, err := v.NewRequest(context.Background(), Call{
			API: AnthropicMessages, Base: mustURL(t, "https://us-east5-aiplatform.googleapis.com"),
			Client: clientRequest(t, "http://gw.local/v1/messages", body, nil), Body: []byte(body), Request: mustParse(t, []byte(body)),
		})
		_ = v.Cleanup()
		if err == nil {
			t.Errorf("%s: built a request with authorization %q", name, out.Header.Get("Authorization"))
			continue
		}
		if !strings.HasPrefix(err.Error(), "vertex: ") {
			t.Errorf("%s: error %q does not name vertex", name, err)
		}
		if name == "refused" && !strings.Contains(err.Error(), "account disabled") || name == "empty token" && !errors.Is(err, errNoToken) {
			t.Errorf("%s: error %v", name, err)
		}
	}
}

// tokenServer is a loopback OAuth token endpoint for service accounts:
// it checks the JWT grant and issues ya29.issued-<n>.
type tokenServer struct {
	*httptest.Server
	issued  atomic.Int32
	problem atomic.Value // string: what was wrong with a grant
}

func newTokenServer(t *testing.T, email string) *tokenServer {
	ts := &tokenServer{}
	ts.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fail := func(p string) {
			ts.problem.Store(p)
			http.Error(w, `{"error":"invalid_grant"}`, http.StatusBadRequest)
		}
		if err := r.ParseForm(); err != nil || r.URL.Path != "/token" {
			fail("bad token request to " + r.URL.Path)
			return
		}
		if g := r.PostForm.Get("grant_type"); g != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
			fail("grant_type " + g)
			return
		}
		parts := strings.Split(r.PostForm.Get("assertion"), ".")
		if len(parts) != 3 {
			fail("assertion is not a JWT")
			return
		}
		claims, _ := base64.RawURLEncoding.DecodeString(parts[1])
		var c struct{ Iss, Scope, Aud string }
		_ = json.Unmarshal(claims, &c)
		if c.Iss != email || c.Scope != "https://www.googleapis.com/auth/cloud-platform" || c.Aud != ts.URL+"/token" {
			fail("claims " + string(claims))
			return
		}
		n := ts.issued.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"access_token":"ya29.issued-`+strconv.Itoa(int(n))+`","token_type":"Bearer","expires_in":3600}`)
	}))
	t.Cleanup(ts.Close)
	return ts
}

// writeServiceAccount writes a service-account JSON key whose token_uri
// is tokenURL, and returns its path and private key.
func writeServiceAccount(t *testing.T, tokenURL, email string) (path, privateKey string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	privateKey = string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	sa, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": "my-proj", "private_key_id": "k1", "private_key": privateKey,
		"client_email": email, "client_id": "1", "token_uri": tokenURL,
	})
	path = filepath.Join(t.TempDir(), "sa.json")
	if err := os.WriteFile(path, sa, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, privateKey
}

// TestVertexProvision loads a service account (from credentials_file and
// through the application default credentials), fetches a token from its
// token_uri, and sends it; the private key is a credential to scrub.
func TestVertexProvision(t *testing.T) {
	const email = "gateway@my-proj.iam.gserviceaccount.com"
	ts := newTokenServer(t, email)
	saFile, privateKey := writeServiceAccount(t, ts.URL+"/token", email)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	body := `{"model":"claude","max_tokens":1}`
	for _, tt := range []struct {
		name, file, adc string
	}{
		{"credentials_file", saFile, ""},
		{"application default credentials", "", saFile},
	} {
		t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", tt.adc)
		v := &Vertex{Project: "my-proj", Region: "us-east5", CredentialsFile: tt.file}
		if err := v.Provision(ctx); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		out, err := v.NewRequest(context.Background(), Call{
			API: AnthropicMessages, Base: mustURL(t, v.DefaultBaseURL()),
			Client: clientRequest(t, "http://gw.local/v1/messages", body, clientCredentials), Body: []byte(body), Request: mustParse(t, []byte(body)),
		})
		if err := v.Cleanup(); err != nil {
			t.Errorf("%s: cleanup: %v", tt.name, err)
		}
		select {
		case <-v.tokens.done:
		default:
			t.Errorf("%s: the token refresh runs on after Cleanup", tt.name)
		}
		if p, _ := ts.problem.Load().(string); p != "" {
			t.Fatalf("%s: token endpoint: %s", tt.name, p)
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := out.Header.Get("Authorization"); !strings.HasPrefix(got, "Bearer ya29.issued-") {
			t.Errorf("%s: authorization %q, want the issued token", tt.name, got)
		}
		if got := v.Credentials(); !reflect.DeepEqual(got, []string{privateKey}) {
			t.Errorf("%s: credentials %d values, want the private key", tt.name, len(got))
		}
	}
	if ts.issued.Load() == 0 {
		t.Error("no token was fetched")
	}
}

// TestVertexTokenEndpointSilent: a token endpoint that takes the
// connection and never answers (a hung metadata proxy, a black-holed
// token_uri) must not hold a request past its context, nor Cleanup (a
// reload) for ever: the token fetch is bounded like any wait on a peer.
func TestVertexTokenEndpointSilent(t *testing.T) {
	const email = "gateway@my-proj.iam.gserviceaccount.com"
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer ts.Close()
	defer close(release) // before ts.Close, which waits for the handlers
	saFile, _ := writeServiceAccount(t, ts.URL+"/token", email)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	v := &Vertex{Project: "my-proj", Region: "us-east5", CredentialsFile: saFile}
	if err := v.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	body := `{"model":"claude","max_tokens":1}`
	reqCtx, reqCancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer reqCancel()
	built := make(chan error, 1)
	go func() {
		_, err := v.NewRequest(reqCtx, Call{
			API: AnthropicMessages, Base: mustURL(t, v.DefaultBaseURL()),
			Client: clientRequest(t, "http://gw.local/v1/messages", body, nil), Body: []byte(body), Request: mustParse(t, []byte(body)),
		})
		built <- err
	}()
	select {
	case err := <-built:
		if err == nil {
			t.Error("built a request without a token")
		}
	case <-time.After(5 * time.Second):
		t.Error("NewRequest still waits on the silent token endpoint 5s after its context ended")
	}
	cleaned := make(chan struct{})
	go func() { _ = v.Cleanup(); close(cleaned) }()
	select {
	case <-cleaned:
	case <-time.After(5 * time.Second):
		t.Error("Cleanup still waits on the silent token endpoint after 5s")
	}
}

func TestVertexProvisionErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	user := write("user.json", `{"type":"authorized_user","client_id":"c","client_secret":"s","refresh_token":"r"}`)
	broken := write("broken.json", `{"type":`)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	for _, tt := range []struct {
		name, file, adc, err string
	}{
		{"missing credentials_file", filepath.Join(dir, "none.json"), "", "vertex credentials_file: open "},
		{"not JSON", broken, "", "vertex credentials_file " + broken + ": "},
		{"not a service account", user, "", `expected credential type "service_account", found "authorized_user"`},
		{"no application default credentials", "", filepath.Join(dir, "none.json"), "vertex: no credentials_file and no application default credentials"},
	} {
		t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", tt.adc)
		v := &Vertex{Project: "p", Region: "us-east5", CredentialsFile: tt.file}
		err := v.Provision(ctx)
		if err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%s: %v, want an error containing %q", tt.name, err, tt.err)
		}
		if v.tokens != nil {
			t.Errorf("%s: a token keeper runs after a failed Provision", tt.name)
		}
		_ = v.Cleanup()
	}
	if err := (&Vertex{}).Cleanup(); err != nil {
		t.Errorf("cleanup before Provision: %v", err)
	}
}

// TestVertexResponseBody: Google's errors reach the client in the
// format of the API it called (Claude's path or the OpenAI endpoint's),
// with a hint for the configuration errors.
func TestVertexResponseBody(t *testing.T) {
	const (
		claudePath = "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict"
		chatPath   = "/v1/projects/p/locations/us-east5/endpoints/openapi/chat/completions"
		notAllowed = "Project `p` is not allowed to use Publisher Model `projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5`"
		quota      = "Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model with base model: anthropic-claude-sonnet-4-5."
	)
	for _, tt := range []struct {
		name, path  string
		status      int
		contentType string
		body, want  string // want "" when the body passes unchanged
	}{
		{"claude 429", claudePath, 429, "application/json",
			`[{"error":{"code":429,"message":"Resource exhausted, please try again later.","status":"RESOURCE_EXHAUSTED"}}]`,
			`{"type":"error","error":{"type":"rate_limit_error","message":"Resource exhausted, please try again later."}}`},
		{"claude model not enabled", claudePath, 400, "application/json",
			`{"error":{"code":400,"message":"` + notAllowed + `","status":"FAILED_PRECONDITION"}}`,
			`{"type":"error","error":{"type":"invalid_request_error","message":"` + notAllowed + ` (enable the model for this project in Vertex AI Model Garden)"}}`},
		{"claude quota zero", claudePath, 429, "application/json",
			`{"error":{"code":429,"message":"` + quota + `","status":"RESOURCE_EXHAUSTED"}}`,
			`{"type":"error","error":{"type":"rate_limit_error","message":"` + quota + ` (a new project's quota for this model is often 0: request a quota increase)"}}`},
		{"chat 404", chatPath, 404, "application/json; charset=UTF-8",
			`[{"error":{"code":404,"message":"Publisher model not found.","status":"NOT_FOUND"}}]`,
			`{"error":{"message":"Publisher model not found.","type":"invalid_request_error","param":null,"code":"model_not_found"}}`},
		{"chat model not enabled", chatPath, 400, "application/json",
			`{"error":{"code":400,"message":"` + notAllowed + `","status":"FAILED_PRECONDITION"}}`,
			`{"error":{"message":"` + notAllowed + ` (enable the model for this project in Vertex AI Model Garden)","type":"invalid_request_error","param":null,"code":null}}`},
		{"no request: Claude's format", "", 500, "application/json", `{"error":{"code":500,"message":"Internal error."}}`,
			`{"type":"error","error":{"type":"api_error","message":"Internal error."}}`},
		{"not JSON", claudePath, 502, "text/html", "<html>502</html>", ""},
		{"2xx", chatPath, 200, "application/json", `{"error":{"message":"not translated"}}`, ""},
		{"2xx stream", claudePath, 200, "text/event-stream", "event: ping\ndata: {}\n\n", ""},
	} {
		res := &http.Response{
			StatusCode: tt.status, ContentLength: int64(len(tt.body)),
			Header: http.Header{"Content-Type": {tt.contentType}, "Content-Length": {"99"}},
			Body:   io.NopCloser(strings.NewReader(tt.body)),
		}
		if tt.path != "" {
			res.Request = &http.Request{URL: mustURL(t, "https://us-east5-aiplatform.googleapis.com"+tt.path)}
		}
		got, err := io.ReadAll((&Vertex{}).ResponseBody(res))
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if tt.want == "" {
			if string(got) != tt.body || res.Header.Get("Content-Length") != "99" {
				t.Errorf("%s: changed to %s", tt.name, got)
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

func TestVertexCredentials(t *testing.T) {
	for _, tt := range []struct {
		json string
		want []string
	}{
		{`{"type":"service_account","private_key":"-----BEGIN PRIVATE KEY-----\nk\n","client_email":"a@b"}`, []string{"-----BEGIN PRIVATE KEY-----\nk\n"}},
		{`{"type":"authorized_user","client_secret":"s","refresh_token":"r","client_id":"c"}`, []string{"s", "r"}},
		{`{"type":"external_account","audience":"x"}`, nil},
		{``, nil},
		{`not json`, nil},
	} {
		if got := jsonSecrets([]byte(tt.json)); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: secrets %q, want %q", tt.json, got, tt.want)
		}
	}
	if got := (&Vertex{}).Credentials(); len(got) != 0 {
		t.Errorf("credentials %q before Provision", got)
	}
	v := &Vertex{secrets: []string{"pk"}}
	if got := ChannelCredentials(nil, nil, v); !reflect.DeepEqual(got, []string{"pk"}) {
		t.Errorf("channel credentials %q", got)
	}
}
