package integration_test

import (
	"testing"
	"time"

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
