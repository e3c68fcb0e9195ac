package integration_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// TestHostileLinesKeepMemoryBounded: 20 streams whose upstream sends one
// content event and then a 50 MB line without an end. The gateway forwards
// every byte and its heap stays bounded (it used to hold each line whole:
// 10 such streams reached 486 MB RSS). The figure is logged.
func TestHostileLinesKeepMemoryBounded(t *testing.T) {
	const streams, lineMB = 20, 50
	piece := []byte(strings.Repeat("x", 64<<10))
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}`+"\n\ndata: ")
		for range lineMB << 20 / len(piece) {
			if _, err := w.Write(piece); err != nil {
				return
			}
		}
	}))
	defer up.Close()
	gateway(t, `
		channel a %s
		model m {
			route a
		}
		auth off
	`, up.URL)

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	stop := make(chan struct{})
	var peak uint64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var m runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapInuse)
		}
	}()
	var wg sync.WaitGroup
	got := make([]int64, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			res, err := http.DefaultClient.Do(newPost(t, ctx, "/v1/chat/completions", fu.ChatRequest("m", true)))
			if err != nil {
				t.Error(err)
				return
			}
			defer res.Body.Close()
			got[i], _ = io.Copy(io.Discard, res.Body)
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	for i, n := range got {
		if n < lineMB<<20 {
			t.Fatalf("stream %d: the client got %d bytes of a %d MB line", i, n, lineMB)
		}
	}
	grown := int64(peak) - int64(before.HeapInuse)
	t.Logf("%d streams of a %d MB line: heap in use grew by at most %d MiB", streams, lineMB, grown>>20)
	// 20 streams × (1 MiB kept of the line + buffers), plus garbage not
	// yet collected: well under what one line held whole would take.
	if grown > 160<<20 {
		t.Fatalf("heap in use grew by %d MiB over %d streams", grown>>20, streams)
	}
}

// A line longer than the hold cap before any content is the channel's
// failure: the request fails over and the client never sees those bytes.
func TestOverlongLineBeforeContentFailsOver(t *testing.T) {
	long := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}`+"\n\ndata: ")
		_, _ = io.WriteString(w, strings.Repeat("x", 3<<20))
	}))
	defer long.Close()
	good := upstream(t, fu.OKNamed("b"))
	gateway(t, `
		channel a %s
		channel b %s
		model m {
			route a cost 1 1
			route b cost 2 2
		}
		auth off
	`, long.URL, good.URL)
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", true))
	if res.StatusCode != http.StatusOK || res.Header.Get("X-Served-By") != "b" || strings.Contains(string(body), "xxxx") {
		t.Fatalf("status %d served by %q: %.200s", res.StatusCode, res.Header.Get("X-Served-By"), body)
	}
}

// A stream held by the gate counts against max_held_bytes like a buffered
// answer: past the cap, a new attempt gets 503 instead of more memory.
func TestHeldStreamsCountAgainstTheCap(t *testing.T) {
	release := make(chan struct{})
	hold := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, ": ping\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer hold.Close()
	defer close(release)
	gatewayWith(t, failoverOption("max_held_bytes 1MiB"), `
		channel a %s
		model m {
			route a
		}
		stream_gate 1m
		auth off
	`, hold.URL)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := make(chan struct{})
	go func() {
		defer close(first)
		if res, err := http.DefaultClient.Do(newPost(t, ctx, "/v1/chat/completions", fu.ChatRequest("m", true))); err == nil {
			res.Body.Close()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for failoverapp.HeldBytes() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	began := time.Now()
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", true))
	if res.StatusCode != http.StatusServiceUnavailable || time.Since(began) > 5*time.Second {
		t.Fatalf("second held stream: status %d after %v: %s", res.StatusCode, time.Since(began), body)
	}
	cancel()
	<-first
}
