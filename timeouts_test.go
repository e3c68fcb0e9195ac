package llmfailover

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// A streaming request to an upstream that accepts the connection and never
// answers fails over after stream_header_timeout; a non-streaming one waits
// header_timeout, which exists for jobs that answer only when done.
func TestStreamHeaderTimeoutFailsStreamsOverSooner(t *testing.T) {
	a := upstream(t, fu.NoHeaders())
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, twoChannels, a.URL, b.URL, "header_timeout 2s\n\t\tstream_header_timeout 300ms")

	began := time.Now()
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", true))
	took := time.Since(began)
	if res.StatusCode != 200 {
		t.Fatalf("stream: status %d: %s", res.StatusCode, body)
	}
	if got := fu.StreamText(mustSSE(t, body)); got != "Hello from backup" {
		t.Errorf("stream text %q", got)
	}
	if took < 300*time.Millisecond || took > 1500*time.Millisecond {
		t.Errorf("stream failed over after %s, want about stream_header_timeout (300ms)", took)
	}

	began = time.Now()
	res, body = post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
	took = time.Since(began)
	if res.StatusCode != 200 {
		t.Fatalf("non-stream: status %d: %s", res.StatusCode, body)
	}
	mustContain(t, body, "Hello from backup")
	if took < 2*time.Second {
		t.Errorf("non-streaming request failed over after %s, before header_timeout (2s)", took)
	}
	eventually(t, 5*time.Second, "the hung upstream requests to end", func() bool { return a.InFlight() == 0 })
}

func TestStreamHeaderTimeoutDefaultsAndNeverExceedsHeaderTimeout(t *testing.T) {
	for _, c := range []struct {
		name, cfg, path string
		stream          bool
		want            time.Duration
	}{
		{"stream default", "", "/v1/chat/completions", true, DefaultStreamHeaderTimeout},
		{"non-stream default", "", "/v1/chat/completions", false, DefaultHeaderTimeout},
		{"gemini stream path", "", "/v1beta/models/g:streamGenerateContent", false, DefaultStreamHeaderTimeout},
		{"stream set", "stream_header_timeout 5s", "/v1/messages", true, 5 * time.Second},
		{"header shorter", "header_timeout 2s", "/v1/messages", true, 2 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := caddyfile.NewTestDispenser("llm_failover {\n channel a http://127.0.0.1:1\n model m {\n route a\n }\n " + c.cfg + "\n}")
			var h Handler
			if err := h.UnmarshalCaddyfile(d); err != nil {
				t.Fatal(err)
			}
			// The defaults Provision sets.
			if h.HeaderTimeout == 0 {
				h.HeaderTimeout = caddy.Duration(DefaultHeaderTimeout)
			}
			if h.StreamHeaderTimeout == 0 {
				h.StreamHeaderTimeout = caddy.Duration(DefaultStreamHeaderTimeout)
			}
			x := &exchange{r: httptest.NewRequest("POST", c.path, nil)}
			x.req.Stream = c.stream
			if got := h.headerTimeout(x); got != c.want {
				t.Errorf("headerTimeout = %s, want %s", got, c.want)
			}
		})
	}
}
