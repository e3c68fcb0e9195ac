package wallet

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Settlement.
//
// Settle and SettleAsync take their reservation out of memory (at most
// once: a second settlement finds nothing and gets ErrNotFound), compute
// the ledger rows, and queue them. One writer op then settles every
// settlement queued at that moment together (the first to find no op
// scheduled submits one, and it takes them all): per account one UPDATE
// of the lease and one of the account, and the ledger rows in a few
// multi-row INSERTs on SQLite (ledgerinsert.go); on PostgreSQL the whole
// batch is one statement (settleBatchPG), and so, alone, one round trip
// without BEGIN or COMMIT. Each settlement ends once its batch committed,
// or fails alone with the batch's error, its reservation put back so that
// a retry (or Sweep) can still end it.
//
// Exactly once. A batch that fails on a transient fault of the database
// is run again (writer.go's Retries), for up to retryBudget, its
// reservations held meanwhile. When its connection was lost after the
// batch was sent, the first run may have committed, so the batch runs
// again only once the writer has made sure the lost session has ended,
// and first looks in the ledger for the rows of that run (settledBefore):
// a batch commits whole (one statement, or one transaction), so finding
// any of them means it committed, and it is not written again. A batch
// given up fails its settlements (their answers go unbilled, and the
// store's Observer hears of each); one given up whose last outcome was
// unknown is booked as if written, so that memory never counts money the
// lease row may no longer hold (resync gives back the rest).

// settleJob is one settlement waiting for its batch.
type settleJob struct {
	id      string // the reservation's
	m       *memReservation
	account string
	charged Micros
	rows    []Entry
	company bool // other reservations were open when it was queued
	// Results, set by the batch that took the job before it ends the job.
	avail Micros // the account's available balance after the batch
	lost  bool   // the lease was gone (swept): nothing was written
	err   error
	// How the batch ends the job: a Settle waits for done to close; a
	// SettleAsync's then runs on the goroutine that ran the batch.
	done chan struct{}
	then func()
}

// settleGather is how long after the previous settlement batch the next
// one may start while other reservations are open. Most of a batch's cost
// is fixed (BEGIN, the account and lease UPDATEs, COMMIT's WAL frames: on
// SQLite about 70 µs of CPU against 8 µs a ledger row), and on one core
// the writer runs as soon as a Settle wakes it, so without a pause every
// batch held one or two settlements. Waiting costs no client anything:
// the gateway settles after the answer is complete (see billing.go); a
// lone reservation (nothing else open: an idle gateway, a script) is
// settled at once.
//
// 20 ms, not the 5 ms it was: at 5,000 requests/s a 5 ms batch held about
// 17 settlements and BEGIN, COMMIT and the UPDATEs still cost the SQLite
// writer ~10 µs a request (profile of the bench target); at 20 ms batches
// reach the 128-row INSERT, and the writer's CPU per request fell from 22
// to 16 µs. The price is the crash window: a kill -9 loses at most the
// last 20 ms of charges (their money stays leased and is released
// uncharged after lease_ttl: the operator's loss, never an overcharge).
const settleGather = 20 * time.Millisecond

// settleQueue is the Settles waiting for a batch.
type settleQueue struct {
	mu      sync.Mutex
	pending []*settleJob
	// scheduled: a batch op is queued in the writer and has not yet taken
	// the pending jobs; a Settle arriving meanwhile just joins them.
	scheduled bool
	// last is when the previous batch took its jobs; full wakes a batch
	// waiting for company once a whole INSERT's worth is pending.
	last time.Time
	full chan struct{}
	// batches and jobs count the batches that settled something and what
	// they settled; waits counts gathers that paused (tests, diagnostics).
	batches, jobs, waits atomic.Int64
	// high is the ledger's newest ID when last read (PostgreSQL: when the
	// store opened, then at every Renew): every row of a batch sent later
	// has a higher ID (see settledBefore).
	high atomic.Int64
}

// add queues j and reports whether the caller must schedule a batch op.
func (q *settleQueue) add(j *settleJob) (schedule bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pending = append(q.pending, j)
	schedule = !q.scheduled
	q.scheduled = true
	if len(q.pending) == maxInsertRows && q.full != nil {
		select {
		case q.full <- struct{}{}:
		default:
		}
	}
	return schedule
}

// hurry wakes a batch waiting for company: a Reserve was refused for
// want of money that pending settlements hold.
func (q *settleQueue) hurry() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.full == nil {
		// Before the first gather: it finds the wake-up waiting.
		q.full = make(chan struct{}, 1)
	}
	select {
	case q.full <- struct{}{}:
	default:
	}
}

// gather waits until settleGather after the previous batch, until a
// whole INSERT's worth of settlements is pending, or until hurried.
func (q *settleQueue) gather() {
	q.mu.Lock()
	if q.full == nil {
		q.full = make(chan struct{}, 1)
	}
	wait := time.Until(q.last.Add(settleGather))
	full := len(q.pending) >= maxInsertRows
	q.mu.Unlock()
	if wait <= 0 || full {
		return
	}
	q.waits.Add(1)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-q.full:
	}
}

func (q *settleQueue) take() []*settleJob {
	q.mu.Lock()
	defer q.mu.Unlock()
	jobs := q.pending
	q.pending, q.scheduled, q.last = nil, false, time.Now()
	if jobs == nil {
		jobs = []*settleJob{}
	}
	return jobs
}

// remove takes j out of the queue, if no batch has taken it yet.
func (q *settleQueue) remove(j *settleJob) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, p := range q.pending {
		if p == j {
			q.pending = append(q.pending[:i], q.pending[i+1:]...)
			return true
		}
	}
	return false
}

func (s *sqlStore) Settle(ctx context.Context, reservationID string, e Entry, more ...Entry) (Micros, error) {
	job, err := s.beginSettle(reservationID, append([]Entry{e}, more...))
	if err != nil {
		return 0, err
	}
	defer s.leases.inflight.Done()
	job.done = make(chan struct{})
	charged, low, err := s.endSettle(job, s.settleWrite(ctx, job))
	if low {
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lateReleaseTimeout)
		defer cancel()
		_ = s.shrink(gctx, []string{job.account}, nil) // failing, the money stays leased until Renew or expiry
	}
	return charged, err
}

func (s *sqlStore) SettleAsync(reservationID string, entries []Entry, done func(charged Micros, err error)) {
	if len(entries) == 0 {
		done(0, fmt.Errorf("settling reservation %s: %w: no entries", reservationID, ErrInvalid))
		return
	}
	job, err := s.beginSettle(reservationID, entries)
	if err != nil {
		done(0, err)
		return
	}
	job.then = func() {
		charged, low, err := s.endSettle(job, job.err)
		if low {
			// Not on this goroutine: it ends the rest of the batch.
			go func() {
				defer s.leases.inflight.Done()
				ctx, cancel := context.WithTimeout(context.Background(), lateReleaseTimeout)
				defer cancel()
				_ = s.shrink(ctx, []string{job.account}, nil) // failing, the money stays leased until Renew or expiry
			}()
		} else {
			s.leases.inflight.Done()
		}
		done(charged, err)
	}
	s.queueSettle(job)
}

// settleWhat names a settlement in its errors; built only for an error,
// so that a settlement that succeeds allocates none.
func settleWhat(reservationID string) string { return "settling reservation " + reservationID }

// beginSettle takes the reservation out of memory and decides its rows.
// On success the job counts in the leases' inflight until endSettle's
// caller marks it done.
func (s *sqlStore) beginSettle(reservationID string, entries []Entry) (*settleJob, error) {
	b := s.leases
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, fmt.Errorf("%s: %w", settleWhat(reservationID), errStoreClosed)
	}
	m := b.res[reservationID]
	if m == nil {
		b.mu.Unlock()
		return nil, fmt.Errorf("%s: %w", settleWhat(reservationID), ErrNotFound)
	}
	delete(b.res, reservationID)
	company := len(b.res) > 0 // other reservations will settle soon
	b.leases[m.Account].settling.start()
	b.inflight.Add(1)
	b.mu.Unlock()

	job := &settleJob{id: reservationID, m: m, account: m.Account, company: company}
	job.rows, job.charged = settleRows(m, entries, s.now())
	return job, nil
}

// endSettle books a settled job's outcome into the leases in memory (or
// puts its reservation back when it failed) and returns what it charged.
// low says the account runs low, so that the caller should give other
// instances the spare money (shrink).
func (s *sqlStore) endSettle(job *settleJob, err error) (charged Micros, low bool, _ error) {
	maybe := false
	switch {
	case err != nil:
		maybe = errors.Is(err, errOutcomeUnknown)
		err = fmt.Errorf("%s: %w", settleWhat(job.id), err)
	case job.lost:
		err = fmt.Errorf("%s: %w: its lease expired and Sweep released it", settleWhat(job.id), ErrNotFound)
	}
	m := job.m
	b := s.leases
	b.mu.Lock()
	l := b.leases[m.Account]
	l.booked++
	l.settling.end()
	switch {
	case job.lost:
		// The lease row is gone (swept) or holds less than the charge (a
		// row re-created since): nothing more is served from it until a
		// grow has made memory agree with the row (see lease.land), and
		// resync does so too once nothing of it is in flight. Zeroing the
		// amount here instead would forget money a re-created row holds
		// for the reservations served from it since.
		l.held -= m.Amount
		l.extended = time.Time{}
		l.unsure++
	case maybe:
		// It may have been written: booked as if it was, so that memory
		// counts no more than the row may hold; if it was not, the row
		// holds the charge too, which resync gives back to the account
		// (the answer goes unbilled, as for any settlement that fails).
		l.held -= m.Amount
		l.amount -= job.charged
		l.unsure++
	case err != nil:
		b.res[job.id] = m
	default:
		l.held -= m.Amount
		l.amount -= job.charged
	}
	b.mu.Unlock()
	if err != nil {
		return 0, false, err
	}
	return job.charged, job.avail < leaseGiveBackFactor*m.Amount, nil
}

// settleRows turns a settlement's entries into ledger rows: charged in
// order, their total capped at the reservation's amount.
func settleRows(m *memReservation, entries []Entry, now time.Time) ([]Entry, Micros) {
	left := m.Amount
	var total Micros
	rows := make([]Entry, len(entries))
	for i, e := range entries {
		var notes []string
		if e.Note != "" {
			notes = append(notes, e.Note)
		}
		cost := e.Cost
		if cost < 0 {
			notes = append(notes, fmt.Sprintf("negative cost %s treated as 0", cost))
			cost = 0
		}
		charged := min(cost, left)
		if charged < cost {
			// Never overdraw: the reservation was the promise to the
			// account holder. The difference is the operator's loss, made
			// visible.
			if i == 0 {
				notes = append(notes, fmt.Sprintf("capped: usage cost %s exceeded reservation %s", cost, m.Amount))
			} else {
				notes = append(notes, fmt.Sprintf("capped: usage cost %s exceeded the %s left of reservation %s", cost, left, m.Amount))
			}
		}
		left -= charged
		total += charged
		e.Kind = KindCharge
		if charged == 0 {
			e.Kind = KindRelease
		}
		e.Account = m.Account
		e.KeyID = firstNonEmpty(e.KeyID, m.KeyID)
		e.Model = firstNonEmpty(e.Model, m.Model)
		e.RequestID = firstNonEmpty(e.RequestID, m.RequestID)
		e.Cost = charged
		e.Note = strings.Join(notes, "; ")
		if e.Time.IsZero() {
			e.Time = now
		}
		rows[i] = e
	}
	return rows, total
}

// queueSettle queues job for a batch. The first settlement to find no
// batch op scheduled submits one; the op takes every job pending when the
// writer starts it, and runs whatever any settlement's context.
func (s *sqlStore) queueSettle(job *settleJob) {
	q := &s.settles
	if q.add(job) {
		go func() {
			if job.company {
				q.gather()
			}
			s.settleBatch(job.account)
		}()
	}
}

// settleWrite queues job and waits for the batch that commits it. A
// Settle whose context ends before its job was taken withdraws the job
// and returns ctx.Err().
func (s *sqlStore) settleWrite(ctx context.Context, job *settleJob) error {
	q := &s.settles
	s.queueSettle(job)
	select {
	case <-job.done:
	case <-ctx.Done():
		if q.remove(job) {
			return ctx.Err()
		}
		<-job.done // taken: it commits, or fails, with its batch
	}
	return job.err
}

// settleBatch runs one batch op and delivers its outcome to the jobs it
// took.
func (s *sqlStore) settleBatch(account string) {
	b := &settleRun{s: s}
	err := s.w.do(context.Background(), "writing a settlement batch", account, b.run,
		opOptions{single: s.d.settleBatch != "", several: true, retry: retryChecked})
	taken := b.taken
	if taken == nil {
		// Refused before it ran (the store is closing): fail what waits.
		taken = s.settles.take()
	}
	if err == nil && len(taken) > 0 { // counted once, however often it ran
		s.settles.batches.Add(1)
		s.settles.jobs.Add(int64(len(taken)))
	}
	var o Observer
	if err != nil {
		if p := s.w.observer.Load(); p != nil {
			o = *p
		}
	}
	for _, j := range taken {
		if err != nil {
			j.err = err
			if o != nil {
				o.SettlementUnwritten(j.rows[0].RequestID, j.account, err)
			}
		}
		if j.then != nil {
			j.then()
		} else {
			close(j.done)
		}
	}
}

// settleRun is a settlement batch op's state across its runs.
type settleRun struct {
	s     *sqlStore
	taken []*settleJob
	// floor is the ledger's newest known ID before the batch was first
	// sent, below all of its rows; done says an earlier run is known to
	// have committed.
	floor int64
	done  bool
}

// run is the batch op's fn: it takes the settlements pending when the
// writer first runs it, and a re-run settles the same ones.
func (b *settleRun) run(t *stx) error {
	s := b.s
	if b.taken == nil {
		b.taken = s.settles.take()
		b.floor = s.settles.high.Load()
	}
	if len(b.taken) == 0 || b.done {
		return nil
	}
	if t.unsure {
		committed, err := s.settledBefore(t, b.taken, b.floor)
		if err != nil {
			return err
		}
		t.resolve()
		if b.done = committed; b.done {
			return nil
		}
	}
	return s.runSettles(t, b.taken)
}

// noteLedgerHigh reads the ledger's newest ID for settledBefore
// (PostgreSQL): the newer, the fewer rows a lost batch's check reads.
// Failing, the older one stays, which is as correct.
func (s *sqlStore) noteLedgerHigh(ctx context.Context) error {
	if s.d.settledSince == "" {
		return nil
	}
	var high int64
	if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(id), 0) FROM ledger`).Scan(&high); err != nil {
		return fmt.Errorf("reading the ledger's newest ID: %w", err)
	}
	s.settles.high.Store(high)
	return nil
}

// settledBefore finds out whether an earlier run of a batch of jobs,
// whose connection was lost after it was sent, committed; the writer has
// made sure that the run's session has ended, so it has committed by now
// or never will. Its rows are looked for among the settlement rows of the
// batch's accounts written since floor, the ledger's newest known ID
// before the batch was first sent (through the ledger_account index, no
// index of its own), by account, request ID and time: the time is when
// the settlement was decided, to the microsecond, so that a request ID
// settled before, or a settlement that has none, is not mistaken for it.
// A batch commits whole: when any of its rows is there, every job is
// settled, and a job without rows found its lease gone (lost), as the run
// itself would have said; each job's available balance is read again.
func (s *sqlStore) settledBefore(t *stx, jobs []*settleJob, floor int64) (bool, error) {
	if s.d.settledSince == "" {
		// No dialect without the query loses a batch's outcome.
		return false, errors.New("cannot find out whether a lost settlement batch committed")
	}
	var accounts []string
	for _, j := range jobs {
		if !slices.Contains(accounts, j.account) {
			accounts = append(accounts, j.account)
		}
	}
	type rowKey struct {
		account, request string
		at               int64
	}
	found := map[rowKey]bool{}
	rs, err := t.queryText(s.d.settledSince, accounts, floor)
	if err != nil {
		return false, fmt.Errorf("looking for a lost settlement batch's rows: %w", err)
	}
	if err := eachRow(rs, func(rs *sql.Rows) error {
		var k rowKey
		err := rs.Scan(&k.account, &k.request, &k.at)
		found[k] = true
		return err
	}); err != nil {
		return false, fmt.Errorf("looking for a lost settlement batch's rows: %w", err)
	}
	committed := false
	for _, j := range jobs {
		e := &j.rows[0]
		j.lost = !found[rowKey{e.Account, e.RequestID, toDB(e.Time)}]
		committed = committed || !j.lost
	}
	if !committed {
		return false, nil
	}
	avail := map[string]Micros{}
	rs, err = t.queryText(s.d.available, accounts)
	if err != nil {
		return false, fmt.Errorf("reading available balances: %w", err)
	}
	if err := scanAvailable(rs, avail); err != nil {
		return false, fmt.Errorf("reading available balances: %w", err)
	}
	for _, j := range jobs {
		j.avail, j.err = avail[j.account], nil
	}
	return true, nil
}

// runSettles settles jobs in t, setting each job's results.
func (s *sqlStore) runSettles(t *stx, jobs []*settleJob) error {
	perAccount := map[string]Micros{}
	for _, j := range jobs {
		j.avail, j.lost, j.err = 0, false, nil
		perAccount[j.account] += j.charged
	}
	accounts := make([]string, 0, len(perAccount))
	for a := range perAccount {
		accounts = append(accounts, a)
	}
	sort.Strings(accounts) // one lock order on every instance
	avail := make(map[string]Micros, len(accounts))
	if s.d.settleBatch != "" {
		if err := s.runSettlesInOne(t, jobs, accounts, perAccount, avail); err != nil {
			return err
		}
	} else {
		for _, a := range accounts {
			charged := int64(perAccount[a])
			res, err := t.exec(s.st.leaseCharge, charged, s.leases.id, a, charged)
			if err != nil {
				return fmt.Errorf("charging lease of %q: %w", a, err)
			}
			if n, err := res.RowsAffected(); err != nil {
				return err
			} else if n == 0 {
				continue // swept: lost
			}
			var av int64
			if err := t.queryRow(s.st.accountCharge, charged, charged, a).Scan(&av); err != nil {
				return fmt.Errorf("charging account %q: %w", a, err)
			}
			avail[a] = Micros(av)
		}
		if err := s.insertRows(t, jobs, avail); err != nil {
			return err
		}
	}
	for _, j := range jobs {
		av, ok := avail[j.account]
		j.avail, j.lost = av, !ok
	}
	return nil
}

// runSettlesInOne is the batch as one PostgreSQL statement (settleBatchPG).
func (s *sqlStore) runSettlesInOne(t *stx, jobs []*settleJob, accounts []string, perAccount, avail map[string]Micros) error {
	charged := make([]int64, len(accounts))
	for i, a := range accounts {
		charged[i] = int64(perAccount[a])
	}
	var (
		kind, account, key, model, upstream, channel, request, note []string
		trace                                                       []string
		tokIn, tokOut, cost, created                                []int64
		cacheRead, cacheWrite, cacheWrite1h                         []int64
	)
	for _, j := range jobs {
		for _, e := range j.rows {
			kind, account, key, model = append(kind, e.Kind), append(account, e.Account), append(key, e.KeyID), append(model, e.Model)
			upstream, channel, request = append(upstream, e.UpstreamModel), append(channel, e.Channel), append(request, e.RequestID)
			tokIn, tokOut, cost = append(tokIn, e.TokensIn), append(tokOut, e.TokensOut), append(cost, int64(e.Cost))
			note, created = append(note, e.Note), append(created, toDB(e.Time))
			cacheRead, cacheWrite = append(cacheRead, e.TokensCacheRead), append(cacheWrite, e.TokensCacheWrite)
			cacheWrite1h, trace = append(cacheWrite1h, e.TokensCacheWrite1h), append(trace, e.TraceID)
		}
	}
	rs, err := t.queryText(s.d.settleBatch, s.leases.id, accounts, charged,
		kind, account, key, model, upstream, channel, request, tokIn, tokOut, cost, note, created, cacheRead, cacheWrite, cacheWrite1h, trace)
	if err != nil {
		return err
	}
	return scanAvailable(rs, avail)
}

// scanAvailable reads (account, available balance) rows into avail.
func scanAvailable(rs *sql.Rows, avail map[string]Micros) error {
	return eachRow(rs, func(rs *sql.Rows) error {
		var (
			a  string
			av int64
		)
		err := rs.Scan(&a, &av)
		avail[a] = Micros(av)
		return err
	})
}
