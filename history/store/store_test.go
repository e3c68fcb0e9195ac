package store

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
	"github.com/llmfailover/caddy-llm-failover/internal/sqlitefile"
	"github.com/llmfailover/caddy-llm-failover/journal"
)

var now = time.Date(2026, 3, 2, 0, 1, 30, 0, time.UTC)

// instance records attempts the way one gateway does and flushes them;
// each attempt stands for a client request of its model too (what the
// store keeps of a model is its requests).
func instance(t *testing.T, s *Store, attempts []history.Attempt, decisions []journal.Decision) {
	t.Helper()
	r := history.NewRecorder()
	r.Track(true)
	j := journal.New(10)
	j.Track(true)
	for _, a := range attempts {
		r.Record(a)
		r.Served(a)
	}
	for _, d := range decisions {
		j.Add(d)
	}
	if err := s.Flush(context.Background(), r.TakeChanges(), j.TakeChanges()); err != nil {
		t.Fatal(err)
	}
	if len(r.TakeChanges()) != 0 || len(j.TakeChanges()) != 0 {
		t.Fatal("changes not forgotten after TakeChanges")
	}
}

// fleet reads the store back into a recorder, as the page does.
func fleet(t *testing.T, s *Store) *history.Recorder {
	t.Helper()
	ds, err := s.Buckets(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	r := history.NewRecorder()
	for _, d := range ds {
		r.AddDelta(d)
	}
	return r
}

func testStore(t *testing.T, open func() *Store) {
	s := open()
	a := []history.Attempt{
		{At: now.Add(-2 * time.Minute), Model: "m", Channel: "a", Class: history.Success, TTFT: 300 * time.Millisecond, OutputTokens: 7,
			InputTokens: 1000, CacheReadTokens: 800},
		{At: now.Add(-30 * time.Hour), Model: "m", Channel: "a", Class: history.Down, Reason: "status", Status: 503},
		{At: now, Model: "m", Channel: "b", Class: history.Limited, Reason: "status", Status: 429},
	}
	b := []history.Attempt{
		{At: now.Add(-2 * time.Minute), Model: "m", Channel: "a", Class: history.Success, TTFT: 3 * time.Second, OutputTokens: 5,
			InputTokens: 200},
		{At: now, Model: "m", Channel: "a", Class: history.Client, Reason: "status", Status: 400},
	}
	d := journal.Decision{At: now, RequestID: "r1", Model: "m", Channel: "a", Attempt: 1, Reason: "status", UpstreamStatus: 503,
		Elapsed: time.Second, Remaining: time.Minute, Next: "b", DeliveredTokens: 40, Form: "instructed", TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
	instance(t, s, a, []journal.Decision{d})
	instance(t, s, b, nil)

	v := fleet(t, s).Channel("a", now, 5*time.Minute, 48*time.Hour)
	if c := v.Windows[5*time.Minute]; c.Attempts != 3 || c.Successes != 2 || c.Client != 1 || c.OutputTokens != 12 || c.TTFT.Count() != 2 ||
		c.InputTokens != 1200 || c.CacheReadTokens != 800 {
		t.Fatalf("5m of the two instances: %+v", c)
	}
	if c := v.Windows[48*time.Hour]; c.Attempts != 4 || c.Down != 1 {
		t.Fatalf("48h: %+v", c)
	}
	w5 := v.Windows[5*time.Minute]
	if p95 := w5.TTFT.Quantile(0.95); p95 < 3*time.Second {
		t.Fatalf("p95 %v lost the slow instance's sketch", p95)
	}
	if c := fleet(t, s).Model("m", now, 5*time.Minute).Windows[5*time.Minute]; c.Attempts != 4 || c.Limited != 1 ||
		c.InputTokens != 1200 || c.CacheReadTokens != 800 {
		t.Fatalf("model 5m: %+v", c)
	}

	// Reopened (a restart), the store has the same.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open()
	defer s.Close()
	if c := fleet(t, s).Channel("a", now, 5*time.Minute).Windows[5*time.Minute]; c.Attempts != 3 || c.InputTokens != 1200 || c.CacheReadTokens != 800 {
		t.Fatalf("after reopening: %+v", c)
	}
	got, err := s.Decisions(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !got[0].At.Equal(d.At) || got[0].Next != "b" || got[0].Remaining != time.Minute || got[0].UpstreamStatus != 503 || got[0].DeliveredTokens != 40 || got[0].Form != "instructed" {
		t.Fatalf("decisions %+v", got)
	}

	// Pruning a week on drops the minutes and hours and the decision,
	// keeps the days.
	later := now.Add(8 * 24 * time.Hour)
	if err := s.Prune(context.Background(), later); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Decisions(context.Background(), 10); len(got) != 0 {
		t.Fatalf("decisions after prune: %d", len(got))
	}
	ds, err := s.Buckets(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if d.Res != history.ByDay {
			t.Fatalf("a %s bucket outlived its reach", d.Res)
		}
	}
	if len(ds) == 0 {
		t.Fatal("pruning dropped the day buckets")
	}
}

func TestSQLiteStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "history.db")
	testStore(t, func() *Store {
		s, err := OpenSQLite(path)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// A store created before decisions had delivered_tokens and form gains
// the columns when opened, and keeps its rows.
func TestSQLiteStoreMigratesDecisions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sqlitefile.Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE llmf_decisions (at BIGINT NOT NULL, request_id TEXT NOT NULL DEFAULT '', model TEXT NOT NULL,
			channel TEXT NOT NULL, attempt BIGINT NOT NULL, reason TEXT NOT NULL, upstream_status BIGINT NOT NULL DEFAULT 0,
			elapsed_ns BIGINT NOT NULL, remaining_ns BIGINT NOT NULL, next_channel TEXT NOT NULL DEFAULT '')`,
		`INSERT INTO llmf_decisions VALUES (1, 'r0', 'm', 'a', 1, 'status', 503, 1, 1, 'b')`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	for range 2 { // the second open finds the column there
		s, err := OpenSQLite(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.Decisions(context.Background(), 10)
		s.Close()
		if err != nil || len(got) != 1 || got[0].RequestID != "r0" || got[0].DeliveredTokens != 0 || got[0].Form != "" {
			t.Fatalf("decisions %+v, %v", got, err)
		}
	}
}

// oldBuckets is llmf_history_buckets as created before input_tokens and
// cache_read_tokens, with one minute bucket of channel a at now: two
// successes, 9 output tokens.
func oldBuckets() []string {
	cols := []string{"attempts", "successes", "down", "limited", "client", "output_tokens"}
	for i := range history.SketchBuckets {
		cols = append(cols, sketchColumn(i))
	}
	start := now.Unix() - now.Unix()%60
	return []string{
		`CREATE TABLE llmf_history_buckets (res TEXT NOT NULL, start BIGINT NOT NULL, scope TEXT NOT NULL, name TEXT NOT NULL, ` +
			strings.Join(cols, " BIGINT NOT NULL DEFAULT 0, ") + ` BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (res, start, scope, name))`,
		fmt.Sprintf(`INSERT INTO llmf_history_buckets (res, start, scope, name, attempts, successes, output_tokens) VALUES ('m', %d, 'channel', 'a', 2, 2, 9)`, start),
	}
}

// testMigratesBuckets opens a store whose buckets table oldBuckets made,
// twice (the second open finds the columns there): the old bucket reads
// with no input tokens, and a flush adds them to it.
func testMigratesBuckets(t *testing.T, open func() *Store) {
	for i := range 2 {
		s := open()
		if i == 0 {
			if c := fleet(t, s).Channel("a", now, time.Minute).Windows[time.Minute]; c.Attempts != 2 || c.OutputTokens != 9 || c.InputTokens != 0 || c.CacheReadTokens != 0 {
				t.Fatalf("old bucket: %+v", c)
			}
			instance(t, s, []history.Attempt{{At: now, Model: "m", Channel: "a", Class: history.Success, InputTokens: 100, CacheReadTokens: 40}}, nil)
		}
		c := fleet(t, s).Channel("a", now, time.Minute).Windows[time.Minute]
		s.Close()
		if c.Attempts != 3 || c.OutputTokens != 9 || c.InputTokens != 100 || c.CacheReadTokens != 40 {
			t.Fatalf("open %d: %+v", i+1, c)
		}
	}
}

// A store created before buckets had input_tokens and cache_read_tokens
// gains the columns when opened, and keeps its rows.
func TestSQLiteStoreMigratesBuckets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sqlitefile.Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range oldBuckets() {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	testMigratesBuckets(t, func() *Store {
		s, err := OpenSQLite(path)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestPostgresStoreMigratesBuckets(t *testing.T) {
	dsn := pgtest.FreshDSN(t)
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range oldBuckets() {
		if _, err := conn.Exec(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close(context.Background())
	testMigratesBuckets(t, func() *Store {
		s, err := OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestPostgresStore(t *testing.T) {
	dsn := pgtest.FreshDSN(t)
	testStore(t, func() *Store {
		s, err := OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// A failed flush writes nothing and its changes go back to be flushed
// again.
func TestFailedFlushPutsBack(t *testing.T) {
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "h.db"))
	if err != nil {
		t.Fatal(err)
	}
	r := history.NewRecorder()
	r.Track(true)
	a := history.Attempt{At: now, Model: "m", Channel: "a", Class: history.Success}
	r.Record(a)
	r.Served(a)
	ds := r.TakeChanges()
	s.Close()
	if err := s.Flush(context.Background(), ds, nil); err == nil {
		t.Fatal("flush to a closed store succeeded")
	}
	r.PutBack(ds, now)
	if got := r.Changes(); len(got) != len(ds) {
		t.Fatalf("%d changes after PutBack, want %d", len(got), len(ds))
	}
	// Changes beyond their rollup's reach are dropped, not kept forever.
	r.TakeChanges()
	r.PutBack(ds, now.Add(7*time.Hour))
	for _, d := range r.Changes() {
		if d.Res == history.ByMinute {
			t.Fatal("a minute bucket 7 h old was put back")
		}
	}
}
