// Package leader elects one gateway instance among those sharing a
// PostgreSQL database to run a job that must not multiply with the fleet
// (the synthetic prober: probes cost money and must not run once per
// instance). The elected instance holds a session-level advisory lock on
// a connection of its own.
//
// A lock outlives its holder's usefulness whenever the holder stops
// talking without its connection closing: a frozen process (SIGSTOP, a
// VM paused, a debugger) keeps its TCP connection up, its kernel even
// answers TCP keepalives, and a partitioned host looks the same to the
// server until TCP gives up, which can take hours. So the leader proves it
// is alive: it pings on its lock's session every PingEvery, and that
// session carries idle_session_timeout (PostgreSQL 14 and later), so the
// server ends a session silent for SessionTimeout and the lock goes with
// it. On an older server a follower ends such a session itself
// (pg_terminate_backend of a holder idle for longer than SessionTimeout),
// which needs the same role as the holder (or pg_signal_backend).
//
// The leader leads on a lease: for Lease after it sent a ping that
// succeeded, shorter than SessionTimeout, the soonest the server can
// free the lock after that ping. A ping that fails ends the lead at once;
// a leader that was frozen finds its lease run out when it resumes, before
// it could learn that its session is gone. So two instances never lead at
// the same time, clocks running at the same rate.
//
// Takeover: a follower campaigns every CampaignEvery on the one connection
// it keeps, and takes the lock at most SessionTimeout + CampaignEvery (plus
// one campaign, at most CampaignTimeout) after the old leader's last
// word: about 12 s, 17 s at worst. When the server ends every session at
// once (a restart, a failover to a standby), the old leader learns it
// only at its next ping, still on its lease: a follower whose own session
// ended too leads only Lease after it takes the lock.
//
// It knows PostgreSQL's advisory locks and nothing of what the job does.
package leader

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The timings of an election. Tests shorten them through Elector.t.
const (
	// SessionTimeout is the idle_session_timeout of every elector
	// session: the server ends a session that said nothing for this long,
	// freeing its lock. It is the main term of the takeover bound; it
	// must leave room for several pings (PingEvery), so that a busy host
	// whose pings run late does not lose the lead for nothing.
	SessionTimeout = 10 * time.Second
	// PingEvery is how often the leader proves it is alive on its lock's
	// session.
	PingEvery = 2 * time.Second
	// PingTimeout bounds one ping: a ping that hangs (a partition) ends
	// the lead when it times out, before the lease would.
	PingTimeout = 3 * time.Second
	// Lease is how long after sending its last successful ping (or the
	// campaign that took the lock) the leader goes on leading. The server
	// ends the session no sooner than SessionTimeout after that; the 3 s
	// between them cover a round of probes starting just before the
	// lease ends and clocks that do not run quite at the same rate. It
	// must exceed PingEvery + PingTimeout, so that one slow ping never
	// lets the lease lapse.
	Lease = SessionTimeout - 3*time.Second
	// CampaignEvery is how often a follower tries to take the lock: one
	// query on the connection it keeps, never a new connection.
	CampaignEvery = 2 * time.Second
	// CampaignTimeout bounds one campaign, connecting included.
	CampaignTimeout = 5 * time.Second
	// staleAfter: a follower whose last good campaign is older than this
	// cannot tell whether anyone leads (Leading reports an error).
	staleAfter = 2*CampaignEvery + CampaignTimeout
)

// timing is the elector's timings, the constants above unless a test
// shortened them.
type timing struct {
	session, ping, pingTimeout, lease, campaign, campaignTimeout, stale time.Duration
	// noIdleTimeout makes the elector behave as on a server older than
	// 14 (no idle_session_timeout), to test that path on a newer one.
	noIdleTimeout bool
}

var defaultTiming = timing{
	session: SessionTimeout, ping: PingEvery, pingTimeout: PingTimeout, lease: Lease,
	campaign: CampaignEvery, campaignTimeout: CampaignTimeout, stale: staleAfter,
}

// Elector campaigns for one lock key. The zero value is not usable; use
// New. It is safe for concurrent use.
type Elector struct {
	dsn string
	key int64
	t   timing

	// op serialises the use of conn.
	op      sync.Mutex
	conn    *pgx.Conn // the elector's session: the lock's while holding
	holding bool      // conn holds the lock
	legacy  bool      // the server has no idle_session_timeout
	// sawHolder: since this elector last held the lock, a campaign found
	// another session holding it. fenced: and then this elector's own
	// session ended too (or it lost the lead with its session), as every
	// session does when the server restarts or fails over: the holder's
	// session may have ended at the same moment, its leader still on its
	// lease, which it learns of only at its next ping.
	sawHolder, fenced bool

	mu       sync.Mutex
	leaseEnd time.Time // leading while now is before it
	leadFrom time.Time // and not before this: another's lease may run until then
	lastGood time.Time // when the last campaign or ping succeeded
	err      error     // of the last campaign or ping; nil when it succeeded
}

// New returns an elector for the advisory lock key on the database at
// dsn. It does not connect until Campaign or Run.
func New(dsn string, key int64) *Elector {
	return &Elector{dsn: dsn, key: key, t: defaultTiming}
}

// IsLeader reports whether this elector leads now.
func (e *Elector) IsLeader() bool {
	lead, _ := e.Leading()
	return lead
}

// Leading reports whether this elector leads now: it holds the lock and
// proved it within its lease. When it does not, err says why it cannot
// tell whether another instance leads: its last campaign failed, or none
// succeeded for a while (it was frozen, or its campaigns hang); nil err
// with false means another instance's live session holds the lock.
func (e *Elector) Leading() (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	if now.Before(e.leaseEnd) {
		if now.Before(e.leadFrom) {
			// The lock is this elector's, but the instance that held it
			// before may still be on its lease.
			return false, nil
		}
		return true, nil
	}
	if e.err != nil {
		return false, e.err
	}
	if e.lastGood.IsZero() {
		return false, errors.New("leader election: no campaign yet")
	}
	if since := now.Sub(e.lastGood); since > e.t.stale {
		return false, fmt.Errorf("leader election: no campaign succeeded for %s", since.Round(time.Second))
	}
	return false, nil
}

// Run campaigns until ctx ends, then gives the lead up: every
// CampaignEvery while following, and while leading it pings every
// PingEvery. It calls changed after its first campaign and whenever the
// lead changes hands, gained or lost.
func (e *Elector) Run(ctx context.Context, changed func()) {
	defer e.Resign()
	first, was := true, false
	for {
		lead, _ := e.Campaign(ctx) // the error is kept for Leading
		if ctx.Err() != nil {
			return
		}
		if first || lead != was {
			changed()
		}
		first, was = false, lead
		wait := e.t.campaign
		if lead {
			wait = e.t.ping
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
	}
}

// Campaign tries, once, to be (or stay) the leader and reports whether it
// is. A leader pings on its lock's session, which renews its lease; a ping
// that fails ends the lead at once, and the elector campaigns again on a
// new connection. A follower tries to take the lock on the connection it
// keeps.
func (e *Elector) Campaign(ctx context.Context) (bool, error) {
	e.op.Lock()
	defer e.op.Unlock()
	if e.holding {
		pctx, cancel := context.WithTimeout(ctx, e.t.pingTimeout)
		sent := time.Now()
		err := e.conn.Ping(pctx)
		cancel()
		if err == nil {
			e.good(sent.Add(e.t.lease))
			return e.IsLeader(), nil
		}
		// The session, and the lock with it, may be gone: stop leading
		// now, then campaign as a follower would.
		e.lost()
		e.fenced = true
		e.dropConn()
	}
	cctx, cancel := context.WithTimeout(ctx, e.t.campaignTimeout)
	defer cancel()
	lead, err := e.tryLock(cctx)
	if err != nil && e.conn != nil {
		// The kept connection may have died while we waited (the server
		// ended it, or this process was frozen): once more on a new one.
		e.dropConn()
		lead, err = e.tryLock(cctx)
	}
	if err != nil {
		e.dropConn()
		e.failed(err)
		return false, err
	}
	return lead, nil
}

// tryLock takes the lock if it is free, connecting first when there is no
// connection.
func (e *Elector) tryLock(ctx context.Context) (bool, error) {
	if e.conn == nil {
		if err := e.connect(ctx); err != nil {
			return false, err
		}
	}
	sent := time.Now()
	got, err := e.try(ctx)
	if err != nil {
		return false, err
	}
	if !got && e.legacy {
		// No idle_session_timeout on this server: end a holder that has
		// been silent for longer than it would allow, and try again.
		if err := e.endSilentHolder(ctx); err != nil {
			return false, err
		}
		sent = time.Now()
		if got, err = e.try(ctx); err != nil {
			return false, err
		}
	}
	if !got {
		e.sawHolder = true
		e.good(time.Time{})
		return false, nil
	}
	e.holding = true
	if e.fenced {
		// The server may have ended every session at once (a restart, a
		// failover to a standby), the previous holder's with this one's:
		// its leader learns it only at its next ping, and its lease,
		// counted from a ping sent before now, runs for up to Lease more.
		// Lead once it has run out.
		e.mu.Lock()
		e.leadFrom = time.Now().Add(e.t.lease)
		e.mu.Unlock()
	}
	e.sawHolder, e.fenced = false, false
	e.good(sent.Add(e.t.lease))
	return e.IsLeader(), nil
}

func (e *Elector) try(ctx context.Context) (bool, error) {
	var got bool
	if err := e.conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", e.key).Scan(&got); err != nil {
		return false, fmt.Errorf("leader election: %w", err)
	}
	return got, nil
}

// connect opens the elector's session and sets its timeouts.
func (e *Elector) connect(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		// The DSN may hold a password; pgx's error does not repeat it.
		return fmt.Errorf("leader election: connecting: %w", err)
	}
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		_ = conn.Close(context.Background())
		return fmt.Errorf("leader election: %w", err)
	}
	e.legacy = version < 140000 || e.t.noIdleTimeout
	if !e.legacy {
		ms := strconv.FormatInt(e.t.session.Milliseconds(), 10)
		if _, err := conn.Exec(ctx, "SELECT set_config('idle_session_timeout', $1, false)", ms); err != nil {
			_ = conn.Close(context.Background())
			return fmt.Errorf("leader election: setting idle_session_timeout: %w", err)
		}
	}
	// The server's own TCP keepalives end the session of a host that
	// vanished from the network (not of a frozen process, whose kernel
	// answers them) in about SessionTimeout: the only bound a server
	// older than 14 enforces by itself. Best effort: they are ignored on
	// a Unix socket and refused on systems without them.
	idle := max(1, int(e.t.session.Seconds())/2)
	for _, kv := range [][2]string{
		{"tcp_keepalives_idle", strconv.Itoa(idle)},
		{"tcp_keepalives_interval", strconv.Itoa(max(1, idle/3))},
		{"tcp_keepalives_count", "3"},
	} {
		_, _ = conn.Exec(ctx, "SELECT set_config($1, $2, false)", kv[0], kv[1])
	}
	e.conn = conn
	return nil
}

// endSilentHolder terminates the session holding the lock when it has
// been idle for longer than SessionTimeout: the lease of its leader ran
// out long ago, so its leader no longer leads.
func (e *Elector) endSilentHolder(ctx context.Context) error {
	// A bigint advisory key is split in pg_locks: its high half is
	// classid, its low half objid, and objsubid is 1.
	classid := int64(uint64(e.key) >> 32)
	objid := int64(uint32(e.key))
	_, err := e.conn.Exec(ctx, `SELECT pg_terminate_backend(a.pid)
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND a.state = 'idle' AND a.state_change < clock_timestamp() - make_interval(secs => $3)`,
		classid, objid, e.t.session.Seconds())
	if err != nil {
		return fmt.Errorf("leader election: ending a silent leader's session: %w", err)
	}
	return nil
}

// good records a successful campaign or ping; leaseEnd is zero when it
// found another instance holding the lock.
func (e *Elector) good(leaseEnd time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.leaseEnd, e.lastGood, e.err = leaseEnd, time.Now(), nil
}

func (e *Elector) lost() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.leaseEnd = time.Time{}
}

func (e *Elector) failed(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.leaseEnd, e.err = time.Time{}, err
}

// dropConn closes the elector's connection (the lock goes with it).
func (e *Elector) dropConn() {
	if e.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = e.conn.Close(ctx)
	e.conn, e.holding = nil, false
	e.fenced = e.fenced || e.sawHolder
}

// Resign gives the lock up (closing its connection), so another instance
// can lead at its next campaign.
func (e *Elector) Resign() {
	e.lost()
	e.op.Lock()
	defer e.op.Unlock()
	e.dropConn()
	e.lost()
}
