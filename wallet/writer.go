package wallet

import (
	"context"
	"database/sql"
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
//     COMMIT fails), every op of the batch gets that error.
//
// Deadlocks (PostgreSQL): a batch holds the row locks of all its ops until
// it commits, so two batches (of two writer goroutines, or of two
// instances) could lock two accounts in opposite orders. The writer therefore sorts a PostgreSQL
// batch by account (the account each op names: Reservation.Account,
// Entry.Account, ...; any order of concurrent calls is a valid one), which
// leaves only rare cycles through one reservation row (the same
// reservation settled twice at once, or settled while a Sweep releases
// it). PostgreSQL breaks those after
// deadlock_timeout (1 s by default) by failing one statement; that batch
// is re-run one op per transaction, and a single-op transaction that hits
// a deadlock or serialization failure is retried (up to
// maxAttempts times).
//
// Context: an op whose context is done before the writer starts it is
// skipped and its caller gets ctx.Err(), also while it is still queued. Once
// the writer has started an op, its statements run to completion
// regardless of the context (cancelling a statement would abort the whole
// batch: on SQLite an interrupt rolls back the transaction, on PostgreSQL
// pgx drops the connection), and the op commits, or fails, with its batch.
// Statements are bounded instead by the store's statement and lock
// timeouts. An op with an undo (Reserve) returns ctx.Err() to its caller
// at once, and should it commit after all, undo runs in the background;
// any other op's caller waits for the outcome, so that a credit the caller
// was told failed never lands.
//
// A lock timeout (PostgreSQL lock_timeout, see lockTimeout) fails the op
// that waited, which re-runs its batch one op per transaction: the other
// ops commit, and the locked one is retried alone while its caller waits.
//
// A panic in a batch fails that batch's unfinished ops with an error; the
// writer goes on with the next batch.
//
// Close stops accepting ops (they fail with errStoreClosed), lets the writer
// finish everything already queued, and waits for it to exit.

// maxBatch bounds how many ops share one transaction, and so how long a
// batch holds SQLite's write lock or PostgreSQL's row locks.
const maxBatch = 64

// maxAttempts bounds the runs of a single-op transaction that fails with a
// retryable error; retries also stop when the op's caller has gone.
const maxAttempts = 25

// lateReleaseTimeout bounds the background release of a reservation that
// committed after its caller gave up.
const lateReleaseTimeout = 30 * time.Second

// errStoreClosed is returned for writes submitted after Close.
var errStoreClosed = errors.New("wallet store is closed")

// Op states: the caller and the writer race to move an op out of opQueued;
// whoever wins decides whether it runs.
const (
	opQueued int32 = iota
	opStarted
	opAbandoned
)

type writeOp struct {
	ctx  context.Context
	key  string // the account the op locks, if known: orders the batch
	fn   func(t *stx) error
	undo func() // runs if the op commits after its caller gave up
	// single: fn is one statement, atomic by itself, so run alone it needs
	// no BEGIN and COMMIT (PostgreSQL: one round trip instead of three).
	single bool
	state  atomic.Int32
	// finished is set by finish; only the writer goroutine reads it.
	finished bool
	err      error         // set by the writer before done is closed
	done     chan struct{} // closed when err is final
}

// stx is one op's view of the writer's transaction. Statements prepared on
// the store (s.st) are bound to the transaction through stmt, once per
// transaction.
type stx struct {
	ctx context.Context
	// tx is nil when a single op runs alone outside a transaction (see
	// writeOp.single); then only queryRowText may be used, on conn.
	tx    *sql.Tx
	conn  *sql.Conn
	bound map[*sql.Stmt]*sql.Stmt
}

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
	retryable  func(error) bool
	queue      chan *writeOp

	mu     sync.RWMutex // guards closed against sends on a closed queue
	closed bool
	// Background ops (see background): bgSlots bounds them, bg counts
	// them so that close waits for them, bgClosed refuses new ones.
	bgSlots  chan struct{}
	bg       sync.WaitGroup
	bgClosed bool
	once     sync.Once
	workers  int
	exited   sync.WaitGroup

	// batches counts transactions holding more than one op, reruns the
	// batches re-run one op per transaction (tests and diagnostics).
	batches, reruns atomic.Int64
}

// worker is one writer goroutine's state.
type worker struct {
	*writer
	conn  *sql.Conn
	live  []*writeOp
	bound map[*sql.Stmt]*sql.Stmt
}

// newWriter starts workers goroutines that take batches from one queue:
// one for SQLite, which has one writer at a time anyway; a few for
// PostgreSQL, where a batch mostly waits on round trips and batches of
// different accounts can run side by side.
func newWriter(db *sql.DB, st *stmts, savepoints bool, retryable func(error) bool, workers int) *writer {
	w := &writer{
		db:         db,
		st:         st,
		savepoints: savepoints,
		retryable:  retryable,
		queue:      make(chan *writeOp, 4*maxBatch),
		bgSlots:    make(chan struct{}, MaxBackgroundWrites),
		workers:    max(1, workers),
	}
	for range w.workers {
		wk := &worker{
			writer: w,
			live:   make([]*writeOp, 0, maxBatch),
			bound:  map[*sql.Stmt]*sql.Stmt{},
		}
		w.exited.Add(1)
		go wk.loop()
	}
	return w
}

// do submits fn and waits for its result, wrapped with what. With an undo,
// do returns when ctx ends even if fn has started (see above). single says
// fn is one self-contained statement (see writeOp.single).
func (w *writer) do(ctx context.Context, what, key string, fn func(t *stx) error, undo func(), single bool) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	op := &writeOp{ctx: ctx, key: key, fn: fn, undo: undo, single: single, done: make(chan struct{})}
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
			// The writer will skip it.
			return fmt.Errorf("%s: %w", what, ctx.Err())
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
		err := w.do(context.Background(), what, key, fn, nil, false)
		<-w.bgSlots
		if done != nil {
			done(err)
		}
	}()
	return true
}

// close stops the writer after it has run every op already queued,
// background ones included.
func (w *writer) close() {
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
	for op := range w.queue {
		batch = append(batch[:0], op)
		// Yield once, so that goroutines already runnable (other requests
		// about to submit their writes) get to queue them first. This is no
		// timed wait: with nothing else runnable it returns at once. It
		// matters most with few Ps (GOMAXPROCS=1): there the first send
		// would otherwise hand the processor straight to the writer, and
		// every batch would hold one op.
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
		w.runRecovering(batch)
		clear(batch)
	}
	w.dropConn()
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
			finish(op, err)
			continue
		}
		live = append(live, op)
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
				finish(op, op.err)
			}
		}
	}
	clear(live)
	w.live = live[:0]
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

// runAlone runs op in a transaction of its own, retrying retryable
// failures, and delivers its result.
func (w *worker) runAlone(op *writeOp) {
	for attempt := 1; ; attempt++ {
		w.runTx([]*writeOp{op})
		if op.err == nil || w.retryable == nil || !w.retryable(op.err) || attempt == maxAttempts || op.ctx.Err() != nil {
			break
		}
	}
	finish(op, op.err)
}

// runTx runs ops in one transaction and sets each op's err; the caller
// delivers them. It returns true, having rolled back, when the batch must
// be re-run one op per transaction; that never happens for a single op.
func (w *worker) runTx(ops []*writeOp) (rerun bool) {
	ctx := context.Background()
	fail := func(err error) bool {
		for _, op := range ops {
			op.err = err
		}
		return false
	}
	if w.conn == nil {
		c, err := w.db.Conn(ctx)
		if err != nil {
			return fail(fmt.Errorf("beginning transaction: %w", err))
		}
		w.conn = c
	}
	if len(ops) == 1 && ops[0].single && !w.savepoints {
		// One statement is its own transaction: no BEGIN, no COMMIT.
		op := ops[0]
		op.err = op.fn(&stx{ctx: ctx, conn: w.conn})
		if op.err != nil && !isClean(op.err) {
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
		return fail(fmt.Errorf("beginning transaction: %w", err))
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
	if len(ops) == 1 {
		// Alone, an op needs no savepoint: its failure rolls back the
		// transaction, as without batching.
		op := ops[0]
		if op.err = op.fn(t); op.err != nil {
			if tx.Rollback() != nil {
				w.dropConn()
			}
			return false
		}
	} else {
		for _, op := range ops {
			if w.savepoints {
				if _, err := t.exec(w.st.savepoint); err != nil {
					return abort()
				}
			}
			op.err = op.fn(t)
			switch {
			case w.savepoints && op.err == nil:
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
			case op.err != nil && !isClean(op.err):
				return abort()
			}
		}
	}
	if err := tx.Commit(); err != nil {
		w.dropConn()
		return fail(fmt.Errorf("committing: %w", err))
	}
	return false
}
