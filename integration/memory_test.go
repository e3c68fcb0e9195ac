package integration_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/internal/shapes"
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

// A stream held by the gate counts the bytes it holds against
// max_held_bytes, not a fixed reservation: a stream whose preamble alone
// passes the budget is committed (the client gets what was held, then the
// rest) instead of taking more memory, and gives its bytes back.
func TestHeldStreamsCountWhatTheyHold(t *testing.T) {
	release := make(chan struct{})
	preamble := strings.Repeat(": "+strings.Repeat("p", 1000)+"\n\n", 600) // ~600 KB, no content
	hold := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, preamble)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "data: "+shapes.ChatContent+"\n\ndata: [DONE]\n\n")
	}))
	defer hold.Close()
	gatewayWith(t, failoverOption("max_held_bytes 512KiB"), `
		channel a %s
		model m {
			route a
		}
		stream_gate 1m
		auth off
	`, hold.URL)
	res, err := http.DefaultClient.Do(newPost(t, context.Background(), "/v1/chat/completions", fu.ChatRequest("m", true)))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	// Committed before its first token: the headers come while the
	// upstream still thinks.
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	if held := failoverapp.HeldBytes(); held > 512<<10 {
		t.Fatalf("%d bytes held for one stream, over max_held_bytes", held)
	}
	close(release)
	body, _ := io.ReadAll(res.Body)
	if !strings.HasPrefix(string(body), preamble) || !strings.Contains(string(body), "Hello") || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("body %.200q … %q", body, body[max(0, len(body)-100):])
	}
	eventually(t, 5*time.Second, "the held bytes to be given back", func() bool { return failoverapp.HeldBytes() == 0 })
}

// Streams waiting for their first token are bounded by the memory they
// hold, not by their number: 2,000 at once, whose upstream sent its
// preamble and then thought (as reasoning models do), are all served with
// the default max_held_bytes. Each used to count 1 MiB, so the 257th was
// refused with 503 (1,744 of 2,000 within 0.4 s).
func TestTwoThousandStreamsWaitingForTheirFirstToken(t *testing.T) {
	const streams = 2000
	release := make(chan struct{})
	up := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: "+shapes.ChatRole+"\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "data: "+shapes.ChatContent+"\n\ndata: [DONE]\n\n")
	}))
	// 2,000 dials at once to one test server on a busy CI machine can
	// overflow its accept queue; a dropped SYN is sent again after 1 s
	// and 3 s, so the default 3 s dial timeout once failed a stream with
	// 502. Dialling is not what this test is about.
	gateway(t, `
		channel a %s {
			transport http {
				dial_timeout 15s
			}
		}
		model m {
			route a
		}
		auth off
		%s`, up.URL, "stream_gate 1m")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams}}
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	complete := 0
	for range streams {
		wg.Go(func() {
			res, err := client.Do(newPost(t, context.Background(), "/v1/chat/completions", fu.ChatRequest("m", true)))
			status := 0
			var body []byte
			if err == nil {
				status = res.StatusCode
				body, _ = io.ReadAll(res.Body)
				res.Body.Close()
			}
			mu.Lock()
			defer mu.Unlock()
			statuses[status]++
			if status == 200 && strings.Contains(string(body), "Hello") && strings.HasSuffix(string(body), "data: [DONE]\n\n") {
				complete++
			}
		})
	}
	eventually(t, 60*time.Second, fmt.Sprintf("%d streams to wait at the upstream at once", streams), func() bool {
		mu.Lock()
		refused := len(statuses)
		mu.Unlock()
		return up.InFlight() == streams || refused > 0
	})
	close(release)
	wg.Wait()
	if complete != streams {
		t.Fatalf("%d of %d streams complete; statuses %v", complete, streams, statuses)
	}
}

// A stream held by the gate counts what it holds against max_held_bytes,
// and the count must be what it costs: 30 streams each holding back most
// of a 1,000 KB line before their first token (a long comment, under the
// 1 MiB a line may have) count 30 MB, and the heap must not grow by much
// more. The parser keeps its own copy of the unfinished line besides the
// bytes held for the client, and that copy was not counted: the heap grew
// by twice what max_held_bytes was told.
func TestHeldLinesCountWhatTheyCost(t *testing.T) {
	const streams, lineKB = 30, 1000
	release := make(chan struct{})
	piece := strings.Repeat("p", 16<<10)
	var written atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, ": ")
		for range lineKB << 10 / len(piece) {
			if _, err := io.WriteString(w, piece); err != nil {
				return
			}
		}
		w.(http.Flusher).Flush()
		written.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer up.Close()
	defer close(release)
	gatewayWith(t, failoverOption("max_held_bytes 256MiB"), `
		channel a %s
		model m {
			route a
		}
		stream_gate 1m
		auth off
	`, up.URL)

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	heldBefore := failoverapp.HeldBytes()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range streams {
		wg.Go(func() {
			res, err := http.DefaultClient.Do(newPost(t, ctx, "/v1/chat/completions", fu.ChatRequest("m", true)))
			if err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		})
	}
	defer func() { cancel(); wg.Wait() }()
	lines := int64(streams * (lineKB<<10/len(piece)*len(piece) + 2))
	last := int64(-1)
	eventually(t, 30*time.Second, "every stream to hold its line", func() bool {
		held := failoverapp.HeldBytes() - heldBefore
		settled := written.Load() == streams && held >= lines && held == last
		last = held
		time.Sleep(100 * time.Millisecond)
		return settled
	})
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := failoverapp.HeldBytes() - heldBefore
	grown := int64(after.HeapInuse) - int64(before.HeapInuse)
	t.Logf("%d streams holding a %d KB line: %d KiB counted as held, heap in use grew by %d KiB", streams, lineKB, held>>10, grown>>10)
	// What a stream costs besides what it holds (its goroutines, its
	// connections' buffers, the request) is well under 128 KiB.
	if grown > held+held/4+streams*128<<10 {
		t.Fatalf("heap in use grew by %d KiB while %d KiB were counted as held", grown>>10, held>>10)
	}
}
