package integration_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/llmfailover/caddy-llm-failover/internal/fakeproviders"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// upstreamSecret is a channel credential the echoing upstreams below
// try to leak.
const upstreamSecret = "sk-upstream-4f1c9a0b7d2e"

// loggedGateway loads a site whose plugin log (at DEBUG) and access log
// go to files, and returns their paths.
func loggedGateway(t *testing.T, body string, args ...any) (pluginLog, accessLog string) {
	t.Helper()
	return loggedGatewayWith(t, "", body, args...)
}

// loggedGatewayWith is loggedGateway with more access-log options.
func loggedGatewayWith(t *testing.T, accessOpts, body string, args ...any) (pluginLog, accessLog string) {
	t.Helper()
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	dir := t.TempDir()
	pluginLog, accessLog = filepath.Join(dir, "plugin.log"), filepath.Join(dir, "access.log")
	cfg := fmt.Sprintf(`{
	skip_install_trust
	admin localhost:%d
	http_port %d
	https_port %d
	grace_period 1ns
	log {
		output file %s
		level DEBUG
	}
}
http://localhost:%d {
	log {
		output file %s
%s
	}
	llm_failover {
%s
	}
}
`, adminPort, httpPort, 9443+portOffset, pluginLog, httpPort, accessLog, accessOpts, fmt.Sprintf(body, args...))
	caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort}).InitServer(cfg, "caddyfile")
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	return pluginLog, accessLog
}

// echoSecret answers like an upstream that quotes the request's
// Authorization back: in its error message, its status text and a header.
func echoSecret(status int) fu.BehaviorFunc {
	return func(w http.ResponseWriter, r *http.Request, _ int64) {
		auth := r.Header.Get("Authorization")
		w.Header().Set("X-Echo", auth)
		w.Header().Set("X-Echo-Clean", "no secret here")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":{"message":"request had Authorization=%s and key %s","type":"server_error"}}`, auth, strings.TrimPrefix(auth, "Bearer "))
	}
}

func TestEchoedSecretsGoNowhere(t *testing.T) {
	for _, status := range []int{503, 400} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			a := upstream(t, echoSecret(status))
			pluginLog, accessLog := loggedGateway(t, `
		channel a %s {
			header Authorization "Bearer `+upstreamSecret+`"
			pass_response_header X-Echo X-Echo-Clean
		}
		model m {
			route a
		}
		auth off`, a.URL)
			res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false), "X-Api-Key", "client-key-123456")
			if res.StatusCode != status {
				t.Fatalf("status %d: %s", res.StatusCode, body)
			}
			// X-Echo is passed by name, so only the secret mask keeps it
			// from the client; its clean neighbour shows that the passed
			// headers of the answer do reach the client.
			if status == 400 && res.Header.Get("X-Echo-Clean") != "no secret here" {
				t.Errorf("X-Echo-Clean = %q: the passed headers did not reach the client, so the header check below proves nothing", res.Header.Get("X-Echo-Clean"))
			}
			if status == 503 {
				mustContain(t, body, "request had Authorization=[REDACTED]")
			}
			mustNotContain(t, body, upstreamSecret)
			for k, v := range res.Header {
				if strings.Contains(strings.Join(v, ","), "sk-upstream") {
					t.Errorf("header %s echoes the secret: %v", k, v)
				}
			}
			// Caddy writes its logs asynchronously enough that the access
			// line may trail the answer.
			eventually(t, 5*time.Second, "the access log line", func() bool {
				b, _ := os.ReadFile(accessLog)
				return strings.Contains(string(b), "/v1/chat/completions")
			})
			for _, f := range []string{pluginLog, accessLog} {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				mustNotContain(t, b, upstreamSecret, "4f1c9a0b7d2e")
			}
		})
	}
}

func TestResponseHeadersByAllowlist(t *testing.T) {
	hostile := withHeaders(fu.OKNamed("a"), "Set-Cookie", "__cf_bm=1", "Strict-Transport-Security", "max-age=0",
		"Access-Control-Allow-Origin", "*", "Alt-Svc", `h3=":443"`, "Openai-Organization", "org-operator",
		"X-Ratelimit-Remaining-Tokens", "42", "X-Request-Id", "req-1", "Openai-Processing-Ms", "7")
	a := upstream(t, hostile)
	b := upstream(t, hostile)
	gateway(t, `
		channel a %s
		channel b %s {
			pass_rate_limit_headers
			pass_response_header Openai-Organization
		}
		model m {
			route a
		}
		model n {
			route b
		}
		auth off`, a.URL, b.URL)
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	for _, k := range []string{"Set-Cookie", "Strict-Transport-Security", "Access-Control-Allow-Origin", "Alt-Svc", "Openai-Organization", "X-Ratelimit-Remaining-Tokens"} {
		if v := res.Header.Get(k); v != "" {
			t.Errorf("%s reached the client: %q", k, v)
		}
	}
	for _, k := range []string{"X-Request-Id", "Openai-Processing-Ms", "Content-Type"} {
		if res.Header.Get(k) == "" {
			t.Errorf("%s did not reach the client", k)
		}
	}
	res, _ = post(t, "/v1/chat/completions", fu.ChatRequest("n", false))
	if res.Header.Get("X-Ratelimit-Remaining-Tokens") != "42" || res.Header.Get("Openai-Organization") != "org-operator" {
		t.Errorf("operator extras not passed: %v", res.Header)
	}
}

func TestRequestHeadersByAllowlist(t *testing.T) {
	a := upstream(t, fu.OK())
	gateway(t, `
		channel a %s {
			header Authorization "Bearer upstream-key-a"
			pass_request_header X-Trace
		}
		model m {
			route a
		}
		auth off`, a.URL)
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false),
		"Cookie", "s=1", "X-Internal", "secret", "X-Trace", "t1", "Openai-Beta", "assistants=v2", "Anthropic-Beta", "x", "Idempotency-Key", "i1")
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	got := a.LastRequest().Header
	for k, want := range map[string]string{"Cookie": "", "X-Internal": "", "Anthropic-Beta": "", "X-Trace": "t1", "Openai-Beta": "assistants=v2", "Idempotency-Key": "i1"} {
		if v := got.Get(k); v != want {
			t.Errorf("upstream %s = %q, want %q", k, v, want)
		}
	}
}

// rawRequest sends a request line as written, so that no client library
// cleans the path, and returns the status line and body.
func rawRequest(t *testing.T, target string) (status int, body string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("localhost:%d", httpPort), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	b := fu.ChatRequest("m", false)
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: localhost:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", target, httpPort, len(b), b)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	rb, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(rb)
}

func TestOnlyLLMPathsReachUpstreams(t *testing.T) {
	a := upstream(t, fu.OK())
	gateway(t, `
		channel a %s/ok {
			header Authorization "Bearer upstream-key-a"
		}
		model m {
			route a
		}
		forward_path /v1/extra /v1/tree/*
		auth off`, a.URL)
	for target, want := range map[string]int{
		"/v1/fine_tuning/jobs":                          404,
		"/v1/files/x/completions":                       404,
		"/../../echo/v1/chat/completions":               400,
		"/v1/../../echo/v1/chat/completions":            400,
		"/%2e%2e/%2e%2e/echo/v1/chat/completions":       400,
		"/v1/%2E%2E/v1/chat/completions":                400,
		"/v1/chat%2fcompletions":                        400,
		"/v1/./chat/completions":                        400,
		"/v1/chat/completions/..;/fine_tuning/jobs":     404,
		"/v1/embeddings/../fine_tuning/jobs/embeddings": 400,
	} {
		status, body := rawRequest(t, target)
		if status != want {
			t.Errorf("%s: status %d, want %d: %s", target, status, want, body)
		}
		if !strings.Contains(body, `"error"`) {
			t.Errorf("%s: not an API error body: %s", target, body)
		}
	}
	hits(t, a, 0)
	if status, body := rawRequest(t, "/v1/chat/completions"); status != 200 {
		t.Errorf("status %d: %s", status, body)
	}
	// The fake upstream serves no such paths (404), but they reach it.
	rawRequest(t, "/v1/extra")
	rawRequest(t, "/v1/tree/x")
	hits(t, a, 3)
	if got := a.LastRequest().Path; got != "/ok/v1/tree/x" {
		t.Errorf("upstream path %q", got)
	}
}

func TestRedirectsAndForeignContentFailOver(t *testing.T) {
	cases := map[string]fu.Behavior{
		"307 to metadata": fu.Status(307, "").WithHeader("Location", "http://169.254.169.254/latest/meta-data/"),
		"302":             fu.Status(302, "moved"),
		"html 200": fu.BehaviorFunc(func(w http.ResponseWriter, _ *http.Request, _ int64) {
			w.Header().Set("Content-Type", "text/html")
			_, _ = io.WriteString(w, "<html>CDN error page</html>")
		}),
	}
	for name, fail := range cases {
		t.Run(name, func(t *testing.T) {
			a := upstream(t, fail)
			b := upstream(t, fu.OKNamed("backup"))
			gateway(t, twoChannels, a.URL, b.URL, "auth off")
			res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
			if res.StatusCode != 200 || res.Header.Get("Location") != "" {
				t.Fatalf("status %d Location %q: %s", res.StatusCode, res.Header.Get("Location"), body)
			}
			mustContain(t, body, "Hello from backup")
			mustNotContain(t, body, "CDN", "169.254")
			hits(t, a, 1)
		})
	}
	// Alone, the client gets a gateway error, never the redirect.
	a := upstream(t, cases["307 to metadata"])
	gateway(t, `
		channel a %s
		model m {
			route a
		}
		auth off`, a.URL)
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
	if res.StatusCode != 502 || res.Header.Get("Location") != "" {
		t.Fatalf("status %d Location %q: %s", res.StatusCode, res.Header.Get("Location"), body)
	}
	mustContain(t, body, "redirect")
}

func TestNDJSONStreams(t *testing.T) {
	a := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = io.WriteString(w, `{"n":1}`+"\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(time.Second):
		}
		_, _ = io.WriteString(w, `{"n":2}`+"\n")
	}))
	gateway(t, `
		channel a %s
		model m {
			route a
		}
		auth off`, a.URL)
	res, err := http.DefaultClient.Do(newPost(t, t.Context(), "/v1/chat/completions", fu.ChatRequest("m", true)))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	start := time.Now()
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	if err != nil || line != `{"n":1}`+"\n" || time.Since(start) > 800*time.Millisecond {
		t.Fatalf("first line %q after %s (%v): NDJSON was not streamed", line, time.Since(start), err)
	}
}

// withHeaders adds name, value pairs to every answer of b.
func withHeaders(b fu.Behavior, kv ...string) fu.Behavior {
	return fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, n int64) {
		for i := 0; i+1 < len(kv); i += 2 {
			w.Header().Set(kv[i], kv[i+1])
		}
		b.Serve(w, r, n)
	})
}

// exampleAccessLogFilter is the access-log format block Caddyfile.example
// ships, as written there.
func exampleAccessLogFilter(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "\t\tformat filter {")
	end := strings.Index(s[max(start, 0):], "\n\t\t}\n")
	if start < 0 || end < 0 {
		t.Fatal("Caddyfile.example has no access-log format filter block")
	}
	return s[start : start+end+len("\n\t\t}")]
}

func TestShippedAccessLogFilterDropsKeys(t *testing.T) {
	a := upstream(t, fu.OK())
	_, accessLog := loggedGatewayWith(t, exampleAccessLogFilter(t), `
		channel a %s
		model m {
			route a
		}
		auth off`, a.URL)
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false),
		"X-Api-Key", "wallet-key-xapikey-1", "Api-Key", "wallet-key-apikey-2", "Authorization", "Bearer wallet-key-bearer-3")
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	var line []byte
	eventually(t, 5*time.Second, "the access log line", func() bool {
		line, _ = os.ReadFile(accessLog)
		return strings.Contains(string(line), "/v1/chat/completions")
	})
	mustNotContain(t, line, "wallet-key-xapikey-1", "wallet-key-apikey-2", "wallet-key-bearer-3")
	mustContain(t, line, `"Content-Type"`) // the filter keeps the rest
}

func TestPortFreeRefusesAForeignListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := portFree(port); err == nil {
		t.Error("a port that answers was taken for free")
	}
	ln.Close()
	if err := portFree(port); err != nil {
		t.Errorf("a closed port: %v", err)
	}
}

// A channel key given as an {env.*} placeholder is resolved when the
// config loads: neither `caddy adapt` nor the admin API's /config/ ever
// holds the secret itself.
func TestEnvSecretsNeverInConfig(t *testing.T) {
	const secret = "sk-envsecret-7f3a9c1e5b"
	t.Setenv("LLMF_TEST_CHANNEL_KEY", secret)
	up := upstream(t, fu.OK())
	body := `
		channel a %s {
			header Authorization "Bearer {env.LLMF_TEST_CHANNEL_KEY}"
		}
		model m {
			route a
		}
		auth off
	`
	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(gatewayConfig(body, up.URL)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(adapted, []byte(secret)) || !bytes.Contains(adapted, []byte("{env.LLMF_TEST_CHANNEL_KEY}")) {
		t.Fatalf("adapted config: %s", adapted)
	}
	gateway(t, body, up.URL)
	if res, _ := post(t, "/v1/chat/completions", fu.ChatRequest("m", false)); res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	if got := up.LastRequest().Header.Get("Authorization"); got != "Bearer "+secret {
		t.Fatalf("the upstream got %q: the placeholder was not resolved", got)
	}
	res, err := http.Get(adminURL + "/config/")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if bytes.Contains(cfg, []byte(secret)) {
		t.Fatal("the admin API's /config/ holds the channel key")
	}
}

// A Vertex channel's access tokens are secrets the gateway learns only as
// it runs (provider.Vertex's LiveCredentials): an upstream that echoes the
// one it was sent, in a passed response header or in an error message,
// must not get it to the client either. The fake's tokens ("ya29.fake-1")
// have no credential shape, so only the live mask can keep them out.
func TestEchoedVertexAccessTokenGoesNowhere(t *testing.T) {
	v := fakeproviders.NewVertex("proj-1", "us-east5", time.Hour)
	t.Cleanup(v.Close)
	sa, err := v.WriteServiceAccount(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var fail atomic.Bool
	echo := fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		w.Header().Set("X-Echo", tok)
		w.Header().Set("X-Echo-Clean", "no secret here")
		if fail.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, fu.AnthropicErrorBody("api_error", "the credential "+tok+" was revoked"))
			return
		}
		// rawPredict answers as Anthropic does.
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5@20250929",`+
			`"content":[{"type":"text","text":"Hello from vertex"}],"stop_reason":"end_turn","stop_sequence":null,`+
			`"usage":{"input_tokens":3,"output_tokens":2}}`)
	})
	a := upstream(t, echo)
	gateway(t, `
		channel v %s {
			provider vertex {
				project proj-1
				region us-east5
				credentials_file %s
			}
			pass_response_header X-Echo X-Echo-Clean
		}
		model claude {
			route v upstream_model claude-sonnet-4-5@20250929
		}
		auth off`, a.URL, sa)
	ask := func() (*http.Response, []byte) {
		return post(t, "/v1/messages", fu.MessagesRequest("claude", false), "anthropic-version", "2023-06-01")
	}
	res, body := ask()
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	if got := a.LastRequest().Header.Get("Authorization"); !strings.HasPrefix(got, "Bearer ya29.fake-") {
		t.Fatalf("the upstream was sent Authorization %q, not a token of the fake's", got)
	}
	if res.Header.Get("X-Echo-Clean") != "no secret here" {
		t.Fatalf("X-Echo-Clean = %q: the passed headers did not reach the client", res.Header.Get("X-Echo-Clean"))
	}
	if got := res.Header.Get("X-Echo"); got != "" {
		t.Errorf("X-Echo reached the client with the access token: %q", got)
	}
	mustContain(t, body, "Hello from vertex")
	mustNotContain(t, body, "ya29.fake")

	fail.Store(true)
	res, body = ask()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	mustContain(t, body, "was revoked")
	mustNotContain(t, body, "ya29.fake")
}
