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
	// migrateLock, when set, runs first in the migration transaction.
	migrateLock string
	schema      []string
}

// sqlStore implements Store over database/sql for both dialects.
type sqlStore struct {
	db *sql.DB
	d  dialect
	// writeSem serialises write transactions inside this process (SQLite
	// only). SQLite allows one writer at a time anyway; queueing writers here
	// instead of in SQLite's busy handler, which sleeps and polls, keeps
	// throughput up and latency fair. Other processes sharing the file still
	// wait via busy_timeout.
	writeSem chan struct{}
	onClose  func()
	now      func() time.Time
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

// writeTx runs fn in a write transaction and wraps any error with what.
// On SQLite the driver begins it with BEGIN IMMEDIATE (_txlock=immediate) so
// the write lock is taken up front and a read-then-write can never fail to
// upgrade; on PostgreSQL it is READ COMMITTED and correctness comes from
// conditional UPDATEs, which re-check their WHERE clause after waiting for a
// row lock.
func (s *sqlStore) writeTx(ctx context.Context, what string, fn func(tx *sql.Tx) error) error {
	if s.writeSem != nil {
		select {
		case s.writeSem <- struct{}{}:
			defer func() { <-s.writeSem }()
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
	}
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

func (s *sqlStore) migrate(ctx context.Context) error {
	return s.writeTx(ctx, "migrating "+s.d.name+" schema", func(tx *sql.Tx) error {
		if s.d.migrateLock != "" {
			if _, err := tx.ExecContext(ctx, s.d.migrateLock); err != nil {
				return fmt.Errorf("taking migration lock: %w", err)
			}
		}
		for _, stmt := range s.d.schema {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("executing %q: %w", firstLine(stmt), err)
			}
		}
		return nil
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
func (s *sqlStore) orMissingAccount(ctx context.Context, tx *sql.Tx, account string, otherwise error) error {
	var one int
	err := tx.QueryRowContext(ctx, s.q(`SELECT 1 FROM accounts WHERE id = ?`), account).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return ErrUnknownAccount
	}
	if err != nil {
		return fmt.Errorf("looking up account: %w", err)
	}
	return otherwise
}

func (s *sqlStore) Reserve(ctx context.Context, r Reservation) error {
	if err := validID("reservation", r.ID); err != nil {
		return fmt.Errorf("reserving: %w", err)
	}
	if r.Amount < 0 {
		return fmt.Errorf("reserving %s: %w: negative amount %s", r.ID, ErrInvalid, r.Amount)
	}
	now := s.now()
	exp := r.ExpiresAt
	if exp.IsZero() {
		exp = now.Add(DefaultReservationTTL)
	}
	what := fmt.Sprintf("reserving %s for account %q", r.Amount, r.Account)
	return s.writeTx(ctx, what, func(tx *sql.Tx) error {
		// The whole no-overdraft rule is this one statement: the row is
		// locked while the condition is checked and the amount added, so
		// concurrent reservations from any number of instances serialise on
		// the account row and none can see a stale available balance.
		res, err := tx.ExecContext(ctx, s.q(`UPDATE accounts SET reserved = reserved + ? WHERE id = ? AND balance - reserved >= ?`),
			int64(r.Amount), r.Account, int64(r.Amount))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return s.orMissingAccount(ctx, tx, r.Account, ErrInsufficientFunds)
		}
		_, err = tx.ExecContext(ctx, s.q(`INSERT INTO reservations (id, account_id, key_id, model, request_id, amount, expires_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
			r.ID, r.Account, r.KeyID, r.Model, r.RequestID, int64(r.Amount), toDB(exp), toDB(now))
		return err
	})
}

func (s *sqlStore) insertEntry(ctx context.Context, tx *sql.Tx, e Entry) error {
	if e.Time.IsZero() {
		e.Time = s.now()
	}
	_, err := tx.ExecContext(ctx, s.q(`INSERT INTO ledger (kind, account_id, key_id, model, channel, request_id, tokens_in, tokens_out, cost, note, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		e.Kind, e.Account, e.KeyID, e.Model, e.Channel, e.RequestID, e.TokensIn, e.TokensOut, int64(e.Cost), e.Note, toDB(e.Time))
	if err != nil {
		return fmt.Errorf("writing %s ledger row: %w", e.Kind, err)
	}
	return nil
}

func (s *sqlStore) Settle(ctx context.Context, reservationID string, e Entry) (Micros, error) {
	var charged Micros
	err := s.writeTx(ctx, "settling reservation "+reservationID, func(tx *sql.Tx) error {
		var (
			account, key, model, reqID string
			amount                     int64
		)
		// Deleting the reservation is what makes settlement happen at most
		// once: of two concurrent settles (or a settle and a sweep) only one
		// gets the row back.
		err := tx.QueryRowContext(ctx, s.q(`DELETE FROM reservations WHERE id = ? RETURNING account_id, key_id, model, request_id, amount`), reservationID).
			Scan(&account, &key, &model, &reqID, &amount)
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		cost := e.Cost
		var notes []string
		if e.Note != "" {
			notes = append(notes, e.Note)
		}
		if cost < 0 {
			notes = append(notes, fmt.Sprintf("negative cost %s treated as 0", cost))
			cost = 0
		}
		charged = min(cost, Micros(amount))
		if charged < cost {
			// Never overdraw: the reservation was the promise to the account
			// holder. The difference is the operator's loss, made visible.
			notes = append(notes, fmt.Sprintf("capped: usage cost %s exceeded reservation %s", cost, Micros(amount)))
		}
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE accounts SET balance = balance - ?, reserved = reserved - ? WHERE id = ?`),
			int64(charged), amount, account); err != nil {
			return fmt.Errorf("updating balance: %w", err)
		}
		e.Kind = KindCharge
		if charged == 0 {
			e.Kind = KindRelease
		}
		e.Account = account
		e.KeyID = firstNonEmpty(e.KeyID, key)
		e.Model = firstNonEmpty(e.Model, model)
		e.RequestID = firstNonEmpty(e.RequestID, reqID)
		e.Cost = charged
		e.Note = strings.Join(notes, "; ")
		return s.insertEntry(ctx, tx, e)
	})
	if err != nil {
		return 0, err
	}
	return charged, nil
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
	return s.writeTx(ctx, "recording failed attempt for request "+e.RequestID, func(tx *sql.Tx) error {
		return s.insertEntry(ctx, tx, e)
	})
}

// sweepBatch bounds how long one Sweep transaction holds locks (on SQLite,
// the whole database's write lock).
const sweepBatch = 256

func (s *sqlStore) Sweep(ctx context.Context, now time.Time) (int, error) {
	total := 0
	for {
		n, err := s.sweepOnce(ctx, now)
		total += n
		if err != nil {
			return total, err
		}
		if n < sweepBatch {
			return total, nil
		}
	}
}

func (s *sqlStore) sweepOnce(ctx context.Context, now time.Time) (int, error) {
	type expired struct {
		id, account, key, model, reqID string
		amount                         int64
	}
	var rows []expired
	err := s.writeTx(ctx, "sweeping expired reservations", func(tx *sql.Tx) error {
		rs, err := tx.QueryContext(ctx, s.q(`DELETE FROM reservations WHERE id IN (SELECT id FROM reservations WHERE expires_at <= ? ORDER BY expires_at LIMIT `+strconv.Itoa(sweepBatch)+s.d.skipLocked+`) RETURNING id, account_id, key_id, model, request_id, amount`), toDB(now))
		if err != nil {
			return err
		}
		for rs.Next() {
			var x expired
			if err := rs.Scan(&x.id, &x.account, &x.key, &x.model, &x.reqID, &x.amount); err != nil {
				rs.Close()
				return err
			}
			rows = append(rows, x)
		}
		if err := rs.Close(); err != nil {
			return err
		}
		if err := rs.Err(); err != nil {
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
			if _, err := tx.ExecContext(ctx, s.q(`UPDATE accounts SET reserved = reserved - ? WHERE id = ?`), perAccount[a], a); err != nil {
				return fmt.Errorf("releasing reserved funds of %q: %w", a, err)
			}
		}
		for _, x := range rows {
			if err := s.insertEntry(ctx, tx, Entry{
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
	err := s.writeTx(ctx, fmt.Sprintf("creating account %q", id), func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, s.q(`INSERT INTO accounts (id, balance, reserved, created_at) VALUES (?, 0, 0, ?) ON CONFLICT (id) DO NOTHING`), id, toDB(a.CreatedAt))
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
	var a Account
	err := s.writeTx(ctx, what, func(tx *sql.Tx) error {
		var res sql.Result
		var err error
		if amount > 0 {
			// Checked in SQL because SQLite would silently turn an
			// overflowing integer into a float.
			res, err = tx.ExecContext(ctx, s.q(`UPDATE accounts SET balance = balance + ? WHERE id = ? AND balance <= ?`),
				int64(amount), account, int64(math.MaxInt64-amount))
		} else {
			// A correction may only take what is not reserved, so it can
			// never break a reservation already promised to a request.
			res, err = tx.ExecContext(ctx, s.q(`UPDATE accounts SET balance = balance + ? WHERE id = ? AND balance - reserved >= ?`),
				int64(amount), account, int64(-amount))
		}
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			if amount > 0 {
				return s.orMissingAccount(ctx, tx, account, fmt.Errorf("%w: balance would overflow", ErrInvalid))
			}
			return s.orMissingAccount(ctx, tx, account, ErrInsufficientFunds)
		}
		if err := s.insertEntry(ctx, tx, Entry{Kind: KindCredit, Account: account, Cost: amount, Note: note}); err != nil {
			return err
		}
		a, err = scanAccount(tx.QueryRowContext(ctx, s.q(`SELECT id, balance, reserved, created_at FROM accounts WHERE id = ?`), account))
		return err
	})
	if err != nil {
		return Account{}, err
	}
	return a, nil
}

type scanner interface{ Scan(dest ...any) error }

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
	plaintext := newKeyPlaintext()
	k := Key{
		ID:        newKeyID(),
		Account:   account,
		Prefix:    plaintext[:len(KeyPrefix)+keyListPrefixLen],
		Label:     label,
		CreatedAt: fromDB(toDB(s.now())),
	}
	err := s.writeTx(ctx, fmt.Sprintf("creating key for account %q", account), func(tx *sql.Tx) error {
		if err := s.orMissingAccount(ctx, tx, account, nil); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO api_keys (id, account_id, hash, prefix, label, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
			k.ID, k.Account, hashKey(plaintext), k.Prefix, k.Label, toDB(k.CreatedAt))
		return err
	})
	if err != nil {
		return "", Key{}, err
	}
	return plaintext, k, nil
}

func (s *sqlStore) RevokeKey(ctx context.Context, keyID string) error {
	return s.writeTx(ctx, "revoking key "+keyID, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, s.q(`UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL`), toDB(s.now()), keyID)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n > 0 {
			return nil
		}
		var one int
		err = tx.QueryRowContext(ctx, s.q(`SELECT 1 FROM api_keys WHERE id = ?`), keyID).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return ErrUnknownKey
		}
		if err != nil {
			return err
		}
		return ErrKeyRevoked
	})
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
	k, err := scanKey(s.db.QueryRowContext(ctx, s.q(`SELECT `+keyColumns+` FROM api_keys WHERE hash = ?`), hashKey(plaintext)))
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, fmt.Errorf("authenticating: %w", ErrUnknownKey)
	}
	if err != nil {
		return Key{}, fmt.Errorf("authenticating: %w", err)
	}
	if k.RevokedAt != nil {
		return k, fmt.Errorf("authenticating key %s: %w", k.ID, ErrKeyRevoked)
	}
	return k, nil
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
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT id, kind, account_id, key_id, model, channel, request_id, tokens_in, tokens_out, cost, note, created_at FROM ledger WHERE account_id = ? AND id < ? ORDER BY id DESC LIMIT ?`),
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
		if err := rows.Scan(&e.ID, &e.Kind, &e.Account, &e.KeyID, &e.Model, &e.Channel, &e.RequestID, &e.TokensIn, &e.TokensOut, &cost, &e.Note, &created); err != nil {
			return nil, fmt.Errorf("reading usage of %q: %w", account, err)
		}
		e.Cost, e.Time = Micros(cost), fromDB(created)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading usage of %q: %w", account, err)
	}
	return out, nil
}

func (s *sqlStore) Ping(ctx context.Context) error {
	if err := s.db.PingContext(ctx); err != nil {
		return fmt.Errorf("pinging %s wallet store: %w", s.d.name, err)
	}
	return nil
}

func (s *sqlStore) Close() error {
	err := s.db.Close()
	if s.onClose != nil {
		s.onClose()
	}
	if err != nil {
		return fmt.Errorf("closing %s wallet store: %w", s.d.name, err)
	}
	return nil
}
