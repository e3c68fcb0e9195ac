package wallet

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
)

// The ledger's kind CHECK on SQLite, as released in the CREATE TABLE and
// as every SQLite wallet holds it after migrating.
//
// SQLite codes "kind IN (five strings)" inside a CHECK by building an
// ephemeral b-tree of the five strings for every row it inserts (a
// constraint's code may not use OP_Once, which elsewhere builds the list
// once per statement); on the pure-Go driver that was about 2 µs of a
// settlement's 10 µs ledger row. The same test written as an OR of
// equalities is at most five comparisons. The two accept exactly the same
// rows (kind is NOT NULL TEXT, compared with BINARY collation both
// ways), so the rewrite is a change SQLite documents as safe to make by
// editing the schema's text (https://sqlite.org/lang_altertable.html,
// "making other kinds of table schema changes"): no row on disk changes,
// and every row in the ledger satisfies the new text because it
// satisfied the old. PostgreSQL evaluates IN lists well and keeps its.
const (
	releasedKindCheck = `CHECK (kind IN ('charge', 'release', 'failed_attempt', 'credit', 'expired'))`
	kindCheck         = `CHECK (kind = 'charge' OR kind = 'release' OR kind = 'failed_attempt' OR kind = 'credit' OR kind = 'expired')`
)

// rewriteKindCheck replaces releasedKindCheck in the ledger's schema
// text with kindCheck, once per database, following SQLite's procedure:
// in one write transaction, with writable_schema on, bumping
// schema_version so that every connection (in this process or another)
// reloads the schema. The new text is tried first in a scratch in-memory
// database, where it must create the table, accept a valid row and
// refuse an unknown kind; a database whose text is not the released one
// (already rewritten, or edited by hand) is left alone.
func rewriteKindCheck(ctx context.Context, db *sql.DB) (err error) {
	conn, err := db.Conn(ctx) // the pragmas are per connection
	if err != nil {
		return err
	}
	defer conn.Close()
	defer func() {
		// RESET turns writable_schema off and reloads the schema: this
		// connection would otherwise keep the old one, since the bump below
		// moved its cached schema_version along with the file's. It runs
		// even when ctx has ended; a connection it fails on is discarded
		// rather than returned to the pool with writable_schema on.
		if _, resetErr := conn.ExecContext(context.WithoutCancel(ctx), `PRAGMA writable_schema = RESET`); resetErr != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			if err == nil {
				err = fmt.Errorf("resetting writable_schema: %w", resetErr)
			}
		}
	}()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var stored string
	if err := tx.QueryRowContext(ctx, `SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'ledger'`).Scan(&stored); err != nil {
		return fmt.Errorf("reading the ledger's schema: %w", err)
	}
	if strings.Count(stored, releasedKindCheck) != 1 {
		return tx.Rollback() // rewritten already, or not ours to edit
	}
	rewritten := strings.Replace(stored, releasedKindCheck, kindCheck, 1)
	if err := tryLedgerSchema(ctx, rewritten); err != nil {
		return fmt.Errorf("the rewritten ledger schema fails its trial: %w", err)
	}
	var version int64
	if err := tx.QueryRowContext(ctx, `PRAGMA schema_version`).Scan(&version); err != nil {
		return fmt.Errorf("reading schema_version: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `PRAGMA writable_schema = ON`); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, `UPDATE sqlite_schema SET sql = ? WHERE type = 'table' AND name = 'ledger' AND sql = ?`, rewritten, stored)
	if err != nil {
		return fmt.Errorf("editing the ledger's schema: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("editing the ledger's schema changed %d rows (%v), want 1", n, err)
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA schema_version = %d`, version+1)); err != nil {
		return fmt.Errorf("bumping schema_version: %w", err)
	}
	return tx.Commit()
}

// tryLedgerSchema creates the ledger from createLedger in a scratch
// in-memory database and checks its kind CHECK there.
func tryLedgerSchema(ctx context.Context, createLedger string) error {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // one in-memory database
	if _, err := db.ExecContext(ctx, createLedger); err != nil {
		return err
	}
	insert := `INSERT INTO ledger (kind, account_id, cost, created_at) VALUES (?, 'a', 0, 0)`
	for _, kind := range []string{KindCharge, KindRelease, KindFailedAttempt, KindCredit, KindExpired} {
		if _, err := db.ExecContext(ctx, insert, kind); err != nil {
			return fmt.Errorf("a %s row: %w", kind, err)
		}
	}
	if _, err := db.ExecContext(ctx, insert, "Charge"); err == nil {
		return errors.New("it accepts the kind \"Charge\"")
	}
	return nil
}
