package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// memStats are the counters of a Go process's runtime.MemStats this tool
// reads from its expvar page (/debug/vars: Caddy serves it on its admin
// endpoint).
type memStats struct {
	TotalAlloc uint64 // bytes allocated, ever
	Mallocs    uint64 // objects allocated, ever
	NumGC      uint32 // collections completed
}

// varsClient has its own transport: the load's connections are the
// target's, and the admin endpoint is another server.
var varsClient = &http.Client{Timeout: 5 * time.Second}

// readMemStats reads url, an expvar page.
func readMemStats(url string) (memStats, error) {
	res, err := varsClient.Get(url)
	if err != nil {
		return memStats{}, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return memStats{}, fmt.Errorf("%s: HTTP %d", url, res.StatusCode)
	}
	var page struct {
		MemStats *memStats `json:"memstats"`
	}
	if err := json.NewDecoder(res.Body).Decode(&page); err != nil {
		return memStats{}, fmt.Errorf("%s: %w", url, err)
	}
	if page.MemStats == nil {
		return memStats{}, fmt.Errorf("%s: no memstats (not a Go expvar page?)", url)
	}
	return *page.MemStats, nil
}

// perRequest is what the process allocated and collected between a and b,
// per request of n.
func perRequest(a, b memStats, n int) (bytes, objects, gcPer1k float64) {
	if n <= 0 || b.TotalAlloc < a.TotalAlloc {
		return 0, 0, 0
	}
	f := float64(n)
	return float64(b.TotalAlloc-a.TotalAlloc) / f, float64(b.Mallocs-a.Mallocs) / f, float64(b.NumGC-a.NumGC) / f * 1000
}
