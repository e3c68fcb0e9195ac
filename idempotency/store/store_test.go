package store

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/idempotency"
	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
)

func testStore(t *testing.T, s *Store) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	lease, keep := now.Add(10*time.Second), now.Add(5*time.Minute)
	c, err := s.Claim(ctx, "c1", "fp", "A", lease, keep, now)
	if err != nil || c.State != Claimed {
		t.Fatalf("first claim: %+v, %v", c, err)
	}
	if c, _ := s.Claim(ctx, "c1", "fp", "B", lease, keep, now); c.State != Running || c.Fingerprint != "fp" {
		t.Fatalf("a second instance's claim while A runs it: %+v", c)
	}
	// A renews, then dies: once its lease passes, B takes the call over.
	if err := s.Renew(ctx, "c1", "A", now.Add(20*time.Second)); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.Claim(ctx, "c1", "fp", "B", lease, keep, now.Add(15*time.Second)); c.State != Running {
		t.Fatalf("claim within A's renewed lease: %+v", c)
	}
	if c, _ := s.Claim(ctx, "c1", "fp", "B", now.Add(40*time.Second), keep, now.Add(21*time.Second)); c.State != Claimed {
		t.Fatalf("claim after A's lease: %+v", c)
	}
	// A, back from the dead, cannot complete B's call.
	a := &idempotency.Answer{Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":1}`)}
	if err := s.Complete(ctx, "c1", "A", &idempotency.Answer{Status: 500}, keep); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "c1", "B", a, keep); err != nil {
		t.Fatal(err)
	}
	c, err = s.Claim(ctx, "c1", "fp", "C", lease, keep, now.Add(time.Minute))
	if err != nil || c.State != Done || c.Answer == nil || c.Answer.Status != 200 || string(c.Answer.Body) != `{"ok":1}` ||
		c.Answer.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("after completion: %+v %+v, %v", c, c.Answer, err)
	}
	// Expired, the key runs again.
	if c, _ := s.Claim(ctx, "c1", "fp2", "C", lease, now.Add(time.Hour), keep); c.State != Claimed {
		t.Fatalf("after expiry: %+v", c)
	}

	// A tombstone; an abandoned (failed) call.
	_, _ = s.Claim(ctx, "big", "fp", "A", lease, keep, now)
	_ = s.Complete(ctx, "big", "A", nil, keep)
	if c, _ := s.Claim(ctx, "big", "fp", "B", lease, keep, now); c.State != Done || c.Answer != nil {
		t.Fatalf("a tombstone: %+v", c)
	}
	_, _ = s.Claim(ctx, "failed", "fp", "A", lease, keep, now)
	_ = s.Abandon(ctx, "failed", "A")
	if c, _ := s.Claim(ctx, "failed", "fp", "B", lease, keep, now); c.State != Claimed {
		t.Fatalf("after a failure: %+v", c)
	}

	if n, err := s.Sweep(ctx, keep.Add(2*time.Hour)); err != nil || n != 3 {
		t.Fatalf("swept %d, %v; want 3", n, err)
	}
}

func TestSQLiteStore(t *testing.T) {
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testStore(t, s)
}

func TestPostgresStore(t *testing.T) {
	s, err := OpenPostgres(context.Background(), pgtest.FreshDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testStore(t, s)
}
