package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// hold counts a stream as completed only when it ended with [DONE], and
// with h2c its requests arrive as HTTP/2 (what lets scale.sh hold 10,000
// streams on one socket each in the proxy).
func TestHoldCountsWholeStreams(t *testing.T) {
	var http2 atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.ProtoMajor == 2 {
			http2.Add(1)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"x\":1}\n\n")
		if r.URL.Path == "/cut" {
			return // ends without [DONE]
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()

	for _, h2c := range []bool{false, true} {
		http2.Store(0)
		got := hold(srv.URL+"/", []byte(`{}`), 20, 5*time.Second, h2c)
		if got != (holdResult{Held: 20, Answered: 20, Completed: 20}) {
			t.Errorf("h2c %v: %+v", h2c, got)
		}
		if want := map[bool]int64{false: 0, true: 20}[h2c]; http2.Load() != want {
			t.Errorf("h2c %v: %d requests over HTTP/2, want %d", h2c, http2.Load(), want)
		}
	}
	if got := hold(srv.URL+"/cut", []byte(`{}`), 5, 5*time.Second, false); got.Answered != 5 || got.Completed != 0 {
		t.Errorf("streams without [DONE]: %+v", got)
	}
}
