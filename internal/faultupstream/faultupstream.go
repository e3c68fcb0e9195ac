// Package faultupstream is a fake LLM provider for tests and benchmarks. It
// speaks enough of the OpenAI (chat completions, responses, embeddings,
// models) and Anthropic (messages, models) wire formats for a gateway to treat
// it as the real thing, and it can misbehave on purpose: error statuses,
// connection resets, hangs, broken or stalled SSE streams, lying bodies.
//
// A Server runs one Behavior at a time; Set swaps it while requests are in
// flight, which is how a test flips an upstream from healthy to failing. The
// behaviours compose (Sequence, FailFirst, FailEvery, FailRatio, SlowHeaders)
// so most scenarios are one expression.
//
// Everything listens on 127.0.0.1 only and every wait honours the request's
// context, which is cancelled both when the client goes away and when the
// Server is closed, so no behaviour can outlive its test.
package faultupstream

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Behavior decides how one request is answered. n is the 1-based number of the
// request on its Server, handy for ids and logging; composite behaviours keep
// their own counters instead, so they restart from 1 when installed with Set
// or nested inside one another.
type Behavior interface {
	Serve(w http.ResponseWriter, r *http.Request, n int64)
}

// BehaviorFunc lets a test write a one-off behaviour inline.
type BehaviorFunc func(w http.ResponseWriter, r *http.Request, n int64)

// Serve calls f.
func (f BehaviorFunc) Serve(w http.ResponseWriter, r *http.Request, n int64) { f(w, r, n) }

// Recorded is a copy of a request as the upstream saw it, taken before the
// behaviour ran, so it is complete even for behaviours that reset the
// connection.
type Recorded struct {
	Proto  string // "HTTP/1.1", or "HTTP/2.0" on a NewHTTP2 server
	Method string
	Path   string
	Query  string // raw query, without '?'
	Host   string
	Header http.Header
	Body   []byte
}

// maxBody bounds what one request may make the fake hold in memory; real
// prompts in tests are far smaller.
const maxBody = 64 << 20

// closeWait bounds how long Close waits for handlers: all built-in behaviours
// return as soon as their context ends, so only a misbehaving BehaviorFunc can
// hit it, and a hung test is worse than a leaked goroutine.
const closeWait = 5 * time.Second

// Server is a running fake upstream.
type Server struct {
	// URL is the base URL, e.g. "http://127.0.0.1:41234" ("https://" from
	// NewHTTP2), without a trailing slash; append "/v1" (or nothing) as the
	// provider under test expects.
	URL string
	// CertPEM is a NewHTTP2 server's self-signed certificate, PEM-encoded:
	// what a client trusts to reach it (nil for New).
	CertPEM []byte

	srv    *http.Server
	ln     net.Listener
	cancel context.CancelFunc

	mu       sync.Mutex
	behavior Behavior
	last     Recorded

	hits     atomic.Int64
	inFlight atomic.Int64
	handlers sync.WaitGroup
	closed   sync.Once
}

// New starts a Server on 127.0.0.1 with a random port. A nil b means OK().
// It panics if it cannot listen, as there is nothing a test could do instead.
func New(b Behavior) *Server {
	s := newServer(b, "http://")
	go func() { _ = s.srv.Serve(s.ln) }()
	return s
}

// NewHTTP2 starts a Server like New, but over TLS with HTTP/2 offered by
// ALPN, as a hosted provider answers: URL is "https://127.0.0.1:<port>",
// and the server's certificate (for 127.0.0.1, self-signed, made for this
// server) is CertPEM. A client that offers HTTP/2 gets it.
//
// Every behaviour works the same, except that HTTP/2 has no connection of
// its own per request to reset or close: a behaviour that hangs up
// (Reset, CloseNoResponse, a cut or truncated answer) resets its stream
// (RST_STREAM, INTERNAL_ERROR) instead, which is what a provider's
// load balancer does to one request.
func NewHTTP2(b Behavior) *Server {
	s := newServer(b, "https://")
	cert, pemBytes, err := selfSigned()
	if err != nil {
		panic("faultupstream: making a certificate: " + err.Error())
	}
	s.CertPEM = pemBytes
	s.srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	go func() { _ = s.srv.ServeTLS(s.ln, "", "") }()
	return s
}

// newServer listens on 127.0.0.1 with a random port and makes the Server
// and its http.Server; the caller starts serving.
func newServer(b Behavior, scheme string) *Server {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic("faultupstream: listen: " + err.Error())
	}
	// Cancelling the base context reaches every request context, which is
	// what lets hanging behaviours notice Close as well as a departed client.
	base, cancel := context.WithCancel(context.Background())
	s := &Server{
		URL:    scheme + ln.Addr().String(),
		ln:     ln,
		cancel: cancel,
	}
	s.Set(b)
	s.srv = &http.Server{
		Handler:     http.HandlerFunc(s.serveHTTP),
		BaseContext: func(net.Listener) context.Context { return base },
		// Resets and cuts are the point of this server; its complaints about
		// them would only bury the real test output.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	return s
}

// selfSigned makes an ECDSA certificate for 127.0.0.1, valid for a day
// either side of now, and returns it with its PEM.
func selfSigned() (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{CommonName: "faultupstream"},
		NotBefore:             now.Add(-24 * time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// Addr is the host:port the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server, ends every hanging behaviour and waits (up to a few
// seconds) for all handlers to return. It is safe to call more than once.
func (s *Server) Close() {
	s.closed.Do(func() {
		// Connections go first so that handlers woken by the cancel find no
		// client to send a half-made answer to.
		_ = s.srv.Close()
		s.cancel()
		done := make(chan struct{})
		go func() { s.handlers.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(closeWait):
		}
	})
}

// Set replaces the behaviour for requests that arrive from now on; requests
// already being served finish with the behaviour they started with. A nil b
// means OK().
func (s *Server) Set(b Behavior) {
	if b == nil {
		b = OK()
	}
	s.mu.Lock()
	s.behavior = b
	s.mu.Unlock()
}

// Hits is the number of requests whose headers were read, including those
// the behaviour then refused to answer.
func (s *Server) Hits() int64 { return s.hits.Load() }

// ResetHits sets Hits back to zero. It does not restart the counters of
// composite behaviours; Set a fresh one for that.
func (s *Server) ResetHits() { s.hits.Store(0) }

// InFlight is the number of requests whose behaviour has not returned yet.
// A test can wait for it to reach zero to prove that a gateway abandoned a
// slow upstream rather than leaving the request hanging.
func (s *Server) InFlight() int64 { return s.inFlight.Load() }

// LastRequest returns a copy of the most recent request (zero before any).
func (s *Server) LastRequest() Recorded {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.last
	r.Header = r.Header.Clone()
	r.Body = bytes.Clone(r.Body)
	return r
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.handlers.Add(1)
	defer s.handlers.Done()
	s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	n := s.hits.Add(1)

	// Reading the whole body first gives LastRequest a complete copy and lets
	// behaviours that never answer still see the client disconnect (the
	// server only watches the connection once the body is consumed).
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	rec := Recorded{
		Proto:  r.Proto,
		Method: r.Method,
		Path:   r.URL.Path,
		Query:  r.URL.RawQuery,
		Host:   r.Host,
		Header: r.Header.Clone(),
		Body:   body,
	}
	s.mu.Lock()
	s.last = rec
	b := s.behavior
	s.mu.Unlock()
	if err != nil {
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	b.Serve(w, r, n)
	if r.Context().Err() != nil {
		// A behaviour cut short by Close or a departed client would otherwise
		// get an implicit empty 200 from net/http; aborting drops the
		// connection instead, which is the only honest outcome.
		panic(http.ErrAbortHandler)
	}
}
