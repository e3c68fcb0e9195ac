package wallet

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// While other reservations are open, a settlement waits for company, so
// that one batch (one transaction, one COMMIT) settles many; a lone one
// (nothing else open) is written at once.
func TestSettleGathersWhileOthersAreOpen(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "acct", 1_000_000_000)
		q := &s.(*sqlStore).settles
		cycle := func() {
			id := testReservationID()
			if err := s.Reserve(ctx, Reservation{ID: id, Account: "acct", Amount: 1000}); err != nil {
				t.Error(err)
				return
			}
			if _, err := s.Settle(ctx, id, Entry{Cost: 10}); err != nil {
				t.Error(err)
			}
		}

		// Lone: no pause, one batch each.
		for range 20 {
			cycle()
		}
		if w, b, j := q.waits.Load(), q.batches.Load(), q.jobs.Load(); w != 0 || b != 20 || j != 20 {
			t.Fatalf("lone settlements: %d pauses, %d batches of %d settlements; want none, 20 of 20", w, b, j)
		}

		// With a request in flight (its reservation open), 64 settling
		// together share a few batches.
		hold := testReservationID()
		if err := s.Reserve(ctx, Reservation{ID: hold, Account: "acct", Amount: 1000}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 64 {
			wg.Add(1)
			go func() { defer wg.Done(); cycle() }()
		}
		wg.Wait()
		b, j := q.batches.Load()-20, q.jobs.Load()-20
		if j != 64 || b > 16 || q.waits.Load() == 0 {
			t.Fatalf("64 settlements beside an open reservation took %d batches (%d settled, %d pauses); want at most 16", b, j, q.waits.Load())
		}
		if _, err := s.Settle(ctx, hold, Entry{Cost: 10}); err != nil {
			t.Fatal(err)
		}
		a, err := s.Account(ctx, "acct")
		if err != nil {
			t.Fatal(err)
		}
		if want := Micros(1_000_000_000 - 85*10); a.Balance != want {
			t.Fatalf("balance %s, want %s", a.Balance, want)
		}
		wantCleanAudit(t, s)
	})
}

// SettleAsync settles like Settle without a goroutine waiting: done gets
// the outcome exactly once, on every path, and Close waits for the
// settlements already queued.
func TestSettleAsync(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "acct", 1_000_000)
		type outcome struct {
			charged Micros
			err     error
		}
		settle := func(id string, entries ...Entry) <-chan outcome {
			ch := make(chan outcome, 2) // a second done would show as a second value
			s.SettleAsync(id, entries, func(c Micros, err error) { ch <- outcome{c, err} })
			return ch
		}
		once := func(ch <-chan outcome) outcome {
			t.Helper()
			o := <-ch
			select {
			case again := <-ch:
				t.Fatalf("done called twice: %+v, then %+v", o, again)
			case <-time.After(50 * time.Millisecond):
			}
			return o
		}
		reserve := func(id string, amount Micros) {
			t.Helper()
			if err := s.Reserve(ctx, Reservation{ID: id, Account: "acct", Amount: amount}); err != nil {
				t.Fatal(err)
			}
		}

		reserve("r1", 1000)
		if o := once(settle("r1", Entry{Cost: 300}, Entry{Cost: 900, Note: "continuation"})); o.err != nil || o.charged != 1000 {
			t.Fatalf("settling r1: %+v, want 1000 charged (capped at the reservation)", o)
		}
		if o := once(settle("r1", Entry{Cost: 1})); !errors.Is(o.err, ErrNotFound) {
			t.Fatalf("settling r1 again: %+v, want ErrNotFound", o)
		}
		reserve("r2", 1000)
		if o := once(settle("r2")); !errors.Is(o.err, ErrInvalid) {
			t.Fatalf("settling with no entries: %+v, want ErrInvalid", o)
		}
		// Still reserved: a Settle ends it.
		if c, err := s.Settle(ctx, "r2", Entry{Cost: 5}); err != nil || c != 5 {
			t.Fatalf("settling r2 after the refused SettleAsync: %v, %v", c, err)
		}
		rows, err := s.Usage(ctx, "acct", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		var charges int
		var charged Micros
		for _, r := range rows {
			if r.Kind == KindCharge {
				charges++
				charged += r.Cost
			}
		}
		if charges != 3 || charged != 1005 {
			t.Fatalf("ledger after the settlements: %+v, want 3 charges of 1005 in all", rows)
		}
		wantCleanAudit(t, s)

		// Queued beside an open reservation (so the batch waits for
		// company), then Close: the settlement is written before Close
		// returns, and the open one is released.
		reserve("r3", 1000)
		reserve("open", 1000)
		pending := settle("r3", Entry{Cost: 7})
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case o := <-pending:
			if o.err != nil || o.charged != 7 {
				t.Fatalf("the settlement queued before Close: %+v", o)
			}
		default:
			t.Fatal("Close returned before the settlement queued before it ended")
		}
		if o := once(settle("open", Entry{Cost: 1})); !errors.Is(o.err, errStoreClosed) {
			t.Fatalf("settling after Close: %+v, want the store closed", o)
		}
	})
}

// pendingSettlement leaves account "low" (balance 1000) with r1's
// settlement (800 reserved, 10 spent) queued and unwritten: another
// request is in flight (account "busy"), so the batch waits for company,
// and the next may start only in 10 s unless hurried. settled gets r1's
// outcome.
func pendingSettlement(t *testing.T, s Store) (q *settleQueue, settled chan error) {
	t.Helper()
	ctx := context.Background()
	mustAccount(t, s, "low", 1000)
	mustAccount(t, s, "busy", 1_000_000)
	if err := s.Reserve(ctx, Reservation{ID: "other", Account: "busy", Amount: 10}); err != nil {
		t.Fatal(err)
	}
	if err := s.Reserve(ctx, Reservation{ID: "r1", Account: "low", Amount: 800}); err != nil {
		t.Fatal(err)
	}
	q = &s.(*sqlStore).settles
	q.mu.Lock()
	q.last = time.Now().Add(10 * time.Second)
	q.mu.Unlock()
	settled = make(chan error, 1)
	s.SettleAsync("r1", []Entry{{Cost: 10}}, func(_ Micros, err error) { settled <- err })
	return q, settled
}

// A Reserve refused for want of money that settlements not yet written
// still hold (the previous answers' reservations) waits for them, hurrying
// their batch, and tries again: a client whose balance covers the request
// is not refused for the reservation of its previous one. Money that is
// really missing is still refused.
func TestReserveWaitsForPendingSettlements(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		q, settled := pendingSettlement(t, s)

		start := time.Now()
		if err := s.Reserve(ctx, Reservation{ID: "r2", Account: "low", Amount: 800}); err != nil {
			lb := s.(*sqlStore).leases
			lb.mu.Lock()
			l := *lb.leases["low"]
			lb.mu.Unlock()
			a, _ := s.Account(ctx, "low")
			t.Fatalf("r2 (800 of the 990 left) refused while r1's settlement was pending: %v (lease %+v, account %+v)", err, l, a)
		}
		if err := <-settled; err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited > 5*time.Second {
			t.Fatalf("r2 waited %s: the refused Reserve did not hurry the settlement's batch", waited)
		}
		// 990 - 800 = 190 available: 300 is refused, after r2's own
		// settlement is booked as well.
		q.mu.Lock()
		q.last = time.Now().Add(10 * time.Second)
		q.mu.Unlock()
		s.SettleAsync("r2", []Entry{{Cost: 500}}, func(_ Micros, err error) { settled <- err })
		if err := s.Reserve(ctx, Reservation{ID: "r3", Account: "low", Amount: 600}); !errors.Is(err, ErrInsufficientFunds) {
			t.Fatalf("r3 (600 of the 490 left): %v, want ErrInsufficientFunds", err)
		}
		if err := <-settled; err != nil {
			t.Fatal(err)
		}
		if err := s.Reserve(ctx, Reservation{ID: "r4", Account: "low", Amount: 490}); err != nil {
			t.Fatalf("r4 (all of the 490 left): %v", err)
		}
		if _, err := s.Settle(ctx, "r4", Entry{Cost: 0}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Settle(ctx, "other", Entry{Cost: 0}); err != nil {
			t.Fatal(err)
		}
		a, err := s.Account(ctx, "low")
		if err != nil {
			t.Fatal(err)
		}
		if a.Balance != 490 {
			t.Fatalf("balance %s, want 490", a.Balance)
		}
		wantCleanAudit(t, s)
	})
}

// A negative credit (a correction) likewise waits for the account's
// settlements not yet written, whose reservations hold money it may take.
func TestNegativeCreditWaitsForPendingSettlements(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		_, settled := pendingSettlement(t, s)
		a, err := s.Credit(ctx, "low", -900, "correction")
		if err != nil {
			t.Fatalf("taking 900 of the 990 left while r1's settlement was pending: %v", err)
		}
		if err := <-settled; err != nil {
			t.Fatal(err)
		}
		if a.Balance != 90 {
			t.Fatalf("balance %s after the correction, want 90", a.Balance)
		}
		if _, err := s.Settle(ctx, "other", Entry{Cost: 0}); err != nil {
			t.Fatal(err)
		}
		wantCleanAudit(t, s)
	})
}

// One batch of more settlements than one INSERT holds (three INSERTs on
// SQLite: 128, 128 and the rest), over two accounts, with two-row
// settlements among them: every row lands once, each account is charged
// its own, and the audit is clean. Such a batch forms when settlements
// queue while the writer is busy, as here behind an op that waits. On
// SQLite only: it has one writer to hold, and it alone splits a batch
// into INSERTs (PostgreSQL's batch is one statement, see settleBatchPG).
func TestSettleBatchBeyondOneInsert(t *testing.T) {
	s := openSQLiteT(t)
	ctx := context.Background()
	mustAccount(t, s, "a", 1_000_000_000)
	mustAccount(t, s, "b", 1_000_000_000)
	const n = 2*maxInsertRows + 44
	ids, accounts := make([]string, n), make([]string, n)
	rows, settlements := map[string]int{}, map[string]int{}
	for i := range n {
		ids[i], accounts[i] = testReservationID(), []string{"a", "b"}[min(i%3, 1)]
		if err := s.Reserve(ctx, Reservation{ID: ids[i], Account: accounts[i], Amount: 100}); err != nil {
			t.Fatal(err)
		}
	}
	sq := s.(*sqlStore)
	release := holdWriter(t, sq)
	batches := sq.settles.batches.Load()
	done := make(chan error, n)
	for i, id := range ids {
		entries := []Entry{{Cost: 10, RequestID: id}}
		if accounts[i] == "b" {
			entries = []Entry{{Cost: 7, RequestID: id}, {Cost: 3, Note: "continuation", RequestID: id}}
		}
		rows[accounts[i]] += len(entries)
		settlements[accounts[i]]++ // each costs 10
		s.SettleAsync(id, entries, func(_ Micros, err error) { done <- err })
	}
	sq.settles.mu.Lock()
	pending := len(sq.settles.pending)
	sq.settles.mu.Unlock()
	if pending != n {
		t.Fatalf("%d settlements pending behind the busy writer, want %d", pending, n)
	}
	release()
	for range n {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if got := sq.settles.batches.Load() - batches; got != 1 {
		t.Errorf("%d batches, want 1", got)
	}
	// a's 100 rows share their columns: 64 and 32 in the shared form, the
	// last 4 with b's 400 (two unalike rows a settlement) in the each-row
	// form, 128, 128, 128, 16 and 4.
	for form, want := range map[int][]int{sharedForm: {32, 64}, eachRowForm: {4, 16, 128}} {
		if got := preparedInserts(sq, form); !slices.Equal(got, want) {
			t.Errorf("prepared INSERTs of form %d: %v rows, want %v", form, got, want)
		}
	}
	sq.inserts.mu.Lock()
	for _, n := range []int{3, 256} {
		if _, err := sq.insertStmt(ctx, eachRowForm, n); !errors.Is(err, ErrInvalid) {
			t.Errorf("a %d-row INSERT: %v, want ErrInvalid", n, err)
		}
	}
	sq.inserts.mu.Unlock()
	for account, want := range rows {
		usage, err := s.Usage(ctx, account, 0, MaxUsageLimit)
		if err != nil {
			t.Fatal(err)
		}
		var got []string // request IDs of the charge rows, oldest first
		for _, e := range slices.Backward(usage) {
			if e.Kind == KindCharge {
				got = append(got, e.RequestID)
			}
		}
		if len(got) != want {
			t.Errorf("account %s: %d charge rows, want %d", account, len(got), want)
		}
		var order []string // the rows in the order they were settled
		for i, id := range ids {
			if accounts[i] == account {
				order = append(order, id)
				if account == "b" {
					order = append(order, id)
				}
			}
		}
		if !slices.Equal(got, order) {
			t.Errorf("account %s: the ledger does not hold the rows in the order they were settled", account)
		}
		a, err := s.Account(ctx, account)
		if err != nil {
			t.Fatal(err)
		}
		if charged, want := 1_000_000_000-a.Balance, Micros(10*settlements[account]); charged != want {
			t.Errorf("account %s charged %s, want %s", account, charged, want)
		}
	}
	wantCleanAudit(t, s)
}
