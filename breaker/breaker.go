package breaker

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// State is the breaker's view of a channel at a given instant.
type State uint8

const (
	Closed State = iota
	HalfOpen
	Open
	Parked
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case HalfOpen:
		return "half_open"
	case Open:
		return "open"
	case Parked:
		return "parked"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Transition is the state before and after a call that may change it, so
// callers can log or count edges without a separate State call that could
// race with other goroutines.
type Transition struct {
	From, To State
}

// Changed reports whether the call moved the breaker to a different state.
func (t Transition) Changed() bool { return t.From != t.To }

// Breaker is the circuit breaker for one channel. It is safe for concurrent
// use and must not be copied after first use.
//
// Internally every instant is Unix nanoseconds: comparisons then agree with
// the lock-free Available path, and 0 doubles as "no deadline" because no
// real clock reading is at the epoch.
type Breaker struct {
	// blockedUntil is max(openUntil, parkedUntil), published so Available
	// can answer without the mutex on every dispatch.
	blockedUntil atomic.Int64
	// recovering mirrors tripped so that Admit and Available can tell a
	// healthy channel (the common case) without the mutex.
	recovering atomic.Bool

	mu  sync.Mutex
	cfg Config

	// failAt holds the most recent outage failure times; only the last
	// MaxFailures matter because Failures never exceeds that.
	failAt  [MaxFailures]int64
	failN   int
	failPos int

	openUntil int64
	openedAt  int64
	// tripped survives the end of the cooldown so the breaker can tell
	// half-open (a trial is running) from closed.
	tripped bool
	opened  uint64
	// unannounced is set when the breaker trips and cleared by the first
	// admission after the cooldown, so that the clock-driven open →
	// half_open change is reported exactly once per trip.
	unannounced bool
	// lastResortTaken is set by the one request AdmitLastResort lets
	// through per trip.
	lastResortTaken bool
	// inFlight counts admitted trials (half-open or last resort) not yet Done.
	inFlight int

	parkedUntil int64
	parkedAt    int64

	outcomes outcomeRing
}

// New returns a closed breaker. cfg gets WithDefaults; out-of-range values
// are clamped rather than rejected, so call Config.Validate beforehand to
// surface mistakes.
func New(cfg Config) *Breaker {
	return &Breaker{cfg: cfg.sanitize()}
}

// SetConfig swaps settings on a live breaker, as on a config reload.
// Recorded failures and outcomes survive and are judged by the new Window,
// Failures and ratio settings from now on. A shorter Cooldown or MaxPark
// also cuts the deadlines already running, because an operator who lowers
// them wants channels back sooner; a longer one only applies to the next
// trip or park, because without a clock SetConfig cannot tell whether
// lengthening would re-open a channel that has already recovered.
func (b *Breaker) SetConfig(cfg Config) {
	cfg = cfg.sanitize()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cfg = cfg
	if b.openUntil != 0 {
		b.openUntil = min(b.openUntil, b.openedAt+int64(cfg.Cooldown))
	}
	if b.parkedUntil != 0 {
		b.parkedUntil = min(b.parkedUntil, b.parkedAt+int64(cfg.MaxPark))
	}
	b.publishLocked()
}

// Config returns the settings in force, after defaults and clamping.
func (b *Breaker) Config() Config {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cfg
}

// State reports the channel's state at now.
func (b *Breaker) State(now time.Time) State {
	n := now.UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stateLocked(n)
}

// Available reports whether Admit would let a request through at now:
// true when Closed, or HalfOpen with a trial slot free. It admits nothing;
// planners use it to leave out channels that would refuse.
func (b *Breaker) Available(now time.Time) bool {
	n := now.UnixNano()
	if n < b.blockedUntil.Load() {
		return false
	}
	if !b.recovering.Load() {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.stateLocked(n) {
	case Closed:
		return true
	case HalfOpen:
		return b.inFlight < b.cfg.Trials
	}
	return false // tripped or parked since the lock-free check
}

// Ticket is a request the breaker let through. A trial ticket holds one
// of the channel's Trials slots until Done; other tickets hold nothing.
// The zero Ticket is a valid non-trial ticket.
type Ticket struct {
	b     *Breaker
	trial bool
	// HalfOpened is set on the first admission after a trip's cooldown:
	// the clock moved the breaker from open to half_open, a change no
	// call returned, and this caller is the one to report it.
	HalfOpened bool
}

// Trial reports whether the ticket is a trial of a recovering channel (a
// half-open trial or the last resort of an open channel).
func (t Ticket) Trial() bool { return t.trial }

// Done frees the ticket's trial slot. Call it exactly once per admitted
// ticket, after the outcome was recorded (or not recorded, when it says
// nothing about the channel, such as a client going away).
func (t Ticket) Done() {
	if !t.trial {
		return
	}
	t.b.mu.Lock()
	t.b.inFlight--
	t.b.mu.Unlock()
}

// Admit decides whether a request may be sent at now. A closed channel
// admits everyone; a half-open one admits up to Trials concurrent trials,
// so that a channel which is still broken (or now hangs) holds back only
// those few requests while every other goes elsewhere at once; an open or
// parked channel admits nobody (see AdmitLastResort).
func (b *Breaker) Admit(now time.Time) (Ticket, bool) {
	n := now.UnixNano()
	if n < b.blockedUntil.Load() {
		return Ticket{}, false
	}
	if !b.recovering.Load() {
		return Ticket{}, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.settleLocked(n)
	switch b.stateLocked(n) {
	case Closed:
		return Ticket{}, true
	case Open, Parked:
		// It tripped or was parked after the lock-free check above read
		// the deadline (a trial failing, or rate limited, just now).
		return Ticket{}, false
	}
	if b.inFlight >= b.cfg.Trials {
		return Ticket{}, false
	}
	b.inFlight++
	t := Ticket{b: b, trial: true, HalfOpened: b.unannounced}
	b.unannounced = false
	return t, true
}

// AdmitLastResort lets one request through to an open channel per trip,
// for when every channel of a chain is open: failing such requests
// untried would turn the breaker into an outage of its own, while letting
// each of them through would send the whole load to a broken channel. It
// refuses a channel that is not open (use Admit), is parked (the upstream
// asked for nothing until then), already had its last resort since it
// tripped, or has its trial slots taken. A last resort holds a trial slot
// like a half-open trial.
func (b *Breaker) AdmitLastResort(now time.Time) (Ticket, bool) {
	n := now.UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	if n >= b.openUntil || n < b.parkedUntil || b.lastResortTaken || b.inFlight >= b.cfg.Trials {
		return Ticket{}, false
	}
	b.lastResortTaken = true
	b.inFlight++
	return Ticket{b: b, trial: true}, true
}

// ReadyAt returns when the channel becomes available: now if it already is,
// otherwise the later of the open and park deadlines. When every channel is
// blocked the caller can pick the one that is ready first.
func (b *Breaker) ReadyAt(now time.Time) time.Time {
	n := now.UnixNano()
	until := b.blockedUntil.Load()
	if n >= until {
		return now
	}
	return time.Unix(0, until).In(now.Location())
}

// RecordSuccess records a successful call. A success while half-open closes
// the breaker and forgets the failures that tripped it.
func (b *Breaker) RecordSuccess(now time.Time) Transition {
	return b.answered(now, true)
}

// RecordCommitted records that a trial's answer is reaching its client:
// the channel answers, so a half-open breaker closes at once, as on a
// success, instead of when the answer ends (a long stream would hold its
// trial slot, and so every other request off the channel, until then).
// It records no outcome: the attempt's own is recorded when it ends.
func (b *Breaker) RecordCommitted(now time.Time) Transition {
	return b.answered(now, false)
}

// answered closes a half-open breaker, recording a successful outcome
// when outcome is set.
func (b *Breaker) answered(now time.Time, outcome bool) Transition {
	n := now.UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.settleLocked(n)
	from := b.stateLocked(n)
	if outcome {
		b.outcomes.add(false)
	}
	if b.halfOpenLocked(n) {
		b.setTrippedLocked(false)
		b.failN, b.failPos = 0, 0
	}
	return Transition{From: from, To: b.stateLocked(n)}
}

// RecordFailure records an outage failure (not a rate limit; see Park).
func (b *Breaker) RecordFailure(now time.Time) Transition {
	n := now.UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.settleLocked(n)
	from := b.stateLocked(n)
	halfOpen := b.halfOpenLocked(n)
	b.failAt[b.failPos] = n
	b.failPos = (b.failPos + 1) % MaxFailures
	b.failN = min(b.failN+1, MaxFailures)
	b.outcomes.add(true)

	switch {
	case n < b.openUntil:
		// Already open: this is a request dispatched before the trip
		// finishing late. It is the same outage, so the deadline stays
		// put instead of depending on how long upstream took to fail.
	case halfOpen:
		// The trial failed. Ratio mode is skipped on purpose: the
		// channel already proved itself bad once in this window.
		b.tripLocked(n)
	case b.shouldTripLocked(n):
		b.tripLocked(n)
	}
	return Transition{From: from, To: b.stateLocked(n)}
}

// ParkFor is how long a rate limit parks the channel: what the upstream
// asked for (hinted), or the configured Park when it named no wait. A
// rate limit is never an outage, hint or no hint.
func (b *Breaker) ParkFor(wait time.Duration, hinted bool) time.Duration {
	if hinted {
		return wait
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cfg.Park
}

// Park takes the channel out of rotation for retryAfter (capped at
// MaxPark) without counting an outage failure, for a rate limit.
// An existing longer park is kept. until is the park deadline in force
// afterwards, zero if the channel is not parked (retryAfter <= 0 and no
// earlier park).
func (b *Breaker) Park(now time.Time, retryAfter time.Duration) (until time.Time, t Transition) {
	n := now.UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	t.From = b.stateLocked(n)
	d := min(retryAfter, b.cfg.MaxPark)
	if d > 0 {
		if u := n + int64(d); u > b.parkedUntil {
			b.parkedUntil, b.parkedAt = u, n
			b.publishLocked()
		}
	}
	if n < b.parkedUntil {
		until = time.Unix(0, b.parkedUntil).In(now.Location())
	}
	t.To = b.stateLocked(n)
	return until, t
}

// Reset closes the breaker by hand: failures, any open deadline and any
// park are cleared. The success-rate ring and the lifetime Opened count are
// kept because they describe history, not the current decision.
func (b *Breaker) Reset(now time.Time) Transition {
	n := now.UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	from := b.stateLocked(n)
	b.failN, b.failPos = 0, 0
	b.setTrippedLocked(false)
	b.unannounced, b.lastResortTaken = false, false
	b.openUntil, b.openedAt = 0, 0
	b.parkedUntil, b.parkedAt = 0, 0
	b.publishLocked()
	return Transition{From: from, To: b.stateLocked(n)}
}

// SuccessRate returns the success share over the last up to 100 recorded
// outcomes and how many outcomes that is. With no outcomes the rate is 1 so
// a new channel is not starved by a weighted router.
func (b *Breaker) SuccessRate() (rate float64, calls int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.outcomes.successRate()
}

// Snapshot is a point-in-time status view of a breaker.
type Snapshot struct {
	State            State
	FailuresInWindow int           // capped at MaxFailures
	OpenUntil        time.Time     // zero when not open
	ParkedUntil      time.Time     // zero when not parked
	RetryIn          time.Duration // 0 when available
	SuccessRate      float64
	Calls            int
	Opened           uint64
	TrialsInFlight   int
	// Available: a request may be sent now (closed, or half-open with a
	// trial slot free), as Available reports.
	Available bool
}

// Snapshot returns the breaker's status at now.
func (b *Breaker) Snapshot(now time.Time) Snapshot {
	n := now.UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	s := Snapshot{
		State:            b.stateLocked(n),
		FailuresInWindow: b.failuresInWindowLocked(n),
		Opened:           b.opened,
		TrialsInFlight:   b.inFlight,
	}
	if n < b.openUntil {
		s.OpenUntil = time.Unix(0, b.openUntil).In(now.Location())
	}
	if n < b.parkedUntil {
		s.ParkedUntil = time.Unix(0, b.parkedUntil).In(now.Location())
	}
	if blocked := max(b.openUntil, b.parkedUntil); n < blocked {
		s.RetryIn = time.Duration(blocked - n)
	}
	s.SuccessRate, s.Calls = b.outcomes.successRate()
	s.Available = s.State == Closed || (s.State == HalfOpen && b.inFlight < b.cfg.Trials)
	return s
}

func (b *Breaker) stateLocked(n int64) State {
	switch {
	case n < b.openUntil:
		return Open
	case n < b.parkedUntil:
		return Parked
	case b.halfOpenLocked(n):
		return HalfOpen
	}
	return Closed
}

// halfOpenLocked ignores parking: a channel can be parked while its
// half-open trial is pending, and the trial logic must still apply.
func (b *Breaker) halfOpenLocked(n int64) bool {
	return b.tripped && n >= b.openUntil && !b.staleTripLocked(n)
}

// staleTripLocked reports whether nothing of the last trip is inside the
// window any more: neither the trip itself nor Failures failures. A trip
// that is still inside the window keeps the channel half-open after its
// cooldown even when fewer than Failures failures are left in it (a
// synthetic check's Trip is one failure; the oldest of spread failures
// may age out during the cooldown): the channel gets its trials, not
// the whole load at once.
func (b *Breaker) staleTripLocked(n int64) bool {
	return n-b.openedAt >= int64(b.cfg.Window) && b.failuresInWindowLocked(n) < b.cfg.Failures
}

// settleLocked drops a trip that has aged out of the window without a
// half-open trial. Left set, it would make later failures that ratio
// mode deliberately ignored look like a failed trial.
func (b *Breaker) settleLocked(n int64) {
	if b.tripped && n >= b.openUntil && b.staleTripLocked(n) {
		b.setTrippedLocked(false)
	}
}

// failuresInWindowLocked scans the whole ring instead of stopping at the
// first old entry because concurrent callers read the clock before taking
// the lock, so timestamps can land slightly out of order.
func (b *Breaker) failuresInWindowLocked(n int64) int {
	cutoff := n - int64(b.cfg.Window)
	c := 0
	for _, t := range b.failAt[:b.failN] {
		if t > cutoff {
			c++
		}
	}
	return c
}

func (b *Breaker) shouldTripLocked(n int64) bool {
	if b.failuresInWindowLocked(n) < b.cfg.Failures {
		return false
	}
	if b.cfg.MinCalls == 0 {
		return true
	}
	calls, fails := b.outcomes.counts()
	if calls < b.cfg.MinCalls {
		return false
	}
	// Division rather than fails >= ratio*calls: 0.28*25 rounds above 7
	// in float64, while 7.0/25 rounds to exactly the literal 0.28.
	return float64(fails)/float64(calls) >= b.cfg.FailureRatio
}

func (b *Breaker) tripLocked(n int64) {
	// Trips only happen once any earlier deadline has passed, so
	// now+Cooldown always extends it; a re-trip never inherits the old one.
	b.openUntil = n + int64(b.cfg.Cooldown)
	b.openedAt = n
	b.setTrippedLocked(true)
	b.opened++
	b.unannounced, b.lastResortTaken = true, false
	b.publishLocked()
}

func (b *Breaker) setTrippedLocked(v bool) {
	b.tripped = v
	b.recovering.Store(v)
}

func (b *Breaker) publishLocked() {
	b.blockedUntil.Store(max(b.openUntil, b.parkedUntil))
}

// outcomeRing remembers the last ringSize outcomes as bits (1 = failure)
// with a running failure count, so recording and reading are O(1) and the
// breaker needs no allocation per call.
type outcomeRing struct {
	bits  [2]uint64
	n     uint8 // outcomes held, up to ringSize
	pos   uint8 // next slot to write
	fails uint8 // set bits among the n held
}

func (r *outcomeRing) add(failed bool) {
	word, bit := r.pos/64, uint64(1)<<(r.pos%64)
	if r.n == ringSize {
		if r.bits[word]&bit != 0 {
			r.fails--
		}
	} else {
		r.n++
	}
	if failed {
		r.bits[word] |= bit
		r.fails++
	} else {
		r.bits[word] &^= bit
	}
	r.pos++
	if r.pos == ringSize {
		r.pos = 0
	}
}

func (r *outcomeRing) counts() (calls, fails int) {
	return int(r.n), int(r.fails)
}

func (r *outcomeRing) successRate() (float64, int) {
	if r.n == 0 {
		return 1, 0
	}
	return float64(r.n-r.fails) / float64(r.n), int(r.n)
}

var (
	_ fmt.Stringer = State(0)
)

// Trip opens the breaker now, for a failure that is decisive on its own:
// a synthetic check of a channel nobody else is using is the only evidence
// there will be for an interval, so waiting for Failures of them would
// leave a dead channel shown as working for several intervals. An open
// breaker keeps its deadline.
func (b *Breaker) Trip(now time.Time) Transition {
	n := now.UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.settleLocked(n)
	from := b.stateLocked(n)
	if n >= b.openUntil {
		b.tripLocked(n)
	}
	return Transition{From: from, To: b.stateLocked(n)}
}
