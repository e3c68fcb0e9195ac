package wallet

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/llmfailover/caddy-llm-failover/internal/faultproxy"
	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
	"github.com/llmfailover/caddy-llm-failover/internal/sqlitefile"
)

// recorder is an Observer that remembers what it heard.
type recorder struct {
	mu        sync.Mutex
	retried   int
	unwritten map[string]error
}

func (r *recorder) WriteRetried(string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retried++
}

func (r *recorder) SettlementUnwritten(requestID, _ string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unwritten == nil {
		r.unwritten = map[string]error{}
	}
	r.unwritten[requestID] = err
}

// settleErrs settles rs at once and returns each outcome by request ID.
func settleErrs(t *testing.T, s Store, rs []request) map[string]error {
	t.Helper()
	type outcome struct {
		id  string
		err error
	}
	out := make(chan outcome, len(rs))
	for _, r := range rs {
		s.SettleAsync(r.ID, []Entry{{Cost: r.cost}}, func(_ Micros, err error) { out <- outcome{r.RequestID, err} })
	}
	errs := map[string]error{}
	deadline := time.After(20 * time.Second)
	for range rs {
		select {
		case o := <-out:
			errs[o.id] = o.err
		case <-deadline:
			t.Fatal("settlements still unwritten")
		}
	}
	return errs
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A batch whose connection is lost while the server still runs it (here
// waiting for a row lock), the server not told (a NAT or load balancer
// that forgets a connection, and pgx's cancel request lost too), must not
// run again until that session has ended: else both would commit once
// the lock is released, and every answer of the batch would be charged
// twice.
func TestPostgresSettlementLostWhileTheServerRunsItIsChargedOnce(t *testing.T) {
	const credit = 1_000_000
	// A lock_timeout long enough for the statement to wait out the lock,
	// and a name of its own for the store's sessions: other packages'
	// tests run settlement batches on the same server at the same time.
	app := "settle-lost-" + testReservationID()
	s, proxy, _, dsn := faultyPG(t, Options{}, "lock_timeout", "20000", "application_name", app)
	mustAccount(t, s, "a", credit)
	warm := reserveAll(t, s, "warm", 1, "a")
	settleAll(t, s, warm, 10*time.Second)
	rs := reserveAll(t, s, "zombie", 4, "a")

	ctx := context.Background()
	locker, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM accounts WHERE id = 'a' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	watcher, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close(ctx)
	// waiting answers the sessions whose settlement batch waits for the lock.
	waiting := func() []int64 {
		rows, err := watcher.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%AS j(account_id, charged)%' AND application_name = $1`, app)
		if err != nil {
			t.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		return pids
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		settleAll(t, s, rs, 30*time.Second)
	}()
	var first []int64
	waitFor(t, 10*time.Second, "the batch to wait for the lock", func() bool { first = waiting(); return len(first) == 1 })
	// The client's connection goes, and so does the cancel request pgx
	// sends on a new one: the server's session waits on.
	proxy.RefuseNew(true)
	retried := s.w.retried.Load()
	proxy.Orphan()
	waitFor(t, 10*time.Second, "a retry", func() bool { return s.w.retried.Load() > retried })
	time.Sleep(300 * time.Millisecond)
	if w := waiting(); !slices.Equal(w, first) {
		t.Fatalf("sessions waiting: %v, want the lost one, %v, still", w, first)
	}
	proxy.RefuseNew(false)
	// The batch runs again, on a new session, which waits for the lock too.
	waitFor(t, 10*time.Second, "the batch to run again", func() bool {
		return slices.ContainsFunc(waiting(), func(pid int64) bool { return pid != first[0] })
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	chargedOnce(t, s, credit, append(warm, rs...), "a")
}

// A grow whose connection is lost after it committed runs again: the
// lease row then holds two grants and memory one, and once the lease is
// idle Renew gives the second back.
func TestPostgresGrowLostAfterItCommittedGivesTheSecondGrantBack(t *testing.T) {
	const credit = 1_000_000
	s, _, c, _ := faultyPG(t, Options{})
	mustAccount(t, s, "a", credit)
	ctx := context.Background()
	first := request{Reservation{ID: testReservationID(), Account: "a", RequestID: "first", Amount: 10_000}, 100}
	if err := s.Reserve(ctx, first.Reservation); err != nil { // grows the lease: the statement is prepared
		t.Fatal(err)
	}
	c.arm(pgGrowSQL, faultproxy.CutAfter)
	big := request{Reservation{ID: testReservationID(), Account: "a", RequestID: "big", Amount: 200_000}, 150_000}
	if err := s.Reserve(ctx, big.Reservation); err != nil {
		t.Fatalf("a Reserve whose grow lost its connection after committing: %v", err)
	}
	if c.count() != 1 {
		t.Fatalf("%d cuts, want 1", c.count())
	}
	s.leases.mu.Lock()
	counted := s.leases.leases["a"].amount
	s.leases.mu.Unlock()
	if a := getAccount(t, s, "a"); a.Reserved <= counted {
		t.Fatalf("reserved %s, lease counts %s: the grow did not land twice, so this test tests nothing", a.Reserved, counted)
	}
	settleAll(t, s, []request{first, big}, 10*time.Second)
	time.Sleep(leaseIdleAfter)
	if err := s.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if a := getAccount(t, s, "a"); a.Reserved != 0 {
		t.Errorf("after the lease went idle: reserved %s, want 0", a.Reserved)
	}
	chargedOnce(t, s, credit, []request{first, big}, "a")
}

// A shrink whose outcome is unknown is not put back in memory (it may
// have landed); when it did not, the next Renew gives back what the row
// still holds.
func TestPostgresShrinkLostGivesTheMoneyBackAtTheNextRenew(t *testing.T) {
	const credit = 1_000_000
	s, _, c, _ := faultyPG(t, Options{})
	mustAccount(t, s, "a", credit)
	ctx := context.Background()
	rs := reserveAll(t, s, "r", 1, "a")
	settleAll(t, s, rs, 10*time.Second)
	time.Sleep(leaseIdleAfter)
	if err := s.Renew(ctx); err != nil { // shrinks: the statement is prepared
		t.Fatal(err)
	}
	more := reserveAll(t, s, "more", 1, "a")
	settleAll(t, s, more, 10*time.Second)
	c.arm(pgShrinkSQL, faultproxy.CutBefore)
	time.Sleep(leaseIdleAfter)
	if err := s.Renew(ctx); !errors.Is(err, errOutcomeUnknown) {
		t.Fatalf("Renew with its shrink cut: %v, want an unknown outcome", err)
	}
	if a := getAccount(t, s, "a"); a.Reserved == 0 {
		t.Fatal("the cut shrink landed: this test tests nothing")
	}
	if err := s.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if a := getAccount(t, s, "a"); a.Reserved != 0 {
		t.Errorf("after the next Renew: reserved %s, want 0", a.Reserved)
	}
	chargedOnce(t, s, credit, append(rs, more...), "a")
}

// After every connection was dropped, the first write finds its idle
// connection dead before sending anything (pingIdle): nothing needs
// retrying.
func TestPostgresFirstWriteAfterAnOutageNeedsNoRetry(t *testing.T) {
	const credit = 1_000_000
	s, proxy, _, _ := faultyPG(t, Options{})
	mustAccount(t, s, "a", credit)
	warm := reserveAll(t, s, "warm", 1, "a")
	settleAll(t, s, warm, 10*time.Second)
	proxy.Reset()
	time.Sleep(pingIdle + 100*time.Millisecond)
	retried := s.w.retried.Load()
	rs := reserveAll(t, s, "after", 3, "a")
	settleAll(t, s, rs, 10*time.Second)
	if n := s.w.retried.Load() - retried; n != 0 {
		t.Errorf("%d writes retried after the outage, want 0", n)
	}
	chargedOnce(t, s, credit, append(warm, rs...), "a")
}

// A database that stays away longer than the retry budget: each
// settlement fails, reported to the observer with its request ID. One
// never sent is put back and can still be settled; one whose connection
// was lost as it was sent may have been written, so it is booked as
// written and the lease gives back the money it held once the database
// answers again: uncharged, the books clean.
func TestPostgresSettlementGivenUp(t *testing.T) {
	const credit = 1_000_000
	for _, sent := range []bool{false, true} {
		t.Run(map[bool]string{false: "never sent", true: "lost as it was sent"}[sent], func(t *testing.T) {
			s, proxy, _, _ := faultyPG(t, Options{})
			s.w.budget = 500 * time.Millisecond
			rec := &recorder{}
			SetObserver(s, rec)
			mustAccount(t, s, "a", credit)
			warm := reserveAll(t, s, "warm", 1, "a")
			settleAll(t, s, warm, 10*time.Second)
			rs := reserveAll(t, s, "lost", 3, "a")
			proxy.Refuse(true)
			if !sent {
				// The writer's ping finds its connection gone before sending.
				time.Sleep(pingIdle + 100*time.Millisecond)
			}
			errs := settleErrs(t, s, rs)
			for _, r := range rs {
				err := errs[r.RequestID]
				if err == nil || !strings.Contains(err.Error(), "gave up") || errors.Is(err, errOutcomeUnknown) != sent {
					t.Errorf("%s: %v", r.RequestID, err)
				}
				if rec.unwritten[r.RequestID] == nil {
					t.Errorf("the observer did not hear that %s was not written", r.RequestID)
				}
			}
			if rec.retried == 0 || s.w.gaveUp.Load() == 0 {
				t.Errorf("retried %d, gave up %d", rec.retried, s.w.gaveUp.Load())
			}
			proxy.Refuse(false)
			ctx := context.Background()
			if !sent {
				// Put back: settled now, charged once.
				for _, r := range rs {
					if _, err := s.Settle(ctx, r.ID, Entry{Cost: r.cost}); err != nil {
						t.Fatal(err)
					}
				}
				chargedOnce(t, s, credit, append(warm, rs...), "a")
				return
			}
			for _, r := range rs {
				if _, err := s.Settle(ctx, r.ID, Entry{Cost: r.cost}); !errors.Is(err, ErrNotFound) {
					t.Errorf("settling %s again: %v, want ErrNotFound", r.RequestID, err)
				}
			}
			if err := s.Renew(ctx); err != nil {
				t.Fatal(err)
			}
			chargedOnce(t, s, credit, warm, "a")
		})
	}
}

// Close does not wait for a database that does not answer: the
// settlements being retried fail at once.
func TestCloseStopsRetrying(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wallet.db")
	st, err := OpenSQLite(path, Options{StatementTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s := st.(*sqlStore)
	mustAccount(t, s, "a", 1_000_000)
	rs := reserveAll(t, s, "r", 2, "a")
	other, err := sqlitefile.Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tx, err := other.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	errs := make(chan error, len(rs))
	for _, r := range rs {
		s.SettleAsync(r.ID, []Entry{{Cost: r.cost}}, func(_ Micros, err error) { errs <- err })
	}
	waitFor(t, 10*time.Second, "a retry", func() bool { return s.w.retried.Load() > 0 })
	began := time.Now()
	_ = s.Close() // its own writes fail too: the file is still locked
	if took := time.Since(began); took > 3*time.Second {
		t.Errorf("Close took %v while settlements were being retried", took)
	}
	for range rs {
		if err := <-errs; err == nil || !strings.Contains(err.Error(), "closing") {
			t.Errorf("a settlement being retried when the store closed: %v", err)
		}
	}
}

func TestPgClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		want failure
	}{
		{&pgconn.PgError{Code: "40001"}, notApplied},
		{&pgconn.PgError{Code: "40P01"}, notApplied},
		{&pgconn.PgError{Code: "55P03"}, notApplied},
		{&pgconn.PgError{Code: "57014"}, notApplied},
		{&pgconn.PgError{Code: "57P01"}, notApplied},
		{&pgconn.PgError{Code: "08006"}, notApplied},
		{&pgconn.PgError{Code: "53300"}, notApplied},
		{&pgconn.PgError{Code: "23505"}, failed},
		{&pgconn.PgError{Code: "42P01"}, failed},
		{fmt.Errorf("settling: %w", io.ErrUnexpectedEOF), unknown},
		{io.EOF, unknown},
		{&net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, unknown},
		{errors.New("something else"), failed},
	} {
		if got := pgClassify(c.err); got != c.want {
			t.Errorf("pgClassify(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

func TestJudge(t *testing.T) {
	w := &worker{writer: &writer{faults: faults{classify: pgClassify}}}
	sess := session{pid: 7, start: time.Now()}
	for _, c := range []struct {
		err        error
		committing bool
		retry      retryPolicy
		want       failure
		lost       int
	}{
		{nil, true, retrySafe, failed, 0},
		{ErrInsufficientFunds, true, retrySafe, failed, 0},
		{driver.ErrBadConn, true, retrySafe, notApplied, 0},
		{sql.ErrConnDone, true, retrySafe, notApplied, 0},
		{io.ErrUnexpectedEOF, true, retrySafe, unknown, 0},
		// Inside a transaction, a lost connection commits nothing.
		{io.ErrUnexpectedEOF, false, retryChecked, notApplied, 0},
		{io.ErrUnexpectedEOF, true, retryChecked, unknown, 1},
	} {
		op := &writeOp{opOptions: opOptions{retry: c.retry}}
		w.judge(op, c.err, c.committing, sess)
		if op.class != c.want || len(op.lost) != c.lost {
			t.Errorf("judge(%v, committing %v) = %d with %d lost sessions, want %d and %d", c.err, c.committing, op.class, len(op.lost), c.want, c.lost)
		}
	}
}

// pgEnded ends a session still running a statement, and leaves an idle
// one (and any other) alone.
func TestPostgresEndedTerminatesOnlyARunningSession(t *testing.T) {
	dsn := pgtest.FreshDSN(t)
	s := openPG(t, dsn).(*sqlStore)
	ctx := context.Background()
	sessionOf := func(c *pgx.Conn) session {
		t.Helper()
		var x session
		if err := c.QueryRow(ctx, `SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&x.pid, &x.start); err != nil {
			t.Fatal(err)
		}
		return x
	}
	idle, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close(ctx)
	busy, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close(ctx)
	idleSess, busySess := sessionOf(idle), sessionOf(busy)
	slept := make(chan error, 1)
	go func() {
		_, err := busy.Exec(ctx, `SELECT pg_sleep(30)`)
		slept <- err
	}()
	watcher, err := s.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	waitFor(t, 10*time.Second, "the sleep to start", func() bool {
		var n int
		if err := watcher.QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active'`, busySess.pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	gone := session{pid: busySess.pid, start: busySess.start.Add(-time.Hour)} // an older session of the same pid
	if err := pgEnded(ctx, watcher, []session{idleSess, gone, busySess}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-slept:
		if err == nil {
			t.Error("the running session's statement completed")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the running session was not ended")
	}
	if err := idle.Ping(ctx); err != nil {
		t.Errorf("the idle session was ended: %v", err)
	}
}
