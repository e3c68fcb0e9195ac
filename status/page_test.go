package status

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

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
		w := failoverapp.WindowView{Attempts: 3, Successes: 3, SuccessRate: rate(1), InputTokens: input, CacheReadTokens: read}
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

// A channel's learned deadlines show as a small table, a learned one with
// the quantile and samples it comes from, one still waiting for samples
// as the configured timeout; a channel without them shows no table.
func TestPageShowsLearnedDeadlines(t *testing.T) {
	now := time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)
	windows := map[string]failoverapp.WindowView{"5m": {}, "1h": {}, "24h": {}}
	channel := func(name string, learned []failoverapp.LearnedDeadlineView) failoverapp.ChannelView {
		return failoverapp.ChannelView{Name: name, State: "closed", Status: failoverapp.StatusOperational, Since: now,
			Counts: "attempts", Doing: "serving", Windows: windows, LearnedDeadlines: learned}
	}
	m := failoverapp.ModelView{Name: "m", Status: failoverapp.StatusOperational, Since: now, Counts: "requests", Windows: windows,
		Channels: []failoverapp.ChannelView{
			channel("alpha", []failoverapp.LearnedDeadlineView{
				{Kind: "header", Class: "s/s", LimitMs: 5000, Learned: true, QuantileMs: 106, Percentile: 99, Samples: 60, MedianMs: 100},
				{Kind: "first_content", Class: "m/l", LimitMs: 12600, Learned: true, QuantileMs: 4200, Percentile: 99.5, Samples: 75, MedianMs: 1500},
				{Kind: "gap", Class: "s/s", LimitMs: 60000, Samples: 12, MedianMs: 800},
				{Kind: "gap", Class: "l/l", Samples: 3, MedianMs: 900},
			}),
			channel("beta", nil),
		}}
	v := failoverapp.StatusView{Title: "t", GeneratedAt: now, Status: failoverapp.StatusOperational,
		Models: []failoverapp.ModelView{m}, WindowKeys: []string{"5m", "1h", "24h"}}
	var buf bytes.Buffer
	if err := render(&buf, v, 0, "/status/"); err != nil {
		t.Fatal(err)
	}
	_, alpha, _ := strings.Cut(buf.String(), `id="channel-m-alpha"`)
	alpha, beta, _ := strings.Cut(alpha, `id="channel-m-beta"`)
	for _, want := range []string{
		"<th>learned deadline</th>",
		"<tr><td>response headers</td><td>s/s</td><td>5.0 s</td><td>p99 106 ms over 60 samples</td></tr>",
		"<tr><td>first content</td><td>m/l</td><td>12.6 s</td><td>p99.5 4.2 s over 75 samples</td></tr>",
		"<tr><td>pause in a stream</td><td>s/s</td><td>1 min 0 s</td><td>configured timeout: 12 samples so far</td></tr>",
		"<tr><td>pause in a stream</td><td>l/l</td><td>none</td><td>configured timeout: 3 samples so far</td></tr>",
	} {
		if !strings.Contains(alpha, want) {
			t.Errorf("alpha: %q missing in %s", want, alpha)
		}
	}
	if strings.Contains(beta, "learned deadline") {
		t.Errorf("beta has no learned deadlines, yet shows a table: %s", beta)
	}
}

// TestPageRefreshChecked: refresh is 0 (off) or a whole number of
// seconds the meta refresh can say. A JSON config is checked as strictly
// as the Caddyfile (a negative refresh rendered content="-30"), and a
// refresh under a second, which the page would silently drop, is refused.
func TestPageRefreshChecked(t *testing.T) {
	for _, cfg := range []string{`{"refresh":-30000000000}`, `{"refresh":500000000}`} {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
		_, err := ctx.LoadModuleByID("http.handlers.llm_status", json.RawMessage(cfg))
		cancel()
		if err == nil {
			t.Errorf("%s loaded", cfg)
		}
	}
	err := new(Page).UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_status {\nrefresh 500ms\n}"))
	if err == nil || !strings.Contains(err.Error(), "Testfile:2") {
		t.Errorf("refresh 500ms: %v", err)
	}
	for _, in := range []string{"llm_status {\nrefresh 0\n}", "llm_status {\nrefresh 30s\n}"} {
		if err := new(Page).UnmarshalCaddyfile(caddyfile.NewTestDispenser(in)); err != nil {
			t.Errorf("%q: %v", in, err)
		}
	}
}

// The status page and its runbooks are HTML for people on the operator's
// host; no other site may show them in a frame of its own (a clickjacking
// overlay, or the full page framed where it passes for a public one).
func TestStatusHTMLRefusesFraming(t *testing.T) {
	for _, path := range []string{"/status", "/status/runbooks/state-open"} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "http://gw.example"+path, nil)
		if err := (&Page{}).ServeHTTP(w, r, nil); err != nil {
			t.Fatal(err)
		}
		if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
			t.Fatalf("%s: Content-Type %q", path, ct)
		}
		csp := w.Header().Get("Content-Security-Policy")
		if !strings.Contains(csp, "frame-ancestors") && w.Header().Get("X-Frame-Options") == "" {
			t.Errorf("%s: any site may frame it: CSP %q, no X-Frame-Options", path, csp)
		}
	}
}
