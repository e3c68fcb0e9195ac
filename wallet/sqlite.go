package wallet

import (
	"context"
	"fmt"
	"time"

	// Pure-Go SQLite, so that xcaddy builds need no cgo.
	"github.com/llmfailover/caddy-llm-failover/internal/sqlitefile"
)

// sqliteConns bounds the pool. All writes go through the store's writer on
// one connection of it; the others let Authenticate and listings read
// concurrently under WAL without waiting behind a write.
const sqliteConns = 4

var sqliteSchema = []string{
	// STRICT makes SQLite reject a non-integer amount instead of storing it
	// as a float; the CHECKs are the last line of defence for the
	// no-overdraft rule should a code path ever get the arithmetic wrong.
	`CREATE TABLE IF NOT EXISTS accounts (
		id TEXT PRIMARY KEY,
		balance INTEGER NOT NULL DEFAULT 0,
		reserved INTEGER NOT NULL DEFAULT 0,
		created_at INTEGER NOT NULL,
		CHECK (reserved >= 0),
		CHECK (balance >= reserved),
		CHECK (balance >= 0)
	) STRICT`,
	`CREATE TABLE IF NOT EXISTS api_keys (
		id TEXT PRIMARY KEY,
		account_id TEXT NOT NULL REFERENCES accounts(id),
		hash TEXT NOT NULL UNIQUE,
		prefix TEXT NOT NULL,
		label TEXT NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL,
		revoked_at INTEGER
	) STRICT`,
	`CREATE INDEX IF NOT EXISTS api_keys_account ON api_keys (account_id)`,
	`CREATE TABLE IF NOT EXISTS reservations (
		id TEXT PRIMARY KEY,
		account_id TEXT NOT NULL REFERENCES accounts(id),
		key_id TEXT NOT NULL DEFAULT '',
		model TEXT NOT NULL DEFAULT '',
		request_id TEXT NOT NULL DEFAULT '',
		amount INTEGER NOT NULL CHECK (amount >= 0),
		expires_at INTEGER NOT NULL,
		created_at INTEGER NOT NULL
	) STRICT`,
	`CREATE INDEX IF NOT EXISTS reservations_expiry ON reservations (expires_at)`,
	// AUTOINCREMENT so IDs are never reused: Usage pages by ID. The kind
	// CHECK is stored rewritten as ORed equalities (rewriteKindCheck).
	`CREATE TABLE IF NOT EXISTS ledger (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		kind TEXT NOT NULL CHECK (kind IN ('charge', 'release', 'failed_attempt', 'credit', 'expired')),
		account_id TEXT NOT NULL REFERENCES accounts(id),
		key_id TEXT NOT NULL DEFAULT '',
		model TEXT NOT NULL DEFAULT '',
		channel TEXT NOT NULL DEFAULT '',
		request_id TEXT NOT NULL DEFAULT '',
		tokens_in INTEGER NOT NULL DEFAULT 0,
		tokens_out INTEGER NOT NULL DEFAULT 0,
		cost INTEGER NOT NULL,
		note TEXT NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL
	) STRICT`,
	`CREATE INDEX IF NOT EXISTS ledger_account ON ledger (account_id, id)`,
	// Credit leases (see lease.go): id is the instance's lease ID. Created
	// with IF NOT EXISTS, like every table, so older databases gain it.
	`CREATE TABLE IF NOT EXISTS leases (
		id TEXT NOT NULL,
		account_id TEXT NOT NULL REFERENCES accounts(id),
		amount INTEGER NOT NULL CHECK (amount >= 0),
		expires_at INTEGER NOT NULL,
		created_at INTEGER NOT NULL,
		PRIMARY KEY (id, account_id)
	) STRICT`,
	`CREATE INDEX IF NOT EXISTS leases_expiry ON leases (expires_at)`,
	// The ledger is the audit trail; nothing in this package updates or
	// deletes it, and the triggers keep it that way for anyone with SQL.
	`CREATE TRIGGER IF NOT EXISTS ledger_no_update BEFORE UPDATE ON ledger
	BEGIN SELECT RAISE(ABORT, 'ledger is append-only'); END`,
	`CREATE TRIGGER IF NOT EXISTS ledger_no_delete BEFORE DELETE ON ledger
	BEGIN SELECT RAISE(ABORT, 'ledger is append-only'); END`,
}

// OpenSQLite opens (creating if needed) the wallet database at path and
// migrates its schema. SQLite suits a single gateway instance; several
// processes may share the file on one host, but not over a network share.
//
// At most one Options may be given.
func OpenSQLite(path string, opts ...Options) (Store, error) {
	o := oneOptions(opts)
	if path == "" {
		return nil, fmt.Errorf("opening SQLite wallet: %w: empty path", ErrInvalid)
	}
	busy := 10 * time.Second
	if o.StatementTimeout > 0 {
		busy = o.StatementTimeout
	}
	db, err := sqlitefile.Open(path, busy)
	if err != nil {
		return nil, fmt.Errorf("opening SQLite wallet %s: %w", path, err)
	}
	db.SetMaxOpenConns(sqliteConns)
	db.SetMaxIdleConns(sqliteConns)
	s := &sqlStore{
		db: db,
		// A failed statement leaves an SQLite transaction usable, and a
		// savepoint costs no I/O: each op of a batch gets one.
		d: dialect{name: "sqlite", schema: sqliteSchema, savepoints: true, writers: 1,
			columnExists: `SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?`,
			faults:       faults{classify: sqliteClassify}},
		now:    time.Now,
		leases: newLeaseBook(o.LeaseTTL),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("opening SQLite wallet %s: %w", path, err)
	}
	if err := rewriteKindCheck(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("opening SQLite wallet %s: migrating the ledger's kind CHECK: %w", path, err)
	}
	if err := s.start(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("opening SQLite wallet %s: %w", path, err)
	}
	return s, nil
}

// sqliteClassify reads an SQLite error (see failure in writer.go): the
// file locked by another process past busy_timeout (SQLITE_BUSY,
// SQLITE_LOCKED) means nothing was applied, and the write may run again
// once the lock is released. Nothing is ever unknown: a local file does
// not lose what it was sent, and the writer rolls back (closes) a
// connection whose COMMIT failed. Any other error would only fail again.
func sqliteClassify(err error) failure {
	if sqlitefile.Busy(err) {
		return notApplied
	}
	return failed
}
