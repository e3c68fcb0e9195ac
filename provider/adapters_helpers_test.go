package provider

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// Helpers the adapter tests (azure, gemini, vertex, bedrock) share.

// checkModule checks an adapter's Caddy module ID and that New returns a
// fresh *T of the adapter's own type.
func checkModule(t *testing.T, m caddy.Module, name string) {
	t.Helper()
	info := m.CaddyModule()
	if want := caddy.ModuleID(Namespace + "." + name); info.ID != want {
		t.Errorf("%T: module ID %q, want %q", m, info.ID, want)
	}
	a, b := info.New(), info.New()
	if want := reflect.PointerTo(reflect.TypeOf(m)); reflect.TypeOf(a) != want {
		t.Errorf("%T: New() returned %T, want %v", m, a, want)
	}
	if a == b {
		t.Errorf("%T: New() returned the same value twice", m)
	}
	if v := reflect.ValueOf(a); v.Kind() == reflect.Pointer && !v.Elem().IsZero() {
		t.Errorf("%T: New() returned %+v, want a zero adapter", m, a)
	}
	if _, ok := a.(Adapter); !ok {
		t.Errorf("%T: New() returned %T, not an Adapter", m, a)
	}
}

// caddyfileCase is one Caddyfile block for an adapter: the adapter it
// sets up, or a part of the error it gets.
type caddyfileCase struct {
	in   string
	want any // a pointer to the adapter the block sets up
	err  string
}

// checkCaddyfile unmarshals every case into a fresh adapter from
// newAdapter.
func checkCaddyfile(t *testing.T, newAdapter func() caddyfile.Unmarshaler, cases []caddyfileCase) {
	t.Helper()
	for _, tt := range cases {
		a := newAdapter()
		err := a.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.in))
		switch {
		case tt.err == "" && err != nil:
			t.Errorf("%q: %v", tt.in, err)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%q: error %v, want one containing %q", tt.in, err, tt.err)
		case tt.err == "" && !reflect.DeepEqual(a, tt.want):
			t.Errorf("%q: set up %+v, want %+v", tt.in, a, tt.want)
		}
	}
}

// clientCredentials are the headers clients send their own keys in (the
// gateway's keys, for the gateway): none may reach an upstream, whatever
// its provider calls its own.
var clientCredentials = http.Header{
	"Authorization":  {"Bearer client-key"},
	"X-Api-Key":      {"client-x-api-key"},
	"Api-Key":        {"client-api-key"},
	"X-Goog-Api-Key": {"client-goog-key"},
	"Cookie":         {"session=client"},
}

// withClientCredentials returns h with clientCredentials added.
func withClientCredentials(h http.Header) http.Header {
	out := h.Clone()
	if out == nil {
		out = http.Header{}
	}
	for k, v := range clientCredentials {
		out[k] = v
	}
	return out
}

// checkNoClientCredentials reports a client credential in an upstream
// request's headers.
func checkNoClientCredentials(t *testing.T, name string, h http.Header) {
	t.Helper()
	for k, vs := range clientCredentials {
		for _, v := range h.Values(k) {
			if slices.Contains(vs, v) {
				t.Errorf("%s: the client's %s %q reached the upstream", name, k, v)
			}
		}
	}
	for k, vs := range h {
		for _, v := range vs {
			if strings.Contains(v, "client-") {
				t.Errorf("%s: the client's key reached the upstream in %s: %q", name, k, v)
			}
		}
	}
}

// sentBody reads an upstream request's body, checking that
// ContentLength and GetBody agree with it.
func sentBody(t *testing.T, req *http.Request) string {
	t.Helper()
	b, err := io.ReadAll(req.Body)
	if err != nil {
		t.Fatal(err)
	}
	if req.ContentLength != int64(len(b)) {
		t.Errorf("ContentLength %d, body of %d bytes", req.ContentLength, len(b))
	}
	if req.GetBody == nil {
		t.Fatal("no GetBody: the request cannot be retried")
	}
	again, err := req.GetBody()
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := io.ReadAll(again); string(a) != string(b) {
		t.Errorf("GetBody replays %s, the body is %s", a, b)
	}
	return string(b)
}

func mustURL(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// recorder is a loopback upstream that records the last request it
// received, as it arrived on the wire.
type recorder struct {
	*httptest.Server
	mu   sync.Mutex
	last recorded
}

// recorded is a request as an upstream received it.
type recorded struct {
	uri    string // RequestURI: the path as sent, escapes included
	host   string
	method string
	header http.Header
	body   string
}

func newRecorder(t *testing.T) *recorder {
	rec := &recorder{}
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.last = recorded{uri: r.RequestURI, host: r.Host, method: r.Method, header: r.Header.Clone(), body: string(b)}
		rec.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}")
	}))
	t.Cleanup(rec.Close)
	return rec
}

// send sends req to the recorder (req's URL must point at it) and
// returns the request as it arrived.
func (rec *recorder) send(t *testing.T, req *http.Request) recorded {
	t.Helper()
	res, err := rec.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.last
}
