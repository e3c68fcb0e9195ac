// Package leader elects one gateway instance among those sharing a
// PostgreSQL database to run a job that must not multiply with the fleet
// (the synthetic prober: probes cost money and must not run once per
// instance). The elected instance holds a session-level advisory lock on
// a connection of its own; when it dies, PostgreSQL drops the connection
// and the lock with it, and the next instance to try takes over.
//
// It knows PostgreSQL's advisory locks and nothing of what the job does.
package leader

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Elector campaigns for one lock key. The zero value is not usable; use
// New. It is safe for concurrent use.
type Elector struct {
	dsn string
	key int64

	mu     sync.Mutex
	conn   *pgx.Conn // held while leading
	leader atomic.Bool
}

// New returns an elector for the advisory lock key on the database at
// dsn. It does not connect until Campaign.
func New(dsn string, key int64) *Elector {
	return &Elector{dsn: dsn, key: key}
}

// IsLeader reports whether this elector held the lock at its last
// Campaign.
func (e *Elector) IsLeader() bool { return e.leader.Load() }

// Campaign tries, once, to be (or stay) the leader and reports whether it
// is. Call it before each run of the job: a leader checks that its
// connection, and so its lock, is still alive; a follower tries to take
// the lock, which succeeds once the old leader's connection is gone.
func (e *Elector) Campaign(ctx context.Context) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.conn != nil {
		if err := e.conn.Ping(ctx); err == nil {
			return true, nil
		}
		// The connection broke: the lock is gone with it.
		_ = e.conn.Close(context.Background())
		e.conn = nil
		e.leader.Store(false)
	}
	conn, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		// The DSN may hold a password; pgx's error does not repeat it.
		return false, fmt.Errorf("leader election: connecting: %w", err)
	}
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", e.key).Scan(&got); err != nil {
		_ = conn.Close(context.Background())
		return false, fmt.Errorf("leader election: %w", err)
	}
	if !got {
		_ = conn.Close(context.Background())
		return false, nil
	}
	e.conn = conn
	e.leader.Store(true)
	return true, nil
}

// Resign gives the lock up (closing its connection), so another instance
// can lead at its next Campaign.
func (e *Elector) Resign() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = e.conn.Close(ctx)
		e.conn = nil
	}
	e.leader.Store(false)
}
