package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The open loop starts requests at the rate asked whatever the target
// does, and counts a request's latency from when it was due: a target that
// stalls every request for 20 ms shows at least 20 ms on every one, and
// the number sent follows the rate, not the target's pace.
func TestOpenLoopKeepsTheRate(t *testing.T) {
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond)
		served.Add(1)
		w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 100}, Timeout: 5 * time.Second}
	start := time.Now()
	w := openLoop(client, http.MethodPost, srv.URL, []byte(`{}`), nil, 200, 1000, start, start.Add(200*time.Millisecond), start.Add(700*time.Millisecond))
	if n := len(w.samples); n < 90 || n > 101 || w.errors != 0 {
		t.Fatalf("%d samples, %d errors (%s) at 200/s for 0.5 s; want about 100", n, w.errors, w.firstError)
	}
	for _, s := range w.samples {
		if s.lat < 20*time.Millisecond || s.ttfb < 20*time.Millisecond {
			t.Fatalf("a latency of %v (ttfb %v) below the target's 20 ms stall", s.lat, s.ttfb)
		}
	}
	path := filepath.Join(t.TempDir(), "q.txt")
	if err := writeQuantiles(path, w.samples); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if lines := strings.Count(string(b), "\n"); lines != 1+199+4 {
		t.Errorf("%d lines in the quantile ladder", lines)
	}

	// With at most one request open, the ones due meanwhile are dropped,
	// never delayed.
	start = time.Now()
	w = openLoop(client, http.MethodPost, srv.URL, []byte(`{}`), nil, 200, 1, start, start, start.Add(300*time.Millisecond))
	if w.errors < 40 || len(w.samples) > 20 || !strings.HasPrefix(w.firstError, "dropped") {
		t.Errorf("%d served, %d dropped (%s); want most of 60 dropped", len(w.samples), w.errors, w.firstError)
	}
}
