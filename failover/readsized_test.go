package failover

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/llmfailover/caddy-llm-failover/provider"
)

// readSized returns the whole body whatever the declared length says and
// however the reader hands it out; a declared length only sizes the first
// buffer, and never past sizedReadMax.
func TestReadSizedReadsTheWholeBody(t *testing.T) {
	small := strings.Repeat("a", 623)
	big := strings.Repeat("b", 3*sizedReadMax+17)
	readers := map[string]func(string) io.Reader{
		"plain":          func(s string) io.Reader { return strings.NewReader(s) },
		"one byte":       func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) },
		"half":           func(s string) io.Reader { return iotest.HalfReader(strings.NewReader(s)) },
		"EOF with data":  func(s string) io.Reader { return iotest.DataErrReader(strings.NewReader(s)) },
		"limit past end": func(s string) io.Reader { return io.LimitReader(strings.NewReader(s), int64(len(s))+1) },
	}
	for _, tc := range []struct {
		name     string
		body     string
		declared int64
	}{
		{"declared", small, int64(len(small))},
		{"none declared", small, -1},
		{"declared short (a rewritten body)", small, 100},
		{"declared long", small, 5000},
		{"empty", "", 0},
		{"empty, none declared", "", -1},
		{"large, none declared", big, -1},
		{"large, declared", big, int64(len(big))},
		{"declared far past what comes", small, 1 << 40},
	} {
		for rname, mk := range readers {
			got, err := readSized(mk(tc.body), tc.declared)
			if err != nil {
				t.Fatalf("%s, %s: %v", tc.name, rname, err)
			}
			if string(got) != tc.body {
				t.Fatalf("%s, %s: read %d bytes, want %d", tc.name, rname, len(got), len(tc.body))
			}
			if tc.declared > sizedReadMax && len(tc.body) < sizedReadMax && cap(got) > sizedReadMax {
				t.Fatalf("%s, %s: a declared length of %d made a buffer of %d", tc.name, rname, tc.declared, cap(got))
			}
		}
	}
}

// A read error comes back with what was read before it.
func TestReadSizedKeepsTheError(t *testing.T) {
	boom := errors.New("reset")
	src := io.MultiReader(strings.NewReader("partial"), iotest.ErrReader(boom))
	got, err := readSized(src, 100)
	if !errors.Is(err, boom) || string(got) != "partial" {
		t.Fatalf("got %q, %v; want \"partial\", %v", got, err, boom)
	}
	// The limit is the reader's: one byte past it tells the caller.
	got, err = readSized(io.LimitReader(strings.NewReader(strings.Repeat("x", 50)), 11), 50)
	if err != nil || len(got) != 11 {
		t.Fatalf("under a limit of 11: %d bytes, %v", len(got), err)
	}
}

// The point of it: a body of a declared length is one allocation of its
// own size, where io.ReadAll makes four (issue 31: fewer bytes allocated
// a request means fewer collections on the request path).
func TestReadSizedAllocatesOnceForADeclaredBody(t *testing.T) {
	body := bytes.Repeat([]byte("c"), 623)
	src := bytes.NewReader(body)
	var got []byte
	allocs := testing.AllocsPerRun(100, func() {
		src.Reset(body)
		got, _ = readSized(src, int64(len(body)))
	})
	if allocs != 1 || len(got) != len(body) || cap(got) > 640 {
		t.Fatalf("%v allocations, %d bytes in a buffer of %d; want 1 allocation of at most 640", allocs, len(got), cap(got))
	}
}

// A retryable error answer's message is read whatever its declared length
// says (an upstream that lies about it loses nothing of the message), and
// no more than 64 KiB of it however long it runs.
func TestStatusFailureReadsTheMessage(t *testing.T) {
	msg := `{"error":{"message":"The server is overloaded","type":"server_error"}}`
	endless := io.MultiReader(strings.NewReader(`{"error":{"message":"`), strings.NewReader(strings.Repeat("x", 1<<20)))
	for _, tc := range []struct {
		name     string
		body     io.Reader
		declared int64
		want     string
	}{
		{"declared", strings.NewReader(msg), int64(len(msg)), "The server is overloaded"},
		{"none declared", strings.NewReader(msg), -1, "The server is overloaded"},
		{"declared short", strings.NewReader(msg), 10, "The server is overloaded"},
		{"declared long", strings.NewReader(msg), 1 << 40, "The server is overloaded"},
		{"not JSON", strings.NewReader("upstream connect error"), -1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{}, Body: io.NopCloser(tc.body), ContentLength: tc.declared}
			f := statusFailure(provider.OpenAIChat, res)
			if f.status != http.StatusServiceUnavailable || f.message != tc.want {
				t.Fatalf("status %d, message %q; want 503, %q", f.status, f.message, tc.want)
			}
		})
	}
	counted := &countingReader{r: endless}
	res := &http.Response{StatusCode: http.StatusBadGateway, Header: http.Header{}, Body: io.NopCloser(counted), ContentLength: -1}
	if f := statusFailure(provider.OpenAIChat, res); f.message != "" {
		t.Fatalf("an unterminated message read as %q", f.message)
	}
	if counted.n > 64<<10 {
		t.Fatalf("read %d bytes of an endless error answer; want at most 64 KiB", counted.n)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
