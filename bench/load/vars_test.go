package main

import (
	"expvar"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
)

var keep [][]byte

// The expvar page is read as Caddy serves it (the standard library's
// handler), and what this process allocates between two reads is found.
func TestReadMemStatsSeesAllocations(t *testing.T) {
	srv := httptest.NewServer(expvar.Handler())
	defer srv.Close()
	a, err := readMemStats(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	const n, size = 1000, 1024
	for range n {
		keep = append(keep, make([]byte, size))
	}
	runtime.GC()
	b, err := readMemStats(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	keep = nil
	bytes, objects, gcPer1k := perRequest(a, b, n)
	if bytes < size || objects < 1 {
		t.Fatalf("per request: %.0f bytes, %.1f objects; want at least %d and 1 (a %+v, b %+v)", bytes, objects, size, a, b)
	}
	if gcPer1k < 1 {
		t.Fatalf("%.2f collections per 1,000 requests after a runtime.GC among 1,000", gcPer1k)
	}
}

func TestReadMemStatsRefusesAPageWithoutThem(t *testing.T) {
	srv := httptest.NewServer(expvarLike(`{"cmdline":["x"]}`))
	defer srv.Close()
	if _, err := readMemStats(srv.URL); err == nil {
		t.Fatal("a page without memstats was read")
	}
}

type expvarLike string

func (p expvarLike) ServeHTTP(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(p)) }
