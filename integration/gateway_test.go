// Package integration_test runs the plugin inside a real, in-process
// Caddy (caddytest), against loopback upstreams that inject faults and
// fakes of real providers, one suite per feature. It is a leaf: nothing
// imports it, and it sees the plugin only as a user does (Caddyfile,
// HTTP, the admin API, metrics, events, logs).
package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/llmfailover/caddy-llm-failover"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// The in-process tests share one Caddy (caddytest runs a single instance
// per test binary), so they do not run in parallel. Each test declares its
// own upstreams, on fresh ports, so breaker state never leaks between tests.

// Ports: LLMF_TEST_PORT_OFFSET shifts them so that several `go test`
// processes of this package (developers working side by side) do not
// collide on one machine.
var (
	portOffset = func() int { n, _ := strconv.Atoi(os.Getenv("LLMF_TEST_PORT_OFFSET")); return n }()
	httpPort   = 9080 + portOffset
	adminPort  = 2999 + portOffset
	gatewayURL = fmt.Sprintf("http://localhost:%d", httpPort)
	adminURL   = fmt.Sprintf("http://localhost:%d", adminPort)
)

// adminClient is for requests to Caddy's admin endpoint. After a config
// load Caddy shuts the previous admin server down in the background
// (caddy.replaceLocalAdminServer) while the new one already serves on the
// same listener, so a connection the old server accepted just before is
// closed unanswered and its request fails with EOF (a flake seen in
// TestBreakerAdminAPI). Nothing was served on it: adminRetry sends the
// request once more, on a fresh connection.
var adminClient = &http.Client{Timeout: 30 * time.Second, Transport: adminRetry{http.DefaultTransport}}

type adminRetry struct{ base http.RoundTripper }

func (a adminRetry) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := a.base.RoundTrip(req)
	if err == nil || !(errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
		return res, err
	}
	again := req.Clone(req.Context())
	if req.Body != nil {
		if req.GetBody == nil {
			return nil, err
		}
		body, gerr := req.GetBody()
		if gerr != nil {
			return nil, err
		}
		again.Body = body
	}
	return a.base.RoundTrip(again)
}

func TestMain(m *testing.M) {
	// caddytest writes autosave.json and storage under the XDG dirs.
	dir, err := os.MkdirTemp("", "llmf-test-")
	if err != nil {
		panic(err)
	}
	os.Setenv("XDG_CONFIG_HOME", dir+"/config")
	os.Setenv("XDG_DATA_HOME", dir+"/data")
	// caddytest drives whatever answers on the admin port: never load test
	// configs into a Caddy these tests did not start.
	for _, port := range []int{adminPort, httpPort} {
		if err := portFree(port); err != nil {
			fmt.Fprintf(os.Stderr, "refusing to run: %v; stop it or set LLMF_TEST_PORT_OFFSET\n", err)
			os.RemoveAll(dir)
			os.Exit(2)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// portFree fails when something already listens on the loopback port.
func portFree(port int) error {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("localhost:%d", port), 200*time.Millisecond)
	if err != nil {
		return nil
	}
	c.Close()
	return fmt.Errorf("port %d already answers before the tests started a Caddy (another Caddy or test run?)", port)
}

// testGlobals is the global options block of every in-process test
// config: the shared Caddy's admin and HTTP ports, errors-only logs, and
// extra options.
func testGlobals(extra string) string {
	return fmt.Sprintf(`{
	skip_install_trust
	admin localhost:%d
	http_port %d
	https_port %d
	grace_period 1ns
	log {
		level ERROR
	}
%s
}
`, adminPort, httpPort, 9443+portOffset, extra)
}

// failoverOption is the global llm_failover option with body in its
// block, for testGlobals.
func failoverOption(body string) string {
	return "\tllm_failover {\n\t\t" + body + "\n\t}"
}

// gatewayConfig is the whole Caddyfile the tests load: global options
// for the shared in-process Caddy, and one site whose llm_failover block
// is body, with %s verbs filled by args (typically upstream URLs).
func gatewayConfig(body string, args ...any) string {
	return gatewayConfigWith("", body, args...)
}

// gatewayConfigWith is gatewayConfig with more global options (globals).
func gatewayConfigWith(globals, body string, args ...any) string {
	return testGlobals(globals) + fmt.Sprintf(`http://localhost:%d {
	header {
		defer
		X-Served-By {http.llm_failover.channel}
		X-Attempts {http.llm_failover.attempts}
	}
	llm_failover {
`, httpPort) + fmt.Sprintf(body, args...) + `
	}
}
`
}

// gateway loads gatewayConfig(body, args...) into the in-process Caddy,
// failing the test if it does not load.
func gateway(t testing.TB, body string, args ...any) *caddytest.Tester {
	t.Helper()
	return gatewayWith(t, "", body, args...)
}

// gatewayWith is gateway with more global options (globals).
func gatewayWith(t testing.TB, globals, body string, args ...any) *caddytest.Tester {
	t.Helper()
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	tc := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tc.InitServer(gatewayConfigWith(globals, body, args...), "caddyfile")
	// A keep-alive connection from before the reload may be closed under
	// the next request; start every test on fresh connections.
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	return tc
}

// tryLoad posts gatewayConfig(body, args...) to the admin API and returns
// the status and answer, for configs that are meant to be refused (gateway
// would fail the test).
func tryLoad(t *testing.T, body string, args ...any) (int, string) {
	t.Helper()
	return tryLoadWith(t, "", body, args...)
}

// tryLoadWith is tryLoad with more global options (globals).
func tryLoadWith(t *testing.T, globals, body string, args ...any) (int, string) {
	t.Helper()
	return loadCaddyfile(t, gatewayConfigWith(globals, body, args...))
}

// loadCaddyfile posts a whole Caddyfile to the admin API's /load and
// returns the status and answer, for configs that may be refused.
func loadCaddyfile(t *testing.T, cfg string) (int, string) {
	t.Helper()
	var err error
	for try := 0; try < 3; try++ {
		if try > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		var req *http.Request
		req, err = http.NewRequest(http.MethodPost, adminURL+"/load", strings.NewReader(cfg))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "text/caddyfile")
		// A connection of its own: a refused load makes Caddy run the old
		// config again, which can close the admin API's kept-alive
		// connections, and a POST reused on one of them is reset, not
		// retried (seen once: TestUnsetEnvironmentVariableIsNamed,
		// 2026-12-06). Even a new connection can land on the admin
		// server while it is being put back, and read EOF (seen once:
		// TestHeartbeatOfAJobThatDoesNotRun, 2026-12-07): loading the same
		// config again is safe, so a transport error is tried again.
		req.Close = true
		var res *http.Response
		res, err = (&http.Client{Timeout: 60 * time.Second}).Do(req)
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res.StatusCode, string(b)
	}
	t.Fatal(err)
	return 0, ""
}

// newPost builds a JSON POST to the gateway; hdr holds name, value pairs.
func newPost(t *testing.T, ctx context.Context, path string, body []byte, hdr ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, gatewayURL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return req
}

// post sends a JSON body to the gateway and returns the response and body.
func post(t *testing.T, path string, body []byte, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	res, err := client.Do(newPost(t, context.Background(), path, body, hdr...))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("reading response: %v", err)
	}
	return res, b
}

func upstream(t *testing.T, b fu.Behavior) *fu.Server { return fu.Start(t, b) }

// openAIError decodes an OpenAI-style error body, failing the test when
// the body has another shape.
func openAIError(t *testing.T, body []byte) (message, typ, code string) {
	t.Helper()
	var v struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &v); err != nil || v.Error == nil {
		t.Fatalf("not an OpenAI error body: %s", body)
	}
	if v.Error.Code != nil {
		code = *v.Error.Code
	}
	return v.Error.Message, v.Error.Type, code
}

// anthropicError decodes an Anthropic-style error body.
func anthropicError(t *testing.T, body []byte) (message, typ string) {
	t.Helper()
	var v struct {
		Type  string `json:"type"`
		Error *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &v); err != nil || v.Type != "error" || v.Error == nil {
		t.Fatalf("not an Anthropic error body: %s", body)
	}
	return v.Error.Message, v.Error.Type
}

func mustContain(t *testing.T, body []byte, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(string(body), w) {
			t.Fatalf("body does not contain %q:\n%s", w, body)
		}
	}
}

func mustNotContain(t *testing.T, body []byte, bad ...string) {
	t.Helper()
	for _, w := range bad {
		if strings.Contains(string(body), w) {
			t.Fatalf("body contains %q:\n%s", w, body)
		}
	}
}

func hits(t *testing.T, s *fu.Server, want int64) { t.Helper(); s.WantHits(t, want) }

// eventually polls cond for up to d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	fu.Eventually(t, d, what, cond)
}

// adminRetry sends a request once more when its connection was closed
// unanswered, as the old admin server does after a config load, and
// only once.
func TestAdminRetryAfterAnUnansweredClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var closeFirst atomic.Int32
	closeFirst.Store(1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if closeFirst.Add(-1) >= 0 {
				buf := make([]byte, 4096)
				_, _ = c.Read(buf) // the request arrives, is never answered
				c.Close()
				continue
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				_, _ = c.Read(buf)
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			}()
		}
	}()
	url := "http://" + ln.Addr().String() + "/reset"
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"x":1}`))
	res, err := adminClient.Do(req)
	if err != nil {
		t.Fatalf("POST after one unanswered close: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	// Closed twice: the second failure is the caller's.
	closeFirst.Store(2)
	req, _ = http.NewRequest(http.MethodPost, url, strings.NewReader(`{"x":1}`))
	if res, err := adminClient.Do(req); err == nil {
		res.Body.Close()
		t.Fatal("a request closed unanswered twice succeeded: adminRetry retries more than once")
	}
}
