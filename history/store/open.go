package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	// Pure-Go SQLite, as the wallet uses it: xcaddy builds need no cgo.
	"github.com/llmfailover/caddy-llm-failover/internal/sqlitefile"
)

// migrationLockKey serialises concurrent migrations of instances sharing
// one PostgreSQL database ("llmf-his" in ASCII).
const migrationLockKey = 0x6c6c6d662d686973

// openTimeout bounds connecting and migrating.
const openTimeout = 30 * time.Second

// OpenSQLite opens (creating if needed) the history database at path, with
// the wallet's settings (internal/sqlitefile): WAL, so the page reads
// while a flush writes.
func OpenSQLite(path string) (*Store, error) {
	db, err := sqlitefile.Open(path, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("opening SQLite history %s: %w", path, err)
	}
	// One writer (the flush job) and a reader (the page) at a time.
	db.SetMaxOpenConns(2)
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	if err := migrate(ctx, db, `SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?`); err != nil {
		db.Close()
		return nil, fmt.Errorf("opening SQLite history %s: %w", path, err)
	}
	return newStore(db, "sqlite", false), nil
}

// OpenPostgres connects to PostgreSQL and migrates the schema, in the
// connection's search_path (add search_path=NAME to the DSN to keep the
// history in its own schema). Several instances may share it: their
// flushes add up.
func OpenPostgres(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// The DSN may hold a password, so it is not repeated here.
		return nil, fmt.Errorf("opening PostgreSQL history: parsing DSN: %w", err)
	}
	if _, set := cfg.ConnConfig.RuntimeParams["lock_timeout"]; !set {
		cfg.ConnConfig.RuntimeParams["lock_timeout"] = "5000"
	}
	// The flush job, a page read and cache-affinity lookups on the request
	// path (affinity.go), which must not queue behind either.
	cfg.MaxConns = 4
	ctx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening PostgreSQL history: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	closeAll := func() { db.Close(); pool.Close() }
	const columnExists = `SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1 AND column_name = $2`
	if err := migrate(ctx, db, columnExists, "SET LOCAL lock_timeout = 0", fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", int64(migrationLockKey))); err != nil {
		closeAll()
		return nil, fmt.Errorf("opening PostgreSQL history: %w", err)
	}
	s := newStore(db, "postgres", true)
	s.onClose = pool.Close
	return s, nil
}
