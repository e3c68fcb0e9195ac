package integration_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// These tests send what real clients and proxies send at the HTTP level,
// end to end through Caddy: the promise is an answer in the API's own
// error format with the right status, or the request served as meant.

func gzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A compressed request body (some SDKs and proxies compress requests:
// Content-Encoding gzip, br, zstd) is either decoded and served, or
// refused with 415 Unsupported Media Type in the API's format. It was
// read as JSON as it came and refused with a 400 saying the body "is not
// a valid JSON object", which tells the client its (valid) JSON is wrong.
func TestCompressedRequestBodyIsNotReadAsJSON(t *testing.T) {
	a := upstream(t, fu.OK())
	gateway(t, oneChannel, a.URL, "")
	for _, c := range []struct {
		path string
		body []byte
	}{
		{"/v1/chat/completions", fu.ChatRequest("m", false)},
		{"/v1/messages", fu.MessagesRequest("m", false)},
	} {
		for _, enc := range []string{"gzip", "br", "zstd"} {
			res, body := post(t, c.path, gzipped(t, c.body), "Content-Encoding", enc, "Anthropic-Version", "2023-06-01")
			if res.StatusCode == http.StatusOK && enc == "gzip" {
				// Decoded: the upstream got the JSON, not the gzip.
				if got := a.LastRequest().Body; !json.Valid(got) || a.LastRequest().Header.Get("Content-Encoding") != "" {
					t.Errorf("%s %s: upstream got %q (Content-Encoding %q)", c.path, enc, got, a.LastRequest().Header.Get("Content-Encoding"))
				}
				continue
			}
			if res.StatusCode != http.StatusUnsupportedMediaType {
				t.Errorf("%s, Content-Encoding %s: status %d, want 415 (or the body decoded): %s", c.path, enc, res.StatusCode, body)
				continue
			}
			var msg string
			if strings.Contains(c.path, "messages") {
				msg, _ = anthropicError(t, body)
			} else {
				msg, _, _ = openAIError(t, body)
			}
			if !strings.Contains(msg, "Content-Encoding") {
				t.Errorf("%s %s: the message does not say what is wrong: %q", c.path, enc, msg)
			}
		}
	}
	// An identity encoding is no encoding, and a plain body labelled
	// compressed (a proxy that decoded it and left the header) is read
	// as it came.
	for _, enc := range []string{"identity", "gzip"} {
		res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false), "Content-Encoding", enc)
		if res.StatusCode != http.StatusOK {
			t.Errorf("plain body, Content-Encoding %s: status %d: %s", enc, res.StatusCode, body)
		}
	}
}

// /v1/models is served for GET and HEAD: a 405 there names them in Allow
// (RFC 9110: the methods the resource supports), not POST.
func TestModelsListMethodNotAllowedNamesGET(t *testing.T) {
	a := upstream(t, fu.OK())
	gateway(t, oneChannel, a.URL, "")
	for _, method := range []string{http.MethodDelete, http.MethodOptions, http.MethodPut} {
		req, _ := http.NewRequest(method, gatewayURL+"/v1/models", nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s /v1/models: status %d: %s", method, res.StatusCode, b)
			continue
		}
		if allow := res.Header.Get("Allow"); !strings.Contains(allow, "GET") || strings.Contains(allow, "POST") {
			t.Errorf("%s /v1/models: Allow %q, want GET, HEAD", method, allow)
		}
		if msg, _, _ := openAIError(t, b); strings.Contains(msg, "LLM API requests are POSTs") {
			t.Errorf("%s /v1/models: %q tells the client to POST", method, msg)
		}
	}
}

// A client that hangs up at any phase of a billed request leaves nothing
// reserved, the ledger settled once per request, the upstream released
// and the audit clean.
func TestWalletClientGoneAtEachPhase(t *testing.T) {
	halfJSON := fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "4096")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[`)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	for _, c := range []struct {
		name   string
		b      fu.Behavior
		stream bool
	}{
		{"waiting for the upstream's headers", fu.SlowHeaders(time.Minute, fu.OK()), false},
		{"held at the stream gate", fu.SlowFirstToken(time.Minute), true},
		{"while a whole answer is read", halfJSON, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := upstream(t, c.b)
			b := upstream(t, fu.OKNamed("b"))
			walletGateway(t, a, b)
			secret, _ := newWalletAccount(t, "acct", "1")
			ctx, cancel := context.WithCancel(context.Background())
			req := newPost(t, ctx, "/v1/chat/completions", fu.ChatRequest("m", c.stream), bearer(secret)...)
			done := make(chan struct{})
			go func() {
				defer close(done)
				if res, err := http.DefaultClient.Do(req); err == nil {
					res.Body.Close()
				}
			}()
			eventually(t, 5*time.Second, "the upstream to be asked", func() bool { return a.InFlight() == 1 })
			if _, reserved := balanceOf(t, "acct"); reserved == 0 {
				t.Fatalf("nothing reserved while the request runs")
			}
			cancel()
			<-done
			eventually(t, 5*time.Second, "the upstream request to end", func() bool { return a.InFlight() == 0 })
			waitUnreserved(t, "acct")
			hits(t, b, 0)
			rows := requestRows(t, "acct")
			if charged := settledOnce(t, rows); charged != 0 {
				t.Errorf("a client that left before any answer was charged %s: %s", charged, kinds(rows))
			}
			if bal, _ := balanceOf(t, "acct"); bal != money(t, "1") {
				t.Errorf("balance %s", bal)
			}
			auditClean(t)
		})
	}
}

// An Anthropic SDK calling an endpoint the gateway does not serve (the
// Message Batches API, the legacy /v1/complete) gets its 404 in
// Anthropic's format, as it gets every other error: the SDKs send
// anthropic-version on every request, as /v1/models already tells them by.
func TestUnservedAnthropicEndpointAnswersInAnthropicFormat(t *testing.T) {
	a := upstream(t, fu.OK())
	gateway(t, oneChannel, a.URL, "")
	for _, path := range []string{"/v1/messages/batches", "/v1/complete"} {
		res, body := post(t, path, fu.MessagesRequest("m", false), "Anthropic-Version", "2023-06-01", "X-Api-Key", "k")
		if res.StatusCode != http.StatusNotFound {
			t.Errorf("%s: status %d: %s", path, res.StatusCode, body)
			continue
		}
		if msg, typ := anthropicError(t, body); typ != "not_found_error" || !strings.Contains(msg, path) {
			t.Errorf("%s: %s %q", path, typ, msg)
		}
	}
	hits(t, a, 0)
}

// h2cClient speaks HTTP/2 without TLS (prior knowledge), as gRPC-style
// clients and sidecars in front of a plain-HTTP gateway do.
func h2cClient() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Protocols: &p}}
}

// Over h2c (Caddy's `protocols h1 h2c`), a body with no Content-Length is
// served, a trickled one is cut at request_body_timeout with a 408, and a
// client that resets its stream while the gate holds the answer leaves
// nothing reserved.
func TestH2CClients(t *testing.T) {
	a := upstream(t, fu.OK())
	gatewayWith(t, "\tservers {\n\t\tprotocols h1 h2c\n\t}", oneChannel, a.URL, "request_body_timeout 1s")
	client := h2cClient()
	defer client.CloseIdleConnections()

	pr, pw := io.Pipe()
	go func() { _, _ = pw.Write(fu.ChatRequest("m", false)); pw.Close() }()
	req, _ := http.NewRequest(http.MethodPost, gatewayURL+"/v1/chat/completions", pr)
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.ProtoMajor != 2 || res.StatusCode != 200 {
		t.Fatalf("%s %d: %s", res.Proto, res.StatusCode, b)
	}

	pr, pw = io.Pipe()
	body := fu.ChatRequest("m", false)
	go func() {
		defer pw.Close()
		for _, c := range body {
			if _, err := pw.Write([]byte{c}); err != nil {
				return
			}
			time.Sleep(300 * time.Millisecond)
		}
	}()
	req, _ = http.NewRequest(http.MethodPost, gatewayURL+"/v1/chat/completions", pr)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	res, err = client.Do(req)
	pr.CloseWithError(io.ErrClosedPipe)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if el := time.Since(start); res.StatusCode != http.StatusRequestTimeout || el > 8*time.Second {
		t.Fatalf("trickled body over h2c: %d after %s: %s", res.StatusCode, el, b)
	}
	hits(t, a, 1)
}

func TestH2CClientGoneAtTheGate(t *testing.T) {
	a := upstream(t, fu.SlowFirstToken(time.Minute))
	b := upstream(t, fu.OKNamed("b"))
	path := t.TempDir() + "/w.db"
	gatewayWith(t, "\tservers {\n\t\tprotocols h1 h2c\n\t}\n"+storeOption("sqlite "+path), walletChannels, a.URL, b.URL)
	secret, _ := newWalletAccount(t, "acct", "1")
	client := h2cClient()
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if res, err := client.Do(newPost(t, ctx, "/v1/chat/completions", fu.ChatRequest("m", true), bearer(secret)...)); err == nil {
			res.Body.Close()
		}
	}()
	eventually(t, 5*time.Second, "the upstream to be asked", func() bool { return a.InFlight() == 1 })
	cancel()
	<-done
	eventually(t, 5*time.Second, "the upstream request to end", func() bool { return a.InFlight() == 0 })
	waitUnreserved(t, "acct")
	if bal, _ := balanceOf(t, "acct"); bal != money(t, "1") {
		t.Errorf("balance %s", bal)
	}
	hits(t, b, 0)
}
