package idempotency

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// maxAnswer is the recorders' bound in these tests.
const maxAnswer = 64

// lim keeps three calls of no body, or two of 40 bytes and one of none.
var lim = Limits{Retention: time.Minute, MaxStored: 3*keptOverhead + 100}

// record runs f's first run: status, a Content-Type, then body.
func record(t *testing.T, f *Flight, status int, body string) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	r := NewRecorder(w, f, maxAnswer, func(int64) bool { return true })
	r.Header().Set("Content-Type", "application/json")
	r.Header().Set("Date", "Sun, 06 Dec 2026 12:00:00 GMT")
	r.WriteHeader(status)
	_, _ = r.Write([]byte(body))
	return w
}

func TestTableLifecycle(t *testing.T) {
	tb := NewTable()
	now := time.Unix(1_800_000_000, 0)
	id, fp := ID("acct", "k1"), Fingerprint("POST /v1/chat/completions", []byte(`{"a":1}`))
	if ID("acct", "k1") == ID("acct2", "k1") || ID("a", "bk") == ID("ab", "k") {
		t.Fatal("IDs of different clients or keys collide")
	}
	v, f, _ := tb.Begin(id, fp, now)
	if v != Run {
		t.Fatalf("first request: %v", v)
	}
	if v, g, _ := tb.Begin(id, fp, now); v != Follow || g != f {
		t.Fatalf("a duplicate during the run: %v", v)
	}
	if v, _, _ := tb.Begin(id, Fingerprint("POST /v1/chat/completions", []byte(`{"a":2}`)), now); v != Mismatch {
		t.Fatalf("another body during the run: %v", v)
	}
	record(t, f, 200, `{"ok":true}`)
	tb.Finish(f, true, lim, now)
	v, _, a := tb.Begin(id, fp, now.Add(time.Second))
	if v != Replay || a.Status != 200 || string(a.Body) != `{"ok":true}` || a.Header.Get("Content-Type") != "application/json" || a.Header.Get("Date") != "" {
		t.Fatalf("after the run: %v %+v", v, a)
	}
	if v, _, _ := tb.Begin(id, Fingerprint("POST /v1/chat/completions", []byte(`{"a":2}`)), now); v != Mismatch {
		t.Fatalf("another body after the run: %v", v)
	}
	// Past the retention, the key is free again.
	if v, _, _ := tb.Begin(id, fp, now.Add(lim.Retention)); v != Run {
		t.Fatalf("after the retention: %v", v)
	}
}

// A failure is forgotten; an answer over the recorder's bound leaves a
// tombstone (its duplicates get 409, never a rerun); a call there is no
// room for pushes out the calls kept longest (the store behind the table
// still answers their duplicates once).
func TestTableFailuresAndTombstones(t *testing.T) {
	tb := NewTable()
	now := time.Unix(1_800_000_000, 0)
	_, f, _ := tb.Begin("failed", "fp", now)
	record(t, f, 503, `{"error":{}}`)
	tb.Finish(f, false, lim, now)
	if v, _, _ := tb.Begin("failed", "fp", now); v != Run {
		t.Fatalf("a failed call's retry: %v", v)
	}

	_, f, _ = tb.Begin("large", "fp", now)
	record(t, f, 200, string(make([]byte, maxAnswer+1)))
	tb.Finish(f, true, lim, now)
	if v, _, _ := tb.Begin("large", "fp", now); v != Unstored {
		t.Fatalf("a large answer's duplicate: %v", v)
	}

	for _, id := range []string{"k1", "k2", "k3"} {
		_, f, _ := tb.Begin(id, "fp", now)
		record(t, f, 200, string(make([]byte, 40)))
		tb.Finish(f, true, lim, now)
		if v, _, a := tb.Begin(id, "fp", now); v != Replay || len(a.Body) != 40 {
			t.Errorf("answer %s: %v, want a replay", id, v)
		}
	}
	// k3 did not fit beside the tombstone, k1 and k2: the two kept
	// longest went, though they expire at the same time as the rest.
	for id, want := range map[string]Verdict{"large": Run, "k1": Run, "k2": Replay, "k3": Replay} {
		if v, _, _ := tb.Begin(id, "fp", now); v != want {
			t.Errorf("after k3: %s %v, want %v", id, v, want)
		}
	}
	// Each counts its headers too: record's Content-Type.
	if kept, bytes := len(tb.answers), tb.bytes; kept != 2 || bytes != 2*(keptOverhead+40+int64(len("Content-Type")+len("application/json"))) {
		t.Errorf("kept %d answers of %d bytes", kept, bytes)
	}
	if n := tb.Sweep(now.Add(lim.Retention)); n != 2 || tb.bytes != 0 || tb.expiry.Len() != 0 {
		t.Errorf("swept %d, %d bytes and %d left", n, tb.bytes, tb.expiry.Len())
	}
}

// A follower gets the whole answer, from its start, whenever it joins;
// one that joins after the answer outgrew the bound cannot start.
func TestFollow(t *testing.T) {
	tb := NewTable()
	_, f, _ := tb.Begin("id", "fp", time.Now())
	w := httptest.NewRecorder()
	r := NewRecorder(w, f, maxAnswer, func(int64) bool { return true })
	r.Header().Set("Content-Type", "text/event-stream")
	r.WriteHeader(200)
	_, _ = r.Write([]byte("data: 1\n\n"))
	got := make(chan *httptest.ResponseRecorder)
	go func() {
		fw := httptest.NewRecorder()
		if started, err := f.Follow(context.Background(), fw); !started || err != nil {
			t.Errorf("could not follow: %v", err)
		}
		got <- fw
	}()
	time.Sleep(20 * time.Millisecond)
	_, _ = r.Write([]byte("data: 2\n\n"))
	tb.Finish(f, true, lim, time.Now())
	fw := <-got
	if fw.Body.String() != w.Body.String() || fw.Code != 200 || fw.Header().Get(ReplayedHeader) != "true" {
		t.Fatalf("follower got %d %q, the client %q", fw.Code, fw.Body.String(), w.Body.String())
	}

	_, f, _ = tb.Begin("big", "fp", time.Now())
	r = NewRecorder(httptest.NewRecorder(), f, maxAnswer, func(int64) bool { return true })
	r.WriteHeader(200)
	_, _ = r.Write(make([]byte, maxAnswer+1))
	if started, _ := f.Follow(context.Background(), httptest.NewRecorder()); started {
		t.Error("followed an answer that outgrew the bound")
	}
}

// A follower that began before the answer outgrew the bound is told its
// answer is incomplete (its caller cuts the response), never ended as if
// it had the whole answer.
func TestFollowerOfAnAnswerThatOutgrowsTheBound(t *testing.T) {
	const maxAnswer = 32
	tb := NewTable()
	_, f, _ := tb.Begin("id", "fp", time.Now())
	r := NewRecorder(httptest.NewRecorder(), f, maxAnswer, func(int64) bool { return true })
	r.WriteHeader(200)
	_, _ = r.Write([]byte("data: 1\n\n"))
	type result struct {
		started bool
		err     error
	}
	got := make(chan result)
	go func() {
		started, err := f.Follow(context.Background(), httptest.NewRecorder())
		got <- result{started, err}
	}()
	time.Sleep(20 * time.Millisecond)
	_, _ = r.Write(make([]byte, maxAnswer))
	tb.Finish(f, true, Limits{Retention: time.Minute, MaxStored: 1 << 20}, time.Now())
	if res := <-got; !res.started || !errors.Is(res.err, ErrIncomplete) {
		t.Fatalf("follower: started %v, err %v; want ErrIncomplete", res.started, res.err)
	}
}

// A client that went away does not stop the run: writes succeed and are
// recorded.
func TestRecorderOutlivesItsClient(t *testing.T) {
	_, f, _ := NewTable().Begin("id", "fp", time.Now())
	r := NewRecorder(failingWriter{httptest.NewRecorder()}, f, maxAnswer, func(int64) bool { return true })
	r.WriteHeader(200)
	for _, p := range []string{"a", "b"} {
		if n, err := r.Write([]byte(p)); n != 1 || err != nil {
			t.Fatalf("write after the client left: %d, %v", n, err)
		}
	}
	if !r.ClientGone() || string(f.body) != "ab" || f.Held() != 2 {
		t.Errorf("gone %v, recorded %q, held %d", r.ClientGone(), f.body, f.Held())
	}
}

type failingWriter struct{ *httptest.ResponseRecorder }

func (failingWriter) Write([]byte) (int, error) { return 0, http.ErrHandlerTimeout }

// Whatever is kept, replaced and swept, the table never holds more than
// MaxStored, counts exactly what it holds, and its expiry queue holds
// what it keeps, soonest first (what a sweep and a full table forget
// first).
func TestTableStaysWithinItsBound(t *testing.T) {
	tb := NewTable()
	rng := rand.New(rand.NewPCG(1, 2))
	lim := Limits{Retention: time.Minute, MaxStored: 20 * keptOverhead}
	now := time.Unix(1_800_000_000, 0)
	for i := range 5000 {
		now = now.Add(time.Duration(rng.IntN(int(time.Second))))
		id := fmt.Sprint("k", rng.IntN(400))
		switch v, f, _ := tb.Begin(id, "fp", now); {
		case v == Run && rng.IntN(10) > 0:
			f.status, f.body = 200, make([]byte, rng.IntN(3*keptOverhead))
			tb.Finish(f, true, Limits{Retention: time.Duration(rng.IntN(120)) * time.Second, MaxStored: lim.MaxStored}, now)
		case v == Run:
			tb.Finish(f, false, lim, now)
		}
		if rng.IntN(50) == 0 {
			tb.Sweep(now)
		}
		var sum int64
		soonest := time.Time{}
		for id, s := range tb.answers {
			if s.id != id {
				t.Fatalf("step %d: %s kept as %s", i, id, s.id)
			}
			if sum += s.size; soonest.IsZero() || s.expires.Before(soonest) {
				soonest = s.expires
			}
		}
		if sum != tb.bytes || tb.expiry.Len() != len(tb.answers) || tb.bytes > lim.MaxStored {
			t.Fatalf("step %d: %d calls in the queue, %d kept of %d bytes (counted %d), bound %d",
				i, tb.expiry.Len(), len(tb.answers), sum, tb.bytes, lim.MaxStored)
		}
		if first, at, ok := tb.expiry.First(); ok && (tb.answers[first] == nil || !at.Equal(soonest)) {
			t.Fatalf("step %d: the queue's first is %s at %v, the soonest kept expires at %v", i, first, at, soonest)
		}
	}
}

// A follower of a run that ends without answering anyone gets nothing
// written and ErrNoAnswer, and the call is not kept: asked again, the
// table lets it run.
func TestFollowerOfARunThatEndsWithoutAnswer(t *testing.T) {
	tb := NewTable()
	_, f, _ := tb.Begin("id", "fp", time.Now())
	got := make(chan error)
	fw := httptest.NewRecorder()
	go func() {
		_, err := f.Follow(context.Background(), fw)
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	tb.Finish(f, false, Limits{Retention: time.Minute, MaxStored: 1 << 20}, time.Now())
	if err := <-got; !errors.Is(err, ErrNoAnswer) || fw.Body.Len() != 0 {
		t.Fatalf("follower: %v, wrote %q", err, fw.Body.String())
	}
	if v, _, _ := tb.Begin("id", "fp", time.Now()); v != Run {
		t.Fatalf("asked again: verdict %d, want Run", v)
	}
}

// An answer's headers are the upstream's to size (up to the transport's
// 10 MiB bound), so a kept answer counts them against MaxStored like its
// body: many calls whose answers carry large headers must not make the
// table hold more than MaxStored.
func TestTableCountsKeptHeaders(t *testing.T) {
	tb := NewTable()
	lim := Limits{Retention: time.Minute, MaxStored: 64 << 10}
	now := time.Unix(1_800_000_000, 0)
	for i := range 200 {
		_, f, _ := tb.Begin(fmt.Sprint("k", i), "fp", now)
		w := httptest.NewRecorder()
		r := NewRecorder(w, f, 1<<20, func(int64) bool { return true })
		r.Header().Set("Content-Type", "application/json")
		for range 16 {
			r.Header().Add("Cache-Control", strings.Repeat("x", 1<<10))
		}
		r.WriteHeader(http.StatusOK)
		_, _ = r.Write([]byte(`{}`))
		tb.Finish(f, true, lim, now)
	}
	var held int64
	for _, s := range tb.answers {
		if s.answer == nil {
			continue
		}
		held += int64(len(s.answer.Body))
		for k, vs := range s.answer.Header {
			for _, v := range vs {
				held += int64(len(k) + len(v))
			}
		}
	}
	if held > lim.MaxStored {
		t.Fatalf("%d kept answers hold %d KiB of bodies and headers, over MaxStored %d KiB (counted %d KiB)",
			len(tb.answers), held>>10, lim.MaxStored>>10, tb.bytes>>10)
	}
}
