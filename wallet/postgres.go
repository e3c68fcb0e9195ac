package wallet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// migrationLockKey is an arbitrary constant identifying this package's
// schema migration among advisory locks ("llmf-wal" in ASCII).
const migrationLockKey = 0x6c6c6d662d77616c

var postgresSchema = []string{
	`CREATE TABLE IF NOT EXISTS accounts (
		id TEXT PRIMARY KEY,
		balance BIGINT NOT NULL DEFAULT 0,
		reserved BIGINT NOT NULL DEFAULT 0,
		created_at BIGINT NOT NULL,
		CHECK (reserved >= 0),
		CHECK (balance >= reserved),
		CHECK (balance >= 0)
	)`,
	`CREATE TABLE IF NOT EXISTS api_keys (
		id TEXT PRIMARY KEY,
		account_id TEXT NOT NULL REFERENCES accounts(id),
		hash TEXT NOT NULL UNIQUE,
		prefix TEXT NOT NULL,
		label TEXT NOT NULL DEFAULT '',
		created_at BIGINT NOT NULL,
		revoked_at BIGINT
	)`,
	`CREATE INDEX IF NOT EXISTS api_keys_account ON api_keys (account_id)`,
	`CREATE TABLE IF NOT EXISTS reservations (
		id TEXT PRIMARY KEY,
		account_id TEXT NOT NULL REFERENCES accounts(id),
		key_id TEXT NOT NULL DEFAULT '',
		model TEXT NOT NULL DEFAULT '',
		request_id TEXT NOT NULL DEFAULT '',
		amount BIGINT NOT NULL CHECK (amount >= 0),
		expires_at BIGINT NOT NULL,
		created_at BIGINT NOT NULL
	)`,
	`CREATE INDEX IF NOT EXISTS reservations_expiry ON reservations (expires_at)`,
	`CREATE TABLE IF NOT EXISTS ledger (
		id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		kind TEXT NOT NULL CHECK (kind IN ('charge', 'release', 'failed_attempt', 'credit', 'expired')),
		account_id TEXT NOT NULL REFERENCES accounts(id),
		key_id TEXT NOT NULL DEFAULT '',
		model TEXT NOT NULL DEFAULT '',
		channel TEXT NOT NULL DEFAULT '',
		request_id TEXT NOT NULL DEFAULT '',
		tokens_in BIGINT NOT NULL DEFAULT 0,
		tokens_out BIGINT NOT NULL DEFAULT 0,
		cost BIGINT NOT NULL,
		note TEXT NOT NULL DEFAULT '',
		created_at BIGINT NOT NULL
	)`,
	`CREATE INDEX IF NOT EXISTS ledger_account ON ledger (account_id, id)`,
	// Credit leases (see lease.go): id is the instance's lease ID. Created
	// with IF NOT EXISTS, like every table, so older databases gain it.
	`CREATE TABLE IF NOT EXISTS leases (
		id TEXT NOT NULL,
		account_id TEXT NOT NULL REFERENCES accounts(id),
		amount BIGINT NOT NULL CHECK (amount >= 0),
		expires_at BIGINT NOT NULL,
		created_at BIGINT NOT NULL,
		PRIMARY KEY (id, account_id)
	)`,
	`CREATE INDEX IF NOT EXISTS leases_expiry ON leases (expires_at)`,
	`CREATE OR REPLACE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		RAISE EXCEPTION 'ledger is append-only';
	END $$`,
	// CREATE OR REPLACE TRIGGER needs PostgreSQL 14+.
	`CREATE OR REPLACE TRIGGER ledger_append_only BEFORE UPDATE OR DELETE ON ledger
	FOR EACH ROW EXECUTE FUNCTION ledger_append_only()`,
}

// pgGrow grows this instance's lease ($6) of account $1 in one statement:
// the account row is locked and read, the grant sized as leaseGrant does
// (amount $2, 4 × amount $3, kmax $4, need $5), and added to reserved by
// the conditional UPDATE that is the no-overdraft rule; the lease row is
// upserted with expiry $7 (created $8). It answers the grant (NULL when none) and
// whether the account exists; a refusal writes nothing and fails no
// statement, as writer.go needs.
const pgGrow = `WITH a AS (
	SELECT id, balance - reserved AS avail FROM accounts WHERE id = $1 FOR UPDATE
), g AS (
	SELECT id, LEAST(GREATEST($2::bigint * LEAST(GREATEST(avail / $3::bigint, 1), $4::bigint), $5::bigint), avail) AS granted
	FROM a WHERE avail >= $5::bigint
), u AS (
	UPDATE accounts x SET reserved = x.reserved + g.granted FROM g WHERE x.id = g.id AND x.balance - x.reserved >= g.granted
	RETURNING g.granted
), l AS (
	INSERT INTO leases (id, account_id, amount, expires_at, created_at)
	SELECT $6::text, $1::text, u.granted, $7::bigint, $8::bigint FROM u
	ON CONFLICT (id, account_id) DO UPDATE SET amount = leases.amount + excluded.amount, expires_at = excluded.expires_at
	RETURNING 1
)
SELECT (SELECT granted FROM u), EXISTS (SELECT 1 FROM a)`

// pgShrink gives back spare lease money in one statement: this
// instance's leases ($1) of the accounts $2 shrink by $3 each, and the
// accounts' reserved with them; a lease Sweep already released is skipped.
const pgShrink = `WITH s AS (
	SELECT * FROM unnest($2::text[], $3::bigint[]) AS s(account_id, spare)
), l AS (
	UPDATE leases y SET amount = y.amount - s.spare FROM s
	WHERE y.id = $1 AND y.account_id = s.account_id AND y.amount >= s.spare
	RETURNING y.account_id, s.spare
)
UPDATE accounts x SET reserved = x.reserved - l.spare FROM l WHERE x.id = l.account_id`

// pgSettleBatch is a batch of settlements (see settle.go) in one
// statement: per account ($2, with the total charged in $3) the lease of
// this instance ($1) and the account go down by the charge, and the ledger
// rows ($4-$15, one array per column) of the accounts whose lease was
// found are written. It answers each such account's available balance; an
// account missing from the answer lost its lease to Sweep, and nothing of
// it was written. A lease is only charged what its reservations held, so
// neither UPDATE can fail a CHECK.
const pgSettleBatch = `WITH j AS (
	SELECT * FROM unnest($2::text[], $3::bigint[]) AS j(account_id, charged)
), l AS (
	UPDATE leases y SET amount = y.amount - j.charged FROM j
	WHERE y.id = $1 AND y.account_id = j.account_id AND y.amount >= j.charged
	RETURNING y.account_id, j.charged
), a AS (
	UPDATE accounts x SET balance = x.balance - l.charged, reserved = x.reserved - l.charged FROM l
	WHERE x.id = l.account_id
	RETURNING x.id, x.balance - x.reserved AS avail
), g AS (
	INSERT INTO ledger (` + ledgerColumns + `)
	SELECT e.* FROM unnest($4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[],
		$11::bigint[], $12::bigint[], $13::bigint[], $14::text[], $15::bigint[])
		AS e(kind, account_id, key_id, model, upstream_model, channel, request_id, tokens_in, tokens_out, cost, note, created_at)
	WHERE e.account_id IN (SELECT id FROM a)
)
SELECT id, avail FROM a`

// OpenPostgres connects to PostgreSQL and migrates the schema. Several
// gateway instances may share one database: reservations serialise on the
// account row, and concurrent migrations on an advisory lock. The schema is
// created in the connection's search_path, so one database can hold several
// wallets (add search_path=NAME to the DSN).
//
// Every statement runs with a short lock_timeout (see lockTimeout) and,
// when o.StatementTimeout is set, that statement_timeout. At most one
// Options may be given.
func OpenPostgres(ctx context.Context, dsn string, opts ...Options) (Store, error) {
	o := oneOptions(opts)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// The DSN may hold a password, so it is not repeated here.
		return nil, fmt.Errorf("opening PostgreSQL wallet: parsing DSN: %w", err)
	}
	params := cfg.ConnConfig.RuntimeParams
	if _, set := params["lock_timeout"]; !set {
		params["lock_timeout"] = fmt.Sprint(lockTimeout.Milliseconds())
	}
	if o.StatementTimeout > 0 {
		params["statement_timeout"] = fmt.Sprint(o.StatementTimeout.Milliseconds())
	}
	if o.tracer != nil {
		cfg.ConnConfig.Tracer = o.tracer
	}
	// Half the pool writes (see writer.go), each writer goroutine holding
	// one connection; the rest is left for reads (Authenticate, listings),
	// so the pool needs at least two.
	writers := max(1, int(cfg.MaxConns/2))
	cfg.MaxConns = max(cfg.MaxConns, int32(writers+1))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening PostgreSQL wallet: %w", err)
	}
	s := &sqlStore{
		// database/sql over the pool lets both dialects share one
		// implementation of every query.
		db: stdlib.OpenDBFromPool(pool),
		d: dialect{
			name:       "postgres",
			dollar:     true,
			skipLocked: " FOR UPDATE SKIP LOCKED",
			// A migration waits as long as another instance's takes, not
			// lockTimeout.
			migratePrelude: []string{"SET LOCAL lock_timeout = 0", fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", int64(migrationLockKey))},
			schema:         postgresSchema,
			// current_schema: the first schema of search_path, where the
			// CREATE TABLEs above put the tables.
			columnExists: `SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = ? AND column_name = ?`,
			// No savepoints: a failed statement aborts the whole
			// transaction, and two more statements per op would cost two
			// round trips each. See writer.go.
			savepoints:  false,
			retryable:   pgRetryable,
			growOne:     pgGrow,
			shrinkOne:   pgShrink,
			settleBatch: pgSettleBatch,
			writers:     writers,
		},
		onClose: pool.Close,
		now:     time.Now,
		leases:  newLeaseBook(o.LeaseTTL),
	}
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("opening PostgreSQL wallet: %w", err)
	}
	if err := s.start(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("opening PostgreSQL wallet: %w", err)
	}
	return s, nil
}

// pgRetryable: after deadlock_detected, serialization_failure or
// lock_not_available (lock_timeout) the transaction is rolled back and can
// simply be run again (see writer.go for how group commit can deadlock
// with another instance's batch).
func pgRetryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001" || pe.Code == "55P03")
}
