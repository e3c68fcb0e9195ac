package failover

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

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
