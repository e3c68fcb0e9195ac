package faultproxy

import (
	"testing"
	"time"
)

// Orphan loses the client's end of a connection and keeps the server's,
// until Reset (or Close) drops it; new connections are served.
func TestOrphan(t *testing.T) {
	p, _ := proxy(t)
	c := dial(t, p)
	if err := roundTrip(c, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Orphan()
	if err := roundTrip(c, 5*time.Second); err == nil {
		t.Fatal("a round trip on an orphaned connection succeeded")
	}
	time.Sleep(50 * time.Millisecond)
	if n := p.Conns(); n != 1 {
		t.Fatalf("%d connections after Orphan, want the server's end kept", n)
	}
	if err := roundTrip(dial(t, p), 5*time.Second); err != nil {
		t.Fatalf("a new connection after Orphan: %v", err)
	}
	p.Reset()
	deadline := time.Now().Add(5 * time.Second)
	for p.Conns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections after Reset", p.Conns())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// RefuseNew refuses new connections and keeps the open ones.
func TestRefuseNew(t *testing.T) {
	p, _ := proxy(t)
	c := dial(t, p)
	if err := roundTrip(c, 5*time.Second); err != nil { // linked
		t.Fatal(err)
	}
	p.RefuseNew(true)
	if err := roundTrip(c, 5*time.Second); err != nil {
		t.Fatalf("an open connection while new ones are refused: %v", err)
	}
	if err := roundTrip(dial(t, p), time.Second); err == nil {
		t.Fatal("a new connection was served")
	}
	p.RefuseNew(false)
	if err := roundTrip(dial(t, p), 5*time.Second); err != nil {
		t.Fatalf("a new connection once they are served again: %v", err)
	}
}
