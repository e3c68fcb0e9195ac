package status

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
)

// The page's <base> is its own path on this host, whatever the request
// path looks like: //evil.example/status would otherwise point every
// runbook link of the genuine page at another host.
func TestPageBaseStaysOnTheHost(t *testing.T) {
	for path, want := range map[string]string{
		"/status":                  "/status/",
		"/status/":                 "/status/",
		"//status.evil.example":    "/status.evil.example/",
		"//evil.example/status":    "/evil.example/status/",
		"/status/../..//x.example": "/x.example/",
		"":                         "/",
	} {
		if got := pageBase(path); got != want || strings.HasPrefix(got, "//") {
			t.Errorf("pageBase(%q) = %q, want %q", path, got, want)
		}
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "http://gw.example/status", nil)
	r.URL.Path = "//status.evil.example"
	if err := (&Page{}).ServeHTTP(w, r, nil); err != nil {
		t.Fatal(err)
	}
	body := w.Body.String()
	if !strings.Contains(body, `<base href="/status.evil.example/">`) || strings.Contains(body, `href="//`) {
		t.Errorf("page base: %s", body[:min(len(body), 600)])
	}
	if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "base-uri 'self'") {
		t.Errorf("CSP %q lets a <base> move the links", csp)
	}
}

func TestSpanReadsAsPeopleWriteIt(t *testing.T) {
	for d, want := range map[time.Duration]string{
		850 * time.Millisecond:    "850 ms",
		12400 * time.Millisecond:  "12.4 s",
		539999 * time.Millisecond: "9 min 0 s",
		61 * time.Second:          "1 min 1 s",
	} {
		if got := span(d); got != want {
			t.Errorf("span(%v) = %q, want %q", d, got, want)
		}
	}
}

// A channel's (and a model's) cache-read share of the last hour shows as
// a whole percent, rounded half up, only where the window has input
// tokens: no input shows nothing, not 0 %.
func TestPageShowsCacheReadShare(t *testing.T) {
	window := func(input, read int64) failoverapp.WindowView {
		w := failoverapp.WindowView{Attempts: 3, Successes: 3, SuccessRate: 1, InputTokens: input, CacheReadTokens: read}
		if input > 0 {
			share := float64(read) / float64(input)
			w.CacheReadShare = &share
		}
		return w
	}
	windows := func(w failoverapp.WindowView) map[string]failoverapp.WindowView {
		return map[string]failoverapp.WindowView{"5m": {}, "1h": w, "24h": w}
	}
	now := time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)
	channels := map[string]struct {
		w    failoverapp.WindowView
		want string // "" for no share shown
	}{
		"half":  {window(1000, 425), "cache reads 1h</span>43 % <span>of 1000 input tokens"},
		"none":  {window(1000, 0), "cache reads 1h</span>0 % <span>of 1000 input tokens"},
		"all":   {window(800, 800), "cache reads 1h</span>100 % <span>of 800 input tokens"},
		"tiny":  {window(100000, 4), "cache reads 1h</span>&lt;1 % <span>"},
		"most":  {window(100000, 99996), "cache reads 1h</span>&gt;99 % <span>"},
		"empty": {window(0, 0), ""},
	}
	m := failoverapp.ModelView{Name: "m", Status: failoverapp.StatusOperational, Since: now, Counts: "requests", Windows: windows(window(2000, 1000))}
	for name, c := range channels {
		m.Channels = append(m.Channels, failoverapp.ChannelView{Name: name, State: "closed", Status: failoverapp.StatusOperational,
			Since: now, Counts: "attempts", Doing: "serving", Windows: windows(c.w)})
	}
	v := failoverapp.StatusView{Title: "t", GeneratedAt: now, Status: failoverapp.StatusOperational,
		Models: []failoverapp.ModelView{m}, WindowKeys: []string{"5m", "1h", "24h"}}
	var buf bytes.Buffer
	if err := render(&buf, v, 0, "/status/"); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	// The model's part ends where its first channel starts.
	model, rest, ok := strings.Cut(page, `<div class="channel"`)
	if !ok {
		t.Fatal("no channel on the page")
	}
	if want := "cache reads 1h</span>50 % <span>of 2000 input tokens"; !strings.Contains(model, want) {
		t.Errorf("model: %q missing", want)
	}
	sections := strings.Split(rest, `<div class="channel"`)
	if len(sections) != len(channels) {
		t.Fatalf("%d channel sections, want %d", len(sections), len(channels))
	}
	for _, sec := range sections {
		_, after, _ := strings.Cut(sec, `id="channel-m-`)
		name, _, _ := strings.Cut(after, `"`)
		c, ok := channels[name]
		if !ok {
			t.Fatalf("unknown channel section %q", name)
		}
		switch {
		case c.want == "" && strings.Contains(sec, "cache reads"):
			t.Errorf("channel %s, no input tokens: shows a cache-read share", name)
		case c.want != "" && !strings.Contains(sec, c.want):
			t.Errorf("channel %s: %q missing", name, c.want)
		}
	}
}
