package wallet

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestExtendKeepsLiveReservations(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "a", 10_000_000)
		now := time.Now()
		live := Reservation{ID: testReservationID(), Account: "a", Amount: 1_000_000, ExpiresAt: now.Add(time.Second)}
		gone := Reservation{ID: testReservationID(), Account: "a", Amount: 2_000_000, ExpiresAt: now.Add(time.Second)}
		settled := Reservation{ID: testReservationID(), Account: "a", Amount: 3_000_000, ExpiresAt: now.Add(time.Second)}
		for _, r := range []Reservation{live, gone, settled} {
			if err := s.Reserve(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Settle(ctx, settled.ID, Entry{Cost: 5}); err != nil {
			t.Fatal(err)
		}
		// Many IDs span several statements; unknown ones are skipped.
		ids := []string{live.ID, settled.ID}
		for i := range 600 {
			ids = append(ids, fmt.Sprint("never-reserved-", i))
		}
		if n, err := s.Extend(ctx, ids, now.Add(time.Hour)); err != nil || n != 1 {
			t.Fatalf("Extend = %d, %v; want 1", n, err)
		}
		// Never earlier: an extension to the past changes nothing.
		if n, err := s.Extend(ctx, []string{live.ID}, now); err != nil || n != 0 {
			t.Fatalf("Extend to the past = %d, %v", n, err)
		}
		if n, err := s.Sweep(ctx, now.Add(time.Minute)); err != nil || n != 1 {
			t.Fatalf("Sweep = %d, %v; want only the unextended one", n, err)
		}
		if a := getAccount(t, s, "a"); a.Reserved != live.Amount {
			t.Errorf("reserved %s, want the live reservation's %s", a.Reserved, live.Amount)
		}
		if c, err := s.Settle(ctx, live.ID, Entry{Cost: 7}); err != nil || c != 7 {
			t.Fatalf("Settle(live) = %s, %v", c, err)
		}
	})
}

func TestAudit(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "a", 10_000_000)
		mustAccount(t, s, "b", 0)
		r := Reservation{ID: testReservationID(), Account: "a", Amount: 1_000_000}
		if err := s.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
		r2 := Reservation{ID: testReservationID(), Account: "a", Amount: 500}
		if err := s.Reserve(ctx, r2); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Settle(ctx, r2.ID, Entry{Cost: 300}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Credit(ctx, "a", -1000, "correction"); err != nil {
			t.Fatal(err)
		}
		rows, err := s.Audit(ctx, "")
		if err != nil || len(rows) != 2 {
			t.Fatalf("Audit = %+v, %v", rows, err)
		}
		for _, row := range rows {
			if !row.Clean() {
				t.Errorf("clean books audited as %+v", row)
			}
		}
		if rows[0].Account != "a" || rows[0].Balance != 10_000_000-300-1000 || rows[0].Live != 1_000_000 {
			t.Errorf("a audited as %+v", rows[0])
		}
		// A difference someone injects behind the ledger's back is found.
		ss := s.(*sqlStore)
		if _, err := ss.db.ExecContext(ctx, ss.q(`UPDATE accounts SET balance = balance + 42, reserved = reserved + 1 WHERE id = ?`), "a"); err != nil {
			t.Fatal(err)
		}
		rows, err = s.Audit(ctx, "a")
		if err != nil || len(rows) != 1 || rows[0].Clean() || rows[0].Balance-rows[0].Ledger != 42 || rows[0].Reserved-rows[0].Live != 1 {
			t.Fatalf("Audit after tampering = %+v, %v", rows, err)
		}
		if _, err := s.Audit(ctx, "ghost"); err == nil {
			t.Error("auditing an unknown account succeeded")
		}
	})
}

// TestRecordAttemptAsyncDrainsOnClose: rows submitted in the background
// are all written by the time Close returns, none lost.
func TestRecordAttemptAsyncDrainsOnClose(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			s := b.open(t)
			mustAccount(t, s, "a", 0)
			const n = 300
			var mu sync.Mutex
			var failed []error
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				s.RecordAttemptAsync(Entry{Account: "a", Channel: "c", RequestID: fmt.Sprint("r", i), Note: "503"}, func(err error) {
					defer wg.Done()
					if err != nil {
						mu.Lock()
						failed = append(failed, err)
						mu.Unlock()
					}
				})
			}
			ss := s.(*sqlStore)
			ss.w.close() // what Close does first: drain, then stop
			wg.Wait()
			if len(failed) > 0 {
				t.Fatalf("%d background rows failed: %v", len(failed), failed[0])
			}
			var count int
			if err := ss.db.QueryRow(ss.q(`SELECT COUNT(*) FROM ledger WHERE kind = ?`), KindFailedAttempt).Scan(&count); err != nil {
				t.Fatal(err)
			}
			if count != n {
				t.Fatalf("%d of %d background rows written before close", count, n)
			}
			// After close the row is refused, and said so.
			done := make(chan error, 1)
			s.RecordAttemptAsync(Entry{Account: "a"}, func(err error) { done <- err })
			if err := <-done; err == nil {
				t.Error("a row submitted after Close reported success")
			}
		})
	}
}
