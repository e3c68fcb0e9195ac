package wallet

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Credit leases.
//
// A Reserve used to be a conditional UPDATE and an INSERT in the database,
// and its Settle a DELETE, an UPDATE and an INSERT: most of a request's
// wallet cost. Instead, each open Store is an instance (a random lease ID)
// that holds, per account, a lease: an amount of the account's balance
// taken into accounts.reserved in the database and recorded as a row of
// the leases table. Reservations are then served from the lease in memory:
//
//   - Reserve takes r.Amount from the lease's spare money (amount minus
//     what its live reservations hold). Only when it does not fit does the
//     lease grow, in one group-committed write: the same conditional UPDATE
//     that once reserved (balance − reserved must cover what is missing),
//     plus the lease row's upsert. Concurrent Reserves of one account that
//     do not fit wait for the one grow in flight. A grant is k whole
//     reservations of the size asked for, k = clamp(available / (4 ×
//     amount), 1, kmax): a nearly empty account grants exactly one request
//     (the old behaviour, so no false 402 from fragmentation between
//     instances), and a grant never takes more than a quarter of what is
//     available. kmax starts at leaseKmaxStart and doubles, up to
//     leaseKmaxMax, when a grant is used up within a second.
//   - Settle charges in the database (balance, reserved and the lease's
//     amount go down by the charge, and the ledger rows are written), in
//     one op that settles every Settle waiting at that moment (see
//     settle.go). What the reservation held and did not charge goes back
//     to the lease's spare money, in memory.
//   - Money goes back to the account when the lease shrinks to what its
//     live reservations hold: after a Settle that finds the account's
//     available balance below 4 × the reservation, when the lease served no
//     Reserve for leaseIdleAfter (Renew), at every Sweep, before a negative
//     Credit, and at Close (which first releases the reservations left
//     unsettled, each with a KindExpired row: their requests can no longer
//     settle). A 402 can therefore come at most about a second
//     early when another instance holds an idle lease of a nearly empty
//     account.
//   - A lease row expires LeaseTTL after its last extension. The live
//     instance extends all its leases in one statement (Renew, which the
//     gateway calls every second), and never serves a Reserve from a lease
//     closer than a third of the TTL to expiry (it grows it instead, which
//     extends it). An instance that dies (kill -9) stops extending; once
//     its leases expire, Sweep on any other instance releases them:
//     reserved goes down by the lease's amount, the row is deleted, and a
//     KindExpired ledger row names the lease. The dead instance's requests
//     are thus released uncharged, as before. A live instance that could
//     not reach the database for longer than the TTL may find its own
//     leases swept: Renew extends in memory only the rows it found, and
//     the grow that re-creates a row takes memory down to what the row
//     holds (lease.land), so nothing is served from money gone back.
//
// balance ≥ reserved still holds by construction: reserved is the sum of
// the leases and of any reservation rows left by an older version (swept
// as before), and every lease was taken by the conditional UPDATE. The
// audit checks reserved against exactly that sum.
//
// A reservation lives in the memory of the Store that made it: Settle and
// Extend it there; another Store (instance) answers ErrNotFound.
//
// Lock order (PostgreSQL; SQLite has one writer). An instance writes on
// several connections at once, and instances share accounts, so every
// transaction that writes a lease row first holds its account's row, and
// takes account rows in one order, by ID: a grow locks the account
// (pgGrow), a settlement batch and a shrink lock their accounts sorted
// before touching a lease (pgSettleBatch, pgShrink), Renew, resync and
// Close lock the accounts of their leases first (lockAccounts), and a
// sweep locks the accounts of the expired leases it takes and skips a
// locked lease row. Then nobody waits for a lease row while holding what
// its holder waits for, and account rows are always taken in the same
// order: no cycle. Before, a settlement batch (lease rows, then accounts)
// and a grow or another instance's batch (accounts in another order)
// could each wait for the other until lock_timeout (200 ms) failed one,
// a stall of a whole batch, dozens of times a second with two instances
// on shared accounts.

// DefaultLeaseTTL is how long a lease outlives its instance's last
// extension (Options.LeaseTTL).
const DefaultLeaseTTL = 30 * time.Second

const (
	// leaseIdleAfter: a lease that served no Reserve for this long gives
	// its spare money back at the next Renew.
	leaseIdleAfter = time.Second
	leaseKmaxStart = 8
	leaseKmaxMax   = 256
	// leaseUsedUpFast: a grant used up within this doubles kmax.
	leaseUsedUpFast = time.Second
	// leaseGiveBackFactor: a Settle that leaves the account less than this
	// many reservations of its size available gives the lease's spare
	// money back, so that other instances can use it.
	leaseGiveBackFactor = 4
)

// memReservation is a live reservation, held in memory.
type memReservation struct {
	Reservation
	expires time.Time
}

// lease is this instance's lease of one account.
type lease struct {
	// amount is what the database's lease row holds, or less while a
	// shrink is being written (never more: memory is the lower bound).
	amount Micros
	// held is the sum of the live reservations served from it.
	held Micros
	// extended is when the row's expiry was last moved (or set).
	extended    time.Time
	lastReserve time.Time
	kmax        int64
	grantedAt   time.Time
	grow        *growCall // in flight, or nil
	// settling counts the account's settlements decided but not yet
	// booked, whose reservations are still held (a Reserve refused
	// meanwhile waits for them), and booked those booked so far.
	settling inFlight
	booked   uint64
	// shrinking counts the shrinks writing money taken from this lease
	// back to the account. Until they end that money is in neither place
	// a grow can see, so a Reserve that must grow waits for them.
	shrinking inFlight
	// unsure counts the writes of this lease whose outcome was unknown (a
	// grow that may have landed twice, a shrink or settlement that may
	// have landed although it failed): the row may hold more than amount
	// until resync gives the difference back. It also counts what found
	// the row swept or re-created (a settlement that found it missing, a
	// grant that re-created it, see land): then the row may hold less,
	// and resync takes memory down to it.
	unsure int
}

func (l *lease) spare() Micros { return l.amount - l.held }

// land books a grant into the lease; row is what its row holds after it.
// expired says the row's expiry may have passed before the grant landed:
// then another instance may have swept the row (during a database outage
// that kept Renew from extending it), and the grant re-created it holding
// the grant alone, so the amount memory counted before is gone. The lease
// then holds no more than the row: memory never counts money the row
// does not hold, or the Reserves it served would settle against nothing
// and go unbilled. Settlements in flight may since have charged the row
// without being booked yet (booking them would count their charge
// twice), and a shrink that began before the row's expiry may yet take
// money out of the new row: resync then makes memory agree with the row
// once they end.
func (l *lease) land(grant, row Micros, expired bool) {
	if !expired || l.amount+grant <= row {
		l.amount += grant
		return
	}
	l.amount = row
	if l.settling.n > 0 || l.shrinking.n > 0 {
		l.unsure++
	}
}

// inFlight counts work in flight that others may wait for; the lease
// book's lock guards it.
type inFlight struct {
	n    int
	none chan struct{} // made by the first wait, closed when n falls to 0
}

func (f *inFlight) start() { f.n++ }

func (f *inFlight) end() {
	if f.n--; f.n == 0 && f.none != nil {
		close(f.none)
		f.none = nil
	}
}

// wait returns a channel closed once none is in flight, or nil when none
// is now.
func (f *inFlight) wait() <-chan struct{} {
	if f.n == 0 {
		return nil
	}
	if f.none == nil {
		f.none = make(chan struct{})
	}
	return f.none
}

// waitShrunk waits until no shrink of the account's lease is writing.
func (s *sqlStore) waitShrunk(ctx context.Context, account string) error {
	b := s.leases
	b.mu.Lock()
	var shrunk <-chan struct{}
	if l := b.leases[account]; l != nil {
		shrunk = l.shrinking.wait()
	}
	b.mu.Unlock()
	if shrunk == nil {
		return nil
	}
	select {
	case <-shrunk:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// growCall is one grow in flight, which Reserves that do not fit wait for.
type growCall struct {
	done chan struct{}
	need Micros
	err  error // set before done is closed
}

// leaseBook is a store's in-memory leases and reservations.
type leaseBook struct {
	id string // this instance's lease ID
	// ttl is the lease TTL (time.Duration): a reload that keeps the store
	// may set another (SetLeaseTTL).
	ttl atomic.Int64

	mu     sync.Mutex
	leases map[string]*lease
	res    map[string]*memReservation
	closed bool
	// inflight counts the Reserves and Settles writing, so that Close
	// returns the leases only once they are done.
	inflight sync.WaitGroup
}

func newLeaseBook(ttl time.Duration) *leaseBook {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	b := &leaseBook{
		id:     "lease_" + randomBase62(20),
		leases: map[string]*lease{},
		res:    map[string]*memReservation{},
	}
	b.ttl.Store(int64(ttl))
	return b
}

// TTL is the lease TTL.
func (b *leaseBook) TTL() time.Duration { return time.Duration(b.ttl.Load()) }

// SetLeaseTTL makes ttl the lease TTL of s (an SQLite or PostgreSQL
// store) from its next grant or renewal on: a reload that keeps the store
// open (the same database) applies its lease_ttl. Zero means
// DefaultLeaseTTL.
func SetLeaseTTL(s Store, ttl time.Duration) {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	if ss, ok := s.(*sqlStore); ok && ss.leases != nil {
		ss.leases.ttl.Store(int64(ttl))
	}
}

// maySwept reports whether l's row may have expired by now, and so been
// swept by another instance.
func (b *leaseBook) maySwept(l *lease, now time.Time) bool {
	return now.Sub(l.extended) >= b.TTL()
}

// usable reports whether a Reserve may be served from l without touching
// the database: its row is far enough from expiring.
func (b *leaseBook) usable(l *lease, now time.Time) bool {
	return now.Sub(l.extended) < b.TTL()*2/3
}

// errDuplicateReservation: a Reserve with the ID of a live reservation.
var errDuplicateReservation = errors.New("duplicate reservation ID")

func (s *sqlStore) Reserve(ctx context.Context, r Reservation) error {
	var booked uint64
	err := s.reserve(ctx, r, &booked)
	if errors.Is(err, ErrInsufficientFunds) && s.waitSettled(ctx, r.Account, booked) {
		// The money was held by answers already given, whose settlements
		// (written up to settleGather later) have now released what they
		// did not spend: a client whose balance covers this request is
		// not refused for the reservation of its previous one.
		err = s.reserve(ctx, r, &booked)
	}
	return err
}

// waitSettled waits until the account's settlements pending now are
// booked into its lease, hurrying their batch. It reports whether a
// Reserve refused for want of money is worth trying again: some were
// pending, or were booked since that Reserve began (booked, the lease's
// count then), and ctx has not ended.
func (s *sqlStore) waitSettled(ctx context.Context, account string, booked uint64) bool {
	b := s.leases
	b.mu.Lock()
	var settled <-chan struct{}
	again := false
	if l := b.leases[account]; l != nil {
		settled, again = l.settling.wait(), l.booked != booked
	}
	b.mu.Unlock()
	if settled == nil {
		return again
	}
	s.settles.hurry()
	select {
	case <-settled:
		return true
	case <-ctx.Done():
		return false
	}
}

// reserving names a Reserve of amount for account in errors. It is built
// only when an error happens, since the usual Reserve costs less than
// formatting it; and it is not a closure over the Reservation, which the
// grow goroutine's use of it moved to the heap on every Reserve.
func reserving(amount Micros, account string) string {
	return fmt.Sprintf("reserving %s for account %q", amount, account)
}

// reserve is Reserve's one try; it sets *booked to the lease's count of
// booked settlements when it first looks at the lease.
func (s *sqlStore) reserve(ctx context.Context, r Reservation, booked *uint64) error {
	if err := validID("reservation", r.ID); err != nil {
		return fmt.Errorf("reserving: %w", err)
	}
	if r.Amount < 0 {
		return fmt.Errorf("reserving %s: %w: negative amount %s", r.ID, ErrInvalid, r.Amount)
	}
	b := s.leases
	var waited *growCall // the last grow this Reserve waited for
	looked := false      // *booked is set
	for {
		now := s.now()
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return fmt.Errorf("%s: %w", reserving(r.Amount, r.Account), errStoreClosed)
		}
		if _, dup := b.res[r.ID]; dup {
			b.mu.Unlock()
			return fmt.Errorf("%s: %w %s", reserving(r.Amount, r.Account), errDuplicateReservation, r.ID)
		}
		l := b.leases[r.Account]
		if l == nil {
			l = &lease{kmax: leaseKmaxStart}
			b.leases[r.Account] = l
		}
		if !looked {
			*booked, looked = l.booked, true
		}
		l.lastReserve = now
		if !l.extended.IsZero() && b.usable(l, now) && l.spare() >= r.Amount {
			l.held += r.Amount
			exp := r.ExpiresAt
			if exp.IsZero() {
				exp = now.Add(DefaultReservationTTL)
			}
			b.res[r.ID] = &memReservation{Reservation: r, expires: exp}
			b.mu.Unlock()
			return nil
		}
		need := max(0, r.Amount-l.spare())
		if waited != nil && need >= waited.need && (errors.Is(waited.err, ErrInsufficientFunds) || errors.Is(waited.err, ErrUnknownAccount)) {
			// The grow just waited for could not cover even what this
			// needs (or found no account).
			b.mu.Unlock()
			return waited.err
		}
		if shrunk := l.shrinking.wait(); shrunk != nil {
			// Spare money of this lease is on its way back to the
			// account: grow once it is there.
			b.mu.Unlock()
			select {
			case <-shrunk:
			case <-ctx.Done():
				return fmt.Errorf("%s: %w", reserving(r.Amount, r.Account), ctx.Err())
			}
			continue
		}
		if g := l.grow; g != nil {
			// Another Reserve is growing the lease: wait, then look again.
			b.mu.Unlock()
			select {
			case <-g.done:
			case <-ctx.Done():
				return fmt.Errorf("%s: %w", reserving(r.Amount, r.Account), ctx.Err())
			}
			waited = g
			continue
		}
		// This Reserve grows the lease (the lock is still held).
		g := &growCall{done: make(chan struct{}), need: need}
		l.grow = g
		if l.spare() < r.Amount && !l.grantedAt.IsZero() && now.Sub(l.grantedAt) < leaseUsedUpFast {
			// The last grant was used up fast: grant more this time.
			l.kmax = min(2*l.kmax, leaseKmaxMax)
		}
		kmax := l.kmax
		b.inflight.Add(1)
		b.mu.Unlock()

		// The grow finishes (and lands in the lease) even if this caller
		// gives up meanwhile: others may be waiting for it, and money it
		// takes stays in the lease, whence Renew returns it when idle.
		go func() {
			defer b.inflight.Done()
			grant, row, unsure, err := s.grow(ctx, reserving(r.Amount, r.Account), r.Account, need, r.Amount, kmax)
			b.mu.Lock()
			defer b.mu.Unlock()
			l.grow = nil
			g.err = err
			if unsure {
				l.unsure++
			}
			if err == nil {
				l.land(grant, row, b.maySwept(l, s.now()))
				l.extended = now
				l.grantedAt = now
			}
			close(g.done)
		}()
		select {
		case <-g.done:
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", reserving(r.Amount, r.Account), ctx.Err())
		}
		if g.err != nil {
			return g.err // wrapped with what by the writer
		}
		// Served from the grown lease on the next turn (or, should others
		// have taken it first, grown again).
		waited = nil
	}
}

// growRaces bounds the runs of a one-statement grow that each found the
// account row changed under it (see pgGrow); each run waits for the
// transaction it raced, so a second run nearly always succeeds.
const growRaces = 8

// grow takes more of the account's available balance into this
// instance's lease and extends its row; see the package's lease notes for
// the size of the grant. need is what must be covered at least, amount the
// size of the reservation asking.
//
// A grow whose connection was lost as it committed is simply run again
// (while its caller waits): should the first run have landed too, the
// row holds a grant memory does not count, which is the safe way round
// (memory is the lower bound: nothing is served from money the row does
// not hold), and unsure says so, so that resync gives it back.
func (s *sqlStore) grow(ctx context.Context, what, account string, need, amount Micros, kmax int64) (grant, row Micros, unsure bool, _ error) {
	now := s.now()
	opts := opOptions{single: s.d.growOne != "", retry: retryAlways}
	if s.d.growOne != "" {
		err := s.w.do(ctx, what, account, func(t *stx) error {
			unsure = unsure || t.unsure
			for range growRaces {
				var (
					granted, sized, held sql.NullInt64
					exists               bool
				)
				if err := t.queryRowText(s.d.growOne, account, int64(amount), int64(max(1, leaseGiveBackFactor*amount)), kmax, int64(need),
					s.leases.id, toDB(now.Add(s.leases.TTL())), toDB(now)).Scan(&granted, &exists, &sized, &held); err != nil {
					return err
				}
				switch {
				case granted.Valid:
					grant, row = Micros(granted.Int64), Micros(held.Int64)
					return nil
				case sized.Valid:
					continue // the row changed under the statement (see pgGrow): nothing written, again
				case exists:
					return ErrInsufficientFunds
				}
				return ErrUnknownAccount
			}
			return fmt.Errorf("the account changed under each of %d tries", growRaces)
		}, opts)
		return grant, row, unsure || errors.Is(err, errOutcomeUnknown), err
	}
	err := s.w.do(ctx, what, account, func(t *stx) error {
		unsure = unsure || t.unsure
		// The writer holds SQLite's write lock: nothing changes the row
		// between this read and the UPDATE below.
		var avail int64
		err := t.tx.QueryRowContext(t.ctx, s.q(`SELECT balance - reserved FROM accounts WHERE id = ?`), account).Scan(&avail)
		if errors.Is(err, sql.ErrNoRows) {
			return ErrUnknownAccount
		}
		if err != nil {
			return fmt.Errorf("reading available balance: %w", err)
		}
		if Micros(avail) < need {
			return ErrInsufficientFunds
		}
		grant = leaseGrant(Micros(avail), need, amount, kmax)
		// The no-overdraft rule, as ever one conditional UPDATE: the row is
		// locked while balance − reserved is checked and the grant added.
		res, err := t.tx.ExecContext(t.ctx, s.q(`UPDATE accounts SET reserved = reserved + ? WHERE id = ? AND balance - reserved >= ?`), int64(grant), account, int64(grant))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return ErrInsufficientFunds
		}
		var held int64
		err = t.tx.QueryRowContext(t.ctx, s.q(`INSERT INTO leases (id, account_id, amount, expires_at, created_at) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (id, account_id) DO UPDATE SET amount = leases.amount + excluded.amount, expires_at = excluded.expires_at
			RETURNING amount`),
			s.leases.id, account, int64(grant), toDB(now.Add(s.leases.TTL())), toDB(now)).Scan(&held)
		if err != nil {
			return fmt.Errorf("writing lease: %w", err)
		}
		row = Micros(held)
		return nil
	}, opts)
	return grant, row, unsure || errors.Is(err, errOutcomeUnknown), err
}

// leaseGrant sizes a grant: k reservations of amount, k = clamp(avail /
// (4 × amount), 1, kmax), but at least need and at most avail.
func leaseGrant(avail, need, amount Micros, kmax int64) Micros {
	if amount <= 0 {
		return need
	}
	k := min(max(int64(avail/(leaseGiveBackFactor*amount)), 1), kmax)
	return min(max(Micros(k)*amount, need), avail)
}

// shrink gives back the spare money of this instance's leases of accounts
// (all of them when accounts is nil) that pass keep: each lease keeps what
// its live reservations hold. The spare money is taken out of memory
// first, so no Reserve can use it while it is written; should the write
// fail, it is put back, unless the failure's outcome is unknown: then it
// may have been given back, and memory keeps the lower amount (a row
// holding more than memory counts is safe; less is not) until resync
// gives back what the row still holds. A failed shrink is not retried:
// the money stays in the lease, and the next Renew (a second later) or
// Sweep gives it back; retrying would keep the Reserves that must grow
// waiting (see shrinking). Rows are never deleted here (a grow may be
// landing on the same row): Close deletes them.
func (s *sqlStore) shrink(ctx context.Context, accounts []string, keep func(l *lease) bool) error {
	b := s.leases
	type giveBack struct {
		account string
		spare   Micros
	}
	var gb []giveBack
	now := s.now()
	b.mu.Lock()
	if accounts == nil {
		for a := range b.leases {
			accounts = append(accounts, a)
		}
	}
	for _, a := range accounts {
		l := b.leases[a]
		if l == nil || (l.grow != nil && b.maySwept(l, now)) || (keep != nil && !keep(l)) {
			// A lease whose row may have been swept, being grown, gives
			// back later: the grant may re-create the row (see land),
			// which money taken out meanwhile would be missing from.
			continue
		}
		if sp := l.spare(); sp > 0 {
			l.amount -= sp
			l.shrinking.start()
			gb = append(gb, giveBack{a, sp})
		}
	}
	b.mu.Unlock()
	if len(gb) == 0 {
		return nil
	}
	defer func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, g := range gb {
			// Renew forgets no lease with a shrink writing, so l is the
			// lease the money came from.
			if l := b.leases[g.account]; l != nil {
				l.shrinking.end()
			}
		}
	}()
	// One order on every instance: see writer.go on deadlocks.
	sort.Slice(gb, func(i, j int) bool { return gb[i].account < gb[j].account })
	err := s.w.do(ctx, fmt.Sprintf("returning spare lease money of %d account(s)", len(gb)), gb[0].account, func(t *stx) error {
		if s.d.shrinkOne != "" {
			accounts, spares := make([]string, len(gb)), make([]int64, len(gb))
			for i, g := range gb {
				accounts[i], spares[i] = g.account, int64(g.spare)
			}
			rs, err := t.queryText(s.d.shrinkOne, b.id, accounts, spares)
			if err != nil {
				return err
			}
			return rs.Close()
		}
		for _, g := range gb {
			res, err := t.tx.ExecContext(t.ctx, s.q(`UPDATE leases SET amount = amount - ? WHERE id = ? AND account_id = ? AND amount >= ?`), int64(g.spare), b.id, g.account, int64(g.spare))
			if err != nil {
				return fmt.Errorf("shrinking lease of %q: %w", g.account, err)
			}
			if n, err := res.RowsAffected(); err != nil {
				return err
			} else if n == 0 {
				continue // swept: nothing left to give back
			}
			if _, err := t.tx.ExecContext(t.ctx, s.q(`UPDATE accounts SET reserved = reserved - ? WHERE id = ?`), int64(g.spare), g.account); err != nil {
				return fmt.Errorf("returning lease money of %q: %w", g.account, err)
			}
		}
		return nil
	}, opOptions{single: s.d.shrinkOne != "", several: true, retry: retryNever})
	if err != nil {
		unknown := errors.Is(err, errOutcomeUnknown)
		b.mu.Lock()
		for _, g := range gb {
			switch l := b.leases[g.account]; {
			case l == nil:
			case unknown:
				l.unsure++
			default:
				l.amount += g.spare
			}
		}
		b.mu.Unlock()
	}
	return err
}

// resync makes memory agree with this instance's lease rows, for the
// leases whose writes had an unknown outcome (see lease.unsure): a grow
// that may have landed twice, a shrink or a settlement that may have
// landed although it failed give back what the row holds beyond what
// memory counts; a row swept or re-created since (a settlement found it
// missing, or a grant re-created it while settlements were in flight, see
// land) lowers memory to what the row holds. It waits for a
// moment when nothing of the lease is being written (no grow, shrink or
// settlement in flight): then what memory counts is what the row must
// hold, and it holds no less (memory is the lower bound). Meanwhile it
// counts as a shrink, so that no grow lands in between. A settlement or
// shrink started meanwhile composes with it (every write is relative),
// and at worst leaves the row holding a little more than counted, the
// safe way round. Not retried: Renew calls it every second.
func (s *sqlStore) resync(ctx context.Context) error {
	b := s.leases
	type check struct {
		account string
		counted Micros
		unsure  int
		gone    bool
		short   Micros // what memory counted beyond the row
	}
	var cs []check
	b.mu.Lock()
	for a, l := range b.leases {
		if l.unsure > 0 && l.grow == nil && l.shrinking.n == 0 && l.settling.n == 0 {
			l.shrinking.start()
			cs = append(cs, check{account: a, counted: l.amount, unsure: l.unsure})
		}
	}
	b.mu.Unlock()
	if len(cs) == 0 {
		return nil
	}
	// One order on every instance: see writer.go on deadlocks.
	sort.Slice(cs, func(i, j int) bool { return cs[i].account < cs[j].account })
	err := s.w.do(ctx, fmt.Sprintf("giving back what %d lease(s) hold beyond their count", len(cs)), cs[0].account, func(t *stx) error {
		for i := range cs {
			c := &cs[i]
			if err := s.lockAccounts(t, `SELECT id FROM accounts WHERE id = ?`, c.account); err != nil {
				return err
			}
			var held int64
			err := t.tx.QueryRowContext(t.ctx, s.q(`SELECT amount FROM leases WHERE id = ? AND account_id = ?`), b.id, c.account).Scan(&held)
			c.gone = errors.Is(err, sql.ErrNoRows)
			if c.gone {
				continue
			}
			if err != nil {
				return fmt.Errorf("reading lease of %q: %w", c.account, err)
			}
			extra := held - int64(c.counted)
			if extra <= 0 {
				c.short = Micros(-extra)
				continue
			}
			if _, err := t.tx.ExecContext(t.ctx, s.q(`UPDATE leases SET amount = amount - ? WHERE id = ? AND account_id = ? AND amount >= ?`), extra, b.id, c.account, extra); err != nil {
				return fmt.Errorf("shrinking lease of %q: %w", c.account, err)
			}
			if _, err := t.tx.ExecContext(t.ctx, s.q(`UPDATE accounts SET reserved = reserved - ? WHERE id = ?`), extra, c.account); err != nil {
				return fmt.Errorf("returning lease money of %q: %w", c.account, err)
			}
		}
		return nil
	}, opOptions{several: true, retry: retryNever})
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range cs {
		l := b.leases[c.account] // Renew forgets no lease with a shrink writing
		l.shrinking.end()
		if err != nil {
			continue
		}
		switch {
		case c.gone && c.counted > 0:
			// Swept (it expired): the money memory counted is gone.
			l.amount, l.extended = 0, time.Time{}
		case c.short > 0:
			// A delta, not the row's amount: a settlement may have been
			// booked meanwhile (see above).
			l.amount -= c.short
		}
		l.unsure -= c.unsure // those are settled; newer ones wait for the next resync
	}
	return err
}

// Renew keeps this instance's leases alive and returns idle ones: it moves
// every lease's expiry LeaseTTL ahead, in one statement, when a third of
// the TTL has passed since the last extension, and gives back the spare
// money of leases that served no Reserve for a second (and what an
// unknown outcome left in a row, see resync). The gateway calls it every
// second (walletapp's keep-alive); most calls write nothing. On
// PostgreSQL it also reads the ledger's newest ID (see settledBefore).
func (s *sqlStore) Renew(ctx context.Context) error {
	b := s.leases
	now := s.now()
	b.mu.Lock()
	extend := false
	var live map[string]bool // accounts with a live reservation, once needed
	for a, l := range b.leases {
		if l.amount == 0 && l.held == 0 && l.grow == nil && l.shrinking.n == 0 && l.settling.n == 0 && l.unsure == 0 && now.Sub(l.lastReserve) >= leaseIdleAfter {
			if live == nil {
				// A reservation of nothing (a model priced at zero) holds
				// nothing, yet its settlement looks its lease up.
				live = make(map[string]bool, len(b.res))
				for _, r := range b.res {
					live[r.Account] = true
				}
			}
			if !live[a] {
				// Forget an empty, idle lease, so that the map holds only
				// the accounts in use (its row, if any, is deleted at
				// Close).
				delete(b.leases, a)
				continue
			}
		}
		if now.Sub(l.extended) >= b.TTL()/3 {
			extend = true
		}
	}
	b.mu.Unlock()
	if err := s.shrink(ctx, nil, func(l *lease) bool { return now.Sub(l.lastReserve) >= leaseIdleAfter }); err != nil {
		return fmt.Errorf("returning idle leases: %w", err)
	}
	if err := s.resync(ctx); err != nil {
		return err
	}
	_ = s.noteLedgerHigh(ctx) // failing, the last one read stays: as correct
	if !extend {
		return nil
	}
	// Not retried: the next Renew extends them again.
	var extended []string
	err := s.w.do(ctx, "extending leases", "", func(t *stx) error {
		extended = extended[:0]
		if err := s.lockAccounts(t, leaseAccounts, s.leases.id); err != nil {
			return err
		}
		rs, err := t.tx.QueryContext(t.ctx, s.q(`UPDATE leases SET expires_at = ? WHERE id = ? RETURNING account_id`), toDB(now.Add(b.TTL())), b.id)
		if err != nil {
			return err
		}
		return eachRow(rs, func(rs *sql.Rows) error {
			var a string
			err := rs.Scan(&a)
			extended = append(extended, a)
			return err
		})
	}, opOptions{several: true, retry: retryNever})
	if err != nil {
		return err
	}
	b.mu.Lock()
	for _, a := range extended {
		// Leases granted since now were extended by their grant. A lease
		// whose row is missing was swept (it expired while the database
		// could not be reached): it stays unextended, so that no Reserve
		// is served from money the database no longer holds; the next
		// grows it afresh (see land).
		if l := b.leases[a]; l != nil && l.extended.Before(now) {
			l.extended = now
		}
	}
	b.mu.Unlock()
	return nil
}

// Extend moves live reservations' expiry, in memory.
func (s *sqlStore) Extend(_ context.Context, ids []string, until time.Time) (int, error) {
	b := s.leases
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, id := range ids {
		if m := b.res[id]; m != nil && m.expires.Before(until) {
			m.expires = until
			n++
		}
	}
	return n, nil
}

// sweepReservations releases this instance's reservations that expired at
// or before now (all of them when closing): their money goes back to the
// lease, each with a KindExpired row.
func (s *sqlStore) sweepReservations(ctx context.Context, now time.Time, closing bool) (int, error) {
	b := s.leases
	total := 0
	for {
		var batch []*memReservation
		b.mu.Lock()
		for id, m := range b.res {
			if closing || !m.expires.After(now) {
				batch = append(batch, m)
				delete(b.res, id)
				if len(batch) == sweepBatch {
					break
				}
			}
		}
		b.mu.Unlock()
		if len(batch) == 0 {
			return total, nil
		}
		why := "expired unsettled"
		if closing {
			why = "released unsettled: its store closed"
		}
		err := s.writeOnce(ctx, fmt.Sprintf("releasing %d expired reservations", len(batch)), "", func(t *stx) error {
			for _, m := range batch {
				if err := s.insertEntry(t, Entry{
					Kind: KindExpired, Account: m.Account, KeyID: m.KeyID, Model: m.Model, RequestID: m.RequestID,
					Note: fmt.Sprintf("reservation %s of %s %s", m.ID, m.Amount, why),
				}); err != nil {
					return err
				}
			}
			return nil
		})
		// Released unless the write failed; one whose outcome is unknown
		// counts as released, so that its row is never written twice (its
		// money stays in the lease either way).
		released := err == nil || errors.Is(err, errOutcomeUnknown)
		b.mu.Lock()
		for _, m := range batch {
			if !released {
				b.res[m.ID] = m
			} else if l := b.leases[m.Account]; l != nil {
				l.held -= m.Amount
			}
		}
		b.mu.Unlock()
		if err != nil {
			return total, err
		}
		total += len(batch)
	}
}

// sweepLeases releases, once they expired at or before now, the leases of
// other instances (this one's are alive while it is): one KindExpired row
// per lease, reserved down by its amount.
func (s *sqlStore) sweepLeases(ctx context.Context, now time.Time) (int, error) {
	total := 0
	for {
		type expired struct {
			id, account string
			amount      int64
		}
		var rows []expired
		err := s.writeOnce(ctx, "releasing expired leases", "", func(t *stx) error {
			rows = rows[:0]
			accounts, err := s.lockExpiredLeaseAccounts(t, now)
			if err != nil || len(accounts) == 0 {
				return err
			}
			args := append([]any{toDB(now), s.leases.id}, accounts...)
			rs, err := t.tx.QueryContext(t.ctx, s.q(`DELETE FROM leases WHERE (id, account_id) IN (SELECT id, account_id FROM leases WHERE expires_at <= ? AND id <> ? AND account_id IN (`+placeholders(len(accounts))+`) ORDER BY expires_at LIMIT `+fmt.Sprint(sweepBatch)+s.d.skipLocked+`) RETURNING id, account_id, amount`), args...)
			if err != nil {
				return err
			}
			if err := eachRow(rs, func(rs *sql.Rows) error {
				var x expired
				err := rs.Scan(&x.id, &x.account, &x.amount)
				rows = append(rows, x)
				return err
			}); err != nil {
				return err
			}
			sort.Slice(rows, func(i, j int) bool { return rows[i].account < rows[j].account })
			for _, x := range rows {
				if x.amount == 0 {
					continue
				}
				if _, err := t.tx.ExecContext(t.ctx, s.q(`UPDATE accounts SET reserved = reserved - ? WHERE id = ?`), x.amount, x.account); err != nil {
					return fmt.Errorf("releasing lease of %q: %w", x.account, err)
				}
				if err := s.insertEntry(t, Entry{Kind: KindExpired, Account: x.account,
					Note: fmt.Sprintf("lease %s of %s expired: its instance stopped extending it", x.id, Micros(x.amount))}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return total, err
		}
		for _, x := range rows {
			if x.amount > 0 { // empty leases go without a word
				total++
			}
		}
		if len(rows) < sweepBatch {
			return total, nil
		}
	}
}

// lockExpiredLeaseAccounts locks, in one order, the accounts of up to
// sweepBatch leases of other instances that expired at or before now, and
// returns them. A sweep takes the account rows before the lease rows, as
// grow does: one that locked a lease row first would wait for its
// account's row while a grow of that same lease (a live instance growing
// the lease it could not renew through an outage) held the account row
// and waited for the lease row, until lock_timeout failed one of them.
func (s *sqlStore) lockExpiredLeaseAccounts(t *stx, now time.Time) ([]any, error) {
	rs, err := t.tx.QueryContext(t.ctx, s.q(`SELECT DISTINCT account_id FROM (SELECT account_id FROM leases WHERE expires_at <= ? AND id <> ? ORDER BY expires_at LIMIT `+fmt.Sprint(sweepBatch)+`) e ORDER BY account_id`), toDB(now), s.leases.id)
	if err != nil {
		return nil, err
	}
	var accounts []any
	if err := eachRow(rs, func(rs *sql.Rows) error {
		var a string
		err := rs.Scan(&a)
		accounts = append(accounts, a)
		return err
	}); err != nil || len(accounts) == 0 {
		return accounts, err
	}
	return accounts, s.lockAccounts(t, `SELECT id FROM accounts WHERE id IN (`+placeholders(len(accounts))+`) ORDER BY id`, accounts...)
}

// lockAccounts runs query, a SELECT of account rows in ID order, with FOR
// UPDATE: the account rows a write takes before its lease rows (see the
// lock order above). Nothing on SQLite, whose one writer needs no locks.
func (s *sqlStore) lockAccounts(t *stx, query string, args ...any) error {
	if s.d.forUpdate == "" {
		return nil
	}
	rs, err := t.tx.QueryContext(t.ctx, s.q(query+s.d.forUpdate), args...)
	if err != nil {
		return fmt.Errorf("locking accounts: %w", err)
	}
	return eachRow(rs, func(*sql.Rows) error { return nil })
}

// leaseAccounts selects the accounts of this instance's leases ($1), for
// lockAccounts.
const leaseAccounts = `SELECT id FROM accounts WHERE id IN (SELECT account_id FROM leases WHERE id = ?) ORDER BY id`

// placeholders is n comma-separated ? placeholders.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// closeLeases refuses new Reserves and Settles, waits for those writing,
// releases the live reservations left (their requests can no longer
// settle: uncharged, each with a KindExpired row, as Sweep would after
// they expired), and returns every lease to its account: all that its row
// holds, which is also what an unknown outcome may have left there beyond
// what memory counted (see resync), now that nothing is served from it.
func (s *sqlStore) closeLeases() error {
	b := s.leases
	b.mu.Lock()
	already := b.closed
	b.closed = true
	b.mu.Unlock()
	if already {
		return nil
	}
	b.inflight.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.sweepReservations(ctx, time.Time{}, true); err != nil {
		return fmt.Errorf("releasing unsettled reservations: %w", err)
	}
	err := s.writeOnce(ctx, "returning the leases", "", func(t *stx) error {
		if err := s.lockAccounts(t, leaseAccounts, s.leases.id); err != nil {
			return err
		}
		if _, err := t.tx.ExecContext(t.ctx, s.q(`UPDATE accounts SET reserved = reserved - (SELECT amount FROM leases WHERE leases.id = ? AND leases.account_id = accounts.id)
			WHERE id IN (SELECT account_id FROM leases WHERE id = ? AND amount > 0)`), b.id, b.id); err != nil {
			return err
		}
		_, err := t.tx.ExecContext(t.ctx, s.q(`DELETE FROM leases WHERE id = ?`), b.id)
		return err
	})
	if err != nil {
		return fmt.Errorf("returning leases: %w", err)
	}
	return nil
}
