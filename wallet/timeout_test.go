package wallet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
)

// A row lock held on one account (an operator's open transaction, another
// instance) must cost only that account: its Reserve returns at its
// caller's deadline, a reservation that commits late is released, and
// Reserves on other accounts, group-committed alongside it, succeed at
// once.
func TestPostgresRowLockBlocksOnlyItsAccount(t *testing.T) {
	dsn := pgtest.FreshDSN(t)
	s := openPG(t, dsn)
	ctx := context.Background()
	for _, id := range []string{"locked", "free1", "free2", "free3"} {
		if _, err := s.CreateAccount(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Credit(ctx, id, 1_000_000, "t"); err != nil {
			t.Fatal(err)
		}
	}
	locker, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT id FROM accounts WHERE id = 'locked' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}

	const deadline = 700 * time.Millisecond
	var wg sync.WaitGroup
	lockedDone := make(chan error, 1)
	start := time.Now()
	wg.Add(1)
	go func() {
		defer wg.Done()
		rctx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		lockedDone <- s.Reserve(rctx, Reservation{ID: "r-locked", Account: "locked", Amount: 10, ExpiresAt: time.Now().Add(time.Hour)})
	}()
	// Let the locked op reach the writer first, so that the others batch
	// with it or queue behind it.
	time.Sleep(50 * time.Millisecond)
	var slowest time.Duration
	var mu sync.Mutex
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			acct := fmt.Sprintf("free%d", i%3+1)
			t0 := time.Now()
			err := s.Reserve(ctx, Reservation{ID: fmt.Sprintf("r-free-%d", i), Account: acct, Amount: 10, ExpiresAt: time.Now().Add(time.Hour)})
			if err != nil {
				t.Errorf("reserve on %s, not locked: %v", acct, err)
			}
			mu.Lock()
			slowest = max(slowest, time.Since(t0))
			mu.Unlock()
		}()
	}
	wg.Wait()
	err = <-lockedDone
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("reserve on the locked account: %v, want a deadline error", err)
	}
	if took > deadline+300*time.Millisecond {
		t.Errorf("reserve on the locked account returned after %v; its deadline was %v", took, deadline)
	}
	// One lock_timeout (a batch re-run) is the most another account waits.
	if slowest > lockTimeout+500*time.Millisecond {
		t.Errorf("a reserve on an unlocked account took %v", slowest)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// Whatever the writer did with the abandoned op, nothing stays
	// reserved: a grant that landed late sits in the lease, which gives it
	// back once idle.
	time.Sleep(2*lockTimeout + leaseIdleAfter)
	if err := s.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	a, err := s.Account(ctx, "locked")
	if err != nil {
		t.Fatal(err)
	}
	if a.Reserved != 0 || a.Balance != 1_000_000 {
		t.Errorf("locked account after the caller gave up: %+v", a)
	}
}

// statement_timeout bounds a statement that waits for something other
// than a row lock, so that a slow store is an error.
func TestPostgresStatementTimeout(t *testing.T) {
	dsn := pgtest.FreshDSN(t)
	s, err := OpenPostgres(context.Background(), dsn, Options{StatementTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	db := s.(*sqlStore).db
	t0 := time.Now()
	_, err = db.ExecContext(context.Background(), "SELECT pg_sleep(3)")
	if err == nil || time.Since(t0) > 2*time.Second {
		t.Fatalf("pg_sleep(3) with statement_timeout 300ms: err %v after %v", err, time.Since(t0))
	}
}
