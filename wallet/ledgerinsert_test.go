package wallet

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestLedgerInsertForms settles one batch whose rows take every path of
// insertRows: a client's group large enough for the shared form (with a
// tail past its power of two), a small group, a group of releases, and a
// settlement whose two rows differ (each-row form). Every row must come
// back with every column as settled (its own trace ID too), a request's
// rows in their order.
func TestLedgerInsertForms(t *testing.T) {
	s := openSQLiteT(t)
	sq := s.(*sqlStore)
	ctx := context.Background()
	mustAccount(t, s, "x", 1_000_000_000)
	mustAccount(t, s, "y", 1_000_000_000)
	type settlement struct {
		r       Reservation
		entries []Entry
	}
	var all []settlement
	add := func(account, key string, entries ...Entry) {
		id := testReservationID()
		for i := range entries {
			entries[i].RequestID = "req-" + id
			entries[i].TraceID = fmt.Sprintf("%032x", len(all)<<4|i)
		}
		all = append(all, settlement{Reservation{ID: id, Account: account, KeyID: key, Model: "m", Amount: 1000}, entries})
	}
	for i := range 150 { // 128 and 16 shared, 6 each-row
		add("x", "kx", Entry{Model: "m", UpstreamModel: "m-2025", Channel: "c1", TokensIn: int64(10 + i), TokensOut: int64(i), Cost: Micros(100 + i)})
	}
	for i := range 3 { // too few for the shared form
		add("y", "ky", Entry{Model: "m", UpstreamModel: "m", Channel: "c2", TokensIn: 5, TokensOut: int64(i), Cost: Micros(7 + i)})
	}
	for range 9 { // releases: nothing served
		add("x", "kx", Entry{Model: "m"})
	}
	add("y", "ky", // a resumed answer: two channels
		Entry{Model: "m", UpstreamModel: "m", Channel: "c2", TokensIn: 5, TokensOut: 3, Cost: 30},
		Entry{Model: "m", UpstreamModel: "m-2025", Channel: "c1", TokensIn: 9, TokensOut: 4, Cost: 40, Note: "continuation"})
	for _, st := range all {
		if err := s.Reserve(ctx, st.r); err != nil {
			t.Fatal(err)
		}
	}

	release := holdWriter(t, sq)
	batches := sq.settles.batches.Load()
	done := make(chan error, len(all))
	before := time.Now()
	for _, st := range all {
		s.SettleAsync(st.r.ID, st.entries, func(_ Micros, err error) { done <- err })
	}
	release()
	for range all {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if got := sq.settles.batches.Load() - batches; got != 1 {
		t.Fatalf("%d batches, want 1", got)
	}
	if got, want := preparedInserts(sq, sharedForm), []int{8, 16, 128}; !slices.Equal(got, want) { // x's charges, 8 of its releases
		t.Errorf("shared-form INSERTs of %v rows prepared, want %v", got, want)
	}

	got := map[string][]Entry{} // by request, oldest first
	for _, account := range []string{"x", "y"} {
		usage, err := s.Usage(ctx, account, 0, MaxUsageLimit)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range slices.Backward(usage) {
			if e.Kind != KindCredit {
				got[e.RequestID] = append(got[e.RequestID], e)
			}
		}
	}
	for _, st := range all {
		rows := got["req-"+st.r.ID]
		if len(rows) != len(st.entries) {
			t.Errorf("request %s: %d rows, want %d", st.r.ID, len(rows), len(st.entries))
			continue
		}
		for i, want := range st.entries {
			want.Kind, want.Account, want.KeyID = KindCharge, st.r.Account, st.r.KeyID
			if want.Cost == 0 {
				want.Kind = KindRelease
			}
			e := rows[i]
			if e.Time.Before(before.Truncate(time.Microsecond)) || e.Time.After(time.Now()) {
				t.Errorf("request %s row %d: time %v", st.r.ID, i, e.Time)
			}
			e.ID, e.Time = 0, time.Time{}
			if fmt.Sprint(e) != fmt.Sprint(want) {
				t.Errorf("request %s row %d:\n got %+v\nwant %+v", st.r.ID, i, e, want)
			}
		}
	}
	wantCleanAudit(t, s)
}

// preparedInserts is the row counts of sq's prepared INSERTs of form.
func preparedInserts(sq *sqlStore, form int) []int {
	var sizes []int
	for i, st := range sq.inserts.byRows[form] {
		if st != nil {
			sizes = append(sizes, 1<<i)
		}
	}
	return sizes
}
