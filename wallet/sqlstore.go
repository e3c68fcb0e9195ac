package wallet

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// dialect is what differs between the SQLite and PostgreSQL stores; every
// query is written once, with ? placeholders, and shared.
type dialect struct {
	name string
	// dollar rewrites ? placeholders to $1, $2, ... for PostgreSQL.
	dollar bool
	// skipLocked is appended to Sweep's row selection so that concurrent
	// sweepers on other instances neither block on nor deadlock with each
	// other or with in-flight settlements.
	skipLocked string
	// forUpdate is appended to a SELECT that locks the rows it reads
	// (PostgreSQL; SQLite's one writer needs none, and it is empty).
	forUpdate string
	// migratePrelude runs first in the migration transaction.
	migratePrelude []string
	schema         []string
	// columnExists counts the columns named by its two arguments, table
	// and column (see addedColumns).
	columnExists string
	// savepoints isolates the ops of a group-committed batch with SAVEPOINT
	// (see writer.go).
	savepoints bool
	// faults says what a failed write tells of the database, so that the
	// writer retries what it may (see writer.go).
	faults faults
	// growOne, when set, grows a lease in one statement (PostgreSQL; see
	// pgGrow).
	growOne string
	// shrinkOne, when set, gives spare lease money back in one statement
	// (PostgreSQL; see pgShrink).
	shrinkOne string
	// settleBatch, when set, settles a whole batch in one statement
	// (PostgreSQL's data-modifying CTEs; SQLite has none), so that a
	// request's settlement is at most one round trip (see settle.go).
	settleBatch string
	// settledSince and available, when set, find out whether a
	// settlement batch whose connection was lost committed (see
	// settledBefore): the ledger rows of accounts ($1) since a ledger ID
	// ($2), and accounts' available balances.
	settledSince, available string
	// writers is the number of writer goroutines (see newWriter), each
	// holding one connection while it runs a batch.
	writers int
}

// sqlStore implements Store over database/sql for both dialects.
type sqlStore struct {
	db *sql.DB
	d  dialect
	// st holds the statements of the hot paths, prepared once.
	st *stmts
	// w runs every write (see writer.go). On SQLite, where only one writer
	// can run at a time anyway, its single connection also replaces the
	// in-process write queue: writers wait in a Go channel, not in SQLite's
	// busy handler, which sleeps and polls. Other processes sharing the file
	// still wait via busy_timeout.
	w    *writer
	auth *authCache
	// known are the keys the database verified within KnownKeyTTL, for
	// KnownKey; refreshed at most once per auth TTL per key.
	known   *authCache
	onClose func()
	now     func() time.Time
	// leases are this instance's credit leases and the live reservations
	// they serve (see lease.go); settles the Settles waiting for a batch.
	leases  *leaseBook
	settles settleQueue
	// inserts caches the multi-row ledger INSERTs, byRows[form][i] of
	// 1<<i rows, and the slice of their arguments (see insertRows).
	inserts struct {
		mu     sync.Mutex
		byRows [insertForms][insertSizes]*sql.Stmt
		args   []any
	}
}

// stmts are the statements of the request path, prepared once per store
// (database/sql then prepares each once per connection) instead of being
// compiled from SQL text on every call.
type stmts struct {
	accountExists, insertLedger    *sql.Stmt
	leaseCharge, accountCharge     *sql.Stmt
	authenticate                   *sql.Stmt
	savepoint, release, rollbackTo *sql.Stmt
	all                            []*sql.Stmt
}

func (s *sqlStore) prepare(ctx context.Context) error {
	st := &stmts{}
	for _, p := range []struct {
		dst   **sql.Stmt
		query string
	}{
		{&st.accountExists, `SELECT 1 FROM accounts WHERE id = ?`},
		// A settlement batch, per account (see settle.go): the charge leaves
		// the lease (no row: Sweep released it) and the account.
		{&st.leaseCharge, `UPDATE leases SET amount = amount - ? WHERE id = ? AND account_id = ? AND amount >= ?`},
		{&st.accountCharge, `UPDATE accounts SET balance = balance - ?, reserved = reserved - ? WHERE id = ? RETURNING balance - reserved`},
		{&st.insertLedger, `INSERT INTO ledger (` + ledgerColumns + `) VALUES (?` + strings.Repeat(", ?", ledgerArgs-1) + `)`},
		{&st.authenticate, `SELECT ` + keyColumns + ` FROM api_keys WHERE hash = ?`},
		{&st.savepoint, `SAVEPOINT op`},
		{&st.release, `RELEASE SAVEPOINT op`},
		{&st.rollbackTo, `ROLLBACK TO SAVEPOINT op`},
	} {
		if p.dst == &st.savepoint || p.dst == &st.release || p.dst == &st.rollbackTo {
			if !s.d.savepoints {
				continue
			}
		}
		stmt, err := s.db.PrepareContext(ctx, s.q(p.query))
		if err != nil {
			st.close()
			return fmt.Errorf("preparing %q: %w", firstLine(p.query), err)
		}
		*p.dst = stmt
		st.all = append(st.all, stmt)
	}
	s.st = st
	return nil
}

func (st *stmts) close() {
	for _, x := range st.all {
		_ = x.Close()
	}
}

// start readies a migrated store for use: prepared statements, the writer
// and the Authenticate cache.
func (s *sqlStore) start(ctx context.Context) error {
	if err := s.prepare(ctx); err != nil {
		return err
	}
	if err := s.noteLedgerHigh(ctx); err != nil {
		return err
	}
	s.w = newWriter(s.db, s.st, s.d.savepoints, s.d.faults, s.d.writers)
	s.auth = newAuthCache(DefaultAuthCacheTTL, authCacheMax)
	s.known = newAuthCache(KnownKeyTTL, authCacheMax)
	return nil
}

// q rewrites placeholders for the dialect.
func (s *sqlStore) q(query string) string {
	if !s.d.dollar {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 8)
	n := 0
	for i := 0; i < len(query); i++ {
		if query[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(query[i])
	}
	return b.String()
}

// writeTx runs fn in a plain write transaction and wraps any error with
// what. Only the schema migration uses it, before the writer starts; every
// other write goes through the writer (s.write).
func (s *sqlStore) writeTx(ctx context.Context, what string, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("%s: beginning transaction: %w", what, err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%s: committing: %w", what, err)
	}
	return nil
}

// write runs fn as one op of the writer's next group commit and waits for
// its result, wrapped with what. account is the account fn will lock, if
// known (a hint that orders the batch, see writer.go). fn may run more than
// once, so it must not depend on state it changed in an earlier run; and
// when it returns one of this package's errors it must have written nothing.
// A run the database did not apply is retried; one whose outcome is
// unknown (its connection was lost as it committed) is not: its error
// wraps errOutcomeUnknown.
func (s *sqlStore) write(ctx context.Context, what, account string, fn func(t *stx) error) error {
	return s.w.do(ctx, what, account, fn, opOptions{})
}

// writeOnce is write for what the store writes again soon anyway if it
// fails (Sweep's writes, every minute): it is not retried, so that a
// database that does not answer never holds up whoever waits for the
// sweep (the store's owner stops its sweeper before closing it).
func (s *sqlStore) writeOnce(ctx context.Context, what, account string, fn func(t *stx) error) error {
	return s.w.do(ctx, what, account, fn, opOptions{several: true, retry: retryNever})
}

func (s *sqlStore) migrate(ctx context.Context) error {
	return s.writeTx(ctx, "migrating "+s.d.name+" schema", func(tx *sql.Tx) error {
		for _, q := range s.d.migratePrelude {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("taking migration lock: %w", err)
			}
		}
		for _, stmt := range s.d.schema {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("executing %q: %w", firstLine(stmt), err)
			}
		}
		return s.addColumns(ctx, tx)
	})
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// orMissingAccount returns ErrUnknownAccount if the account does not exist,
// otherwise otherwise. It explains why a conditional UPDATE matched no row.
func (s *sqlStore) orMissingAccount(t *stx, account string, otherwise error) error {
	var one int
	err := t.queryRow(s.st.accountExists, account).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return ErrUnknownAccount
	}
	if err != nil {
		return fmt.Errorf("looking up account: %w", err)
	}
	return otherwise
}

func (s *sqlStore) insertEntry(t *stx, e Entry) error {
	if e.Time.IsZero() {
		e.Time = s.now()
	}
	_, err := t.exec(s.st.insertLedger,
		e.Kind, e.Account, e.KeyID, e.Model, e.UpstreamModel, e.Channel, e.RequestID, e.TokensIn, e.TokensOut, int64(e.Cost), e.Note, toDB(e.Time),
		e.TokensCacheRead, e.TokensCacheWrite, e.TokensCacheWrite1h, e.TraceID)
	if err != nil {
		return fmt.Errorf("writing %s ledger row: %w", e.Kind, err)
	}
	return nil
}

// firstNonEmpty returns the first non-empty string.
func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (s *sqlStore) RecordAttempt(ctx context.Context, e Entry) error {
	if err := validID("account", e.Account); err != nil {
		return fmt.Errorf("recording failed attempt: %w", err)
	}
	e.Kind = KindFailedAttempt
	e.Cost = 0
	return s.write(ctx, "recording failed attempt for request "+e.RequestID, e.Account, func(t *stx) error {
		return s.insertEntry(t, e)
	})
}

// attemptTimeout bounds a RecordAttemptAsync that had to write
// synchronously because the background queue was full.
const attemptTimeout = 10 * time.Second

func (s *sqlStore) RecordAttemptAsync(e Entry, done func(error)) {
	report := func(err error) {
		if done != nil {
			done(err)
		}
	}
	if err := validID("account", e.Account); err != nil {
		report(fmt.Errorf("recording failed attempt: %w", err))
		return
	}
	e.Kind = KindFailedAttempt
	e.Cost = 0
	e.Time = s.now() // when it failed, not when the row lands
	what := "recording failed attempt for request " + e.RequestID
	fn := func(t *stx) error { return s.insertEntry(t, e) }
	if s.w.background(what, e.Account, fn, done) {
		return
	}
	// Full (or closing): write now rather than lose the row.
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
	defer cancel()
	report(s.write(ctx, what, e.Account, fn))
}

// sweepBatch bounds how long one Sweep transaction holds locks (on SQLite,
// the whole database's write lock).
const sweepBatch = 256

// Sweep releases this instance's expired reservations (in memory, see
// lease.go), then reservation rows an older version left, then other
// instances' expired leases; and last returns this instance's spare lease
// money.
func (s *sqlStore) Sweep(ctx context.Context, now time.Time) (int, error) {
	total, err := s.sweepReservations(ctx, now, false)
	if err != nil {
		return total, err
	}
	for {
		n, err := s.sweepOnce(ctx, now)
		total += n
		if err != nil {
			return total, err
		}
		if n < sweepBatch {
			break
		}
	}
	n, err := s.sweepLeases(ctx, now)
	total += n
	if err != nil {
		return total, err
	}
	if err := s.shrink(ctx, nil, nil); err != nil {
		return total, fmt.Errorf("returning spare lease money: %w", err)
	}
	return total, nil
}

func (s *sqlStore) sweepOnce(ctx context.Context, now time.Time) (int, error) {
	type expired struct {
		id, account, key, model, reqID string
		amount                         int64
	}
	var rows []expired
	err := s.writeOnce(ctx, "sweeping expired reservations", "", func(t *stx) error {
		rows = rows[:0]
		rs, err := t.tx.QueryContext(t.ctx, s.q(`DELETE FROM reservations WHERE id IN (SELECT id FROM reservations WHERE expires_at <= ? ORDER BY expires_at LIMIT `+strconv.Itoa(sweepBatch)+s.d.skipLocked+`) RETURNING id, account_id, key_id, model, request_id, amount`), toDB(now))
		if err != nil {
			return err
		}
		if err := eachRow(rs, func(rs *sql.Rows) error {
			var x expired
			err := rs.Scan(&x.id, &x.account, &x.key, &x.model, &x.reqID, &x.amount)
			rows = append(rows, x)
			return err
		}); err != nil {
			return err
		}
		// One update per account, in ID order, so two sweepers on different
		// instances lock accounts in the same order and cannot deadlock.
		perAccount := map[string]int64{}
		for _, x := range rows {
			perAccount[x.account] += x.amount
		}
		accounts := make([]string, 0, len(perAccount))
		for a := range perAccount {
			accounts = append(accounts, a)
		}
		sort.Strings(accounts)
		for _, a := range accounts {
			if _, err := t.tx.ExecContext(t.ctx, s.q(`UPDATE accounts SET reserved = reserved - ? WHERE id = ?`), perAccount[a], a); err != nil {
				return fmt.Errorf("releasing reserved funds of %q: %w", a, err)
			}
		}
		for _, x := range rows {
			if err := s.insertEntry(t, Entry{
				Kind: KindExpired, Account: x.account, KeyID: x.key, Model: x.model, RequestID: x.reqID,
				Note: fmt.Sprintf("reservation %s of %s expired unsettled", x.id, Micros(x.amount)),
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(rows), nil
}

func (s *sqlStore) CreateAccount(ctx context.Context, id string) (Account, error) {
	if err := validID("account", id); err != nil {
		return Account{}, fmt.Errorf("creating account: %w", err)
	}
	a := Account{ID: id, CreatedAt: fromDB(toDB(s.now()))}
	err := s.write(ctx, fmt.Sprintf("creating account %q", id), id, func(t *stx) error {
		res, err := t.tx.ExecContext(t.ctx, s.q(`INSERT INTO accounts (id, balance, reserved, created_at) VALUES (?, 0, 0, ?) ON CONFLICT (id) DO NOTHING`), id, toDB(a.CreatedAt))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return ErrAccountExists
		}
		return nil
	})
	if err != nil {
		return Account{}, err
	}
	return a, nil
}

func (s *sqlStore) Credit(ctx context.Context, account string, amount Micros, note string) (Account, error) {
	what := fmt.Sprintf("crediting %s to account %q", amount, account)
	if amount == 0 || amount == math.MinInt64 {
		return Account{}, fmt.Errorf("%s: %w: amount must be non-zero", what, ErrInvalid)
	}
	if err := validText("note", note); err != nil {
		return Account{}, fmt.Errorf("%s: %w", what, err)
	}
	if amount < 0 {
		// This instance's lease counts as reserved: give its spare money
		// back first. Other instances' leases still count (they shrink
		// when idle, within about a second). Settlements not yet written
		// hold money of the lease too: they release what they did not
		// spend first.
		_ = s.waitSettled(ctx, account, 0)
		if err := s.shrink(ctx, []string{account}, nil); err != nil {
			return Account{}, fmt.Errorf("%s: %w", what, err)
		}
		// And a shrink started elsewhere (a settlement that left the
		// account low) may still be writing the spare money back.
		if err := s.waitShrunk(ctx, account); err != nil {
			return Account{}, fmt.Errorf("%s: %w", what, err)
		}
	}
	var a Account
	err := s.write(ctx, what, account, func(t *stx) error {
		var res sql.Result
		var err error
		if amount > 0 {
			// Checked in SQL because SQLite would silently turn an
			// overflowing integer into a float.
			res, err = t.tx.ExecContext(t.ctx, s.q(`UPDATE accounts SET balance = balance + ? WHERE id = ? AND balance <= ?`),
				int64(amount), account, int64(math.MaxInt64-amount))
		} else {
			// A correction may only take what is not reserved, so it can
			// never break a reservation already promised to a request.
			res, err = t.tx.ExecContext(t.ctx, s.q(`UPDATE accounts SET balance = balance + ? WHERE id = ? AND balance - reserved >= ?`),
				int64(amount), account, int64(-amount))
		}
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			if amount > 0 {
				return s.orMissingAccount(t, account, fmt.Errorf("%w: balance would overflow", ErrInvalid))
			}
			return s.orMissingAccount(t, account, ErrInsufficientFunds)
		}
		if err := s.insertEntry(t, Entry{Kind: KindCredit, Account: account, Cost: amount, Note: note}); err != nil {
			return err
		}
		a, err = scanAccount(t.tx.QueryRowContext(t.ctx, s.q(`SELECT id, balance, reserved, created_at FROM accounts WHERE id = ?`), account))
		return err
	})
	if err != nil {
		return Account{}, err
	}
	return a, nil
}

type scanner interface{ Scan(dest ...any) error }

// eachRow calls scan on every row of rs and closes it; the first error
// wins.
func eachRow(rs *sql.Rows, scan func(*sql.Rows) error) error {
	defer rs.Close()
	for rs.Next() {
		if err := scan(rs); err != nil {
			return err
		}
	}
	if err := rs.Close(); err != nil {
		return err
	}
	return rs.Err()
}

func scanAccount(r scanner) (Account, error) {
	var (
		a                          Account
		balance, reserved, created int64
	)
	if err := r.Scan(&a.ID, &balance, &reserved, &created); err != nil {
		return Account{}, err
	}
	a.Balance, a.Reserved, a.CreatedAt = Micros(balance), Micros(reserved), fromDB(created)
	return a, nil
}

func (s *sqlStore) Account(ctx context.Context, id string) (Account, error) {
	a, err := scanAccount(s.db.QueryRowContext(ctx, s.q(`SELECT id, balance, reserved, created_at FROM accounts WHERE id = ?`), id))
	if errors.Is(err, sql.ErrNoRows) {
		return Account{}, fmt.Errorf("reading account %q: %w", id, ErrUnknownAccount)
	}
	if err != nil {
		return Account{}, fmt.Errorf("reading account %q: %w", id, err)
	}
	return a, nil
}

func (s *sqlStore) Accounts(ctx context.Context) ([]Account, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, balance, reserved, created_at FROM accounts ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("listing accounts: %w", err)
	}
	defer rows.Close()
	var out []Account
	for rows.Next() {
		a, err := scanAccount(rows)
		if err != nil {
			return nil, fmt.Errorf("listing accounts: %w", err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing accounts: %w", err)
	}
	return out, nil
}

func (s *sqlStore) CreateKey(ctx context.Context, account, label string) (string, Key, error) {
	if err := validText("key label", label); err != nil {
		return "", Key{}, err
	}
	plaintext := newKeyPlaintext()
	k := Key{
		ID:        newKeyID(),
		Account:   account,
		Prefix:    plaintext[:len(KeyPrefix)+keyListPrefixLen],
		Label:     label,
		CreatedAt: fromDB(toDB(s.now())),
	}
	err := s.write(ctx, fmt.Sprintf("creating key for account %q", account), account, func(t *stx) error {
		if err := s.orMissingAccount(t, account, nil); err != nil {
			return err
		}
		_, err := t.tx.ExecContext(t.ctx, s.q(`INSERT INTO api_keys (id, account_id, hash, prefix, label, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
			k.ID, k.Account, hashKey(plaintext).String(), k.Prefix, k.Label, toDB(k.CreatedAt))
		return err
	})
	if err != nil {
		return "", Key{}, err
	}
	return plaintext, k, nil
}

func (s *sqlStore) RevokeKey(ctx context.Context, keyID string) error {
	now := s.now()
	err := s.write(ctx, "revoking key "+keyID, "", func(t *stx) error {
		res, err := t.tx.ExecContext(t.ctx, s.q(`UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL`), toDB(now), keyID)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n > 0 {
			return nil
		}
		var one int
		err = t.tx.QueryRowContext(t.ctx, s.q(`SELECT 1 FROM api_keys WHERE id = ?`), keyID).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return ErrUnknownKey
		}
		if err != nil {
			return err
		}
		return ErrKeyRevoked
	})
	// Committed (or failed): either way nothing cached about this key may
	// outlive the call, so the revocation applies to this store at once.
	// Only this key: the others stay known (KnownKey), so that a
	// revocation during an outage does not refuse every other client.
	s.auth.forgetKey(keyID)
	s.known.forgetKey(keyID)
	return err
}

const keyColumns = `id, account_id, prefix, label, created_at, revoked_at`

func scanKey(r scanner) (Key, error) {
	var (
		k       Key
		created int64
		revoked sql.NullInt64
	)
	if err := r.Scan(&k.ID, &k.Account, &k.Prefix, &k.Label, &created, &revoked); err != nil {
		return Key{}, err
	}
	k.CreatedAt = fromDB(created)
	if revoked.Valid {
		t := fromDB(revoked.Int64)
		k.RevokedAt = &t
	}
	return k, nil
}

func (s *sqlStore) Keys(ctx context.Context, account string) ([]Key, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT `+keyColumns+` FROM api_keys WHERE account_id = ? ORDER BY created_at, id`), account)
	if err != nil {
		return nil, fmt.Errorf("listing keys of %q: %w", account, err)
	}
	defer rows.Close()
	var out []Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("listing keys of %q: %w", account, err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing keys of %q: %w", account, err)
	}
	if len(out) == 0 {
		// Distinguish "no keys yet" from a typo in the account name.
		if _, err := s.Account(ctx, account); err != nil {
			return nil, fmt.Errorf("listing keys: %w", err)
		}
	}
	return out, nil
}

func (s *sqlStore) Authenticate(ctx context.Context, plaintext string) (Key, error) {
	if !plausibleKey(plaintext) {
		return Key{}, fmt.Errorf("authenticating: %w", ErrUnknownKey)
	}
	hash := hashKey(plaintext)
	now := s.now()
	k, ok, gen := s.auth.get(hash, now)
	if ok {
		return k, nil
	}
	_, _, knownGen := s.known.get(hash, now)
	var err error
	k, err = scanKey(s.st.authenticate.QueryRowContext(ctx, hash.String()))
	if errors.Is(err, sql.ErrNoRows) {
		s.known.forget(hash)
		return Key{}, fmt.Errorf("authenticating: %w", ErrUnknownKey)
	}
	if err != nil {
		return Key{}, fmt.Errorf("authenticating: %w", err)
	}
	if k.RevokedAt != nil {
		s.known.forget(hash)
		return k, fmt.Errorf("authenticating key %s: %w", k.ID, ErrKeyRevoked)
	}
	s.auth.put(hash, k, now, gen)
	s.known.put(hash, k, now, knownGen)
	return k, nil
}

// KnownKey implements Store.
func (s *sqlStore) KnownKey(plaintext string) (Key, bool) {
	if !plausibleKey(plaintext) {
		return Key{}, false
	}
	k, ok, _ := s.known.get(hashKey(plaintext), s.now())
	return k, ok
}

// Usage page sizes: a default for callers that pass 0, and a ceiling so one
// request cannot pull an entire ledger into memory.
const (
	DefaultUsageLimit = 100
	MaxUsageLimit     = 1000
)

func (s *sqlStore) Usage(ctx context.Context, account string, before int64, limit int) ([]Entry, error) {
	if before <= 0 {
		before = math.MaxInt64
	}
	if limit <= 0 {
		limit = DefaultUsageLimit
	}
	limit = min(limit, MaxUsageLimit)
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT id, kind, account_id, key_id, model, upstream_model, channel, request_id, tokens_in, tokens_out, cost, note, created_at,
		tokens_cache_read, tokens_cache_write, tokens_cache_write_1h, trace_id FROM ledger WHERE account_id = ? AND id < ? ORDER BY id DESC LIMIT ?`),
		account, before, limit)
	if err != nil {
		return nil, fmt.Errorf("reading usage of %q: %w", account, err)
	}
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		var (
			e             Entry
			cost, created int64
		)
		if err := rows.Scan(&e.ID, &e.Kind, &e.Account, &e.KeyID, &e.Model, &e.UpstreamModel, &e.Channel, &e.RequestID, &e.TokensIn, &e.TokensOut, &cost, &e.Note, &created,
			&e.TokensCacheRead, &e.TokensCacheWrite, &e.TokensCacheWrite1h, &e.TraceID); err != nil {
			return nil, fmt.Errorf("reading usage of %q: %w", account, err)
		}
		e.Cost, e.Time = Micros(cost), fromDB(created)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading usage of %q: %w", account, err)
	}
	if len(out) == 0 {
		// An empty page of an account that does not exist is a typo in
		// its name, as for Keys.
		if _, err := s.Account(ctx, account); err != nil {
			return nil, fmt.Errorf("reading usage: %w", err)
		}
	}
	return out, nil
}

func (s *sqlStore) Ping(ctx context.Context) error {
	if err := s.db.PingContext(ctx); err != nil {
		return fmt.Errorf("pinging %s wallet store: %w", s.d.name, err)
	}
	return nil
}

// Close stops retrying writes (see writer.go), lets the writer finish the
// writes already queued, releases the reservations left unsettled
// (KindExpired rows) and returns this instance's leases, then closes the
// database. Writes submitted after Close fail.
func (s *sqlStore) Close() error {
	var leaseErr error
	if s.w != nil {
		// No write waits for a database that does not answer: the
		// settlements and grows being retried fail now, and what Close
		// writes itself is tried once.
		s.w.stop()
		leaseErr = s.closeLeases()
		s.w.close()
	}
	return errors.Join(leaseErr, s.closeDB())
}

// closeDB closes the statements and the database.
func (s *sqlStore) closeDB() error {
	if s.st != nil {
		s.st.close()
	}
	s.inserts.mu.Lock()
	for f := range s.inserts.byRows {
		for i, st := range s.inserts.byRows[f] {
			if st != nil {
				_ = st.Close()
				s.inserts.byRows[f][i] = nil
			}
		}
	}
	s.inserts.mu.Unlock()
	err := s.db.Close()
	if s.onClose != nil {
		s.onClose()
	}
	if err != nil {
		return fmt.Errorf("closing %s wallet store: %w", s.d.name, err)
	}
	return nil
}
