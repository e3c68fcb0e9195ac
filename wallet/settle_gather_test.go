package wallet

import (
	"context"
	"sync"
	"testing"
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
