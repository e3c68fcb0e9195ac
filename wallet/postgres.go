package wallet

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
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
// upserted with expiry $7 (created $8). It answers the grant (NULL when
// none), whether the account exists, the grant it sized (NULL when the
// balance could not cover need), and what the lease row holds now; a
// refusal writes nothing and fails no statement, as writer.go needs.
//
// A grant sized but not made means the row changed under the statement.
// The UPDATE tests its condition first on the row as the statement's
// snapshot saw it, and only a row passing it is re-read at its newest
// version and tested again; FOR UPDATE reads the newest at once. So when
// another transaction gave money back to the account (a settlement, a
// shrink, a Sweep) after the snapshot was taken and committed while this
// statement waited for the row's lock, the grant is sized from the newer,
// larger available balance, fails the older one, and nothing is written.
// grow runs the statement again, with a fresh snapshot. (A change the
// other way round needs nothing: the older row passes, the newest is
// tested again, and a grant that no longer fits is a true refusal.)
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
	RETURNING amount
)
SELECT (SELECT granted FROM u), EXISTS (SELECT 1 FROM a), (SELECT granted FROM g), (SELECT amount FROM l)`

// pgShrink gives back spare lease money in one statement: this
// instance's leases ($1) of the accounts $2 shrink by $3 each, and the
// accounts' reserved with them; a lease Sweep already released is skipped.
// The account rows are locked first, in order (see "Lock order" in lease.go).
const pgShrink = `WITH s AS (
	SELECT * FROM unnest($2::text[], $3::bigint[]) AS s(account_id, spare)
), k AS MATERIALIZED (
	SELECT x.id FROM accounts x WHERE x.id = ANY($2::text[]) ORDER BY x.id FOR UPDATE
), l AS (
	UPDATE leases y SET amount = y.amount - s.spare FROM s JOIN k ON k.id = s.account_id
	WHERE y.id = $1 AND y.account_id = s.account_id AND y.amount >= s.spare
	RETURNING y.account_id, s.spare
)
UPDATE accounts x SET reserved = x.reserved - l.spare FROM l WHERE x.id = l.account_id`

// pgSettleBatch is a batch of settlements (see settle.go) in one
// statement: per account ($2, with the total charged in $3) the lease of
// this instance ($1) and the account go down by the charge, and the ledger
// rows ($4-$19, one array per column) of the accounts whose lease was
// found are written. It answers each such account's available balance; an
// account missing from the answer lost its lease to Sweep, and nothing of
// it was written. A lease is only charged what its reservations held, so
// neither UPDATE can fail a CHECK. The account rows are locked first, in
// order (see "Lock order" in lease.go).
const pgSettleBatch = `WITH j AS (
	SELECT * FROM unnest($2::text[], $3::bigint[]) AS j(account_id, charged)
), k AS MATERIALIZED (
	SELECT x.id FROM accounts x WHERE x.id = ANY($2::text[]) ORDER BY x.id FOR UPDATE
), l AS (
	UPDATE leases y SET amount = y.amount - j.charged FROM j JOIN k ON k.id = j.account_id
	WHERE y.id = $1 AND y.account_id = j.account_id AND y.amount >= j.charged
	RETURNING y.account_id, j.charged
), a AS (
	UPDATE accounts x SET balance = x.balance - l.charged, reserved = x.reserved - l.charged FROM l
	WHERE x.id = l.account_id
	RETURNING x.id, x.balance - x.reserved AS avail
), g AS (
	INSERT INTO ledger (` + ledgerColumns + `)
	SELECT e.* FROM unnest($4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[],
		$11::bigint[], $12::bigint[], $13::bigint[], $14::text[], $15::bigint[], $16::bigint[], $17::bigint[], $18::bigint[], $19::text[])
		AS e(kind, account_id, key_id, model, upstream_model, channel, request_id, tokens_in, tokens_out, cost, note, created_at,
			tokens_cache_read, tokens_cache_write, tokens_cache_write_1h, trace_id)
	WHERE e.account_id IN (SELECT id FROM a)
)
SELECT id, avail FROM a`

// pgSettledSince and pgAvailable find out whether a settlement batch
// whose connection was lost committed (see settledBefore): the settlement
// rows of the batch's accounts ($1) written after ledger ID $2 (read
// through ledger_account), and the accounts' available balances.
const (
	pgSettledSince = `SELECT account_id, request_id, created_at FROM ledger
WHERE account_id = ANY($1::text[]) AND id > $2 AND kind IN ('` + KindCharge + `', '` + KindRelease + `')`
	pgAvailable = `SELECT id, balance - reserved FROM accounts WHERE id = ANY($1::text[])`
)

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
			forUpdate:  " FOR UPDATE",
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
			savepoints:   false,
			faults:       faults{classify: pgClassify, sessionOf: pgSession, ended: pgEnded, pingIdle: pingIdle},
			growOne:      pgGrow,
			shrinkOne:    pgShrink,
			settleBatch:  pgSettleBatch,
			settledSince: pgSettledSince,
			available:    pgAvailable,
			writers:      writers,
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

// pgClassify reads a PostgreSQL error (see failure in writer.go):
//
//   - Nothing sent (pgconn.SafeToRetry: no connection, or one pgx knew was
//     closed): not applied.
//   - An error the server answered: the statement, and with it an
//     autocommit statement's transaction, was rolled back. Not applied,
//     and worth running again once the cause passes: a connection
//     exception (08), the server shutting down, restarting or crashed
//     (57P01-57P03), too many connections (53300), a serialization failure
//     or deadlock (40001, 40P01: see writer.go on how group commit can
//     deadlock with another instance's batch), a lock timeout (55P03, see
//     lockTimeout), or a statement cancelled (57014): by
//     statement_timeout, a load the database may shed in a moment, or by
//     an operator; each run stays bounded by the timeout, and all of them
//     by retryBudget. Any other server error (a constraint, a missing
//     table) would only fail again.
//   - The connection lost with no answer (EOF, a reset, a network error):
//     unknown, since the statement may have been received and committed.
func pgClassify(err error) failure {
	if pgconn.SafeToRetry(err) {
		return notApplied
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		if strings.HasPrefix(pe.Code, "08") {
			return notApplied
		}
		switch pe.Code {
		case "57P01", "57P02", "57P03", "53300", "40001", "40P01", "55P03", "57014":
			return notApplied
		}
		return failed
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return notApplied
	}
	var ne net.Error
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || errors.As(err, &ne) {
		return unknown
	}
	return failed
}

// pgSession identifies a writer connection's session: its backend's pid
// and start. Behind a pooler (PgBouncer) a connection may reach another
// backend at its next transaction, and a backend serves other clients,
// so none is identified (the zero session): the pooler's pid, the one
// pgx was told at connecting, differs from the backend's. The writer
// then cannot make sure a lost session has ended (see pgEnded).
func pgSession(ctx context.Context, c *sql.Conn) (session, error) {
	var (
		s    session
		told uint32
	)
	if err := c.Raw(func(dc any) error {
		if sc, ok := dc.(*stdlib.Conn); ok {
			told = sc.Conn().PgConn().PID()
		}
		return nil
	}); err != nil {
		return session{}, err
	}
	err := c.QueryRowContext(ctx, `SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&s.pid, &s.start)
	if err != nil || s.pid != int64(told) {
		return session{}, err
	}
	return s, nil
}

// sessionEndWait is how long pgEnded waits for a lost connection's
// session to end once told to (pg_terminate_backend): below the default
// statement_timeout, so that the wait ends first.
const sessionEndWait = 3 * time.Second

// pgEnded makes sure the sessions of lost writer connections have ended,
// so that nothing they were sent can still commit: a session that is
// gone, or idle outside a transaction, has ended its last statement; one
// still running it (the server may not yet know its client is gone: pgx
// sends a cancel request once it loses a connection, but that may be
// lost too) is terminated, which rolls back what has not committed, and
// waited for. A session is its pid and start, so that another session
// that took the pid since is never touched. It fails when a session does
// not end in time or may not be terminated (another role's): the writer
// then tries again later, by when the session has ended by itself.
func pgEnded(ctx context.Context, c *sql.Conn, lost []session) error {
	for _, s := range lost {
		var ended bool
		err := c.QueryRowContext(ctx, `SELECT pg_terminate_backend(pid, $3) FROM pg_stat_activity
WHERE pid = $1 AND backend_start = $2 AND state IS DISTINCT FROM 'idle'`, s.pid, s.start, sessionEndWait.Milliseconds()).Scan(&ended)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			// Gone, or idle: ended.
		case err != nil:
			return err
		case !ended:
			return fmt.Errorf("session %d of a lost connection has not ended", s.pid)
		}
	}
	return nil
}
