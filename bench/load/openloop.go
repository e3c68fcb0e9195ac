package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

// Open loop (-rate): requests start at a constant rate whatever the
// target does, as users arrive, instead of each worker waiting for its
// answer before sending the next (closed loop, which slows down with the
// target and so hides its stalls: coordinated omission). Request i is due
// at start + i/rate; its latency is counted from when it was due, not
// from when the generator got round to sending it, so a generator or a
// target that falls behind shows as latency. At most -max-inflight
// requests are open at once; a request due while that many are open is
// counted as dropped (an error), never delayed. The requests are sent
// within microseconds of when they are due (clock, dispatch_linux.go).

// readBuffer is what reading one answer needs. They are pooled: at
// thousands of requests a second, a fresh 32 KiB each would be most of the
// generator's garbage, and its collections show in every target's tail.
type readBuffer struct {
	buf  [32 << 10]byte
	tail [64]byte
}

var readBuffers = sync.Pool{New: func() any { return new(readBuffer) }}

// openLoop runs the open-loop load and returns the samples of requests due
// in [measureFrom, end).
func openLoop(client *http.Client, method, url string, body []byte, headers headerFlags, rate float64, maxInflight int,
	start, measureFrom, end time.Time) *worker {
	out := &worker{samples: make([]sample, 0, int(rate*end.Sub(measureFrom).Seconds())+16)}
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		inflight = make(chan struct{}, maxInflight)
	)
	interval := time.Duration(float64(time.Second) / rate)
	clk := newClock()
	defer clk.release()
	for i := 0; ; i++ {
		due := start.Add(time.Duration(i) * interval)
		if !due.Before(end) {
			break
		}
		clk.sleepUntil(due)
		measured := !due.Before(measureFrom)
		select {
		case inflight <- struct{}{}:
		default:
			if measured {
				mu.Lock()
				out.fail(fmt.Sprintf("dropped: %d requests already open", maxInflight))
				mu.Unlock()
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-inflight }()
			ctx, cancel := context.WithTimeout(context.Background(), client.Timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			for _, h := range headers {
				k, v, _ := strings.Cut(h, ":")
				req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
			}
			b := readBuffers.Get().(*readBuffer)
			defer readBuffers.Put(b)
			buf, tail := b.buf[:], b.tail[:0]
			sent := time.Now()
			s, n, isStream, errMsg := do(client, req, buf, &tail)
			if !measured {
				return
			}
			late := sent.Sub(due)
			mu.Lock()
			defer mu.Unlock()
			if errMsg != "" {
				out.fail(errMsg)
				return
			}
			s.lat = time.Since(due)
			s.ttfb += late
			out.samples = append(out.samples, s)
			out.bytes += n
			out.stream = out.stream || isStream
		}()
	}
	wg.Wait()
	return out
}

// writeQuantiles writes the latency and time-to-first-byte quantile
// ladders of samples to path, one "q latency_us ttfb_us" line per
// quantile: every half percent, then the tail (99.9, 99.95, 99.99, max),
// enough to redraw any percentile plot without keeping every sample.
func writeQuantiles(path string, samples []sample) error {
	if len(samples) == 0 {
		return nil
	}
	lat := make([]time.Duration, len(samples))
	ttfb := make([]time.Duration, len(samples))
	for i, s := range samples {
		lat[i], ttfb[i] = s.lat, s.ttfb
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	sort.Slice(ttfb, func(i, j int) bool { return ttfb[i] < ttfb[j] })
	var qs []float64
	for q := 0.005; q < 0.9951; q += 0.005 {
		qs = append(qs, q)
	}
	qs = append(qs, 0.999, 0.9995, 0.9999, 1)
	var b strings.Builder
	b.WriteString("# q latency_us ttfb_us\n")
	for _, q := range qs {
		fmt.Fprintf(&b, "%.4f %d %d\n", q, at(lat, q).Microseconds(), at(ttfb, q).Microseconds())
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// at is the q-quantile of sorted d (nearest rank).
func at(d []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(d))+0.999999) - 1
	return d[min(max(i, 0), len(d)-1)]
}
