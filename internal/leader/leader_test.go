package leader

import (
	"context"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func testDSN(t *testing.T) string {
	dsn := os.Getenv("LLMF_TEST_POSTGRES_DSN")
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("LLMF_TEST_POSTGRES_DSN is unset but CI=true: PostgreSQL tests must not be skipped in CI")
		}
		t.Skip("PostgreSQL tests skipped: LLMF_TEST_POSTGRES_DSN is unset")
	}
	return dsn
}

// Of several electors on one key exactly one leads; when its connection
// dies (the process was killed), another takes over at its next campaign.
func TestOneLeaderAndTakeover(t *testing.T) {
	dsn := testDSN(t)
	ctx := context.Background()
	key := rand.Int64() // no other test shares it
	es := []*Elector{New(dsn, key), New(dsn, key), New(dsn, key), New(dsn, key)}
	defer func() {
		for _, e := range es {
			e.Resign()
		}
	}()
	var wg sync.WaitGroup
	won := make([]bool, len(es))
	for i, e := range es {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := e.Campaign(ctx)
			if err != nil {
				t.Error(err)
			}
			won[i] = ok
		}()
	}
	wg.Wait()
	leader := -1
	for i, w := range won {
		if w {
			if leader >= 0 {
				t.Fatalf("two leaders: %d and %d", leader, i)
			}
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no leader")
	}
	// A leader's second campaign keeps the lock; a follower's still fails.
	if ok, _ := es[leader].Campaign(ctx); !ok {
		t.Fatal("the leader lost its lock on its own")
	}
	other := (leader + 1) % len(es)
	if ok, _ := es[other].Campaign(ctx); ok {
		t.Fatal("a follower took a held lock")
	}

	// Kill the leader's session from outside, as a crash would.
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var pid uint32
	es[leader].op.Lock()
	pid = es[leader].conn.PgConn().PID()
	es[leader].op.Unlock()
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	// The backend exits, and frees the lock, a moment after it is
	// signalled: a follower takes over at one of its next campaigns.
	var took bool
	for range 50 {
		ok, err := es[other].Campaign(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if took = ok; took {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !took {
		t.Fatal("no takeover within 5s after the leader died")
	}
	if ok, _ := es[leader].Campaign(ctx); ok {
		t.Fatal("the dead leader still thinks it leads")
	}
	if es[leader].IsLeader() || !es[other].IsLeader() {
		t.Fatal("IsLeader disagrees with the campaigns")
	}
}
