package wallet

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
)

// holdWriter occupies every writer goroutine of s with an op that blocks
// until released, so that whatever is submitted meanwhile queues up. The
// returned release frees one of them only, which then takes everything
// queued as one batch; the others are freed when the test ends.
func holdWriter(t *testing.T, s *sqlStore) (release func()) {
	t.Helper()
	var releases []func()
	for range s.w.workers {
		started := make(chan struct{})
		unblock := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- s.write(context.Background(), "holding the writer", "", func(*stx) error {
				close(started)
				<-unblock
				return nil
			})
		}()
		// Submitted one at a time: each lands on a free goroutine.
		<-started
		var once sync.Once
		releases = append(releases, func() {
			once.Do(func() {
				close(unblock)
				if err := <-done; err != nil {
					t.Errorf("holding op: %v", err)
				}
			})
		})
	}
	t.Cleanup(func() {
		for _, r := range releases {
			r()
		}
	})
	return releases[0]
}

// waitQueued waits until n ops are queued behind the held writer.
func waitQueued(t *testing.T, s *sqlStore, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(s.w.queue) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d ops queued, want %d", len(s.w.queue), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestGroupCommitIsolatesFailures puts ops that fail (insufficient funds, a
// double settle, a duplicate reservation ID that fails after its UPDATE, a
// ledger row for an unknown account) into one batch with ops that succeed:
// exactly the successful ones must be committed. On PostgreSQL the
// constraint errors also exercise the roll-back-and-re-run path.
func TestGroupCommitIsolatesFailures(t *testing.T) {
	forEachStore(t, func(t *testing.T, st Store) {
		s := st.(*sqlStore)
		ctx := context.Background()
		mustAccount(t, s, "a", 1_000)
		mustAccount(t, s, "poor", 100)
		mustAccount(t, s, "tight", 1_000)
		settled := Reservation{ID: testReservationID(), Account: "a", Amount: 200}
		if err := s.Reserve(ctx, settled); err != nil {
			t.Fatal(err)
		}
		dupID := Reservation{ID: testReservationID(), Account: "a", Amount: 50}
		if err := s.Reserve(ctx, dupID); err != nil {
			t.Fatal(err)
		}
		batchesBefore, rerunsBefore := s.w.batches.Load(), s.w.reruns.Load()

		release := holdWriter(t, s)
		type result struct {
			name    string
			err     error
			charged Micros
		}
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			results = map[string][]result{}
		)
		submit := func(name string, f func() (Micros, error)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := f()
				mu.Lock()
				results[name] = append(results[name], result{name, err, c})
				mu.Unlock()
			}()
		}
		okRes := Reservation{ID: testReservationID(), Account: "a", Amount: 300}
		submit("reserve ok", func() (Micros, error) { return 0, s.Reserve(ctx, okRes) })
		submit("reserve poor", func() (Micros, error) {
			return 0, s.Reserve(ctx, Reservation{ID: testReservationID(), Account: "poor", Amount: 101})
		})
		// Only one of two 600s fits in 1000: decided inside the batch.
		tight := []Reservation{{ID: testReservationID(), Account: "tight", Amount: 600}, {ID: testReservationID(), Account: "tight", Amount: 600}}
		for _, r := range tight {
			submit("reserve tight", func() (Micros, error) { return 0, s.Reserve(ctx, r) })
		}
		// Same ID again: its UPDATE succeeds, then the INSERT violates the
		// primary key, and the UPDATE must be undone with it.
		submit("reserve dup", func() (Micros, error) {
			return 0, s.Reserve(ctx, Reservation{ID: dupID.ID, Account: "a", Amount: 70})
		})
		for i := 0; i < 2; i++ {
			submit("settle", func() (Micros, error) { return s.Settle(ctx, settled.ID, Entry{Cost: 150, Channel: "c"}) })
		}
		submit("attempt ok", func() (Micros, error) { return 0, s.RecordAttempt(ctx, Entry{Account: "a", Channel: "c", Note: "503"}) })
		submit("attempt ghost", func() (Micros, error) { return 0, s.RecordAttempt(ctx, Entry{Account: "ghost"}) })
		// Queued: the grows of "reserve ok", "reserve poor" and one of the
		// tight pair (the other waits for it), one settle, both attempts.
		// The duplicate ID and the second settle fail in memory at once.
		const n = 6
		waitQueued(t, s, n)
		release()
		wg.Wait()

		// The queued ops ran as one batch; what they set off afterwards (a
		// settle's give-back, the second tight grow) may make another.
		if got := s.w.batches.Load() - batchesBefore; got < 1 || got > 2 {
			t.Errorf("%d multi-op batches, want 1 (or 2)", got)
		}
		t.Logf("%d writer goroutines; re-runs: %d", s.w.workers, s.w.reruns.Load()-rerunsBefore)
		one := func(name string) result {
			t.Helper()
			if len(results[name]) != 1 {
				t.Fatalf("%s: %d results", name, len(results[name]))
			}
			return results[name][0]
		}
		if r := one("reserve ok"); r.err != nil {
			t.Errorf("reserve ok: %v", r.err)
		}
		wantErr(t, one("reserve poor").err, ErrInsufficientFunds)
		if r := one("reserve dup"); r.err == nil || isClean(r.err) {
			t.Errorf("duplicate reservation ID: %v, want a constraint error", r.err)
		}
		if r := one("attempt ok"); r.err != nil {
			t.Errorf("attempt ok: %v", r.err)
		}
		if r := one("attempt ghost"); r.err == nil {
			t.Error("attempt for unknown account accepted")
		}
		var tightOK, tightRefused int
		for _, r := range results["reserve tight"] {
			switch {
			case r.err == nil:
				tightOK++
			case errors.Is(r.err, ErrInsufficientFunds):
				tightRefused++
			default:
				t.Errorf("reserve tight: %v", r.err)
			}
		}
		if tightOK != 1 || tightRefused != 1 {
			t.Errorf("tight: %d ok, %d refused; want 1 and 1", tightOK, tightRefused)
		}
		var settleOK, settleNotFound int
		for _, r := range results["settle"] {
			switch {
			case r.err == nil && r.charged == 150:
				settleOK++
			case errors.Is(r.err, ErrNotFound):
				settleNotFound++
			default:
				t.Errorf("settle: %s, %v", r.charged, r.err)
			}
		}
		if settleOK != 1 || settleNotFound != 1 {
			t.Errorf("settles: %d ok, %d not found; want 1 and 1", settleOK, settleNotFound)
		}

		// a: 1000 − 150 charged; reserved: dupID's 50 + okRes's 300 (the
		// duplicate's 70 rolled back).
		if a := getAccount(t, s, "a"); a.Balance != 850 || a.Reserved != 350 {
			t.Errorf("a = %+v, want balance 850 reserved 350", a)
		}
		if a := getAccount(t, s, "poor"); a.Reserved != 0 {
			t.Errorf("poor = %+v", a)
		}
		if a := getAccount(t, s, "tight"); a.Reserved != 600 || a.Balance != 1_000 {
			t.Errorf("tight = %+v", a)
		}
		rows, err := s.Usage(ctx, "a", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		kinds := map[string]int{}
		for _, e := range rows {
			kinds[e.Kind]++
		}
		if len(rows) != 3 || kinds[KindCredit] != 1 || kinds[KindCharge] != 1 || kinds[KindFailedAttempt] != 1 {
			t.Errorf("ledger of a = %+v", rows)
		}
		// Both surviving reservations settle normally.
		for _, id := range []string{okRes.ID, dupID.ID} {
			if _, err := s.Settle(ctx, id, Entry{}); err != nil {
				t.Errorf("Settle(%s): %v", id, err)
			}
		}
		if _, err := s.Sweep(ctx, time.Now()); err != nil { // returns the spare lease money
			t.Fatal(err)
		}
		if a := getAccount(t, s, "a"); a.Reserved != 0 {
			t.Errorf("a after settling = %+v", a)
		}
	})
}

// TestGroupCommitContext: an op whose context ends while it is queued is
// not applied, and its caller returns at once.
func TestGroupCommitContext(t *testing.T) {
	forEachStore(t, func(t *testing.T, st Store) {
		s := st.(*sqlStore)
		mustAccount(t, s, "a", 1_000)
		release := holdWriter(t, s)

		// The caller gives up while queued.
		ctx, cancel := context.WithCancel(context.Background())
		r := Reservation{ID: testReservationID(), Account: "a", Amount: 100}
		errc := make(chan error, 1)
		go func() { errc <- s.Reserve(ctx, r) }()
		waitQueued(t, s, 1)
		cancel()
		select {
		case err := <-errc:
			wantErr(t, err, context.Canceled)
		case <-time.After(5 * time.Second):
			t.Fatal("Reserve did not return after its context was cancelled")
		}

		// The writer finds a context that ended before it started the op
		// (the caller has not noticed yet): skipped with ctx.Err().
		ctx2, cancel2 := context.WithCancel(context.Background())
		ran := false
		op := &writeOp{ctx: ctx2, fn: func(*stx) error { ran = true; return nil }, done: make(chan struct{})}
		s.w.queue <- op
		cancel2()
		release()
		<-op.done
		if !errors.Is(op.err, context.Canceled) || ran {
			t.Errorf("op with a cancelled context: err %v, ran %v", op.err, ran)
		}

		if a := getAccount(t, s, "a"); a.Reserved != 0 {
			t.Errorf("cancelled reservation applied: %+v", a)
		}
		_, err := s.Settle(context.Background(), r.ID, Entry{})
		wantErr(t, err, ErrNotFound)
		// An already-cancelled context never reaches the queue.
		wantErr(t, s.Reserve(ctx, r), context.Canceled)
	})
}

// TestCloseWithOpsInFlight: Close lets queued ops finish, fails later ones,
// loses no commit, and leaves no goroutine behind.
func TestCloseWithOpsInFlight(t *testing.T) {
	for _, be := range []struct {
		name   string
		open   func(t *testing.T) (Store, func() Store)
		reopen bool
	}{
		{"sqlite", func(t *testing.T) (Store, func() Store) {
			path := filepath.Join(t.TempDir(), "w.db")
			open := func() Store {
				s, err := OpenSQLite(path)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			return open(), open
		}, true},
		{"postgres", func(t *testing.T) (Store, func() Store) {
			dsn := pgtest.FreshDSN(t)
			open := func() Store {
				s, err := OpenPostgres(context.Background(), dsn)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			return open(), open
		}, true},
	} {
		t.Run(be.name, func(t *testing.T) {
			baseline := runtime.NumGoroutine()
			s, reopen := be.open(t)
			const amount = Micros(1_000)
			mustAccount(t, s, "a", 1<<40)
			ctx := context.Background()
			var (
				wg                 sync.WaitGroup
				reserved, settled  atomic.Int64
				closedErrs, others atomic.Int64
				started            = make(chan struct{}, 32)
			)
			for i := 0; i < 32; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					first := true
					for {
						if first {
							started <- struct{}{}
							first = false
						}
						id := testReservationID()
						err := s.Reserve(ctx, Reservation{ID: id, Account: "a", Amount: amount})
						if err == nil {
							reserved.Add(1)
							_, err = s.Settle(ctx, id, Entry{})
							if err == nil {
								settled.Add(1)
							}
						}
						if err != nil {
							if errors.Is(err, errStoreClosed) {
								closedErrs.Add(1)
							} else {
								others.Add(1)
								t.Errorf("unexpected error: %v", err)
							}
							return
						}
					}
				}()
			}
			for i := 0; i < 32; i++ {
				<-started
			}
			time.Sleep(50 * time.Millisecond)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if closedErrs.Load() != 32 {
				t.Errorf("%d callers saw the store closed, want 32", closedErrs.Load())
			}
			if _, err := s.(*sqlStore).CreateAccount(ctx, "late"); !errors.Is(err, errStoreClosed) {
				t.Errorf("write after Close: %v", err)
			}
			if err := s.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
			t.Logf("%d reserved, %d settled before Close", reserved.Load(), settled.Load())

			// Every Settle that returned nil is committed, and every
			// reservation left unsettled was released by Close, uncharged,
			// with an expired row: nothing stays reserved.
			s2 := reopen()
			a := getAccount(t, s2, "a")
			if a.Reserved != 0 || a.Balance != 1<<40 {
				t.Errorf("account %+v after reopening, want nothing reserved or charged", a)
			}
			var expired int64
			if err := s2.(*sqlStore).db.QueryRow(s2.(*sqlStore).q(`SELECT COUNT(*) FROM ledger WHERE kind = ?`), KindExpired).Scan(&expired); err != nil {
				t.Fatal(err)
			}
			if want := reserved.Load() - settled.Load(); expired != want {
				t.Errorf("%d expired rows, want one per unsettled reservation (%d)", expired, want)
			}
			wantCleanAudit(t, s2)
			s2.Close()

			deadline := time.Now().Add(10 * time.Second)
			for runtime.NumGoroutine() > baseline {
				if time.Now().After(deadline) {
					buf := make([]byte, 1<<20)
					t.Fatalf("%d goroutines, %d before opening:\n%s", runtime.NumGoroutine(), baseline, buf[:runtime.Stack(buf, true)])
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// fakeClock is a settable clock for the store's now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestAuthCache: a revocation on this store applies at once; one made by
// another instance on the same database applies once the cached entry's
// TTL has passed.
func TestAuthCache(t *testing.T) {
	for _, be := range []struct {
		name string
		open func(t *testing.T) (Store, Store)
	}{
		{"sqlite", func(t *testing.T) (Store, Store) {
			path := filepath.Join(t.TempDir(), "w.db")
			var out [2]Store
			for i := range out {
				s, err := OpenSQLite(path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				out[i] = s
			}
			return out[0], out[1]
		}},
		{"postgres", func(t *testing.T) (Store, Store) {
			dsn := pgtest.FreshDSN(t)
			return openPG(t, dsn), openPG(t, dsn)
		}},
	} {
		t.Run(be.name, func(t *testing.T) {
			a, b := be.open(t)
			ctx := context.Background()
			clock := &fakeClock{t: time.Now()}
			a.(*sqlStore).now = clock.now
			b.(*sqlStore).now = clock.now
			mustAccount(t, a, "acct", 0)
			k1, key1, err := a.CreateKey(ctx, "acct", "one")
			if err != nil {
				t.Fatal(err)
			}
			k2, key2, err := a.CreateKey(ctx, "acct", "two")
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range []Store{a, b} {
				for _, k := range []string{k1, k2} {
					if _, err := s.Authenticate(ctx, k); err != nil {
						t.Fatal(err)
					}
				}
			}
			// Served from the cache: the database is not asked again.
			db := b.(*sqlStore)
			if _, ok, _ := db.auth.get(hashKey(k2), clock.now()); !ok {
				t.Fatal("key not cached after a successful Authenticate")
			}

			if k, ok := b.KnownKey(k2); !ok || k.ID != key2.ID {
				t.Errorf("KnownKey after Authenticate: %+v %v", k, ok)
			}
			if _, ok := b.KnownKey(KeyPrefix + strings.Repeat("A", keyRandomLen)); ok {
				t.Error("KnownKey knows a key nobody presented")
			}

			// Revoked on a: a refuses it at once.
			if err := a.RevokeKey(ctx, key1.ID); err != nil {
				t.Fatal(err)
			}
			if _, ok := a.KnownKey(k1); ok {
				t.Error("a still knows the key it revoked")
			}
			k, err := a.Authenticate(ctx, k1)
			wantErr(t, err, ErrKeyRevoked)
			if k.RevokedAt == nil {
				t.Errorf("revoked key = %+v", k)
			}
			// b, another instance, still has it cached until the TTL ends.
			if _, err := b.Authenticate(ctx, k1); err != nil {
				t.Errorf("b within the TTL: %v (the cache should still answer)", err)
			}
			clock.advance(DefaultAuthCacheTTL - time.Millisecond)
			if _, err := b.Authenticate(ctx, k1); err != nil {
				t.Errorf("b just before the TTL: %v", err)
			}
			clock.advance(time.Millisecond)
			_, err = b.Authenticate(ctx, k1)
			wantErr(t, err, ErrKeyRevoked)
			if _, ok := b.KnownKey(k1); ok {
				t.Error("b still knows a key the database said was revoked")
			}
			// Revoked keys are not cached: still refused later.
			clock.advance(time.Second)
			_, err = b.Authenticate(ctx, k1)
			wantErr(t, err, ErrKeyRevoked)
			// The other key is unaffected on both.
			for _, s := range []Store{a, b} {
				if got, err := s.Authenticate(ctx, k2); err != nil || got.ID != key2.ID || got.Label != "two" {
					t.Errorf("other key: %+v, %v", got, err)
				}
			}
			// A key not verified for KnownKeyTTL is no longer known.
			if _, ok := a.KnownKey(k2); !ok {
				t.Error("a does not know k2, verified again after another key was revoked")
			}
			clock.advance(KnownKeyTTL)
			if _, ok := b.KnownKey(k2); ok {
				t.Error("b still knows k2 an hour after it last verified it")
			}
			// Revoking on b clears b's cache at once too.
			if err := b.RevokeKey(ctx, key2.ID); err != nil {
				t.Fatal(err)
			}
			_, err = b.Authenticate(ctx, k2)
			wantErr(t, err, ErrKeyRevoked)
		})
	}
}

func TestAuthCacheBounded(t *testing.T) {
	c := newAuthCache(time.Second, 3)
	start := time.Now()
	now := start
	for i := 0; i < 10; i++ {
		now = start.Add(time.Duration(i) * time.Millisecond)
		_, _, gen := c.get(hashKey(fmt.Sprint(i)), now)
		c.put(hashKey(fmt.Sprint(i)), Key{ID: fmt.Sprint(i)}, now, gen)
		if len(c.m) > 3 || c.expiry.Len() != len(c.m) {
			t.Fatalf("%d entries (%d in the expiry queue), max 3", len(c.m), c.expiry.Len())
		}
	}
	// The full cache made room by forgetting the entries expiring soonest.
	for i, want := range []bool{6: false, 7: true, 8: true, 9: true} {
		if k, ok, _ := c.get(hashKey(fmt.Sprint(i)), now); i >= 6 && (ok != want || ok && k.ID != fmt.Sprint(i)) {
			t.Errorf("entry %d: %+v %v, want kept %v", i, k, ok, want)
		}
	}
	c.forget(hashKey("8"))
	if c.expiry.Len() != 2 {
		t.Errorf("%d in the expiry queue after a forget, want 2", c.expiry.Len())
	}
	// A lookup that began before a revocation must not store its answer;
	// the other keys stay.
	_, _, gen := c.get(hashKey("x"), now)
	before := len(c.m)
	c.forgetKey("x")
	c.put(hashKey("x"), Key{ID: "x"}, now, gen)
	if _, ok, _ := c.get(hashKey("x"), now); ok || len(c.m) != before || c.expiry.Len() != before {
		t.Error("stale lookup stored after a revocation, or another key forgotten")
	}
	// Expired entries are misses.
	_, _, gen = c.get(hashKey("y"), now)
	c.put(hashKey("y"), Key{ID: "y"}, now, gen)
	if _, ok, _ := c.get(hashKey("y"), now.Add(time.Second)); ok {
		t.Error("expired entry served")
	}
}

// TestPostgresTinyPool: the writer holds a connection of its own, which
// must not starve reads even when the DSN asks for a one-connection pool.
func TestPostgresTinyPool(t *testing.T) {
	s := openPG(t, pgtest.FreshDSN(t)+"&pool_max_conns=1")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	mustAccount(t, s, "a", 1_000_000)
	plain, _, err := s.CreateKey(ctx, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Authenticate(ctx, plain); err != nil {
				t.Error(err)
			}
			id := testReservationID()
			if err := s.Reserve(ctx, Reservation{ID: id, Account: "a", Amount: 10}); err != nil {
				t.Error(err)
				return
			}
			if _, err := s.Account(ctx, "a"); err != nil {
				t.Error(err)
			}
			if _, err := s.Settle(ctx, id, Entry{Cost: 1}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if _, err := s.Sweep(ctx, time.Now()); err != nil { // returns the spare lease money
		t.Fatal(err)
	}
	if a := getAccount(t, s, "a"); a.Reserved != 0 || a.Balance != 1_000_000-8 {
		t.Errorf("a = %+v", a)
	}
}

// testReservationID returns a fresh random reservation ID.
func testReservationID() string { return "rsv_" + randomBase62(22) }

// docs/wallet.md: with on_store_error allow, "only keys this instance
// verified against the database within the last hour are served". A
// revocation of one key that does not go through (the database does not
// answer: the moment an operator cuts off a leaked key may well be during
// the outage) must not make this instance forget every other key it
// verified, or every client is refused with 503 for the rest of the
// outage. The key being revoked may be forgotten (the safe way round).
func TestFailedRevokeKeepsOtherKeysKnown(t *testing.T) {
	forEachStore(t, func(t *testing.T, st Store) {
		s := st.(*sqlStore)
		ctx := context.Background()
		mustAccount(t, s, "acct", 0)
		leaked, leakedKey, err := s.CreateKey(ctx, "acct", "leaked")
		if err != nil {
			t.Fatal(err)
		}
		good, _, err := s.CreateKey(ctx, "acct", "good")
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{leaked, good} {
			if _, err := s.Authenticate(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		// The database does not take the revocation: its write never
		// gets to run before the operator's call gives up.
		release := holdWriter(t, s)
		defer release()
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if err := s.RevokeKey(short, leakedKey.ID); err == nil {
			t.Fatal("RevokeKey succeeded with the writer held")
		}
		if _, ok := s.KnownKey(good); !ok {
			t.Error("a failed revocation of another key made this instance forget a key it verified: on_store_error allow now refuses its client")
		}
	})
}
