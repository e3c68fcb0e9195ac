package wallet

import (
	"context"
	"database/sql"
	"fmt"
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
	switch {
	case err != nil:
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
		// The database no longer holds this lease: nothing may be served
		// from it, and the next Reserve grows a fresh one.
		l.held -= m.Amount
		l.amount, l.extended = 0, time.Time{}
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
	var taken []*settleJob
	err := s.w.do(context.Background(), "writing a settlement batch", account, func(t *stx) error {
		if taken == nil { // a re-run settles the same batch
			taken = s.settles.take()
		}
		if len(taken) == 0 {
			return nil
		}
		return s.runSettles(t, taken)
	}, nil, s.d.settleBatch != "")
	if taken == nil {
		// Refused before it ran (the store is closing): fail what waits.
		taken = s.settles.take()
	}
	if err == nil && len(taken) > 0 { // counted once, however often it ran
		s.settles.batches.Add(1)
		s.settles.jobs.Add(int64(len(taken)))
	}
	for _, j := range taken {
		if err != nil {
			j.err = err
		}
		if j.then != nil {
			j.then()
		} else {
			close(j.done)
		}
	}
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
		tokIn, tokOut, cost, created                                []int64
	)
	for _, j := range jobs {
		for _, e := range j.rows {
			kind, account, key, model = append(kind, e.Kind), append(account, e.Account), append(key, e.KeyID), append(model, e.Model)
			upstream, channel, request = append(upstream, e.UpstreamModel), append(channel, e.Channel), append(request, e.RequestID)
			tokIn, tokOut, cost = append(tokIn, e.TokensIn), append(tokOut, e.TokensOut), append(cost, int64(e.Cost))
			note, created = append(note, e.Note), append(created, toDB(e.Time))
		}
	}
	rs, err := t.queryText(s.d.settleBatch, s.leases.id, accounts, charged,
		kind, account, key, model, upstream, channel, request, tokIn, tokOut, cost, note, created)
	if err != nil {
		return err
	}
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
