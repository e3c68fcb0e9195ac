package failover

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// flushLog is a client that notes how much of the body it had when each
// flush sent what was written.
type flushLog struct {
	*httptest.ResponseRecorder
	flushedAt []int
}

func (f *flushLog) Flush() {
	f.flushedAt = append(f.flushedAt, f.Body.Len())
	f.ResponseRecorder.Flush()
}

// A committed stream's headers go out with its first event, in one write:
// the gate held that event, so flushing the headers alone first would wake
// the client's reader twice for nothing.
func TestStreamHeadersGoOutWithTheFirstEvent(t *testing.T) {
	up := upstream(t, fu.OK())
	e := testEngine(t, testPlan(t, Options{}, nil, testChannel{name: uniqueName("commit"), url: up.URL}))
	w := &flushLog{ResponseRecorder: httptest.NewRecorder()}
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(fu.ChatRequest("m", true)))
	r.Header.Set("Content-Type", "application/json")
	serveDirect(e, w, r)
	if w.Code != http.StatusOK || !bytes.Contains(w.Body.Bytes(), []byte("data: [DONE]")) {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if len(w.flushedAt) == 0 || w.flushedAt[0] == 0 {
		t.Fatalf("flushes at body lengths %v: the headers went out alone", w.flushedAt)
	}
}

// deadlineLog is a client that notes each write deadline set on it.
type deadlineLog struct {
	*httptest.ResponseRecorder
	deadlines []time.Time
}

func (d *deadlineLog) SetWriteDeadline(t time.Time) error {
	d.deadlines = append(d.deadlines, t)
	return nil
}

// The idle writer sets one write deadline for the writes up to each
// flush, and a fresh one for the next: a stream that keeps flowing is
// never cut by a deadline set when it began.
func TestIdleWriterDeadlineEachFlush(t *testing.T) {
	w := &deadlineLog{ResponseRecorder: httptest.NewRecorder()}
	iw := &idleWriter{w: w, rc: http.NewResponseController(w), idle: time.Minute}
	for range 3 {
		_, _ = iw.Write([]byte("data: a\n\n"))
		_, _ = iw.Write([]byte("data: b\n\n"))
		if err := iw.Flush(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	iw.done()
	if len(w.deadlines) != 4 || !w.deadlines[3].IsZero() {
		t.Fatalf("deadlines %v: want one a flush, then the zero one", w.deadlines)
	}
	for i := 1; i < 3; i++ {
		if !w.deadlines[i].After(w.deadlines[i-1]) {
			t.Fatalf("deadline %d (%v) is not later than the one before (%v)", i, w.deadlines[i], w.deadlines[i-1])
		}
	}
}
