package llmfailover

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

func TestRetrySameRetriesTheCheaperChannelOnce(t *testing.T) {
	cases := []struct {
		name    string
		opt     string
		fail    fu.Behavior
		want    string // the channel that answers
		hitsA   int64
		minTook time.Duration
	}{
		{"default moves on at once", "", fu.Status(500, ""), "backup", 1, 0},
		{"single 500 retried", "retry_same 500 502", fu.Status(500, ""), "primary", 2, 0},
		{"429 within max_wait", "retry_same 429 max_wait 3s", fu.Status(429, "").WithHeader("Retry-After", "2"), "primary", 2, 2 * time.Second},
		{"429 beyond max_wait", "retry_same 429 max_wait 1s", fu.Status(429, "").WithHeader("Retry-After", "2"), "backup", 1, 0},
		{"status not listed", "retry_same 502", fu.Status(500, ""), "backup", 1, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := upstream(t, fu.FailFirst(1, c.fail, fu.OKNamed("primary")))
			b := upstream(t, fu.OKNamed("backup"))
			gateway(t, twoChannels, a.URL, b.URL, c.opt)
			began := time.Now()
			res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
			took := time.Since(began)
			if res.StatusCode != 200 {
				t.Fatalf("status %d: %s", res.StatusCode, body)
			}
			mustContain(t, body, "Hello from "+c.want)
			hits(t, a, c.hitsA)
			if took < c.minTook {
				t.Errorf("answered after %s, before the Retry-After of %s", took, c.minTook)
			}
		})
	}
}

func TestRetrySameCaddyfile(t *testing.T) {
	parse := func(opt string) (*Handler, error) {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_failover {\n channel a http://127.0.0.1:1\n model m {\n route a\n }\n " + opt + "\n}"))
		return &h, err
	}
	h, err := parse("retry_same 500 502 429 max_wait 2s")
	if err != nil {
		t.Fatal(err)
	}
	if r := h.RetrySame; r == nil || len(r.Statuses) != 3 || time.Duration(r.MaxWait) != 2*time.Second {
		t.Fatalf("parsed %+v", h.RetrySame)
	}
	for opt, want := range map[string]string{
		"retry_same":                     "at least one status",
		"retry_same soon":                "not an HTTP status code",
		"retry_same 429":                 "429 needs max_wait",
		"retry_same 404":                 "not a retry_status",
		"retry_same 500 max_wait":        "wrong argument count",
		"retry_same 500 max_wait 1s 502": "wrong argument count",
	} {
		if _, err := parse(opt); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", opt, err, want)
		}
	}
}
