package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
)

// testPins: a pin is read back until it expires; a later turn's pin
// replaces it and an older one written late does not; Prune deletes the
// expired.
func testPins(t *testing.T, s *Store) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	p := Pin{Model: "m", Conversation: "pck:c1", Channel: "a", Cached: 2000, Output: 40, Expires: now.Add(5 * time.Minute)}
	if err := s.SavePins(ctx, []Pin{p, {Model: "other", Conversation: "pck:c1", Channel: "x", Expires: now.Add(time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := s.PinOf(ctx, "m", "pck:c1", now); err != nil || !ok || got != p {
		t.Fatalf("PinOf = %+v, %v, %v; want %+v", got, ok, err, p)
	}
	if _, ok, err := s.PinOf(ctx, "m", "pck:c2", now); err != nil || ok {
		t.Fatalf("an unknown conversation: %v, %v", ok, err)
	}
	if _, ok, _ := s.PinOf(ctx, "m", "pck:c1", p.Expires); ok {
		t.Fatal("a pin is read at its expiry")
	}

	later := p
	later.Channel, later.Cached, later.Expires = "b", 2500, now.Add(6*time.Minute)
	stale := p
	stale.Channel, stale.Expires = "c", now.Add(5*time.Minute+time.Second)
	if err := s.SavePins(ctx, []Pin{later, stale}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.PinOf(ctx, "m", "pck:c1", now); got != later {
		t.Fatalf("after a later turn and a stale one: %+v, want %+v", got, later)
	}

	if err := s.Prune(ctx, now.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM llmf_affinity").Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d pins after pruning the expired one, %v; want 1", n, err)
	}
}

func TestSQLitePins(t *testing.T) {
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "history.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testPins(t, s)
}

func TestPostgresPins(t *testing.T) {
	s, err := OpenPostgres(context.Background(), pgtest.FreshDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testPins(t, s)
}
