package status

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
)

func rate(r float64) *float64 { return &r }

// pageWith renders a page of one model whose 1h window is w.
func pageWith(t *testing.T, w failoverapp.WindowView) string {
	t.Helper()
	now := time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)
	m := failoverapp.ModelView{Name: "m", Status: failoverapp.StatusOperational, Since: now, Counts: "requests",
		Windows: map[string]failoverapp.WindowView{"5m": {}, "1h": w, "24h": {}}}
	v := failoverapp.StatusView{Title: "t", GeneratedAt: now, Status: failoverapp.StatusOperational,
		Models: []failoverapp.ModelView{m}, WindowKeys: []string{"5m", "1h", "24h"}}
	var buf bytes.Buffer
	if err := render(&buf, v, 0, "/status/"); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// A success rate is never rounded up to a perfect one: one failed
// request in 30 000 is not "100.00%" on a page operators read as
// "nothing failed", in the windows or in a bar's tooltip.
func TestPercentNeverRoundsUpToPerfect(t *testing.T) {
	w := failoverapp.WindowView{Attempts: 30000, Successes: 29999, Down: 1, SuccessRate: rate(29999.0 / 30000)}
	if page := pageWith(t, w); !strings.Contains(page, "requests ok 1h</span>99.99%") {
		t.Errorf("29 999 of 30 000 served: %q missing", "requests ok 1h</span>99.99%")
	}
	all := failoverapp.WindowView{Attempts: 5, Successes: 5, SuccessRate: rate(1)}
	if page := pageWith(t, all); !strings.Contains(page, "requests ok 1h</span>100.00%") {
		t.Error("5 of 5 served does not show 100.00%")
	}
	near := failoverapp.BarView{Start: time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC), Attempts: 30000, Successes: 29999, Down: 1,
		SuccessRate: rate(29999.0 / 30000)}
	if got := barTitle(near, "2006-01-02", "requests"); strings.Contains(got, "100.00% ok") {
		t.Errorf("a bar with a failure reads %q", got)
	}
}

// A window (or a bar) whose only attempts were the clients' own errors
// says nothing about the upstreams: no data, not 100 % ok.
func TestPercentOfClientErrorsOnlyIsNoData(t *testing.T) {
	w := failoverapp.WindowView{Attempts: 4, Client: 4}
	if page := pageWith(t, w); !strings.Contains(page, "requests ok 1h</span>– ") {
		t.Error("a window of 4 client errors only does not show as no data")
	}
	b := failoverapp.BarView{Start: time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC), Attempts: 4, Client: 4}
	if got := barTitle(b, "2006-01-02", "requests"); strings.Contains(got, "% ok") {
		t.Errorf("a bar of 4 client errors reads %q (and is drawn grey: no data)", got)
	}
}
