package soak

import (
	"strings"
	"testing"
	"time"
)

// A connection that fails is described by the request it last carried
// on the same instance, whatever ran on other connections in between.
func TestConnBefore(t *testing.T) {
	at := time.Unix(1000, 0)
	rec := func(seq, inst int, conn string, sent, done float64) *record {
		return &record{Seq: seq, Inst: inst, Conn: conn, Reused: true, API: "chat", Model: "m", Class: classOK, Status: 200,
			Sent: at.Add(time.Duration(sent * float64(time.Second))), Done: at.Add(time.Duration(done * float64(time.Second)))}
	}
	failed := rec(9, 0, "127.0.0.1:5000", 10, 10.001)
	failed.Class = classConnError
	c := &checker{l: &load{records: []*record{
		rec(1, 0, "127.0.0.1:5000", 1, 1.5),
		rec(2, 0, "127.0.0.1:5000", 3, 6.4), // the last on this connection
		rec(3, 0, "127.0.0.1:5001", 7, 9.9), // another connection
		rec(4, 1, "127.0.0.1:5000", 8, 9.8), // another instance
		failed,
	}}}
	got := c.connBefore(failed)
	if !strings.Contains(got, "last carried request 2 ") || !strings.Contains(got, "ended 3.600s before") {
		t.Fatalf("%q", got)
	}
	failed.Reused = false
	if got := c.connBefore(failed); got != "" {
		t.Fatalf("a new connection described: %q", got)
	}
}
