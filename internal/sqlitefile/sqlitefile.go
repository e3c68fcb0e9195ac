// Package sqlitefile opens the embedded SQLite databases the gateway keeps
// (the wallet, the status history) with one set of settings, so that both
// behave the same under load and after a crash. It knows SQLite's
// connection options and nothing of what the tables hold.
package sqlitefile

import (
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"modernc.org/sqlite" // the pure-Go driver: no cgo in the Caddy build
	sqlite3 "modernc.org/sqlite/lib"
)

// Open opens (creating it and its directory if needed) the database at
// path. Every transaction takes the write lock at BEGIN (immediate), so a
// check-then-update never hits SQLITE_BUSY halfway through; WAL lets
// readers run during a write; synchronous=NORMAL is durable against
// process crashes in WAL mode and only risks the last commits on power
// loss; busy is how long a statement waits for another process's lock;
// foreign keys are on (off by default, per connection).
func Open(path string, busy time.Duration) (*sql.DB, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o700); err != nil {
		return nil, fmt.Errorf("creating directory: %w", err)
	}
	q := url.Values{}
	q.Set("_txlock", "immediate")
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(1)")
	return sql.Open("sqlite", "file:"+(&url.URL{Path: abs}).EscapedPath()+"?"+q.Encode())
}

// Busy reports whether err is SQLITE_BUSY or SQLITE_LOCKED, in any of
// their extended forms: the database was locked (by another process, or
// another connection) for longer than the busy timeout. The statement
// that got it did nothing, and an immediate transaction that got it at
// BEGIN or COMMIT took or kept nothing once rolled back, so it may simply
// run again.
func Busy(err error) bool {
	var e *sqlite.Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return true
	}
	return false
}
