// Package faultproxy is a TCP proxy for tests that makes a database (or
// any TCP server) fail the way networks do: refuse connections, drop
// every connection, freeze (accept and forward nothing, as a partition or
// a stopped host does), cut one connection just before or just after
// the server sees its next request, or orphan every connection (drop the
// client's end only, as a NAT or load balancer that forgets a
// connection does, so that the server goes on with what it was sent).
// Tests put it between the gateway and a server they started.
package faultproxy

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Proxy forwards every connection to its target until told to fail.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	changed *sync.Cond // signalled when frozen or a connection's state changes
	refuse  bool
	// refuseNew refuses new connections only (RefuseNew).
	refuseNew bool
	frozen    bool
	delay     time.Duration
	closed    bool
	conns     map[*link]struct{}
	cuts      map[string]CutPoint // by the client's address, armed by Cut
}

// CutPoint is where Cut breaks a connection: before or after its next
// request reaches the server.
type CutPoint int

const (
	// CutBefore drops the request: the server never sees it.
	CutBefore CutPoint = iota + 1
	// CutAfter forwards the request and drops the server's reply: the
	// server did the work, the client cannot know it.
	CutAfter
)

// link is one proxied connection.
type link struct {
	client, server net.Conn
	once           sync.Once
	// orphaned (guarded by the proxy's mu): the client's end was closed
	// by Orphan; the server's stays open, what it sends is discarded.
	orphaned bool
}

func (l *link) close() {
	l.once.Do(func() { l.client.Close(); l.server.Close() })
}

// New listens on a loopback port and forwards to target (host:port).
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[*link]struct{}{}, cuts: map[string]CutPoint{}}
	p.changed = sync.NewCond(&p.mu)
	go p.serve()
	return p, nil
}

// Postgres starts a proxy to the server of a PostgreSQL DSN and returns
// the DSN rewritten to go through it. A DSN on a Unix socket cannot be
// proxied.
func Postgres(dsn string) (*Proxy, string, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, "", err
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return nil, "", errors.New("faultproxy: the DSN names a Unix socket")
	}
	hostPort := net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
	rewritten := strings.Replace(dsn, hostPort, "%s", 1)
	if rewritten == dsn {
		return nil, "", fmt.Errorf("faultproxy: cannot find %s in the DSN to rewrite it", hostPort)
	}
	p, err := New(hostPort)
	if err != nil {
		return nil, "", err
	}
	return p, fmt.Sprintf(rewritten, p.Addr()), nil
}

// Addr is the proxy's address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops listening and drops every connection.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.dropLocked()
	p.mu.Unlock()
	return err
}

// Refuse drops every connection and refuses new ones while on: the
// server is down.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = on
	if on {
		p.dropLocked()
	}
}

// RefuseNew refuses new connections while on, and leaves the open ones
// alone: a client cut off from the server (say, for the cancel request
// pgx sends on a new connection once it loses one) while the sessions
// the server has go on.
func (p *Proxy) RefuseNew(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuseNew = on
}

// Freeze stops forwarding while on, on every connection, old and new
// (they are accepted and held): the server is partitioned away or
// stopped, and nothing tells the client.
func (p *Proxy) Freeze(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = on
	p.changed.Broadcast()
}

// Delay holds every chunk a client sends for d before forwarding it:
// with a database behind the proxy, each statement's round trip takes at
// least d.
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// Reset drops every connection; new ones are served: the server's
// connections were terminated (pg_terminate_backend, a restart).
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropLocked()
}

// Orphan closes the client's end of every connection and keeps the
// server's open, discarding what the server sends: the client sees its
// connection lost, while the server, told nothing, goes on with the
// request it is running (and commits it) until it ends that connection
// itself. Close and Reset close the servers' ends too. New connections
// are served.
func (p *Proxy) Orphan() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.conns {
		l.orphaned = true
		l.client.Close()
	}
	p.changed.Broadcast()
}

// Cut arms a cut of the connection whose client end is clientAddr (the
// client's local address, e.g. net.Conn.LocalAddr().String()): its next
// request is dropped (CutBefore) or forwarded with its reply dropped
// (CutAfter), and the connection closed.
func (p *Proxy) Cut(clientAddr string, how CutPoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts[clientAddr] = how
}

// Conns is the number of open connections.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func (p *Proxy) dropLocked() {
	for l := range p.conns {
		l.close()
	}
	clear(p.conns)
	p.changed.Broadcast()
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.refuse || p.refuseNew || p.closed
		p.mu.Unlock()
		if refuse {
			c.Close()
			continue
		}
		go p.link(c)
	}
}

func (p *Proxy) link(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	l := &link{client: c, server: s}
	p.mu.Lock()
	if p.refuse || p.refuseNew || p.closed {
		p.mu.Unlock()
		l.close()
		return
	}
	p.conns[l] = struct{}{}
	p.mu.Unlock()
	key := c.RemoteAddr().String()
	go p.pipe(l, c, s, key, true)
	p.pipe(l, s, c, key, false)
}

// pipe copies from src to dst until either end closes, honouring Freeze,
// Orphan and the cuts armed for the connection's client at key.
func (p *Proxy) pipe(l *link, src, dst net.Conn, key string, request bool) {
	defer func() {
		p.mu.Lock()
		orphaned := l.orphaned
		p.mu.Unlock()
		if orphaned && request {
			return // the server's end stays open: the reply pipe drains it
		}
		l.close()
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.frozen && !p.closed {
				if _, open := p.conns[l]; !open {
					break
				}
				p.changed.Wait()
			}
			how := p.cuts[key]
			drop := (request && how == CutBefore) || (!request && how == CutAfter)
			if drop {
				delete(p.cuts, key)
			}
			_, open := p.conns[l]
			delay, orphaned := p.delay, l.orphaned
			p.mu.Unlock()
			if drop || !open {
				return
			}
			if orphaned {
				if err != nil {
					return
				}
				continue // the server's reply has nobody to go to
			}
			if request {
				time.Sleep(delay)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
