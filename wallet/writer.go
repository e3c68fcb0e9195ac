package wallet

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Group commit.
//
// Every write of a store (Reserve, Settle, RecordAttempt, and the rarer
// Sweep, Credit, CreateAccount, CreateKey, RevokeKey) is an op put on the
// store's write queue, and its caller waits for the op's own result, so the
// Store's semantics are unchanged: when Reserve returns nil the reservation
// is committed, when Settle returns it is committed.
//
// A writer goroutine (SQLite has one; PostgreSQL a few, see newWriter)
// takes whatever is queued when it becomes free, up to maxBatch ops,
// without waiting for more (it yields the processor once, but sets no
// timer: a lone request adds no latency), and runs them in order in one
// transaction on its own connection, then commits once. Under load, N
// requests thus share one BEGIN, one COMMIT and one WAL write instead of
// paying N of each, and on SQLite the writer's dedicated connection
// replaces the in-process write queue. The no-overdraft rule is unchanged:
// each Reserve is the same conditional UPDATE, evaluated in order inside
// the transaction, so it sees every earlier op of the batch.
//
// One op's failure does not fail the others:
//
//   - On SQLite each op of a batch runs inside its own SAVEPOINT; an op that
//     fails (ErrInsufficientFunds, ErrNotFound, a constraint error, ...)
//     is undone with ROLLBACK TO SAVEPOINT and the rest commit.
//   - On PostgreSQL two savepoint statements per op would cost two extra
//     round trips each, more than the batching saves. Instead, every op is
//     written so that when it fails with one of this package's errors
//     (ErrInsufficientFunds, ErrNotFound, ErrUnknownAccount, ...) it has
//     written nothing and no statement failed; such an op is simply left
//     out. Any other error (a constraint violation, a deadlock with another
//     instance's batch) aborts a PostgreSQL transaction, so the batch is
//     rolled back and its ops are run again, one transaction each, exactly
//     as without batching.
//   - On either store, if the batch transaction itself breaks (BEGIN or
//     COMMIT fails), every op of the batch gets that error (and, if it
//     was transient, runs again: see Retries below).
//
// Deadlocks (PostgreSQL): a batch holds the row locks of all its ops until
// it commits, so two batches (of two writer goroutines, or of two
// instances) could lock two accounts in opposite orders. The writer therefore sorts a PostgreSQL
// batch by account (the account each op names: Reservation.Account,
// Entry.Account, ...; any order of concurrent calls is a valid one), and
// runs an op that writes several accounts (opOptions.several: a
// settlement batch, a shrink, a sweep) in a transaction of its own; each
// op takes an account's row before its lease's (lease.go's lock order).
// That leaves only rare cycles through one reservation row (the same
// reservation settled twice at once, or settled while a Sweep releases
// it). PostgreSQL breaks those after
// deadlock_timeout (1 s by default) by failing one statement; that batch
// is re-run one op per transaction, and a single-op transaction that hits
// a deadlock or serialization failure is retried (see Retries below).
//
// Context: an op whose context is done before the writer starts it is
// skipped and its caller gets ctx.Err(), also while it is still queued. Once
// the writer has started an op, its statements run to completion
// regardless of the context (cancelling a statement would abort the whole
// batch: on SQLite an interrupt rolls back the transaction, on PostgreSQL
// pgx drops the connection), and the op commits, or fails, with its batch.
// Statements are bounded instead by the store's statement and lock
// timeouts. An op with an undo returns ctx.Err() to its caller at once,
// and should it commit after all, undo runs in the background; any other
// op's caller waits for the outcome, so that a credit the caller was told
// failed never lands.
//
// A lock timeout (PostgreSQL lock_timeout, see lockTimeout) fails the op
// that waited, which re-runs its batch one op per transaction: the other
// ops commit, and the locked one is retried while its caller waits.
//
// Retries. A write that fails on a transient fault of the database is run
// again, after a pause that doubles from retryFirst to retryMax, until it
// succeeds, its caller's context ends, the store closes, or retryBudget
// has passed since it first failed; then its caller gets the last error.
// The writer goroutine does not sleep meanwhile: it keeps running new
// batches, and re-runs the waiting ops together as a batch of their own
// when the pause is over. What a failure means is the dialect's to say
// (failure):
//
//   - notApplied: the database did not apply the op. The statement was
//     never sent (no connection, a connection found dead before use), or
//     the server answered and rolled back (deadlock, serialization
//     failure, lock or statement timeout, shutdown; on SQLite, the file
//     locked by another process past busy_timeout), or the connection was
//     lost inside a transaction before its COMMIT was sent. Any op may be
//     run again.
//   - unknown: the connection was lost after a COMMIT, or an autocommit
//     statement, was sent (PostgreSQL only: an SQLite file does not lose
//     what it was sent). The op may have committed. What happens next is
//     the op's retry policy: most ops fail (a credit, an account, a key or
//     a ledger row must never land twice, so their caller is told, and the
//     error wraps errOutcomeUnknown); an op a duplicate cannot hurt
//     (retryAlways: a lease grow, whose spare grant lease.go gives back)
//     simply runs again; a settlement batch (retryChecked) runs again
//     once the writer has made sure that the lost connection's session
//     has ended (so that nothing of the first run can still commit), and
//     first looks in the ledger for what the first run wrote (stx.unsure,
//     settle.go).
//
// Writes the store makes again soon anyway (Renew's, every second;
// Sweep's, every minute) are not retried (retryNever). To lose fewer
// writes to a connection that died while idle (a database restart, a
// proxy's idle timeout), a PostgreSQL writer pings its connection before
// using it again after pingIdle, as database/sql does for pooled
// connections.
//
// A panic in a batch fails that batch's unfinished ops with an error; the
// writer goes on with the next batch.
//
// Close stops retrying at once (ops waiting for a re-run fail with their
// last error), stops accepting ops (they fail with errStoreClosed), lets
// the writer finish everything already queued, and waits for it to exit.

// maxBatch bounds how many ops share one transaction, and so how long a
// batch holds SQLite's write lock or PostgreSQL's row locks.
const maxBatch = 64

// retryFirst and retryMax bound the pause before a write that failed on
// a transient fault runs again: the first pause, doubling up to the
// longest. A connection reset is usually mended by the next connection
// at once; a database restarting or failing over takes seconds.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 2 * time.Second
)

// retryBudget bounds how long after its first failure a write is run
// again. 30 s rides out a PostgreSQL restart or failover and an SQLite
// file held by another process for a few busy timeouts. Longer would
// hardly save more: the store's lease rows, which Renew cannot extend
// while the database is away, expire DefaultLeaseTTL (30 s) after their
// last extension, and another instance's Sweep may then release them, so
// that a settlement written later finds its money gone anyway. A
// settlement keeps its reservation's money held while it is retried; one
// given up is left to expire (see settle.go).
const retryBudget = 30 * time.Second

// pingIdle: a PostgreSQL writer connection idle for longer is pinged
// before its next batch, so that one the server (or a proxy) closed
// meanwhile is replaced before any write is sent on it; pingTimeout
// bounds the ping and connectTimeout getting a connection, so that a
// database that does not answer is a fault to retry, not a writer stuck.
const (
	pingIdle       = time.Second
	pingTimeout    = 5 * time.Second
	connectTimeout = 10 * time.Second
)

// lateReleaseTimeout bounds the background release of a reservation that
// committed after its caller gave up.
const lateReleaseTimeout = 30 * time.Second

// errStoreClosed is returned for writes submitted after Close, and for
// those Close found waiting to be tried again (closingError).
var errStoreClosed = errors.New("wallet store is closed")

// closingError is the error of a write that failed on a transient error
// and is not tried again because the store is closing: the caller learns
// the store closed (as every other write in flight at Close does) and
// why this one did not get through. Whether it was applied is what
// maybeApplied adds.
func closingError(err error) error {
	return fmt.Errorf("not retried, the store is closing: %w: %w", errStoreClosed, err)
}

// errOutcomeUnknown is wrapped in the error of a write whose connection
// was lost after the write was sent: it may have committed.
var errOutcomeUnknown = errors.New("outcome unknown: the connection was lost after the write was sent, so it may have been applied")

// failure is what a failed run of an op tells of the database (see
// Retries above).
type failure uint8

const (
	// failed: the op's own answer (one of this package's errors, a
	// constraint), or a fault that running it again would not mend.
	failed failure = iota
	// notApplied: the database did not apply the op; it may run again.
	notApplied
	// unknown: the connection was lost after the op was sent, and it may
	// have committed.
	unknown
)

// retryPolicy is what becomes of an op after a transient failure (see
// Retries above).
type retryPolicy uint8

const (
	// retrySafe re-runs an op the database did not apply, and fails one
	// whose outcome is unknown: the default.
	retrySafe retryPolicy = iota
	// retryAlways also re-runs an op whose outcome is unknown: a duplicate
	// does no harm.
	retryAlways
	// retryChecked also re-runs an op whose outcome is unknown, once the
	// lost connection's session has ended; the op sees stx.unsure, finds
	// out what its earlier run wrote, and calls stx.resolve.
	retryChecked
	// retryNever fails at once: the op's caller writes it again soon.
	retryNever
)

// opOptions say how an op runs.
type opOptions struct {
	// undo runs if the op commits after its caller gave up.
	undo func()
	// single: fn is one statement, atomic by itself, so run alone it needs
	// no BEGIN and COMMIT (PostgreSQL: one round trip instead of three).
	single bool
	// several: fn writes the rows of several accounts (taking their locks
	// in order, see lease.go's lock order). On PostgreSQL it runs in a
	// transaction of its own: in a batch, the ops before and after it
	// would lock accounts on either side of its own, out of order.
	several bool
	retry   retryPolicy
}

// session identifies the database session behind a writer connection
// (PostgreSQL: its backend's pid and start), so that once the connection
// is lost the writer can make sure the session has ended.
type session struct {
	pid   int64
	start time.Time
}

// faults is how a dialect's failures read (see Retries above).
type faults struct {
	// classify says what a run's error tells of the database; nil: every
	// error is failed. The writer itself reads a connection database/sql
	// found broken (driver.ErrBadConn, sql.ErrConnDone) as notApplied.
	classify func(error) failure
	// sessionOf identifies a new writer connection's session, and ended
	// makes sure the sessions of lost connections have ended; nil when a
	// dialect never reports unknown.
	sessionOf func(ctx context.Context, c *sql.Conn) (session, error)
	ended     func(ctx context.Context, c *sql.Conn, lost []session) error
	// pingIdle: a writer connection idle for longer is pinged before use;
	// 0, never.
	pingIdle time.Duration
}

// Observer hears of a store's write faults (see SetObserver). Its methods
// run on the store's writer goroutines: they must be quick and must not
// call the store.
type Observer interface {
	// WriteRetried: a write, named by what, that failed on a transient
	// fault of the database (err) runs again.
	WriteRetried(what string, err error)
	// SettlementUnwritten: a settlement of the request could not be
	// written, as the database kept failing for as long as the store
	// retries writes or the store closed first; err says why. Its answer
	// is not charged, and its reservation's money stays held until the
	// reservation expires (or, when the outcome was unknown, until the
	// lease gives back what it holds beyond what it counts).
	SettlementUnwritten(requestID, account string, err error)
}

// SetObserver makes o hear of the write faults of s, a store this package
// opened (any other is left alone); o replaces any observer set before.
func SetObserver(s Store, o Observer) {
	if ss, ok := s.(*sqlStore); ok && ss.w != nil {
		ss.w.observer.Store(&o)
	}
}

// Op states: the caller and the writer race to move an op out of opQueued;
// whoever wins decides whether it runs. An op waiting to run again is
// back in opQueued, so that its caller can still give up on it.
const (
	opQueued int32 = iota
	opStarted
	opAbandoned
)

type writeOp struct {
	ctx  context.Context
	what string // names the op to the observer
	key  string // the account the op locks, if known: orders the batch
	fn   func(t *stx) error
	opOptions
	state atomic.Int32
	// finished is set by finish; only the writer goroutine reads it.
	finished bool
	err      error         // set by the writer before done is closed
	done     chan struct{} // closed when err is final

	// Set by the writer goroutine running the op. class is what its last
	// run's err tells (see failure). unsure: a run whose outcome is
	// unknown may have committed (do reads it only once it took the op
	// back from opQueued). lost are the sessions of connections lost under
	// such runs, which must have ended before a retryChecked op runs
	// again. runs counts its runs, failedAt is its first failure's time.
	class    failure
	unsure   bool
	lost     []session
	runs     int
	failedAt time.Time
}

// stx is one op's view of the writer's transaction. Statements prepared on
// the store (s.st) are bound to the transaction through stmt, once per
// transaction.
type stx struct {
	ctx context.Context
	// tx is nil when a single op runs alone outside a transaction (see
	// opOptions.single); then only queryRowText may be used, on conn.
	tx    *sql.Tx
	conn  *sql.Conn
	bound map[*sql.Stmt]*sql.Stmt
	// unsure: an earlier run of this op, whose outcome is unknown, may
	// have committed (retryAlways and retryChecked ops run again after
	// one); a retryChecked op calls resolve once it knows what that run
	// wrote.
	unsure, resolved bool
}

// resolve tells the writer that the op found out what its earlier run
// wrote: should this run fail too, the op's outcome is no longer in
// doubt because of that earlier run.
func (t *stx) resolve() { t.resolved = true }

// queryRowText runs one statement given as text, in the transaction or, for
// a single op run alone, on the writer's connection in autocommit. pgx
// prepares it once per connection (its statement cache).
func (t *stx) queryRowText(query string, args ...any) *sql.Row {
	if t.tx == nil {
		return t.conn.QueryRowContext(t.ctx, query, args...)
	}
	return t.tx.QueryRowContext(t.ctx, query, args...)
}

// queryText is queryRowText for a statement answering several rows.
func (t *stx) queryText(query string, args ...any) (*sql.Rows, error) {
	if t.tx == nil {
		return t.conn.QueryContext(t.ctx, query, args...)
	}
	return t.tx.QueryContext(t.ctx, query, args...)
}

func (t *stx) stmt(st *sql.Stmt) *sql.Stmt {
	if b, ok := t.bound[st]; ok {
		return b
	}
	b := t.tx.StmtContext(t.ctx, st)
	t.bound[st] = b
	return b
}

func (t *stx) exec(st *sql.Stmt, args ...any) (sql.Result, error) {
	return t.stmt(st).ExecContext(t.ctx, args...)
}

func (t *stx) queryRow(st *sql.Stmt, args ...any) *sql.Row {
	return t.stmt(st).QueryRowContext(t.ctx, args...)
}

type writer struct {
	db *sql.DB
	st *stmts
	// savepoints: isolate ops with SAVEPOINT (SQLite) rather than re-running
	// the batch when an op fails with a statement error (PostgreSQL).
	savepoints bool
	faults
	queue chan *writeOp
	// budget is retryBudget (shorter in tests).
	budget time.Duration

	mu     sync.RWMutex // guards closed against sends on a closed queue
	closed bool
	// Background ops (see background): bgSlots bounds them, bg counts
	// them so that close waits for them, bgClosed refuses new ones.
	bgSlots  chan struct{}
	bg       sync.WaitGroup
	bgClosed bool
	once     sync.Once
	// halt is closed when the writer stops retrying (stop).
	halt     chan struct{}
	haltOnce sync.Once
	workers  int
	exited   sync.WaitGroup
	observer atomic.Pointer[Observer]

	// batches counts transactions holding more than one op, reruns the
	// batches re-run one op per transaction, retried the runs of ops
	// again after a transient failure, gaveUp the ops that failed for
	// good after retryBudget or because the store closed (tests and
	// diagnostics).
	batches, reruns, retried, gaveUp atomic.Int64
}

// worker is one writer goroutine's state.
type worker struct {
	*writer
	conn *sql.Conn
	sess session   // conn's
	used time.Time // when conn last ran a batch
	live []*writeOp
	one  [1]*writeOp // an op run alone, without allocating its slice
	// bound is the statements bound to the current transaction.
	bound map[*sql.Stmt]*sql.Stmt
	// again are the ops waiting to run again, when timer fires (armed),
	// spare the slice they last ran from; pause is the next wait.
	again, spare []*writeOp
	timer        *time.Timer
	armed        bool
	pause        time.Duration
}

// newWriter starts workers goroutines that take batches from one queue:
// one for SQLite, which has one writer at a time anyway; a few for
// PostgreSQL, where a batch mostly waits on round trips and batches of
// different accounts can run side by side.
func newWriter(db *sql.DB, st *stmts, savepoints bool, f faults, workers int) *writer {
	w := &writer{
		db:         db,
		st:         st,
		savepoints: savepoints,
		faults:     f,
		queue:      make(chan *writeOp, 4*maxBatch),
		budget:     retryBudget,
		bgSlots:    make(chan struct{}, MaxBackgroundWrites),
		halt:       make(chan struct{}),
		workers:    max(1, workers),
	}
	for range w.workers {
		wk := &worker{
			writer: w,
			live:   make([]*writeOp, 0, maxBatch),
			bound:  map[*sql.Stmt]*sql.Stmt{},
			timer:  time.NewTimer(time.Hour),
			pause:  retryFirst,
		}
		wk.timer.Stop()
		w.exited.Add(1)
		go wk.loop()
	}
	return w
}

// do submits fn and waits for its result, wrapped with what. With an undo,
// do returns when ctx ends even if fn has started (see above).
func (w *writer) do(ctx context.Context, what, key string, fn func(t *stx) error, o opOptions) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	op := &writeOp{ctx: ctx, what: what, key: key, fn: fn, opOptions: o, done: make(chan struct{})}
	w.mu.RLock()
	if w.closed {
		w.mu.RUnlock()
		return fmt.Errorf("%s: %w", what, errStoreClosed)
	}
	select {
	case w.queue <- op:
		w.mu.RUnlock()
	case <-ctx.Done():
		w.mu.RUnlock()
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	select {
	case <-op.done:
	case <-ctx.Done():
		if op.state.CompareAndSwap(opQueued, opAbandoned) {
			// Queued, or waiting to run again: the writer will skip it.
			return fmt.Errorf("%s: %w", what, maybeApplied(op, ctx.Err()))
		}
		// Already running: its outcome is the batch's.
		if op.undo == nil {
			<-op.done
			break
		}
		go func() {
			<-op.done
			if op.err == nil {
				op.undo()
			}
		}()
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	if op.err != nil {
		return fmt.Errorf("%s: %w", what, op.err)
	}
	return nil
}

// maybeApplied wraps err with errOutcomeUnknown when a run of op may have
// committed.
func maybeApplied(op *writeOp, err error) error {
	if op.unsure && !errors.Is(err, errOutcomeUnknown) {
		return fmt.Errorf("%w: %w", errOutcomeUnknown, err)
	}
	return err
}

// MaxBackgroundWrites bounds the writes waiting in the background (failed
// attempts' rows), and so the memory a stalled store can make them hold.
const MaxBackgroundWrites = 4096

// background submits fn without waiting: it returns false, having done
// nothing, when MaxBackgroundWrites are already waiting or the writer is
// closing; otherwise done gets the outcome, from another goroutine.
func (w *writer) background(what, key string, fn func(t *stx) error, done func(error)) bool {
	select {
	case w.bgSlots <- struct{}{}:
	default:
		return false
	}
	w.mu.RLock()
	if w.bgClosed {
		w.mu.RUnlock()
		<-w.bgSlots
		return false
	}
	w.bg.Add(1)
	w.mu.RUnlock()
	go func() {
		defer w.bg.Done()
		err := w.do(context.Background(), what, key, fn, opOptions{})
		<-w.bgSlots
		if done != nil {
			done(err)
		}
	}()
	return true
}

// stop makes the writer give up retrying: the ops waiting to run again
// fail with their last error, and a failure from now on is final.
func (w *writer) stop() {
	w.haltOnce.Do(func() { close(w.halt) })
}

func (w *writer) halted() bool {
	select {
	case <-w.halt:
		return true
	default:
		return false
	}
}

// close stops retrying, then stops the writer after it has run every op
// already queued, background ones included.
func (w *writer) close() {
	w.stop()
	w.mu.Lock()
	w.bgClosed = true
	w.mu.Unlock()
	w.bg.Wait()
	w.once.Do(func() {
		w.mu.Lock()
		w.closed = true
		close(w.queue)
		w.mu.Unlock()
	})
	w.exited.Wait()
}

func (w *worker) loop() {
	defer w.exited.Done()
	batch := make([]*writeOp, 0, maxBatch)
	for {
		var again <-chan time.Time
		var halt <-chan struct{}
		if len(w.again) > 0 {
			if !w.armed {
				w.timer.Reset(w.pause)
				w.armed = true
			}
			again, halt = w.timer.C, w.halt
		}
		select {
		case op, ok := <-w.queue:
			if !ok {
				w.flush()
				w.dropConn()
				return
			}
			batch = append(batch[:0], op)
			// Yield once, so that goroutines already runnable (other
			// requests about to submit their writes) get to queue them
			// first. This is no timed wait: with nothing else runnable it
			// returns at once. It matters most with few Ps (GOMAXPROCS=1):
			// there the first send would otherwise hand the processor
			// straight to the writer, and every batch would hold one op.
			runtime.Gosched()
		fill:
			for len(batch) < maxBatch {
				select {
				case op, ok := <-w.queue:
					if !ok {
						break fill
					}
					batch = append(batch, op)
				default:
					break fill
				}
			}
		case <-again:
			w.armed = false
			w.pause = min(2*w.pause, retryMax)
			w.runAgain()
			continue
		case <-halt:
			w.flush()
			continue
		}
		w.runRecovering(batch)
		clear(batch)
		if len(w.again) == 0 {
			w.pause = retryFirst
		}
	}
}

// runAgain runs the ops waiting to run again, in batches of their own;
// those that fail again wait for the next round.
func (w *worker) runAgain() {
	todo := w.again
	w.again, w.spare = w.spare[:0], nil
	for i := 0; i < len(todo); i += maxBatch {
		if w.halted() {
			// Failed by the next turn of the loop.
			w.again = append(w.again, todo[i:]...)
			break
		}
		w.runRecovering(todo[i:min(i+maxBatch, len(todo))])
	}
	clear(todo)
	w.spare = todo[:0]
	if len(w.again) == 0 {
		w.pause = retryFirst
	}
}

// flush fails the ops waiting to run again: the store is closing.
func (w *worker) flush() {
	w.timer.Stop()
	w.armed = false
	for _, op := range w.again {
		if op.state.CompareAndSwap(opQueued, opStarted) {
			w.gaveUp.Add(1)
			finish(op, maybeApplied(op, closingError(op.err)))
		}
	}
	clear(w.again)
	w.again = w.again[:0]
}

func finish(op *writeOp, err error) {
	op.err = err
	op.finished = true
	close(op.done)
}

// runRecovering runs a batch; should it panic, the batch's transaction is
// dropped with its connection and every op not yet answered fails.
func (w *worker) runRecovering(batch []*writeOp) {
	defer func() {
		if r := recover(); r != nil {
			w.dropConn()
			clear(w.live)
			w.live = w.live[:0]
			for _, op := range batch {
				if op.state.Load() == opStarted && !op.finished {
					finish(op, fmt.Errorf("wallet writer panicked: %v", r))
				}
			}
		}
	}()
	w.run(batch)
}

func (w *worker) run(batch []*writeOp) {
	live := w.live[:0]
	for _, op := range batch {
		if !op.state.CompareAndSwap(opQueued, opStarted) {
			continue // abandoned: its caller has returned ctx.Err()
		}
		if err := op.ctx.Err(); err != nil {
			finish(op, maybeApplied(op, err))
			continue
		}
		op.runs++
		live = append(live, op)
	}
	if !w.savepoints && len(live) > 1 {
		// PostgreSQL: an op of several accounts runs alone (see several).
		n := 0
		for _, op := range live {
			if op.several {
				w.runAlone(op)
				continue
			}
			live[n] = op
			n++
		}
		clear(live[n:])
		live = live[:n]
	}
	switch {
	case len(live) == 1:
		w.runAlone(live[0])
	case len(live) > 1:
		w.batches.Add(1)
		if !w.savepoints {
			// PostgreSQL: lock accounts in one order in every batch.
			slices.SortStableFunc(live, func(a, b *writeOp) int { return strings.Compare(a.key, b.key) })
		}
		if w.runTx(live) {
			w.reruns.Add(1)
			for _, op := range live {
				w.runAlone(op)
			}
		} else {
			for _, op := range live {
				w.conclude(op)
			}
		}
	}
	clear(live)
	w.live = live[:0]
	if w.pingIdle > 0 {
		w.used = time.Now()
	}
}

func (w *worker) dropConn() {
	if w.conn != nil {
		_ = w.conn.Close()
		w.conn = nil
	}
}

// isClean reports whether err is one an op returns having written nothing
// and with no failed statement, which leaves a PostgreSQL transaction usable.
func isClean(err error) bool {
	for _, e := range []error{ErrInsufficientFunds, ErrNotFound, ErrUnknownAccount, ErrAccountExists, ErrUnknownKey, ErrKeyRevoked, ErrInvalid} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// runAlone runs op in a transaction of its own and concludes it.
func (w *worker) runAlone(op *writeOp) {
	w.one[0] = op
	w.runTx(w.one[:])
	w.one[0] = nil
	w.conclude(op)
}

// conclude delivers op's result, or puts it back to run again after a
// transient failure (see Retries above).
func (w *worker) conclude(op *writeOp) {
	err := op.err
	if err == nil || op.class == failed {
		finish(op, err)
		return
	}
	if op.class == unknown {
		op.unsure = true
		if op.retry == retrySafe {
			finish(op, maybeApplied(op, err))
			return
		}
	}
	now := time.Now()
	if op.failedAt.IsZero() {
		op.failedAt = now
	}
	switch {
	case op.retry == retryNever || op.ctx.Err() != nil:
		finish(op, maybeApplied(op, err))
	case w.halted():
		w.gaveUp.Add(1)
		finish(op, maybeApplied(op, closingError(err)))
	case now.Sub(op.failedAt) >= w.budget:
		w.gaveUp.Add(1)
		finish(op, maybeApplied(op, fmt.Errorf("gave up after %d runs in %s: %w", op.runs, now.Sub(op.failedAt).Round(time.Millisecond), err)))
	default:
		w.retried.Add(1)
		if o := w.observer.Load(); o != nil {
			(*o).WriteRetried(op.what, err)
		}
		op.state.Store(opQueued)
		w.again = append(w.again, op)
	}
}

// judge records op's run: its error and what the error tells (see
// failure). committing says the error came from a statement that could
// have committed (an autocommit statement, or COMMIT); any other
// statement's transaction ends rolled back. sess is the session the run
// used, remembered when the outcome is unknown.
func (w *worker) judge(op *writeOp, err error, committing bool, sess session) {
	op.err, op.class = err, failed
	if err == nil || isClean(err) {
		return
	}
	switch {
	case errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone):
		// database/sql found the connection broken before using it.
		op.class = notApplied
	case w.classify != nil:
		op.class = w.classify(err)
	}
	if op.class == unknown && !committing {
		op.class = notApplied
	}
	if op.class == unknown && op.retry == retryChecked && sess != (session{}) {
		op.lost = append(op.lost, sess)
	}
}

// ready makes sure the worker has a connection, pinging one idle for
// longer than pingIdle and replacing it should the ping fail.
func (w *worker) ready(ctx context.Context) error {
	if w.conn != nil && w.pingIdle > 0 && time.Since(w.used) > w.pingIdle {
		pctx, cancel := context.WithTimeout(ctx, pingTimeout)
		err := w.conn.PingContext(pctx)
		cancel()
		if err != nil {
			w.dropConn()
		}
	}
	if w.conn != nil {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	c, err := w.db.Conn(cctx)
	if err != nil {
		return err
	}
	w.conn, w.sess = c, session{}
	if w.sessionOf != nil {
		s, err := w.sessionOf(cctx, c)
		if err != nil {
			w.dropConn()
			return fmt.Errorf("identifying the connection's session: %w", err)
		}
		w.sess = s
	}
	return nil
}

// runTx runs ops in one transaction and judges each op's run; the caller
// concludes them. It returns true, having rolled back, when the batch must
// be re-run one op per transaction; that never happens for a single op.
func (w *worker) runTx(ops []*writeOp) (rerun bool) {
	ctx := context.Background()
	if err := w.ready(ctx); err != nil {
		for _, op := range ops {
			op.err, op.class = fmt.Errorf("beginning transaction: %w", err), notApplied
		}
		return false
	}
	sess := w.sess
	if w.ended != nil {
		// A retryChecked op whose earlier run was lost with its connection
		// runs again only once that connection's session has ended: until
		// then, what it sent may still commit.
		for _, op := range ops {
			if len(op.lost) == 0 {
				continue
			}
			if err := w.ended(ctx, w.conn, op.lost); err != nil {
				w.dropConn()
				for _, op := range ops {
					op.err, op.class = fmt.Errorf("making sure the session of a lost connection has ended: %w", err), notApplied
				}
				return false
			}
			op.lost = op.lost[:0]
		}
	}
	if len(ops) == 1 && ops[0].single && !w.savepoints {
		// One statement is its own transaction: no BEGIN, no COMMIT.
		op := ops[0]
		t := stx{ctx: ctx, conn: w.conn, unsure: op.unsure}
		err := op.fn(&t)
		if t.resolved {
			op.unsure = false
		}
		w.judge(op, err, true, sess)
		if err != nil && !isClean(err) {
			// As after a failed BEGIN: a fresh connection next time, should
			// this one be broken.
			w.dropConn()
		}
		return false
	}
	// On SQLite the driver begins with BEGIN IMMEDIATE (_txlock=immediate),
	// so the write lock is taken up front; on PostgreSQL it is READ
	// COMMITTED and correctness comes from conditional UPDATEs, which
	// re-check their WHERE clause after waiting for a row lock.
	tx, err := w.conn.BeginTx(ctx, nil)
	if err != nil {
		w.dropConn() // a fresh connection next time, should this one be broken
		for _, op := range ops {
			// Nothing began, so nothing can commit.
			w.judge(op, fmt.Errorf("beginning transaction: %w", err), false, sess)
		}
		return false
	}
	clear(w.bound)
	t := &stx{ctx: ctx, tx: tx, conn: w.conn, bound: w.bound}
	abort := func() bool {
		if tx.Rollback() != nil {
			w.dropConn()
		}
		for _, op := range ops {
			op.err = nil
		}
		return true
	}
	runOp := func(op *writeOp) error {
		t.unsure, t.resolved = op.unsure, false
		err := op.fn(t)
		if t.resolved {
			op.unsure = false
		}
		return err
	}
	if len(ops) == 1 {
		// Alone, an op needs no savepoint: its failure rolls back the
		// transaction, as without batching.
		op := ops[0]
		if err := runOp(op); err != nil {
			w.judge(op, err, false, sess)
			if tx.Rollback() != nil {
				w.dropConn()
			}
			return false
		}
		w.judge(op, nil, false, sess)
	} else {
		for _, op := range ops {
			if w.savepoints {
				if _, err := t.exec(w.st.savepoint); err != nil {
					return abort()
				}
			}
			err := runOp(op)
			w.judge(op, err, false, sess)
			switch {
			case w.savepoints && err == nil:
				if _, err := t.exec(w.st.release); err != nil {
					return abort()
				}
			case w.savepoints:
				if _, err := t.exec(w.st.rollbackTo); err != nil {
					return abort()
				}
				if _, err := t.exec(w.st.release); err != nil {
					return abort()
				}
			case err != nil && !isClean(err):
				return abort()
			}
		}
	}
	if err := tx.Commit(); err != nil {
		w.dropConn()
		for _, op := range ops {
			w.judge(op, fmt.Errorf("committing: %w", err), true, sess)
		}
		return false
	}
	return false
}
