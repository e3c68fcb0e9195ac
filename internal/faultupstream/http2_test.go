package faultupstream

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"strings"
	"testing"
)

// startHTTP2 is start for a NewHTTP2 server: the client trusts only its
// certificate and offers HTTP/2, as Caddy's transport does to an https
// upstream.
func startHTTP2(t *testing.T, b Behavior) (*Server, *http.Client) {
	t.Helper()
	s := NewHTTP2(b)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.CertPEM) {
		t.Fatal("CertPEM holds no certificate")
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		s.Close()
	})
	return s, &http.Client{Transport: tr}
}

func TestHTTP2ServesOverTLS(t *testing.T) {
	s, c := startHTTP2(t, OK())
	if !strings.HasPrefix(s.URL, "https://127.0.0.1:") {
		t.Fatalf("URL %q", s.URL)
	}
	resp := mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", true))
	if resp.ProtoMajor != 2 {
		t.Fatalf("answered over %s, want HTTP/2", resp.Proto)
	}
	if got := StreamText(readEvents(t, resp)); got != "Hello from "+DefaultName {
		t.Fatalf("text %q", got)
	}
	if got := s.LastRequest().Proto; got != "HTTP/2.0" {
		t.Fatalf("recorded proto %q", got)
	}
	// A client that does not trust the certificate is refused.
	if _, err := post(t, &http.Client{}, s.URL+"/v1/chat/completions", nil); err == nil {
		t.Fatal("an untrusting client got an answer")
	}
}

// Over HTTP/2 a hang-up resets the request's stream: before the headers
// (Reset, CloseNoResponse) the request fails, after them (a cut, a
// truncated body) the body's read does, and the connection serves the
// next request.
func TestHTTP2HangUpResetsTheStream(t *testing.T) {
	isReset := func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "INTERNAL_ERROR")
	}
	for name, b := range map[string]Behavior{"reset": Reset(), "close": CloseNoResponse()} {
		s, c := startHTTP2(t, b)
		if _, err := post(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", false)); !isReset(err) {
			t.Fatalf("%s: want a stream reset, got %v", name, err)
		}
	}

	s, c := startHTTP2(t, CutMidStream())
	evs, err := ReadSSE(mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", true)).Body)
	if !isReset(err) || StreamText(evs) != "Hello from" {
		t.Fatalf("cut stream: %q, %v", StreamText(evs), err)
	}
	if _, err := io.ReadAll(mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", false)).Body); !isReset(err) {
		t.Fatalf("cut JSON: %v", err)
	}
	s.Set(OK())
	if resp := mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", false)); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the resets: %d", resp.StatusCode)
	}
	if s.Hits() != 3 {
		t.Fatalf("hits %d", s.Hits())
	}
}
