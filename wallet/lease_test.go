package wallet

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
)

// abandon drops s the way kill -9 drops a gateway: its writes stop, its
// connections close, and its leases stay behind in the database.
func (s *sqlStore) abandon() {
	s.leases.mu.Lock()
	s.leases.closed = true
	s.leases.mu.Unlock()
	s.w.close()
	_ = s.closeDB()
}

// twoInstances opens two stores (instances) on one database of each
// backend, with opts, and hands them to f.
func twoInstances(t *testing.T, opts Options, f func(t *testing.T, a, b *sqlStore, reopen func() *sqlStore)) {
	for _, be := range []struct {
		name string
		open func(t *testing.T) func() *sqlStore
	}{
		{"sqlite", func(t *testing.T) func() *sqlStore {
			path := filepath.Join(t.TempDir(), "w.db")
			return func() *sqlStore {
				s, err := OpenSQLite(path, opts)
				if err != nil {
					t.Fatal(err)
				}
				return s.(*sqlStore)
			}
		}},
		{"postgres", func(t *testing.T) func() *sqlStore {
			dsn := pgtest.FreshDSN(t)
			return func() *sqlStore {
				s, err := OpenPostgres(context.Background(), dsn, opts)
				if err != nil {
					t.Fatal(err)
				}
				return s.(*sqlStore)
			}
		}},
	} {
		t.Run(be.name, func(t *testing.T) {
			open := be.open(t)
			var all []*sqlStore
			reopen := func() *sqlStore { s := open(); all = append(all, s); return s }
			t.Cleanup(func() {
				for _, s := range all {
					s.Close()
				}
			})
			f(t, reopen(), reopen(), reopen)
		})
	}
}

// wantBilledAndReturned checks, once two instances' traffic has ended,
// that each account was charged exactly what its settlements charged
// (charged, by account) and is not overdrawn, and that the audit is
// clean; then it closes both and checks that nothing is left reserved. It
// returns a third instance on the database.
func wantBilledAndReturned(t *testing.T, a, b *sqlStore, reopen func() *sqlStore, accounts []string, balance Micros, charged []atomic.Int64) *sqlStore {
	t.Helper()
	for i, id := range accounts {
		if acct := getAccount(t, a, id); acct.Balance != balance-Micros(charged[i].Load()) || acct.Balance < acct.Reserved {
			t.Errorf("%s: %+v, want balance %s", id, acct, balance-Micros(charged[i].Load()))
		}
	}
	wantCleanAudit(t, a)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	c := reopen()
	for _, id := range accounts {
		if acct := getAccount(t, c, id); acct.Reserved != 0 {
			t.Errorf("%s after both instances closed: %+v", id, acct)
		}
	}
	return c
}

func wantCleanAudit(t *testing.T, s Store) {
	t.Helper()
	rows, err := s.Audit(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if !r.Clean() {
			t.Errorf("audit of %s: %+v", r.Account, r)
		}
	}
}

// Two instances on one database, hammered with whole requests (Reserve,
// then Settle with a random cost, sometimes over the reservation) on a
// few accounts: every charge lands exactly once, nothing is overdrawn, and
// once both are closed nothing is reserved and the audit is clean.
func TestLeasesTwoInstancesHammered(t *testing.T) {
	twoInstances(t, Options{}, func(t *testing.T, a, b *sqlStore, reopen func() *sqlStore) {
		ctx := context.Background()
		accounts := []string{"x", "y", "z"}
		const balance = Micros(500_000_000)
		for _, id := range accounts {
			mustAccount(t, a, id, balance)
		}
		var (
			wg      sync.WaitGroup
			charged [3]atomic.Int64
			refused atomic.Int64
		)
		for g := range 24 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := []*sqlStore{a, b}[g%2]
				rng := rand.New(rand.NewPCG(uint64(g), 1))
				for range 60 {
					i := rng.IntN(len(accounts))
					amount := Micros(1_000 + rng.IntN(200_000))
					id := testReservationID()
					err := s.Reserve(ctx, Reservation{ID: id, Account: accounts[i], Amount: amount})
					if errors.Is(err, ErrInsufficientFunds) {
						refused.Add(1)
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					cost := Micros(rng.IntN(int(amount) * 5 / 4)) // one in five over the reservation
					c, err := s.Settle(ctx, id, Entry{Cost: cost, Channel: "c"})
					if err != nil {
						t.Error(err)
						return
					}
					if c != min(cost, amount) {
						t.Errorf("charged %s for cost %s of reservation %s", c, cost, amount)
					}
					charged[i].Add(int64(c))
				}
			}()
		}
		wg.Wait()
		// Both instances take the rows they write in one order (lease.go's
		// lock order): their writes wait for each other but never in a
		// cycle, which only PostgreSQL's lock_timeout would break, failing
		// a write that is then run again. Taking rows out of order, this
		// test saw about 20 such re-runs; one or two may still come from a
		// transaction that holds a row past lock_timeout on a loaded box.
		if again := a.w.retried.Load() + a.w.reruns.Load() + b.w.retried.Load() + b.w.reruns.Load(); again > 3 {
			t.Errorf("%d writes run again (a lock timeout or a deadlock): the instances took rows out of order", again)
		}
		c := wantBilledAndReturned(t, a, b, reopen, accounts, balance, charged[:])
		var leases int
		if err := c.db.QueryRow(`SELECT COUNT(*) FROM leases`).Scan(&leases); err != nil || leases != 0 {
			t.Errorf("%d lease rows left after Close (%v)", leases, err)
		}
		wantCleanAudit(t, c)
		t.Logf("%d refused (none expected with this much money)", refused.Load())
		if refused.Load() > 0 {
			t.Error("a reservation was refused on an account with money to spare")
		}
	})
}

// An instance that dies without Close leaves its lease behind: its money
// stays reserved until the lease expires, then Sweep on another instance
// releases it with one KindExpired row, and the balance is what it was.
func TestLeaseOfDeadInstanceSwept(t *testing.T) {
	const ttl = 2 * time.Second
	twoInstances(t, Options{LeaseTTL: ttl}, func(t *testing.T, a, b *sqlStore, _ func() *sqlStore) {
		ctx := context.Background()
		mustAccount(t, a, "acme", 5_000_000)
		if err := a.Reserve(ctx, Reservation{ID: testReservationID(), Account: "acme", Amount: 100_000}); err != nil {
			t.Fatal(err)
		}
		held := getAccount(t, b, "acme").Reserved
		if held < 100_000 {
			t.Fatalf("reserved %s, want at least the reservation", held)
		}
		a.abandon()
		t0 := time.Now()
		if n, err := b.Sweep(ctx, t0); err != nil || n != 0 {
			t.Fatalf("Sweep before the lease expired = %d, %v", n, err)
		}
		if got := getAccount(t, b, "acme"); got.Reserved != held {
			t.Fatalf("the dead instance's lease was released early: %+v", got)
		}
		n, err := b.Sweep(ctx, t0.Add(ttl+time.Second))
		if err != nil || n != 1 {
			t.Fatalf("Sweep after the lease expired = %d, %v; want 1", n, err)
		}
		if got := getAccount(t, b, "acme"); got.Reserved != 0 || got.Balance != 5_000_000 {
			t.Fatalf("after the sweep: %+v, want balance 5 and nothing reserved", got)
		}
		rows, err := b.Usage(ctx, "acme", 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 2 || rows[0].Kind != KindExpired || rows[0].Cost != 0 || !strings.Contains(rows[0].Note, a.leases.id) {
			t.Errorf("ledger = %+v, want the credit and one expired row naming the lease", rows)
		}
		wantCleanAudit(t, b)
		// A live instance's own lease is never swept, however late the
		// sweep's clock.
		if err := b.Reserve(ctx, Reservation{ID: testReservationID(), Account: "acme", Amount: 10}); err != nil {
			t.Fatal(err)
		}
		if n, err := b.Sweep(ctx, t0.Add(time.Hour)); err != nil || n != 1 {
			t.Fatalf("late Sweep = %d, %v; want only b's own expired reservation", n, err)
		}
		wantCleanAudit(t, b)
	})
}

// A grow that waits for its account row's lock while another transaction
// gives money back to the account (a settlement, a shrink, a Sweep of
// another instance's lease) still grants: PostgreSQL's one-statement grow
// then sized its grant from the newer row but tested it against the older
// one, and without running again it refused a Reserve the balance covered
// (a false 402, seen in TestReserveWaitsForPendingSettlements under load).
func TestGrowWhileMoneyComesBack(t *testing.T) {
	dsn := pgtest.FreshDSN(t)
	s := openPG(t, dsn)
	mustAccount(t, s, "acme", 1000)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	// Another instance holds 300 of the 1000.
	if _, err := other.Exec(ctx, `INSERT INTO leases (id, account_id, amount, expires_at, created_at) VALUES ('lease_other', 'acme', 300, $1, $2)`,
		toDB(time.Now().Add(time.Hour)), toDB(time.Now())); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, `UPDATE accounts SET reserved = reserved + 300 WHERE id = 'acme'`); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := other.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	// It gives them back, in a transaction that commits only once the
	// Reserve below waits for the account row.
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `DELETE FROM leases WHERE id = 'lease_other'`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE accounts SET reserved = reserved - 300 WHERE id = 'acme'`); err != nil {
		t.Fatal(err)
	}
	reserved := make(chan error, 1)
	go func() { reserved <- s.Reserve(ctx, Reservation{ID: "r1", Account: "acme", Amount: 800}) }()
	for waiting := 0; waiting == 0; {
		if err := other.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND $1 = ANY (pg_blocking_pids(pid))`, pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-reserved:
			t.Fatalf("the Reserve did not wait for the account row: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-reserved; err != nil {
		t.Fatalf("Reserve of 800 of the 1000 given back meanwhile: %v", err)
	}
	if got := getAccount(t, s, "acme"); got.Reserved < 800 || got.Balance != 1000 {
		t.Fatalf("account after the grow: %+v, want 800 or more of 1000 reserved", got)
	}
	if _, err := s.Settle(ctx, "r1", Entry{Cost: 5}); err != nil {
		t.Fatal(err)
	}
	wantCleanAudit(t, s)
}

// An instance whose lease expired while it could not reach the database
// (a restart longer than the lease's TTL), and which another instance
// swept meanwhile, serves no Reserve from the money it counted: that money
// went back to the account, and an answer served from it would settle
// against nothing and go unbilled (the soak saw one). Renew leaves the
// swept lease unextended, and the grow that re-creates its row makes
// memory agree with it; every answer served after the sweep is billed.
func TestSweptLeaseServesNothing(t *testing.T) {
	const ttl = 2 * time.Second
	for _, after := range []string{"renewed", "not renewed", "settled first"} {
		t.Run(after, func(t *testing.T) {
			twoInstances(t, Options{LeaseTTL: ttl}, func(t *testing.T, a, b *sqlStore, _ func() *sqlStore) {
				ctx := context.Background()
				clock := &fakeClock{t: time.Now()}
				a.now = clock.now
				const balance, amount, cost = 10_000, 100, 100
				mustAccount(t, a, "acme", balance)
				var ids []string
				reserve := func() {
					t.Helper()
					id := testReservationID()
					if err := a.Reserve(ctx, Reservation{ID: id, Account: "acme", Amount: amount}); err != nil {
						t.Fatal(err)
					}
					ids = append(ids, id)
				}
				reserve()
				if got := getAccount(t, b, "acme").Reserved; got <= 2*amount {
					t.Fatalf("reserved %s: the lease should hold spare money", got)
				}
				// The database was out of a's reach for longer than the
				// TTL: b swept a's lease, and its money went back.
				clock.advance(ttl + time.Second)
				if n, err := b.Sweep(ctx, clock.now()); err != nil || n != 1 {
					t.Fatalf("Sweep of a's expired lease = %d, %v; want 1", n, err)
				}
				if got := getAccount(t, b, "acme"); got.Reserved != 0 {
					t.Fatalf("after the sweep: %+v, want nothing reserved", got)
				}
				switch after {
				case "renewed":
					// Reserves kept arriving (and failing) meanwhile, so
					// the lease is not idle: Renew keeps its spare money.
					a.leases.mu.Lock()
					a.leases.leases["acme"].lastReserve = clock.now()
					a.leases.mu.Unlock()
					if err := a.Renew(ctx); err != nil {
						t.Fatal(err)
					}
				case "settled first":
					// Its reservation went with the lease.
					_, err := a.Settle(ctx, ids[0], Entry{Cost: cost})
					wantErr(t, err, ErrNotFound)
					ids = ids[1:]
				}
				// More than the lease held before it was swept.
				for range 12 {
					reserve()
				}
				for _, id := range ids {
					if charged, err := a.Settle(ctx, id, Entry{Cost: cost}); err != nil || charged != cost {
						t.Fatalf("settling %s after the sweep: charged %s, %v; want %s", id, charged, err, Micros(cost))
					}
				}
				if got := getAccount(t, b, "acme"); got.Balance != balance-Micros(len(ids))*cost {
					t.Fatalf("after the settlements: %+v, want every answer billed", got)
				}
				// Once nothing is in flight, memory agrees with the row.
				clock.advance(leaseIdleAfter)
				if err := a.Renew(ctx); err != nil {
					t.Fatal(err)
				}
				if got := getAccount(t, b, "acme"); got.Reserved != 0 {
					t.Fatalf("after an idle Renew: %+v, want the lease's money all given back", got)
				}
				wantCleanAudit(t, a)
			})
		})
	}
}

// Leases swept from a live instance while it serves (a database out of
// its reach for longer than the TTL, over and over): however the sweeps
// fall among its Reserves, grows, settlements, shrinks and Renews, nothing
// is overdrawn, a settlement charges what it should or finds its
// reservation released with its lease, every answer served after the
// last sweep is billed, and once the instances close nothing is reserved
// and the audit is clean.
func TestLeasesSweptUnderLoad(t *testing.T) {
	const ttl = 2 * time.Second
	twoInstances(t, Options{LeaseTTL: ttl}, func(t *testing.T, a, b *sqlStore, reopen func() *sqlStore) {
		ctx := context.Background()
		clock := &fakeClock{t: time.Now()}
		a.now = clock.now
		accounts := []string{"x", "y"}
		const balance = Micros(50_000_000)
		for _, id := range accounts {
			mustAccount(t, a, id, balance)
		}
		var (
			charged  [2]atomic.Int64
			lost     atomic.Int64
			timedOut atomic.Int64
		)
		// serve has one answer reserved and settled on a; lostOK says a
		// sweep may have released its reservation meanwhile.
		serve := func(rng *rand.Rand, lostOK bool) bool {
			i := rng.IntN(len(accounts))
			amount := Micros(1_000 + rng.IntN(20_000))
			id := testReservationID()
			if err := a.Reserve(ctx, Reservation{ID: id, Account: accounts[i], Amount: amount}); err != nil {
				t.Errorf("Reserve of %s: %v", amount, err)
				return false
			}
			cost := Micros(rng.IntN(int(amount) * 5 / 4))
			c, err := a.Settle(ctx, id, Entry{Cost: cost, Channel: "c"})
			switch {
			case lostOK && errors.Is(err, ErrNotFound):
				lost.Add(1)
			case err != nil:
				t.Errorf("Settle: %v", err)
				return false
			case c != min(cost, amount):
				t.Errorf("charged %s for cost %s of reservation %s", c, cost, amount)
			default:
				charged[i].Add(int64(c))
			}
			return true
		}
		run := func(rounds int, lostOK bool) {
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), uint64(rounds)))
					for range rounds {
						if !serve(rng, lostOK) {
							return
						}
					}
				}()
			}
			wg.Wait()
		}
		stop := make(chan struct{})
		disrupted := make(chan int)
		go func() {
			n := 0
			defer func() { disrupted <- n }()
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
				clock.advance(ttl + time.Second)
				switch _, err := b.Sweep(ctx, clock.now()); {
				case err != nil && strings.Contains(err.Error(), "SQLSTATE 55P03"):
					// Waited lockTimeout for an account row that a's grows
					// and settlement batches, taking rows in opposite
					// orders, held: the sweeper's next run sweeps.
					timedOut.Add(1)
				case err != nil:
					t.Errorf("Sweep: %v", err)
					return
				}
				if err := a.Renew(ctx); err != nil {
					t.Errorf("Renew: %v", err)
					return
				}
				n++
			}
		}()
		run(80, true)
		close(stop)
		sweeps := <-disrupted
		// A last sweep with nothing in flight, and no Renew after it (whose
		// idle shrink would empty the leases): what it took must not be
		// served from.
		clock.advance(ttl + time.Second)
		if _, err := b.Sweep(ctx, clock.now()); err != nil {
			t.Fatal(err)
		}
		run(20, false)
		t.Logf("%d sweeps (%d ran into lock_timeout); %d settlements found their lease swept", sweeps, timedOut.Load(), lost.Load())
		wantCleanAudit(t, wantBilledAndReturned(t, a, b, reopen, accounts, balance, charged[:]))
	})
}

func TestLeaseGrant(t *testing.T) {
	for _, c := range []struct {
		avail, need, amount Micros
		kmax                int64
		want                Micros
	}{
		{1000, 100, 100, 8, 200},      // a quarter of 1000, in whole requests
		{1_000_000, 100, 100, 8, 800}, // kmax
		{1_000_000, 100, 100, 256, 25_600},
		{350, 100, 100, 8, 100}, // nearly empty: exactly one request
		{100, 100, 100, 8, 100},
		{350, 30, 100, 8, 100}, // spare covers 70 of it: still a whole request
		{60, 30, 100, 8, 60},   // ... but never more than available
		{500, 0, 0, 8, 0},      // free requests take nothing
	} {
		if got := leaseGrant(c.avail, c.need, c.amount, c.kmax); got != c.want {
			t.Errorf("leaseGrant(avail %d, need %d, amount %d, kmax %d) = %d, want %d", c.avail, c.need, c.amount, c.kmax, got, c.want)
		}
	}
}

// Grants: several requests while the account is full, kmax doubling when
// a grant is used up fast, exactly one request when it is nearly empty.
func TestLeaseGrantsFollowTheBalance(t *testing.T) {
	forEachStore(t, func(t *testing.T, st Store) {
		s := st.(*sqlStore)
		ctx := context.Background()
		const amount = 1_000
		mustAccount(t, s, "rich", 1_000_000_000)
		mustAccount(t, s, "poor", 3*amount+500)
		reserve := func(account string) {
			t.Helper()
			if err := s.Reserve(ctx, Reservation{ID: testReservationID(), Account: account, Amount: amount}); err != nil {
				t.Fatal(err)
			}
		}
		reserve("rich")
		if got := getAccount(t, s, "rich").Reserved; got != leaseKmaxStart*amount {
			t.Fatalf("first grant %s, want %d requests' worth", got, leaseKmaxStart)
		}
		for range leaseKmaxStart { // uses the grant up, and one more grows it
			reserve("rich")
		}
		if got := getAccount(t, s, "rich").Reserved; got != 3*leaseKmaxStart*amount {
			t.Fatalf("after using a grant up at once: reserved %s, want a doubled second grant (%d in all)", got, 3*leaseKmaxStart)
		}
		for i := range 3 {
			reserve("poor")
			if got := getAccount(t, s, "poor").Reserved; got != Micros(i+1)*amount {
				t.Fatalf("nearly empty account: reserved %s after %d requests, want exactly theirs", got, i+1)
			}
		}
		wantErr(t, s.Reserve(ctx, Reservation{ID: testReservationID(), Account: "poor", Amount: amount}), ErrInsufficientFunds)
	})
}

// A lease that serves no Reserve for a second gives back what its live
// reservations do not hold; Renew also extends the lease's expiry, and a
// lease close to expiry is not served from.
func TestIdleLeaseReturned(t *testing.T) {
	forEachStore(t, func(t *testing.T, st Store) {
		s := st.(*sqlStore)
		clock := &fakeClock{t: time.Now()}
		s.now = clock.now
		ctx := context.Background()
		mustAccount(t, s, "a", 1_000_000_000)
		live := Reservation{ID: testReservationID(), Account: "a", Amount: 1_000}
		done := Reservation{ID: testReservationID(), Account: "a", Amount: 2_000}
		for _, r := range []Reservation{live, done} {
			if err := s.Reserve(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Settle(ctx, done.ID, Entry{Cost: 500}); err != nil {
			t.Fatal(err)
		}
		busy := getAccount(t, s, "a").Reserved
		if busy <= live.Amount {
			t.Fatalf("reserved %s: the lease should hold spare money while busy", busy)
		}
		if err := s.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if got := getAccount(t, s, "a").Reserved; got != busy {
			t.Fatalf("Renew of a lease just used: reserved %s, want %s", got, busy)
		}
		expiry := func() int64 {
			var exp int64
			if err := s.db.QueryRow(s.q(`SELECT expires_at FROM leases WHERE id = ?`), s.leases.id).Scan(&exp); err != nil {
				t.Fatal(err)
			}
			return exp
		}
		first := expiry()
		clock.advance(DefaultLeaseTTL / 3)
		if err := s.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if got := getAccount(t, s, "a"); got.Reserved != live.Amount || got.Balance != 1_000_000_000-500 {
			t.Fatalf("idle lease: %+v, want only the live reservation reserved", got)
		}
		if got := expiry(); got != first+(DefaultLeaseTTL/3).Microseconds() {
			t.Errorf("Renew moved the lease's expiry by %dµs, want %v", got-first, DefaultLeaseTTL/3)
		}
		// Two thirds of the TTL without renewal: the next Reserve goes to
		// the database (and so extends the lease) although it would fit.
		clock.advance(DefaultLeaseTTL * 2 / 3)
		before := expiry()
		if err := s.Reserve(ctx, Reservation{ID: testReservationID(), Account: "a", Amount: 0}); err != nil {
			t.Fatal(err)
		}
		if got := expiry(); got <= before {
			t.Errorf("a Reserve on a lease close to expiry did not extend it")
		}
		wantCleanAudit(t, s)
	})
}

// Settle with several entries: one ledger row each, charged in order, the
// total capped at the reservation; a row charged below its cost says so.
func TestSettleMore(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "a", 10_000)
		r := Reservation{ID: testReservationID(), Account: "a", KeyID: "k", Model: "m", RequestID: "req", Amount: 1_000}
		if err := s.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
		charged, err := s.Settle(ctx, r.ID,
			Entry{Channel: "first", Cost: 600, TokensOut: 6, Note: "cut"},
			Entry{Channel: "second", Cost: 300, TokensOut: 3},
			Entry{Channel: "second", Cost: 500, Note: "continuation", Model: "m2"},
			Entry{Channel: "third", Cost: 0})
		if err != nil || charged != 1_000 {
			t.Fatalf("Settle = %s, %v; want the whole reservation", charged, err)
		}
		_, err = s.Settle(ctx, r.ID, Entry{Cost: 1})
		wantErr(t, err, ErrNotFound)
		rows, err := s.Usage(ctx, "a", 0, 4)
		if err != nil || len(rows) != 4 {
			t.Fatalf("Usage = %+v, %v", rows, err)
		}
		want := []struct {
			kind, channel, model string
			cost                 Micros
			capped               bool
		}{{KindRelease, "third", "m", 0, false}, {KindCharge, "second", "m2", 100, true}, {KindCharge, "second", "m", 300, false}, {KindCharge, "first", "m", 600, false}}
		for i, w := range want {
			e := rows[i]
			if e.Kind != w.kind || e.Channel != w.channel || e.Model != w.model || e.Cost != w.cost || strings.Contains(e.Note, "capped") != w.capped ||
				e.KeyID != "k" || e.RequestID != "req" {
				t.Errorf("row %d = %+v, want %+v", i, e, w)
			}
		}
		if !strings.Contains(rows[1].Note, "continuation") || rows[3].Note != "cut" {
			t.Errorf("notes %q, %q", rows[1].Note, rows[3].Note)
		}
		if a := getAccount(t, s, "a"); a.Balance != 9_000 {
			t.Errorf("account %+v, want 1,000 charged", a)
		}
		wantCleanAudit(t, s)
	})
}

// A reservation lives in the instance that made it.
func TestSettleOnAnotherInstance(t *testing.T) {
	twoInstances(t, Options{}, func(t *testing.T, a, b *sqlStore, _ func() *sqlStore) {
		ctx := context.Background()
		mustAccount(t, a, "acme", 1_000_000)
		r := Reservation{ID: testReservationID(), Account: "acme", Amount: 1_000}
		if err := a.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
		_, err := b.Settle(ctx, r.ID, Entry{Cost: 1})
		wantErr(t, err, ErrNotFound)
		if c, err := a.Settle(ctx, r.ID, Entry{Cost: 1}); err != nil || c != 1 {
			t.Fatalf("Settle on the owner = %s, %v", c, err)
		}
		if n, err := b.Extend(ctx, []string{r.ID}, time.Now().Add(time.Hour)); err != nil || n != 0 {
			t.Errorf("Extend on another instance = %d, %v", n, err)
		}
	})
}

// A reservation of nothing (a model priced at zero: the wallet only
// authenticates) holds nothing in its lease, so an idle Renew finds the
// lease empty. It must not forget the lease while that reservation is
// live: its Settle looks the lease up.
func TestZeroReservationOutlivesIdleRenew(t *testing.T) {
	forEachStore(t, func(t *testing.T, st Store) {
		s := st.(*sqlStore)
		clock := &fakeClock{t: time.Now()}
		s.now = clock.now
		ctx := context.Background()
		mustAccount(t, s, "a", 1_000_000)
		r := Reservation{ID: testReservationID(), Account: "a", Amount: 0}
		if err := s.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
		// The request streams for a few seconds; Renew runs every second.
		for range 3 {
			clock.advance(time.Second)
			if err := s.Renew(ctx); err != nil {
				t.Fatal(err)
			}
		}
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("Settle panicked: %v", p)
				}
			}()
			if _, err := s.Settle(ctx, r.ID, Entry{Cost: 0}); err != nil {
				t.Fatal(err)
			}
		}()
		wantCleanAudit(t, s)
	})
}
