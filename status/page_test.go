package status

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
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
