package fake

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Each path answers what the benchmarks count on: the JSON answer with
// its length, a stream of the configured chunks ending in [DONE], a 503,
// a stream failing in its first event, and a reset.
func TestPaths(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("no chunks accepted")
	}
	u, err := New(Config{Chunks: 3, RoleChunk: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(u)
	defer srv.Close()
	post := func(path, body string) (*http.Response, string, error) {
		res, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			return nil, "", err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return res, string(b), err
	}
	res, body, err := post("/v1/chat/completions", `{"model":"m","stream": false}`)
	if err != nil || res.StatusCode != 200 || len(body) != u.CompletionLen() || !strings.Contains(body, `"chat.completion"`) {
		t.Fatalf("json: %v %v %q", err, res, body)
	}
	res, body, err = post("/v1/chat/completions", `{"model":"m","stream" : true}`)
	if err != nil || res.StatusCode != 200 || strings.Count(body, "data: ") != u.Events() || u.Events() != 1+3+1+1 ||
		!strings.HasSuffix(body, "data: [DONE]\n\n") || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %v %v %q", err, res, body)
	}
	res, body, err = post("/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`)
	if err != nil || strings.Count(body, "data: ") != u.Events()+1 || !strings.Contains(body, `"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,`) ||
		!strings.HasSuffix(body, "}\n\ndata: [DONE]\n\n") {
		t.Fatalf("stream with include_usage: %v %v %q", err, res, body)
	}
	res, body, err = post("/fail/v1/chat/completions", `{}`)
	if err != nil || res.StatusCode != 503 || !strings.Contains(body, "overloaded") {
		t.Fatalf("fail: %v %v %q", err, res, body)
	}
	res, body, err = post("/errorframe/v1/chat/completions", `{"stream":true}`)
	if err != nil || res.StatusCode != 200 || !strings.HasPrefix(body, `data: {"error"`) {
		t.Fatalf("error frame: %v %v %q", err, res, body)
	}
	if _, _, err = post("/reset/v1/chat/completions", `{}`); err == nil {
		t.Fatal("reset: an answer")
	}
}

// Serve answers HTTP/1.1 and HTTP/2 without TLS on one listener: bench/scale.sh
// measures channels that reach their upstream over h2c.
func TestServeSpeaksH1AndH2C(t *testing.T) {
	u, err := New(Config{Chunks: 2})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = u.Serve(ln) }()
	defer ln.Close()
	for _, h2c := range []bool{false, true} {
		tr := &http.Transport{}
		if h2c {
			var p http.Protocols
			p.SetUnencryptedHTTP2(true)
			tr.Protocols = &p
		}
		res, err := (&http.Client{Transport: tr}).Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
		if err != nil {
			t.Fatalf("h2c %v: %v", h2c, err)
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		if want := map[bool]int{false: 1, true: 2}[h2c]; err != nil || res.ProtoMajor != want || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
			t.Fatalf("h2c %v: %v %s %q", h2c, err, res.Proto, b)
		}
		tr.CloseIdleConnections()
	}
}
