package llmfailover

import (
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/journal"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// statusStates holds the history and the decision journal across
// `caddy reload`, like the breakers: one entry, shared by every config
// generation while any llm_failover app is loaded.
var statusStates = caddy.NewUsagePool()

const statusStateKey = "history"

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
	// the page reads from it; nil without a store (status_store.go).
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

// Cleanup releases this config's reference to the history.
func (a *App) Cleanup() error {
	a.releaseHistory()
	if a.status == nil {
		return nil
	}
	_, err := statusStates.Delete(statusStateKey)
	return err
}

// historyClass is what an attempt's outcome says about its channel, for
// the history; false for an attempt that says nothing (the client left).
func historyClass(res attemptResult, outcome reason, status int) (history.Class, bool) {
	switch {
	case res.verdict == clientGone:
		return 0, false
	case outcome == outcomeRateLimited || status == http.StatusTooManyRequests || (res.verdict == passed && res.status == http.StatusTooManyRequests):
		return history.Limited, true
	case res.fail != nil && !res.fail.channelFault():
		return history.Client, true
	case res.fail != nil || (res.verdict == passed && res.status >= 500):
		return history.Down, true
	case res.verdict == passed && res.status >= 400:
		return history.Client, true
	}
	return history.Success, true
}

// outputTokens is the output the upstream reported for an attempt, or
// the estimate of the content delivered when it reported none (an OpenAI
// stream nobody asked usage of); 0 without a meter.
func outputTokens(m *provider.Meter) int64 {
	if m == nil {
		return 0
	}
	if u := m.Usage(); u.OutputKnown {
		return u.Output
	}
	return m.DeliveredTokens()
}

// recordHistory adds one attempt to the history. ttft is the time to
// first content; 0 when the attempt committed nothing.
func (a *App) recordHistory(model, channel string, res attemptResult, outcome reason, status int, ttft time.Duration, outputTokens int64) {
	class, ok := historyClass(res, outcome, status)
	if !ok || a.status == nil {
		return
	}
	at := history.Attempt{At: time.Now(), Model: model, Channel: channel, Class: class, Status: status, TTFT: ttft, OutputTokens: outputTokens}
	if res.fail != nil {
		at.Reason = string(res.fail.reason)
	} else if res.verdict == passed {
		at.Reason, at.Status = string(reasonStatus), res.status
	}
	a.status.history.Record(at)
	if class == history.Success {
		// A parked channel recovers by the clock, without a transition:
		// a success is what proves the model works again.
		a.status.history.ModelAvailable(model, true, at.At)
	}
}

// decided journals one failover decision.
func (a *App) decided(x *exchange, channel string, f *failure, next string) {
	if a.status == nil {
		return
	}
	a.status.journal.Add(journal.Decision{
		At: time.Now(), RequestID: requestID(x), Model: x.req.Model, Channel: channel, Attempt: x.attempts,
		Reason: string(f.reason), UpstreamStatus: f.status, Elapsed: time.Since(x.start), Remaining: time.Until(x.deadline), Next: next,
		DeliveredTokens: f.delivered,
	})
}

// transitioned keeps the history's incidents and state times in step with
// one breaker transition: an open breaker is a channel incident, and a
// model whose every channel is open or parked is a model incident.
func (a *App) transitioned(st *channelState, tr breaker.Transition, reason string) {
	if a.status == nil {
		return
	}
	now := time.Now()
	a.status.mu.Lock()
	a.status.since[st.name] = now
	a.status.mu.Unlock()
	switch tr.To {
	case breaker.Open:
		a.status.history.ChannelOpened(st.name, reason, now)
	case breaker.Closed:
		a.status.history.ChannelClosed(st.name, now)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range a.models {
		uses, working := false, false
		for _, r := range m.chain.Routes {
			cs := m.channels[r.Channel].state
			uses = uses || cs == st
			working = working || cs.breaker.Available(now)
		}
		if uses {
			a.status.history.ModelAvailable(m.chain.Name, working, now)
		}
	}
}

// Interface guards
var (
	_ caddy.CleanerUpper = (*App)(nil)
)
