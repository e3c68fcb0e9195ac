// Package store keeps the status history, the decision journal and the
// cache-affinity table (affinity.go) in SQL
// (SQLite or PostgreSQL) so they survive restarts and, on PostgreSQL, add
// up across instances: each instance flushes what its buckets gained
// (history.Delta) and the store adds it to the row of that (resolution,
// period, scope, name), so every reader sees the fleet's totals.
//
// It owns the SQL and the schema; it must not know HTTP, Caddy or how the
// page shows the counts.
package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/journal"
)

// DecisionsReach is how long decisions are kept in the store.
const DecisionsReach = 7 * 24 * time.Hour

// counterColumns are a bucket's counters after its key; then one column
// per latency sketch bucket.
var counterColumns = []string{"attempts", "successes", "down", "limited", "client", "output_tokens", "input_tokens", "cache_read_tokens"}

func sketchColumn(i int) string { return fmt.Sprintf("ttft_b%d", i) }

func valueColumns() []string {
	cols := append([]string(nil), counterColumns...)
	for i := range history.SketchBuckets {
		cols = append(cols, sketchColumn(i))
	}
	return cols
}

// schema is both dialects' (BIGINT is an integer in SQLite too). The key
// leads with (res, start) so that pruning a resolution is a range delete.
func schema() []string {
	var cols strings.Builder
	for _, c := range valueColumns() {
		fmt.Fprintf(&cols, "\t\t%s BIGINT NOT NULL DEFAULT 0,\n", c)
	}
	return []string{
		`CREATE TABLE IF NOT EXISTS llmf_history_buckets (
		res TEXT NOT NULL,
		start BIGINT NOT NULL,
		scope TEXT NOT NULL,
		name TEXT NOT NULL,
` + cols.String() + `		PRIMARY KEY (res, start, scope, name)
	)`,
		`CREATE TABLE IF NOT EXISTS llmf_decisions (
		at BIGINT NOT NULL,
		request_id TEXT NOT NULL DEFAULT '',
		model TEXT NOT NULL,
		channel TEXT NOT NULL,
		attempt BIGINT NOT NULL,
		reason TEXT NOT NULL,
		upstream_status BIGINT NOT NULL DEFAULT 0,
		elapsed_ns BIGINT NOT NULL,
		remaining_ns BIGINT NOT NULL,
		next_channel TEXT NOT NULL DEFAULT '',
		delivered_tokens BIGINT NOT NULL DEFAULT 0,
		form TEXT NOT NULL DEFAULT ''
	)`,
		`CREATE INDEX IF NOT EXISTS llmf_decisions_at ON llmf_decisions (at)`,
		affinitySchema,
	}
}

// Store is an open history store, safe for concurrent use.
type Store struct {
	db     *sql.DB
	kind   string
	dollar bool // PostgreSQL placeholders: $1, $2, …
	upsert string
	insert string
	// onClose closes what db runs on (PostgreSQL's pool).
	onClose func()
}

func newStore(db *sql.DB, kind string, dollar bool) *Store {
	s := &Store{db: db, kind: kind, dollar: dollar}
	cols := valueColumns()
	keys := []string{"res", "start", "scope", "name"}
	var set []string
	for _, c := range cols {
		set = append(set, fmt.Sprintf("%s = llmf_history_buckets.%s + excluded.%s", c, c, c))
	}
	all := append(keys, cols...)
	s.upsert = fmt.Sprintf("INSERT INTO llmf_history_buckets (%s) VALUES (%s) ON CONFLICT (res, start, scope, name) DO UPDATE SET %s",
		strings.Join(all, ", "), s.placeholders(len(all)), strings.Join(set, ", "))
	s.insert = "INSERT INTO llmf_decisions (at, request_id, model, channel, attempt, reason, upstream_status, elapsed_ns, remaining_ns, next_channel, delivered_tokens, form, trace_id) VALUES (" +
		s.placeholders(13) + ")"
	return s
}

// arg is the n-th (1-based) placeholder.
func (s *Store) arg(n int) string {
	if s.dollar {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}

func (s *Store) placeholders(n int) string {
	ps := make([]string, n)
	for i := range ps {
		ps[i] = s.arg(i + 1)
	}
	return strings.Join(ps, ", ")
}

// Kind is "sqlite" or "postgres".
func (s *Store) Kind() string { return s.kind }

// Close closes the database.
func (s *Store) Close() error {
	err := s.db.Close()
	if s.onClose != nil {
		s.onClose()
	}
	return err
}

// migrate creates the schema and adds the columns later versions
// introduced; columnExists counts a table's column by name (a dialect's
// catalogue query with two placeholders).
func migrate(ctx context.Context, db *sql.DB, columnExists string, prelude ...string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	for _, q := range append(prelude, schema()...) {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("migrating the history schema: %w", err)
		}
	}
	// Added after the first release: stores created before them lack
	// them.
	for _, col := range []struct{ table, name, def string }{
		{"llmf_decisions", "delivered_tokens", "BIGINT NOT NULL DEFAULT 0"},
		{"llmf_decisions", "form", "TEXT NOT NULL DEFAULT ''"},
		{"llmf_history_buckets", "input_tokens", "BIGINT NOT NULL DEFAULT 0"},
		{"llmf_history_buckets", "cache_read_tokens", "BIGINT NOT NULL DEFAULT 0"},
		{"llmf_decisions", "trace_id", "TEXT NOT NULL DEFAULT ''"},
	} {
		var n int
		if err := tx.QueryRowContext(ctx, columnExists, col.table, col.name).Scan(&n); err != nil {
			return fmt.Errorf("migrating the history schema: %w", err)
		}
		if n == 0 {
			if _, err := tx.ExecContext(ctx, "ALTER TABLE "+col.table+" ADD COLUMN "+col.name+" "+col.def); err != nil {
				return fmt.Errorf("migrating the history schema: %w", err)
			}
		}
	}
	return tx.Commit()
}

// Flush adds the deltas to their buckets and appends the decisions, in
// one transaction: all of it is written or none. Deltas come in key order
// (history.Recorder.TakeChanges), so two instances flushing at once lock
// shared rows in the same order.
func (s *Store) Flush(ctx context.Context, deltas []history.Delta, decisions []journal.Decision) error {
	if len(deltas) == 0 && len(decisions) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("flushing history: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if len(deltas) > 0 {
		st, err := tx.PrepareContext(ctx, s.upsert)
		if err != nil {
			return fmt.Errorf("flushing history: %w", err)
		}
		defer st.Close()
		args := make([]any, 0, 4+len(counterColumns)+history.SketchBuckets)
		for _, d := range deltas {
			args = append(args[:0], string(d.Res), d.Start, d.Scope, d.Name,
				d.Attempts, d.Successes, d.Down, d.Limited, d.Client, d.OutputTokens, d.InputTokens, d.CacheReadTokens)
			for i := range history.SketchBuckets {
				args = append(args, int64(d.TTFT.Bucket(i)))
			}
			if _, err := st.ExecContext(ctx, args...); err != nil {
				return fmt.Errorf("flushing history bucket %s/%s: %w", d.Scope, d.Name, err)
			}
		}
	}
	if len(decisions) > 0 {
		st, err := tx.PrepareContext(ctx, s.insert)
		if err != nil {
			return fmt.Errorf("flushing decisions: %w", err)
		}
		defer st.Close()
		for _, d := range decisions {
			if _, err := st.ExecContext(ctx, d.At.UnixNano(), d.RequestID, d.Model, d.Channel, int64(d.Attempt), d.Reason,
				int64(d.UpstreamStatus), int64(d.Elapsed), int64(d.Remaining), d.Next, d.DeliveredTokens, d.Form, d.TraceID); err != nil {
				return fmt.Errorf("flushing decisions: %w", err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("flushing history: %w", err)
	}
	return nil
}

// Buckets reads every bucket still within its rollup's reach at now, as
// the fleet's totals.
func (s *Store) Buckets(ctx context.Context, now time.Time) ([]history.Delta, error) {
	q := "SELECT res, start, scope, name, " + strings.Join(valueColumns(), ", ") +
		" FROM llmf_history_buckets WHERE res = " + s.arg(1) + " AND start >= " + s.arg(2)
	var out []history.Delta
	vals := make([]int64, len(valueColumns()))
	for _, res := range history.Resolutions {
		if err := s.readBuckets(ctx, q, res, now, vals, &out); err != nil {
			return nil, fmt.Errorf("reading history: %w", err)
		}
	}
	return out, nil
}

func (s *Store) readBuckets(ctx context.Context, q string, res history.Resolution, now time.Time, vals []int64, out *[]history.Delta) error {
	rows, err := s.db.QueryContext(ctx, q, string(res), now.Add(-res.Reach()).Unix())
	if err != nil {
		return err
	}
	defer rows.Close()
	dest := make([]any, 4+len(vals))
	for rows.Next() {
		var d history.Delta
		var r string
		dest[0], dest[1], dest[2], dest[3] = &r, &d.Start, &d.Scope, &d.Name
		for i := range vals {
			dest[4+i] = &vals[i]
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		d.Res = history.Resolution(r)
		d.Attempts, d.Successes, d.Down, d.Limited, d.Client, d.OutputTokens = vals[0], vals[1], vals[2], vals[3], vals[4], vals[5]
		d.InputTokens, d.CacheReadTokens = vals[6], vals[7]
		for i, n := range vals[len(counterColumns):] {
			d.TTFT.AddBucket(i, uint32(min(max(n, 0), 1<<32-1)))
		}
		*out = append(*out, d)
	}
	return rows.Err()
}

// Decisions reads the latest limit decisions, oldest first.
func (s *Store) Decisions(ctx context.Context, limit int) ([]journal.Decision, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT at, request_id, model, channel, attempt, reason, upstream_status, elapsed_ns, remaining_ns, next_channel, delivered_tokens, form, trace_id FROM llmf_decisions ORDER BY at DESC LIMIT "+s.arg(1), limit)
	if err != nil {
		return nil, fmt.Errorf("reading decisions: %w", err)
	}
	defer rows.Close()
	var out []journal.Decision
	for rows.Next() {
		var d journal.Decision
		var at, attempt, status, elapsed, remaining int64
		if err := rows.Scan(&at, &d.RequestID, &d.Model, &d.Channel, &attempt, &d.Reason, &status, &elapsed, &remaining, &d.Next, &d.DeliveredTokens, &d.Form, &d.TraceID); err != nil {
			return nil, fmt.Errorf("reading decisions: %w", err)
		}
		d.At, d.Attempt, d.UpstreamStatus = time.Unix(0, at), int(attempt), int(status)
		d.Elapsed, d.Remaining = time.Duration(elapsed), time.Duration(remaining)
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading decisions: %w", err)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

// Prune deletes buckets beyond their rollup's reach and decisions older
// than DecisionsReach, so the store stays as bounded as the memory.
func (s *Store) Prune(ctx context.Context, now time.Time) error {
	q := "DELETE FROM llmf_history_buckets WHERE res = " + s.arg(1) + " AND start < " + s.arg(2)
	for _, res := range history.Resolutions {
		if _, err := s.db.ExecContext(ctx, q, string(res), now.Add(-res.Reach()).Unix()); err != nil {
			return fmt.Errorf("pruning history: %w", err)
		}
	}
	if _, err := s.db.ExecContext(ctx, "DELETE FROM llmf_decisions WHERE at < "+s.arg(1), now.Add(-DecisionsReach).UnixNano()); err != nil {
		return fmt.Errorf("pruning decisions: %w", err)
	}
	return s.pruneAffinity(ctx, now)
}
