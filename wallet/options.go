package wallet

import (
	"time"

	"github.com/jackc/pgx/v5"
)

// Options tune a store when it is opened.
type Options struct {
	// StatementTimeout bounds each statement: PostgreSQL's
	// statement_timeout, SQLite's busy timeout (how long a write waits
	// for another process holding the database). Zero keeps the
	// defaults: no PostgreSQL timeout, a 10 s SQLite busy timeout.
	StatementTimeout time.Duration
	// LeaseTTL is how long this instance's credit leases outlive its last
	// extension (see lease.go): after a crash, how long the money its
	// requests held stays reserved before Sweep on another instance
	// releases it. Zero means DefaultLeaseTTL.
	LeaseTTL time.Duration

	// tracer, if set, sees every PostgreSQL statement (tests count round
	// trips with it).
	tracer pgx.QueryTracer
}

// lockTimeout is PostgreSQL's lock_timeout for every statement. It is short
// so that an op waiting on a row lock (another instance, or an operator's
// open transaction) fails alone and does not hold the other ops of its
// batch hostage: the batch is re-run one op per transaction, and the
// locked op is retried while its caller still waits (see writer.go).
const lockTimeout = 200 * time.Millisecond

func oneOptions(opts []Options) Options {
	if len(opts) > 0 {
		return opts[0]
	}
	return Options{}
}
