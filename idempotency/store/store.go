// Package store keeps idempotent calls in SQL (an embedded SQLite file,
// or the wallet's PostgreSQL, which a fleet shares): which instance runs
// each call, under a lease it renews, and the answers of completed calls
// until they expire. A call claimed by an instance that died is taken over
// once its lease passes.
//
// It owns the SQL and the schema; it knows answers as status, headers and
// bytes, never HTTP serving, LLM APIs or money.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/llmfailover/caddy-llm-failover/idempotency"
	"github.com/llmfailover/caddy-llm-failover/internal/sqlitefile"
)

// State is what Claim found.
type State int

const (
	// Claimed: the caller runs the call now.
	Claimed State = iota
	// Running: another instance runs it, under a live lease.
	Running
	// Done: the call completed; Answer is its answer (nil: too large to
	// keep).
	Done
)

// Claim is Claim's finding.
type Claim struct {
	State       State
	Fingerprint string
	Answer      *idempotency.Answer
}

// Store is an open idempotency store, safe for concurrent use.
type Store struct {
	db      *sql.DB
	dollar  bool
	onClose func()
}

const schema = `CREATE TABLE IF NOT EXISTS llmf_idempotency (
	id TEXT PRIMARY KEY,
	fingerprint TEXT NOT NULL,
	owner TEXT NOT NULL,
	state TEXT NOT NULL,
	lease_until BIGINT NOT NULL,
	expires BIGINT NOT NULL,
	status BIGINT NOT NULL DEFAULT 0,
	header TEXT NOT NULL DEFAULT '',
	body %s,
	unstored BIGINT NOT NULL DEFAULT 0
)`

// OpenSQLite opens (creating) the embedded store at path.
func OpenSQLite(path string) (*Store, error) {
	db, err := sqlitefile.Open(path, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("opening the idempotency store %s: %w", path, err)
	}
	db.SetMaxOpenConns(4)
	if _, err := db.Exec(fmt.Sprintf(schema, "BLOB")); err != nil {
		db.Close()
		return nil, fmt.Errorf("opening the idempotency store %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// OpenPostgres connects to PostgreSQL (the wallet's database) and creates
// the table if needed.
func OpenPostgres(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// The DSN may hold a password, so it is not repeated here.
		return nil, fmt.Errorf("opening the PostgreSQL idempotency store: parsing DSN: %w", err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening the PostgreSQL idempotency store: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	if _, err := db.ExecContext(ctx, fmt.Sprintf(schema, "BYTEA")); err != nil {
		db.Close()
		pool.Close()
		return nil, fmt.Errorf("opening the PostgreSQL idempotency store: %w", err)
	}
	return &Store{db: db, dollar: true, onClose: pool.Close}, nil
}

// Close closes the database.
func (s *Store) Close() error {
	err := s.db.Close()
	if s.onClose != nil {
		s.onClose()
	}
	return err
}

// q rewrites ? placeholders as $n for PostgreSQL.
func (s *Store) q(query string) string {
	if !s.dollar {
		return query
	}
	var b strings.Builder
	n := 0
	for _, c := range query {
		if c == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// Claim makes owner the runner of call id, unless another instance runs
// it under a lease still live at now, or it completed and has not
// expired: then it says which, with the completed call's answer.
func (s *Store) Claim(ctx context.Context, id, fingerprint, owner string, leaseUntil, expires, now time.Time) (Claim, error) {
	res, err := s.db.ExecContext(ctx, s.q(`INSERT INTO llmf_idempotency (id, fingerprint, owner, state, lease_until, expires)
		VALUES (?, ?, ?, 'running', ?, ?)
		ON CONFLICT (id) DO UPDATE SET fingerprint = excluded.fingerprint, owner = excluded.owner, state = 'running',
			lease_until = excluded.lease_until, expires = excluded.expires, status = 0, header = '', body = NULL, unstored = 0
		WHERE (llmf_idempotency.state = 'running' AND llmf_idempotency.lease_until < ?)
			OR (llmf_idempotency.state = 'done' AND llmf_idempotency.expires <= ?)`),
		id, fingerprint, owner, leaseUntil.UnixNano(), expires.UnixNano(), now.UnixNano(), now.UnixNano())
	if err != nil {
		return Claim{}, fmt.Errorf("claiming an idempotent call: %w", err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 1 {
		return Claim{State: Claimed, Fingerprint: fingerprint}, nil
	}
	return s.look(ctx, id)
}

// Look reads call id as it stands.
func (s *Store) look(ctx context.Context, id string) (Claim, error) {
	var (
		c               Claim
		state, header   string
		status, unstore int64
		body            []byte
	)
	err := s.db.QueryRowContext(ctx, s.q(`SELECT fingerprint, state, status, header, body, unstored FROM llmf_idempotency WHERE id = ?`), id).
		Scan(&c.Fingerprint, &state, &status, &header, &body, &unstore)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// Completed and swept, or abandoned, between the two statements:
		// as if running, so the caller asks again.
		return Claim{State: Running}, nil
	case err != nil:
		return Claim{}, fmt.Errorf("reading an idempotent call: %w", err)
	}
	if state == "running" {
		c.State = Running
		return c, nil
	}
	c.State = Done
	if unstore == 0 {
		a := &idempotency.Answer{Status: int(status), Body: body, Header: http.Header{}}
		if header != "" {
			if err := json.Unmarshal([]byte(header), &a.Header); err != nil {
				return Claim{}, fmt.Errorf("reading an idempotent call's headers: %w", err)
			}
		}
		c.Answer = a
	}
	return c, nil
}

// Renew extends owner's lease on call id.
func (s *Store) Renew(ctx context.Context, id, owner string, leaseUntil time.Time) error {
	if _, err := s.db.ExecContext(ctx, s.q(`UPDATE llmf_idempotency SET lease_until = ? WHERE id = ? AND owner = ? AND state = 'running'`),
		leaseUntil.UnixNano(), id, owner); err != nil {
		return fmt.Errorf("renewing an idempotent call's lease: %w", err)
	}
	return nil
}

// Complete records owner's run of call id as completed with a (nil: too
// large to keep), kept until expires.
func (s *Store) Complete(ctx context.Context, id, owner string, a *idempotency.Answer, expires time.Time) error {
	var (
		status   int64
		header   []byte
		body     []byte
		unstored int64 = 1
	)
	if a != nil {
		status, body, unstored = int64(a.Status), a.Body, 0
		var err error
		if header, err = json.Marshal(a.Header); err != nil {
			return fmt.Errorf("completing an idempotent call: %w", err)
		}
	}
	if _, err := s.db.ExecContext(ctx, s.q(`UPDATE llmf_idempotency SET state = 'done', status = ?, header = ?, body = ?, unstored = ?, expires = ?
		WHERE id = ? AND owner = ?`), status, string(header), body, unstored, expires.UnixNano(), id, owner); err != nil {
		return fmt.Errorf("completing an idempotent call: %w", err)
	}
	return nil
}

// Abandon forgets owner's run of call id (it failed): a retry runs again.
func (s *Store) Abandon(ctx context.Context, id, owner string) error {
	if _, err := s.db.ExecContext(ctx, s.q(`DELETE FROM llmf_idempotency WHERE id = ? AND owner = ? AND state = 'running'`), id, owner); err != nil {
		return fmt.Errorf("abandoning an idempotent call: %w", err)
	}
	return nil
}

// Sweep deletes completed calls expired at now and runs whose lease ended
// an hour before it (their instance died).
func (s *Store) Sweep(ctx context.Context, now time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, s.q(`DELETE FROM llmf_idempotency WHERE (state = 'done' AND expires <= ?) OR (state = 'running' AND lease_until < ?)`),
		now.UnixNano(), now.Add(-time.Hour).UnixNano())
	if err != nil {
		return 0, fmt.Errorf("sweeping idempotent calls: %w", err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}
