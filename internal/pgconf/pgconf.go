// Package pgconf checks PostgreSQL connection strings when a config
// loads, so that a DSN that can never work is a config error while a
// database that is merely down is an outage the gateway rides out.
package pgconf

import (
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrBadDSN is the error of a DSN that does not parse. It never repeats
// the DSN, which may hold a password.
var ErrBadDSN = errors.New("the PostgreSQL DSN does not parse")

// Validate reports whether dsn parses as pgx reads it, connecting to
// nothing.
func Validate(dsn string) error {
	if _, err := pgxpool.ParseConfig(dsn); err != nil {
		return ErrBadDSN
	}
	return nil
}
