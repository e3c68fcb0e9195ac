package wallet

import (
	"context"
	"strings"
	"testing"
)

// A resumed answer settles as two rows, charged in order and capped
// together at the reservation: the first row is charged in full, the
// second gets what is left and says it was capped.
func TestSettleSeveralRows(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "acme", 10_000_000)
		whole := Reservation{ID: testReservationID(), Account: "acme", KeyID: "key_1", Model: "claude", RequestID: "req-1", Amount: 3_000_000}
		capped := Reservation{ID: testReservationID(), Account: "acme", Model: "claude", RequestID: "req-2", Amount: 1_000_000}
		for _, r := range []Reservation{whole, capped} {
			if err := s.Reserve(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		first := Entry{Channel: "a", UpstreamModel: "claude-a", TokensIn: 100, TokensOut: 40, Cost: 700_000, Note: "estimated", TraceID: "5b8efff798038103d269b633813fc60c"}
		cont := Entry{Channel: "b", UpstreamModel: "claude-b", TokensIn: 140, TokensOut: 20, Cost: 500_000, TraceID: "5b8efff798038103d269b633813fc60c"}
		if c, err := s.Settle(ctx, whole.ID, first, cont); err != nil || c != 1_200_000 {
			t.Fatalf("Settle(two rows) = %s, %v", c, err)
		}
		if c, err := s.Settle(ctx, capped.ID, first, cont); err != nil || c != 1_000_000 {
			t.Fatalf("Settle(two rows over the reservation) = %s, %v", c, err)
		}
		_, err := s.Settle(ctx, whole.ID, first, cont)
		wantErr(t, err, ErrNotFound)
		if a := getAccount(t, s, "acme"); a.Balance != 10_000_000-2_200_000 || a.Reserved != 0 {
			t.Fatalf("account = %+v", a)
		}
		rows, err := s.Usage(ctx, "acme", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 5 {
			t.Fatalf("ledger has %d rows: %+v", len(rows), rows)
		}
		// Newest first: req-2's continuation, req-2's first, req-1's
		// continuation, req-1's first, the credit.
		c2, f2, c1, f1 := rows[0], rows[1], rows[2], rows[3]
		if f1.Kind != KindCharge || f1.Channel != "a" || f1.UpstreamModel != "claude-a" || f1.TokensIn != 100 || f1.TokensOut != 40 ||
			f1.Cost != 700_000 || f1.Note != "estimated" || f1.KeyID != "key_1" || f1.RequestID != "req-1" || f1.Model != "claude" ||
			f1.TraceID != "5b8efff798038103d269b633813fc60c" {
			t.Errorf("first row = %+v", f1)
		}
		if c1.Kind != KindCharge || c1.Channel != "b" || c1.UpstreamModel != "claude-b" || c1.TokensIn != 140 || c1.TokensOut != 20 ||
			c1.Cost != 500_000 || c1.Note != "" || c1.KeyID != "key_1" || c1.RequestID != "req-1" ||
			c1.TraceID != "5b8efff798038103d269b633813fc60c" {
			t.Errorf("continuation row = %+v", c1)
		}
		if f2.Cost != 700_000 || strings.Contains(f2.Note, "capped") {
			t.Errorf("capped request's first row = %+v", f2)
		}
		if c2.Cost != 300_000 || c2.Kind != KindCharge || !strings.Contains(c2.Note, "capped") || c2.RequestID != "req-2" {
			t.Errorf("capped request's continuation row = %+v", c2)
		}
		audit, err := s.Audit(ctx, "acme")
		if err != nil || len(audit) != 1 || !audit[0].Clean() {
			t.Fatalf("audit = %+v, %v", audit, err)
		}
	})
}
