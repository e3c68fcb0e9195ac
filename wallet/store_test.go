package wallet

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
)

func openPG(tb testing.TB, dsn string) Store {
	tb.Helper()
	s, err := OpenPostgres(context.Background(), dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

func openSQLiteT(tb testing.TB) Store {
	tb.Helper()
	s, err := OpenSQLite(filepath.Join(tb.TempDir(), "sub", "wallet.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

var backends = []struct {
	name string
	open func(testing.TB) Store
}{
	{"sqlite", openSQLiteT},
	{"postgres", func(tb testing.TB) Store { return openPG(tb, pgtest.FreshDSN(tb)) }},
}

func forEachStore(t *testing.T, f func(t *testing.T, s Store)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { f(t, b.open(t)) })
	}
}

func mustAccount(t testing.TB, s Store, id string, balance Micros) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.CreateAccount(ctx, id); err != nil {
		t.Fatal(err)
	}
	if balance > 0 {
		if _, err := s.Credit(ctx, id, balance, "test top-up"); err != nil {
			t.Fatal(err)
		}
	}
}

func getAccount(t testing.TB, s Store, id string) Account {
	t.Helper()
	a, err := s.Account(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func wantErr(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error = %v, want %v", err, target)
	}
}

func TestReserveSettle(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "acme", 10_000_000)
		r := Reservation{ID: testReservationID(), Account: "acme", KeyID: "key_1", Model: "gpt-4o", RequestID: "req-1", Amount: 3_000_000}
		if err := s.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
		if a := getAccount(t, s, "acme"); a.Balance != 10_000_000 || a.Reserved != 3_000_000 || a.Available() != 7_000_000 {
			t.Fatalf("after reserve: %+v", a)
		}
		charged, err := s.Settle(ctx, r.ID, Entry{Channel: "openai-east", TokensIn: 100, TokensOut: 50, Cost: 1_500_000})
		if err != nil || charged != 1_500_000 {
			t.Fatalf("Settle = %s, %v", charged, err)
		}
		if a := getAccount(t, s, "acme"); a.Balance != 8_500_000 || a.Reserved != 0 {
			t.Fatalf("after settle: %+v", a)
		}
		// A second settle, and a late release, must be no-ops.
		_, err = s.Settle(ctx, r.ID, Entry{Cost: 1_500_000})
		wantErr(t, err, ErrNotFound)
		_, err = s.Settle(ctx, r.ID, Entry{})
		wantErr(t, err, ErrNotFound)
		if a := getAccount(t, s, "acme"); a.Balance != 8_500_000 || a.Reserved != 0 {
			t.Fatalf("after double settle: %+v", a)
		}
		rows, err := s.Usage(ctx, "acme", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 2 {
			t.Fatalf("ledger has %d rows: %+v", len(rows), rows)
		}
		e := rows[0]
		if e.Kind != KindCharge || e.Account != "acme" || e.KeyID != "key_1" || e.Model != "gpt-4o" || e.Channel != "openai-east" ||
			e.RequestID != "req-1" || e.TokensIn != 100 || e.TokensOut != 50 || e.Cost != 1_500_000 || e.Time.IsZero() {
			t.Errorf("charge row = %+v", e)
		}
		if rows[1].Kind != KindCredit || rows[1].Cost != 10_000_000 || rows[1].Note != "test top-up" {
			t.Errorf("credit row = %+v", rows[1])
		}
	})
}

func TestSettleCapAndRelease(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "a", 5_000_000)
		capped := Reservation{ID: testReservationID(), Account: "a", Amount: 1_000_000}
		if err := s.Reserve(ctx, capped); err != nil {
			t.Fatal(err)
		}
		charged, err := s.Settle(ctx, capped.ID, Entry{Cost: 2_500_000, Note: "stream"})
		if err != nil || charged != 1_000_000 {
			t.Fatalf("capped Settle = %s, %v; want the reservation, 1", charged, err)
		}
		released := Reservation{ID: testReservationID(), Account: "a", Amount: 2_000_000, Model: "m"}
		if err := s.Reserve(ctx, released); err != nil {
			t.Fatal(err)
		}
		if charged, err := s.Settle(ctx, released.ID, Entry{}); err != nil || charged != 0 {
			t.Fatalf("release = %s, %v", charged, err)
		}
		if a := getAccount(t, s, "a"); a.Balance != 4_000_000 || a.Reserved != 0 {
			t.Fatalf("account = %+v", a)
		}
		rows, _ := s.Usage(ctx, "a", 0, 10)
		if rows[0].Kind != KindRelease || rows[0].Cost != 0 || rows[0].Model != "m" {
			t.Errorf("release row = %+v", rows[0])
		}
		if rows[1].Kind != KindCharge || rows[1].Cost != 1_000_000 || !strings.Contains(rows[1].Note, "capped") || !strings.Contains(rows[1].Note, "stream") {
			t.Errorf("capped row = %+v", rows[1])
		}
	})
}

func TestReserveErrors(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "poor", 1_000)
		wantErr(t, s.Reserve(ctx, Reservation{ID: testReservationID(), Account: "poor", Amount: 1_001}), ErrInsufficientFunds)
		wantErr(t, s.Reserve(ctx, Reservation{ID: testReservationID(), Account: "ghost", Amount: 1}), ErrUnknownAccount)
		wantErr(t, s.Reserve(ctx, Reservation{ID: testReservationID(), Account: "poor", Amount: -1}), ErrInvalid)
		wantErr(t, s.Reserve(ctx, Reservation{Account: "poor", Amount: 1}), ErrInvalid)
		// Exactly the available balance is fine, and then nothing more is.
		if err := s.Reserve(ctx, Reservation{ID: testReservationID(), Account: "poor", Amount: 1_000}); err != nil {
			t.Fatal(err)
		}
		wantErr(t, s.Reserve(ctx, Reservation{ID: testReservationID(), Account: "poor", Amount: 1}), ErrInsufficientFunds)
		// A free request still fits.
		if err := s.Reserve(ctx, Reservation{ID: testReservationID(), Account: "poor", Amount: 0}); err != nil {
			t.Fatal(err)
		}
		if a := getAccount(t, s, "poor"); a.Reserved != 1_000 || a.Balance != 1_000 {
			t.Fatalf("account = %+v", a)
		}
		// A failed reservation leaves no trace.
		rows, _ := s.Usage(ctx, "poor", 0, 0)
		if len(rows) != 1 {
			t.Errorf("ledger = %+v", rows)
		}
	})
}

func TestRecordAttempt(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "a", 1_000_000)
		err := s.RecordAttempt(ctx, Entry{Kind: KindCharge, Account: "a", KeyID: "k", Model: "gpt-4o", Channel: "azure", RequestID: "r1", TokensIn: 10, Cost: 999, Note: "upstream 503"})
		if err != nil {
			t.Fatal(err)
		}
		rows, _ := s.Usage(ctx, "a", 0, 1)
		e := rows[0]
		if e.Kind != KindFailedAttempt || e.Cost != 0 || e.Channel != "azure" || e.Note != "upstream 503" || e.TokensIn != 10 {
			t.Errorf("attempt row = %+v", e)
		}
		if a := getAccount(t, s, "a"); a.Balance != 1_000_000 {
			t.Errorf("balance changed: %+v", a)
		}
		if err := s.RecordAttempt(ctx, Entry{Account: "ghost"}); err == nil {
			t.Error("attempt for unknown account accepted")
		}
	})
}

func TestSweep(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "a", 10_000_000)
		mustAccount(t, s, "b", 10_000_000)
		now := time.Now()
		old1 := Reservation{ID: testReservationID(), Account: "a", RequestID: "old1", Amount: 1_000_000, ExpiresAt: now.Add(-time.Minute)}
		old2 := Reservation{ID: testReservationID(), Account: "b", RequestID: "old2", Amount: 2_000_000, ExpiresAt: now}
		fresh := Reservation{ID: testReservationID(), Account: "a", RequestID: "fresh", Amount: 3_000_000, ExpiresAt: now.Add(time.Minute)}
		deflt := Reservation{ID: testReservationID(), Account: "a", RequestID: "default-ttl", Amount: 500_000}
		for _, r := range []Reservation{old1, old2, fresh, deflt} {
			if err := s.Reserve(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		n, err := s.Sweep(ctx, now)
		if err != nil || n != 2 {
			t.Fatalf("Sweep = %d, %v; want 2", n, err)
		}
		if a := getAccount(t, s, "a"); a.Reserved != 3_500_000 || a.Balance != 10_000_000 {
			t.Errorf("a = %+v", a)
		}
		if b := getAccount(t, s, "b"); b.Reserved != 0 || b.Balance != 10_000_000 {
			t.Errorf("b = %+v", b)
		}
		rows, _ := s.Usage(ctx, "b", 0, 0)
		if rows[0].Kind != KindExpired || rows[0].RequestID != "old2" || rows[0].Cost != 0 || !strings.Contains(rows[0].Note, old2.ID) {
			t.Errorf("expired row = %+v", rows[0])
		}
		// A settle arriving after the sweep must not charge or release again.
		_, err = s.Settle(ctx, old1.ID, Entry{Cost: 1})
		wantErr(t, err, ErrNotFound)
		if n, err := s.Sweep(ctx, now); err != nil || n != 0 {
			t.Fatalf("second Sweep = %d, %v", n, err)
		}
		// The unexpired one still settles normally.
		if c, err := s.Settle(ctx, fresh.ID, Entry{Cost: 10}); err != nil || c != 10 {
			t.Fatalf("Settle(fresh) = %s, %v", c, err)
		}
		// Far in the future everything is expired, default TTL included.
		if n, err := s.Sweep(ctx, now.Add(DefaultReservationTTL+time.Second)); err != nil || n != 1 {
			t.Fatalf("late Sweep = %d, %v", n, err)
		}
		if a := getAccount(t, s, "a"); a.Reserved != 0 || a.Balance != 10_000_000-10 {
			t.Errorf("a = %+v", a)
		}
	})
}

func TestSweepManyBatches(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "a", 1_000_000_000)
		past := time.Now().Add(-time.Hour)
		const n = sweepBatch*2 + 7
		for i := 0; i < n; i++ {
			if err := s.Reserve(ctx, Reservation{ID: testReservationID(), Account: "a", Amount: 1000, ExpiresAt: past}); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.Sweep(ctx, time.Now())
		if err != nil || got != n {
			t.Fatalf("Sweep = %d, %v; want %d", got, err, n)
		}
		if a := getAccount(t, s, "a"); a.Reserved != 0 {
			t.Errorf("a = %+v", a)
		}
	})
}

func TestCredit(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "a", 0)
		_, err := s.CreateAccount(ctx, "a")
		wantErr(t, err, ErrAccountExists)
		_, err = s.CreateAccount(ctx, "")
		wantErr(t, err, ErrInvalid)
		a, err := s.Credit(ctx, "a", 5_000_000, "invoice 1")
		if err != nil || a.Balance != 5_000_000 {
			t.Fatalf("Credit = %+v, %v", a, err)
		}
		if err := s.Reserve(ctx, Reservation{ID: testReservationID(), Account: "a", Amount: 4_000_000}); err != nil {
			t.Fatal(err)
		}
		// A correction may take only what is not reserved.
		_, err = s.Credit(ctx, "a", -1_000_001, "too much")
		wantErr(t, err, ErrInsufficientFunds)
		a, err = s.Credit(ctx, "a", -1_000_000, "refund")
		if err != nil || a.Balance != 4_000_000 || a.Available() != 0 {
			t.Fatalf("correction = %+v, %v", a, err)
		}
		_, err = s.Credit(ctx, "a", 0, "")
		wantErr(t, err, ErrInvalid)
		_, err = s.Credit(ctx, "ghost", 1, "")
		wantErr(t, err, ErrUnknownAccount)
		_, err = s.Credit(ctx, "a", 1<<62, "")
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Credit(ctx, "a", 1<<62, "overflow")
		wantErr(t, err, ErrInvalid)
		rows, _ := s.Usage(ctx, "a", 0, 0)
		if len(rows) != 3 || rows[1].Kind != KindCredit || rows[1].Cost != -1_000_000 || rows[1].Note != "refund" {
			t.Errorf("ledger = %+v", rows)
		}
		accts, err := s.Accounts(ctx)
		if err != nil || len(accts) != 1 || accts[0].ID != "a" {
			t.Errorf("Accounts = %+v, %v", accts, err)
		}
		_, err = s.Account(ctx, "ghost")
		wantErr(t, err, ErrUnknownAccount)
	})
}

// What an operator's script can send that one database would store and
// the other refuse is refused by both, as ErrInvalid: IDs that are not
// one path segment of the admin API, and text PostgreSQL cannot hold.
// An unknown account's usage is ErrUnknownAccount, as its keys are.
func TestInvalidAdminInput(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		for _, id := range []string{"team/a", ".", "..", "a\x00b", "\xff\xfe"} {
			_, err := s.CreateAccount(ctx, id)
			wantErr(t, err, ErrInvalid)
		}
		mustAccount(t, s, "a", 0)
		_, _, err := s.CreateKey(ctx, "a", "nul\x00label")
		wantErr(t, err, ErrInvalid)
		_, _, err = s.CreateKey(ctx, "a", "\xc3\x28")
		wantErr(t, err, ErrInvalid)
		_, err = s.Credit(ctx, "a", 1, "note\x00")
		wantErr(t, err, ErrInvalid)
		if a := getAccount(t, s, "a"); a.Balance != 0 {
			t.Errorf("balance %v after a refused credit", a.Balance)
		}
		_, err = s.Usage(ctx, "ghost", 0, 0)
		wantErr(t, err, ErrUnknownAccount)
		if rows, err := s.Usage(ctx, "a", 0, 0); err != nil || len(rows) != 0 {
			t.Errorf("usage of an account with no rows: %v, %v", rows, err)
		}
	})
}

var keyPattern = regexp.MustCompile(`^sk-llmf-[0-9A-Za-z]{40}$`)

func TestKeys(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "a", 0)
		plain, k, err := s.CreateKey(ctx, "a", "laptop")
		if err != nil {
			t.Fatal(err)
		}
		if !keyPattern.MatchString(plain) || !strings.HasPrefix(plain, k.Prefix) || len(k.Prefix) != len(KeyPrefix)+keyListPrefixLen {
			t.Fatalf("key %q prefix %q", plain, k.Prefix)
		}
		plain2, _, err := s.CreateKey(ctx, "a", "ci")
		if err != nil || plain2 == plain {
			t.Fatalf("second key %q, %v", plain2, err)
		}
		got, err := s.Authenticate(ctx, plain)
		if err != nil || got.ID != k.ID || got.Account != "a" || got.Label != "laptop" || got.RevokedAt != nil {
			t.Fatalf("Authenticate = %+v, %v", got, err)
		}
		keys, err := s.Keys(ctx, "a")
		if err != nil || len(keys) != 2 {
			t.Fatalf("Keys = %+v, %v", keys, err)
		}
		if err := s.RevokeKey(ctx, k.ID); err != nil {
			t.Fatal(err)
		}
		got, err = s.Authenticate(ctx, plain)
		wantErr(t, err, ErrKeyRevoked)
		if got.ID != k.ID || got.RevokedAt == nil {
			t.Errorf("revoked key = %+v", got)
		}
		wantErr(t, s.RevokeKey(ctx, k.ID), ErrKeyRevoked)
		wantErr(t, s.RevokeKey(ctx, "key_nope"), ErrUnknownKey)
		if _, err := s.Authenticate(ctx, plain2); err != nil {
			t.Errorf("other key: %v", err)
		}
		for _, bad := range []string{"", "sk-llmf-", plain + "x", strings.Replace(plain, "sk-llmf-", "sk-llmx-", 1), plain[:len(plain)-1] + "!", "sk-llmf-" + strings.Repeat("A", 40)} {
			_, err := s.Authenticate(ctx, bad)
			wantErr(t, err, ErrUnknownKey)
		}
		_, _, err = s.CreateKey(ctx, "ghost", "")
		wantErr(t, err, ErrUnknownAccount)
		_, err = s.Keys(ctx, "ghost")
		wantErr(t, err, ErrUnknownAccount)
		mustAccount(t, s, "empty", 0)
		if keys, err := s.Keys(ctx, "empty"); err != nil || len(keys) != 0 {
			t.Errorf("Keys(empty) = %+v, %v", keys, err)
		}
	})
}

func TestUsagePaging(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "a", 1_000_000)
		mustAccount(t, s, "other", 1_000_000)
		for i := 0; i < 24; i++ {
			if err := s.RecordAttempt(ctx, Entry{Account: "a", RequestID: fmt.Sprint("r", i)}); err != nil {
				t.Fatal(err)
			}
			if err := s.RecordAttempt(ctx, Entry{Account: "other"}); err != nil {
				t.Fatal(err)
			}
		}
		var all []Entry
		before := int64(0)
		pages := 0
		for {
			page, err := s.Usage(ctx, "a", before, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			pages++
			all = append(all, page...)
			before = page[len(page)-1].ID
		}
		if pages != 3 || len(all) != 25 {
			t.Fatalf("%d pages, %d rows; want 3, 25", pages, len(all))
		}
		for i, e := range all {
			if e.Account != "a" {
				t.Fatalf("row of another account: %+v", e)
			}
			if i > 0 && e.ID >= all[i-1].ID {
				t.Fatalf("not newest first at %d", i)
			}
		}
		if all[0].RequestID != "r23" || all[24].Kind != KindCredit {
			t.Errorf("first %+v last %+v", all[0], all[24])
		}
	})
}

func TestLedgerAppendOnly(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "a", 1_000_000)
		db := s.(*sqlStore).db
		if _, err := db.ExecContext(ctx, `UPDATE ledger SET cost = 0`); err == nil {
			t.Error("ledger UPDATE succeeded")
		}
		if _, err := db.ExecContext(ctx, `DELETE FROM ledger`); err == nil {
			t.Error("ledger DELETE succeeded")
		}
		// The CHECK constraints back up the code: no overdraft even by hand.
		if _, err := db.ExecContext(ctx, `UPDATE accounts SET reserved = balance + 1`); err == nil {
			t.Error("reserved > balance accepted")
		}
	})
}

func TestReopenSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.db")
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	mustAccount(t, s, "a", 42)
	s.Close()
	s, err = OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if a := getAccount(t, s, "a"); a.Balance != 42 {
		t.Errorf("after reopen: %+v", a)
	}
	if err := s.Ping(context.Background()); err != nil {
		t.Error(err)
	}
}

// runInvariant is THE no-overdraft test: an account whose balance covers
// exactly `slots` reservations is hammered by `attempts` concurrent Reserve
// calls spread over the given stores (one per "gateway instance").
func runInvariant(t *testing.T, stores []Store, slots, attempts int) {
	ctx := context.Background()
	const amount = Micros(123_457)
	balance := amount * Micros(slots)
	mustAccount(t, stores[0], "hot", balance)

	var (
		wg         sync.WaitGroup
		mu         sync.Mutex
		ids        []string
		refused    atomic.Int64
		unexpected atomic.Int64
		start      = make(chan struct{})
	)
	for i := 0; i < attempts; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s := stores[i%len(stores)]
			id := testReservationID()
			<-start
			err := s.Reserve(ctx, Reservation{ID: id, Account: "hot", Amount: amount, RequestID: fmt.Sprint("req-", i)})
			switch {
			case err == nil:
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
			case errors.Is(err, ErrInsufficientFunds):
				refused.Add(1)
			default:
				unexpected.Add(1)
				t.Errorf("Reserve: %v", err)
			}
		}(i)
	}
	close(start)
	wg.Wait()
	if unexpected.Load() > 0 {
		t.FailNow()
	}
	if len(ids) != slots || int(refused.Load()) != attempts-slots {
		t.Fatalf("%d reservations succeeded, %d refused; want exactly %d and %d", len(ids), refused.Load(), slots, attempts-slots)
	}
	if a := getAccount(t, stores[0], "hot"); a.Reserved != balance || a.Available() != 0 {
		t.Fatalf("after reserving: %+v", a)
	}

	// Settle each twice, concurrently and from different instances: exactly
	// one of each pair may charge.
	var charged atomic.Int64
	var notFound atomic.Int64
	for i, id := range ids {
		cost := Micros(i) * amount / Micros(slots) // varied, 0 ≤ cost < amount
		if i == len(ids)-1 {
			cost = amount * 2 // and one over-run, capped at the reservation
		}
		for j := 0; j < 2; j++ {
			wg.Add(1)
			go func(s Store) {
				defer wg.Done()
				c, err := s.Settle(ctx, id, Entry{Cost: cost, Channel: "ch"})
				switch {
				case err == nil:
					charged.Add(int64(c))
				case errors.Is(err, ErrNotFound):
					notFound.Add(1)
				default:
					t.Errorf("Settle: %v", err)
				}
			}(stores[(i+j)%len(stores)])
		}
	}
	wg.Wait()
	if int(notFound.Load()) != slots {
		t.Errorf("%d duplicate settles reported ErrNotFound, want %d", notFound.Load(), slots)
	}

	// What the leases still hold goes back at the keep-alive tick (Sweep
	// returns spare lease money).
	for _, s := range stores {
		if _, err := s.Sweep(ctx, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	a := getAccount(t, stores[0], "hot")
	if a.Balance < 0 || a.Reserved != 0 {
		t.Fatalf("after settling and sweeping: %+v", a)
	}
	var ledgerCharges, ledgerCredits Micros
	var chargeRows int
	for before := int64(0); ; {
		page, err := stores[0].Usage(ctx, "hot", before, MaxUsageLimit)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, e := range page {
			switch e.Kind {
			case KindCharge, KindRelease:
				ledgerCharges += e.Cost
				chargeRows++
			case KindCredit:
				ledgerCredits += e.Cost
			}
		}
		before = page[len(page)-1].ID
	}
	if chargeRows != slots {
		t.Errorf("%d settlement rows, want %d", chargeRows, slots)
	}
	if ledgerCharges != Micros(charged.Load()) || balance-a.Balance != ledgerCharges || ledgerCredits-ledgerCharges != a.Balance {
		t.Errorf("ledger charges %s, returned charges %d, balance change %s", ledgerCharges, charged.Load(), balance-a.Balance)
	}
	if rows, err := stores[0].Audit(ctx, "hot"); err != nil || len(rows) != 1 || !rows[0].Clean() {
		t.Errorf("audit = %+v, %v", rows, err)
	}
}

func TestNoOverdraftUnderLoad(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		runInvariant(t, []Store{openSQLiteT(t)}, 10, 1000)
	})
	t.Run("sqlite-two-handles", func(t *testing.T) {
		// Two handles on one file: the in-process write queue is per
		// handle, so this exercises SQLite's own locking (busy_timeout).
		path := filepath.Join(t.TempDir(), "w.db")
		var stores []Store
		for i := 0; i < 2; i++ {
			s, err := OpenSQLite(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			stores = append(stores, s)
		}
		runInvariant(t, stores, 10, 1000)
	})
	t.Run("postgres", func(t *testing.T) {
		runInvariant(t, []Store{openPG(t, pgtest.FreshDSN(t))}, 10, 1000)
	})
	t.Run("postgres-two-instances", func(t *testing.T) {
		dsn := pgtest.FreshDSN(t)
		// Open concurrently too: the advisory lock must serialise migrations.
		var stores [2]Store
		var wg sync.WaitGroup
		for i := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := OpenPostgres(context.Background(), dsn)
				if err != nil {
					t.Error(err)
					return
				}
				stores[i] = s
			}()
		}
		wg.Wait()
		for _, s := range stores {
			if s == nil {
				t.FailNow()
			}
			t.Cleanup(func() { s.Close() })
		}
		runInvariant(t, stores[:], 10, 1000)
	})
}
