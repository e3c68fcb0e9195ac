package faultproxy

import (
	"bufio"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// echoServer answers every line with the same line and counts the lines
// it saw.
func echoServer(t *testing.T) (addr string, seen *atomic.Int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	seen = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					seen.Add(1)
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), seen
}

func proxy(t *testing.T) (*Proxy, *atomic.Int64) {
	addr, seen := echoServer(t)
	p, err := New(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, seen
}

// roundTrip sends one line on c and reads the echo, within d.
func roundTrip(c net.Conn, d time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err := bufio.NewReader(c).ReadString('\n')
	return err
}

func dial(t *testing.T, p *Proxy) net.Conn {
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestForwards(t *testing.T) {
	p, seen := proxy(t)
	if err := roundTrip(dial(t, p), 5*time.Second); err != nil || seen.Load() != 1 {
		t.Fatalf("round trip: %v, server saw %d", err, seen.Load())
	}
}

func TestRefuseAndReset(t *testing.T) {
	p, _ := proxy(t)
	c := dial(t, p)
	if err := roundTrip(c, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Refuse(true)
	if err := roundTrip(c, 5*time.Second); err == nil {
		t.Fatal("an open connection survived Refuse")
	}
	if err := roundTrip(dial(t, p), 5*time.Second); err == nil {
		t.Fatal("a new connection was served while refusing")
	}
	p.Refuse(false)
	c = dial(t, p)
	if err := roundTrip(c, 5*time.Second); err != nil {
		t.Fatalf("after Refuse(false): %v", err)
	}
	p.Reset()
	if err := roundTrip(c, 5*time.Second); err == nil {
		t.Fatal("a connection survived Reset")
	}
	if err := roundTrip(dial(t, p), 5*time.Second); err != nil {
		t.Fatalf("a new connection after Reset: %v", err)
	}
}

func TestFreeze(t *testing.T) {
	p, seen := proxy(t)
	c := dial(t, p)
	p.Freeze(true)
	if err := roundTrip(c, 200*time.Millisecond); err == nil {
		t.Fatal("a frozen proxy answered")
	}
	if seen.Load() != 0 {
		t.Fatal("the server saw a request through a frozen proxy")
	}
	if err := roundTrip(dial(t, p), 200*time.Millisecond); err == nil {
		t.Fatal("a new connection was served while frozen")
	}
	p.Freeze(false)
	// What waited is delivered once thawed.
	c2 := dial(t, p)
	if err := roundTrip(c2, 5*time.Second); err != nil {
		t.Fatalf("after thawing: %v", err)
	}
}

func TestCut(t *testing.T) {
	for _, tc := range []struct {
		how  CutPoint
		seen int64
	}{{CutBefore, 0}, {CutAfter, 1}} {
		p, seen := proxy(t)
		c := dial(t, p)
		other := dial(t, p)
		p.Cut(c.LocalAddr().String(), tc.how)
		if err := roundTrip(c, 5*time.Second); err == nil {
			t.Fatalf("cut %d: the request was answered", tc.how)
		}
		if seen.Load() != tc.seen {
			t.Errorf("cut %d: the server saw %d requests, want %d", tc.how, seen.Load(), tc.seen)
		}
		if err := roundTrip(other, 5*time.Second); err != nil {
			t.Errorf("cut %d: another connection was hurt: %v", tc.how, err)
		}
	}
}

func TestPostgresRewritesTheDSN(t *testing.T) {
	p, dsn, err := Postgres("postgres://u:pw@127.0.0.1:5999/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if want := "postgres://u:pw@" + p.Addr() + "/db?sslmode=disable"; dsn != want {
		t.Errorf("dsn %q, want %q", dsn, want)
	}
	if _, _, err := Postgres("host=/run/postgresql dbname=x"); err == nil {
		t.Error("a Unix socket DSN was accepted")
	}
}
