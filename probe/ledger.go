package probe

import (
	"context"
	"sync"
	"time"

	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// Ledger is what probes found and spent. Its keeper holds one for the
// process, like the breakers: a reload keeps the day's spend, so a reload
// loop cannot reset a budget.
type Ledger struct {
	// history holds probe attempts only, apart from real traffic.
	history *history.Recorder

	mu sync.Mutex
	// channels are keyed by channel name.
	channels map[string]*Record
	// slots lets one probe of unknown cost per channel run at a time.
	slots map[string]chan struct{}
	// probed is when each route (model, channel and the channel's
	// identity) was last probed, so that the scheduler of the next config
	// keeps its interval; a channel that a reload gave another URL or key
	// is another channel, never probed yet.
	probed map[probedKey]time.Time
	// inFlight are the routes a probe is under way for, by any config's
	// scheduler: during a reload the new config's prober starts before
	// the old one stops, and must not probe a route alongside it.
	inFlight map[probedKey]bool
}

type probedKey struct{ model, channel, ref string }

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{history: history.NewRecorder(), channels: map[string]*Record{}, slots: map[string]chan struct{}{},
		probed: map[probedKey]time.Time{}, inFlight: map[probedKey]bool{}}
}

// Record is one channel's last probe and today's probe spend.
type Record struct {
	At      time.Time
	Model   string
	Outcome Outcome
	Reason  string
	Day     string // UTC date of Spent
	Spent   wallet.Micros
	// Held is what the probes in flight may still cost.
	Held    wallet.Micros
	Stopped bool // the day's budget is spent; logged once
}

// noteProbed records that a probe of the route was sent at at.
func (l *Ledger) noteProbed(c Route, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := probedKey{c.Model, c.Channel, c.Ref}
	if at.After(l.probed[k]) {
		l.probed[k] = at
	}
}

// claim marks a probe of the route under way; false when one already is.
func (l *Ledger) claim(c Route) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := probedKey{c.Model, c.Channel, c.Ref}
	if l.inFlight[k] {
		return false
	}
	l.inFlight[k] = true
	return true
}

// unclaim ends a claim.
func (l *Ledger) unclaim(c Route) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.inFlight, probedKey{c.Model, c.Channel, c.Ref})
}

// lastProbed is when a probe of the route was last sent, by any config;
// the zero time when none was.
func (l *Ledger) lastProbed(c Route) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.probed[probedKey{c.Model, c.Channel, c.Ref}]
}

// History is the probes' own history, for the status page.
func (l *Ledger) History() *history.Recorder { return l.history }

func (l *Ledger) record(channel string) *Record {
	r := l.channels[channel]
	if r == nil {
		r = &Record{}
		l.channels[channel] = r
	}
	return r
}

// View returns a copy of the channel's record, its day rolled at now;
// false when the channel was never probed.
func (l *Ledger) View(channel string, now time.Time) (Record, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.channels[channel]
	if !ok {
		return Record{}, false
	}
	c := *r
	if c.Day != now.UTC().Format(time.DateOnly) {
		c.Spent, c.Stopped = 0, false
	}
	return c, true
}

// roll starts the channel's new day at now: the spend restarts; what
// probes in flight hold stays held.
func roll(r *Record, now time.Time) {
	if day := now.UTC().Format(time.DateOnly); r.Day != day {
		r.Day, r.Spent, r.Stopped = day, 0, false
	}
}

// Hold is one probe's claim on its channel's daily budget, from the check
// that let it go until it is settled to its real cost or released.
type Hold struct {
	l      *Ledger
	route  Route
	amount wallet.Micros
	slot   chan struct{} // the channel's one slot for a probe of unknown cost; nil when the cost is known
}

// hold checks the route's daily budget and holds the probe's maximum cost
// (Route.MaxCost) in one step, so that probes running at once cannot
// together spend more than the budget: a probe goes only when what its
// channel spent today, plus what probes in flight hold, plus its own
// maximum fit in the budget. A probe whose maximum is unknown waits for
// the channel's previous one of unknown cost to settle and goes while the
// spend and the holds are under the budget: the budget is then overshot by
// at most one probe, as when probes ran one after another.
//
// A nil hold is a probe that may not go now (or ctx ended while it
// waited); stopped is true the first time in a day that the spend alone
// leaves no room, and spent is the day's spend.
func (l *Ledger) hold(ctx context.Context, c Route, budget wallet.Micros, now time.Time) (h *Hold, stopped bool, spent wallet.Micros) {
	var slot chan struct{}
	if c.MaxCost <= 0 {
		l.mu.Lock()
		slot = l.slots[c.Channel]
		if slot == nil {
			slot = make(chan struct{}, 1)
			l.slots[c.Channel] = slot
		}
		l.mu.Unlock()
		select {
		case slot <- struct{}{}:
		case <-ctx.Done():
			return nil, false, 0
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.record(c.Channel)
	roll(r, now)
	// room is what is left of the budget; compared rather than summed
	// so that no sum overflows.
	room := budget - r.Spent
	var fits, spentOut bool
	if c.MaxCost > 0 {
		fits = room-r.Held >= c.MaxCost
		spentOut = room < c.MaxCost
	} else {
		fits = room-r.Held > 0
		spentOut = room <= 0
	}
	if !fits {
		if slot != nil {
			<-slot
		}
		if spentOut && !r.Stopped {
			r.Stopped = true
			stopped = true
		}
		return nil, stopped, r.Spent
	}
	amount := max(c.MaxCost, 0)
	r.Held += amount
	return &Hold{l: l, route: c, amount: amount, slot: slot}, false, r.Spent
}

// release gives the hold back: the probe was not sent.
func (h *Hold) release() {
	h.l.mu.Lock()
	h.l.record(h.route.Channel).Held -= h.amount
	h.l.mu.Unlock()
	if h.slot != nil {
		<-h.slot
	}
}

// interrupted replaces the hold with what a probe cut short by the
// prober's own stop cost, and records no result: it says nothing of
// the channel.
func (h *Hold) interrupted(cost wallet.Micros, at time.Time) {
	l, c := h.l, h.route
	l.mu.Lock()
	r := l.record(c.Channel)
	roll(r, at)
	r.Held -= h.amount
	r.Spent += cost
	l.mu.Unlock()
	if h.slot != nil {
		<-h.slot
	}
	spend.WithLabelValues(c.Channel).Add(float64(cost) / 1e6)
}

// settle records the probe's result and replaces its hold with its real
// cost.
func (h *Hold) settle(res Result, at time.Time) {
	l, c := h.l, h.route
	l.mu.Lock()
	r := l.record(c.Channel)
	roll(r, at)
	r.Held -= h.amount
	r.At, r.Model, r.Outcome, r.Reason = at, c.Model, res.Outcome, res.Reason
	r.Spent += res.Cost
	l.mu.Unlock()
	if h.slot != nil {
		<-h.slot
	}
	spend.WithLabelValues(c.Channel).Add(float64(res.Cost) / 1e6)
	total.WithLabelValues(c.Channel, string(res.Outcome)).Inc()
	l.history.Record(history.Attempt{At: at, Model: c.Model, Channel: c.Channel, Class: res.Outcome.Class(), Reason: res.Reason, TTFT: res.TTFT})
}
