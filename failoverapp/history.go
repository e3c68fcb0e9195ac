package failoverapp

import (
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/journal"
	"github.com/llmfailover/caddy-llm-failover/probe"
)

// statusStates holds the history, the decision journal and the probe
// ledger across `caddy reload`, like the breakers: one entry, shared by
// every config generation while any llm_failover app is loaded.
var statusStates = caddy.NewUsagePool()

const statusStateKey = "history"

// probes is what the probes found and spent. It outlives every config, so
// that a reload loop cannot reset a day's budget.
var probes = probe.NewLedger()

// statusState is what the status page shows about the past.
type statusState struct {
	history *history.Recorder
	journal *journal.Journal

	mu sync.Mutex
	// since is when each channel's breaker last changed state (by name);
	// a channel never changed since the process started counts from
	// started.
	since   map[string]time.Time
	started time.Time

	// holder is the store the history flushes to and reader caches what
	// the page reads from it; nil without a store (historystore.go).
	holder *historyHolder
	reader *historyReader
}

// Destruct implements caddy.Destructor.
func (*statusState) Destruct() error { return nil }

func loadStatusState() (*statusState, error) {
	v, _, err := statusStates.LoadOrNew(statusStateKey, func() (caddy.Destructor, error) {
		return &statusState{history: history.NewRecorder(), journal: journal.New(journal.DefaultSize),
			since: map[string]time.Time{}, started: time.Now()}, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*statusState), nil
}

func (s *statusState) stateSince(channel string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.since[channel]; ok {
		return t
	}
	return s.started
}

// Served adds what one client request got to its model's history.
func (a *App) Served(q history.Attempt) {
	a.status.history.Served(q)
}

// Record adds one attempt of real traffic to its channel's history.
func (a *App) Record(at history.Attempt) {
	a.status.history.Record(at)
	if at.Class == history.Success {
		// A parked channel recovers by the clock, without a transition:
		// a success is what proves the model works again.
		a.status.history.ModelAvailable(at.Model, true, at.At)
	}
}

// Decided journals one failover decision.
func (a *App) Decided(d journal.Decision) {
	a.status.journal.Add(d)
}

// transitioned keeps the history's incidents and state times in step with
// one breaker transition: an open breaker is a channel incident, and a
// model whose every channel is open or parked is a model incident.
func (a *App) transitioned(ch *Channel, tr breaker.Transition, cause string) {
	now := time.Now()
	a.status.mu.Lock()
	a.status.since[ch.Name] = now
	a.status.mu.Unlock()
	switch tr.To {
	case breaker.Open:
		a.status.history.ChannelOpened(ch.Name, cause, now)
	case breaker.Closed:
		a.status.history.ChannelClosed(ch.Name, now)
	}
	// The models are copied out: a.mu is never held while the history
	// store or anything else is called.
	a.mu.Lock()
	models := slices.Clone(a.models)
	a.mu.Unlock()
	for _, m := range models {
		uses, working := false, false
		for _, r := range m.Chain.Routes {
			c := m.Channels[r.Channel]
			uses = uses || c == ch
			working = working || c.Breaker.Available(now)
		}
		if uses {
			a.status.history.ModelAvailable(m.Chain.Name, working, now)
		}
	}
}
