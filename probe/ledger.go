package probe

import (
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
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{history: history.NewRecorder(), channels: map[string]*Record{}}
}

// Record is one channel's last probe and today's probe spend.
type Record struct {
	At      time.Time
	Model   string
	Outcome Outcome
	Reason  string
	Day     string // UTC date of Spent
	Spent   wallet.Micros
	Stopped bool // the day's budget is spent; logged once
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

// overBudget reports whether the channel's probes spent budget today; the
// first time it does, in a day, stopped is true.
func (l *Ledger) overBudget(channel string, budget wallet.Micros, now time.Time) (over, stopped bool, spent wallet.Micros) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.record(channel)
	if day := now.UTC().Format(time.DateOnly); r.Day != day {
		r.Day, r.Spent, r.Stopped = day, 0, false
	}
	if r.Spent < budget {
		return false, false, r.Spent
	}
	if !r.Stopped {
		r.Stopped = true
		budgetSpent.WithLabelValues(channel).Set(1)
		return true, true, r.Spent
	}
	return true, false, r.Spent
}

// finished records one probe's result and cost.
func (l *Ledger) finished(c Route, res Result, at time.Time) {
	l.mu.Lock()
	r := l.record(c.Channel)
	if day := at.UTC().Format(time.DateOnly); r.Day != day {
		r.Day, r.Spent, r.Stopped = day, 0, false
		budgetSpent.WithLabelValues(c.Channel).Set(0)
	}
	r.At, r.Model, r.Outcome, r.Reason = at, c.Model, res.Outcome, res.Reason
	r.Spent += res.Cost
	l.mu.Unlock()
	spend.WithLabelValues(c.Channel).Add(float64(res.Cost) / 1e6)
	total.WithLabelValues(c.Channel, string(res.Outcome)).Inc()
	l.history.Record(history.Attempt{At: at, Model: c.Model, Channel: c.Channel, Class: res.Outcome.Class(), Reason: res.Reason, TTFT: res.TTFT})
}
