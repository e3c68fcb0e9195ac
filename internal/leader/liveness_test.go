package leader

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmfailover/caddy-llm-failover/internal/faultproxy"
)

// fast is the election's timings shortened for tests, in the same
// proportions as the constants.
var fast = timing{
	session:         2 * time.Second,
	ping:            200 * time.Millisecond,
	pingTimeout:     500 * time.Millisecond,
	lease:           1400 * time.Millisecond,
	campaign:        200 * time.Millisecond,
	campaignTimeout: 5 * time.Second,
	stale:           6 * time.Second,
}

// bound is the takeover bound the package states, at timing tm: the
// server ends the silent session, then a follower's next campaign takes
// the lock.
func bound(tm timing) time.Duration { return tm.session + tm.campaign + tm.campaignTimeout }

func newElector(dsn string, key int64, tm timing) *Elector {
	e := New(dsn, key)
	e.t = tm
	return e
}

// run runs e's campaigns until the test ends.
func run(t *testing.T, e *Elector) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Run(ctx, func() {})
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

func leads(e *Elector) bool {
	lead, _ := e.Leading()
	return lead
}

// follows reports whether e knows another instance leads.
func follows(e *Elector) bool {
	lead, err := e.Leading()
	return !lead && err == nil
}

// watchOverlap samples both electors until the test ends and counts the
// times both led: the follower is read first, so a leader read after it
// that still leads had its lease reach past the follower's takeover.
func watchOverlap(t *testing.T, old, next *Elector) *atomic.Int64 {
	var overlaps atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if leads(next) && leads(old) {
				overlaps.Add(1)
			}
			time.Sleep(time.Millisecond)
		}
	})
	t.Cleanup(func() { close(stop); wg.Wait() })
	return &overlaps
}

// The leader's connection freezes (a partition, or a stopped database
// host: nothing tells either end): the leader stops leading when its
// ping times out, the server ends its silent session, and a follower
// takes over within the bound; never both lead. When the network comes
// back the old leader follows.
func TestFrozenLeaderIsReplaced(t *testing.T) {
	dsn := testDSN(t)
	proxy, viaProxy, err := faultproxy.Postgres(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	key := rand.Int64()
	old := newElector(viaProxy, key, fast)
	next := newElector(dsn, key, fast)
	run(t, old)
	if !waitFor(10*time.Second, func() bool { return leads(old) }) {
		t.Fatalf("the first elector does not lead: %v", errOf(old))
	}
	run(t, next)
	if !waitFor(10*time.Second, func() bool { return follows(next) }) {
		t.Fatalf("the second elector does not follow: %v", errOf(next))
	}
	// A follower campaigns on the connection it keeps.
	pid := backendPID(next)
	time.Sleep(5 * fast.campaign)
	if got := backendPID(next); got != pid {
		t.Fatalf("the follower's session changed between campaigns (%d, then %d): a connection per campaign", pid, got)
	}
	overlaps := watchOverlap(t, old, next)

	proxy.Freeze(true)
	frozen := time.Now()
	if !waitFor(bound(fast)+10*time.Second, func() bool { return leads(next) }) {
		t.Fatalf("no takeover %s after the leader's connection froze (bound %s): old %v, next %v",
			time.Since(frozen), bound(fast), errOf(old), errOf(next))
	}
	took := time.Since(frozen)
	t.Logf("takeover %s after the freeze (bound %s)", took.Round(time.Millisecond), bound(fast))
	// The leader's last ping may have been one ping interval before the
	// freeze; sooner than that, the lock was not freed by the server.
	if took < fast.session-2*fast.ping {
		t.Fatalf("takeover after %s, before the server could have ended the silent session (%s)", took, fast.session)
	}
	if leads(old) {
		t.Fatal("the partitioned leader still leads")
	}

	proxy.Freeze(false)
	if !waitFor(bound(fast)+10*time.Second, func() bool { return follows(old) }) {
		t.Fatalf("the old leader does not follow once its network is back: %v", errOf(old))
	}
	if !leads(next) {
		t.Fatal("the new leader lost the lead to the old one")
	}
	if n := overlaps.Load(); n > 0 {
		t.Fatalf("both led at once (%d samples)", n)
	}
}

// A leader that stops talking with its connection up (its process was
// stopped: SIGSTOP, a paused VM) stops leading when its lease runs out,
// and another takes over: on PostgreSQL 14 and later the server ends the
// silent session (idle_session_timeout); on an older one the follower
// ends it. Resumed, the old leader follows.
func TestSilentLeaderIsReplaced(t *testing.T) {
	dsn := testDSN(t)
	for _, tc := range []struct {
		name   string
		legacy bool
	}{{"idle_session_timeout", false}, {"follower ends the session (server < 14)", true}} {
		t.Run(tc.name, func(t *testing.T) {
			tm := fast
			tm.noIdleTimeout = tc.legacy
			key := rand.Int64()
			old := newElector(dsn, key, tm)
			defer old.Resign()
			// One campaign and then nothing, as a process stopped
			// right after it.
			if lead, err := old.Campaign(context.Background()); !lead || err != nil {
				t.Fatalf("first campaign: %v %v", lead, err)
			}
			next := newElector(dsn, key, tm)
			run(t, next)
			overlaps := watchOverlap(t, old, next)
			start := time.Now()
			if !waitFor(bound(tm)+10*time.Second, func() bool { return leads(next) }) {
				t.Fatalf("no takeover %s after the leader fell silent: %v", time.Since(start), errOf(next))
			}
			t.Logf("takeover %s after the leader's last word (bound %s)", time.Since(start).Round(time.Millisecond), bound(tm))
			// Resumed: its first campaign finds its session gone and the
			// lock taken.
			if lead, err := old.Campaign(context.Background()); lead || err != nil {
				t.Fatalf("the resumed leader's campaign: lead %v, err %v; want a follower", lead, err)
			}
			if !leads(next) || overlaps.Load() > 0 {
				t.Fatalf("after the old leader resumed: next leads %v, %d overlapping samples", leads(next), overlaps.Load())
			}
		})
	}
}

// A follower whose campaigns stopped (frozen, or its database gone)
// cannot tell whether anyone leads: it says so rather than that another
// instance does.
func TestStaleFollowerCannotTell(t *testing.T) {
	dsn := testDSN(t)
	key := rand.Int64()
	holder := newElector(dsn, key, fast)
	defer holder.Resign()
	if lead, err := holder.Campaign(context.Background()); !lead || err != nil {
		t.Fatalf("first campaign: %v %v", lead, err)
	}
	f := newElector(dsn, key, fast)
	defer f.Resign()
	if _, err := f.Leading(); err == nil {
		t.Fatal("an elector that never campaigned tells who leads")
	}
	if lead, err := f.Campaign(context.Background()); lead || err != nil {
		t.Fatalf("follower's campaign: %v %v", lead, err)
	}
	if !follows(f) {
		t.Fatal("a follower that just campaigned cannot tell")
	}
	f.mu.Lock()
	f.lastGood = time.Now().Add(-fast.stale - time.Second)
	f.mu.Unlock()
	if lead, err := f.Leading(); lead || err == nil {
		t.Fatalf("a follower whose last campaign is stale: lead %v, err %v", lead, err)
	}
}

func errOf(e *Elector) error {
	_, err := e.Leading()
	return err
}

func backendPID(e *Elector) uint32 {
	e.op.Lock()
	defer e.op.Unlock()
	if e.conn == nil {
		return 0
	}
	return e.conn.PgConn().PID()
}

// A database restart, or a failover to a standby, ends every session at
// once, not after SessionTimeout of silence: the lock is free as soon as
// the server is back, and a follower takes it at its next campaign,
// while the old leader learns of it only at its next ping (PingEvery
// later, PingTimeout more when that ping hangs on a dead primary), its
// lease, counted from its last ping, still running. Two instances must
// never lead at the same time (the package's promise, which the fleet's
// single prober rests on).
func TestServerRestartNeverMakesTwoLeaders(t *testing.T) {
	dsn := testDSN(t)
	ctx := context.Background()
	key := rand.Int64()
	old := newElector(dsn, key, fast)
	defer old.Resign()
	next := newElector(dsn, key, fast)
	defer next.Resign()
	if lead, err := old.Campaign(ctx); !lead || err != nil {
		t.Fatalf("first campaign: %v %v", lead, err)
	}
	if lead, err := next.Campaign(ctx); lead || err != nil {
		t.Fatalf("follower's campaign: %v %v", lead, err)
	}
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	// What a restart does to the electors' sessions (and only to theirs:
	// the test's server is shared).
	for _, e := range []*Elector{old, next} {
		if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", backendPID(e)); err != nil {
			t.Fatal(err)
		}
	}
	// The follower campaigns on; the old leader does not ping meanwhile
	// (its next ping is not due, or it hangs until PingTimeout).
	deadline := time.Now().Add(fast.lease + time.Second)
	for time.Now().Before(deadline) {
		_, _ = next.Campaign(ctx)
		if leads(next) && leads(old) {
			t.Fatal("two leaders: the follower took the freed lock while the old leader's lease still ran")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !leads(next) {
		t.Fatalf("the follower does not lead %s after the restart: %v", fast.lease+time.Second, errOf(next))
	}
}
