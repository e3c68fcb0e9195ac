package faultupstream

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Start starts a server with b for the test t; it closes when t ends.
func Start(t testing.TB, b Behavior) *Server {
	t.Helper()
	s := New(b)
	t.Cleanup(s.Close)
	return s
}

// StartHTTP2 starts a NewHTTP2 server with b for the test t; it closes
// when t ends.
func StartHTTP2(t testing.TB, b Behavior) *Server {
	t.Helper()
	s := NewHTTP2(b)
	t.Cleanup(s.Close)
	return s
}

// CertFile writes CertPEM to a file of t's and returns its path, for a
// client that reads its trusted certificates from files (Caddy's
// tls_trust_pool file).
func (s *Server) CertFile(t testing.TB) string {
	t.Helper()
	if s.CertPEM == nil {
		t.Fatalf("upstream %s has no certificate: it was not started with NewHTTP2", s.URL)
	}
	path := filepath.Join(t.TempDir(), "upstream.pem")
	if err := os.WriteFile(path, s.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// WantHits fails t unless the server got exactly want requests.
func (s *Server) WantHits(t testing.TB, want int64) {
	t.Helper()
	if got := s.Hits(); got != want {
		t.Fatalf("upstream %s got %d requests, want %d", s.URL, got, want)
	}
}

// Eventually polls cond every 10ms for up to d, failing t when it never
// holds; what says what was waited for.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
