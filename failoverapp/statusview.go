package failoverapp

import (
	"math"
	"slices"
	"sort"
	"time"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/journal"
)

// Statuses of a model or a channel, worst last.
const (
	StatusOperational = "operational"
	StatusDegraded    = "degraded"
	StatusLimited     = "rate_limited"
	StatusDown        = "down"
)

// statusWindows are the success-rate windows every view carries.
var statusWindows = []struct {
	key string
	d   time.Duration
}{{"5m", 5 * time.Minute}, {"1h", time.Hour}, {"24h", 24 * time.Hour}}

// recentDecisions is how many failover decisions a channel shows.
const recentDecisions = 5

// StatusView is the status page's data, the JSON schema documented in the
// in docs/operations.md ("Status page").
type StatusView struct {
	Title       string         `json:"title"`
	GeneratedAt time.Time      `json:"generated_at"`
	Status      string         `json:"status"`
	Models      []ModelView    `json:"models"`
	Incidents   []IncidentView `json:"incidents"`
	Hidden      bool           `json:"-"` // channels hidden: a public page
	WindowKeys  []string       `json:"-"` // for the page, in order
	// Legend is every reason the view shows, sorted: the page lists their
	// runbooks.
	Legend []string `json:"-"`
}

// ModelView is one model: its status, windows and bars count what its
// clients got (Counts "requests"); its channels', their upstream
// attempts (Counts "attempts"), so a channel that fails over shows
// failures its model's clients never saw.
type ModelView struct {
	Name     string                `json:"name"`
	Status   string                `json:"status"`
	Since    time.Time             `json:"since"`
	Counts   string                `json:"counts"`
	Windows  map[string]WindowView `json:"windows"`
	Hourly   []BarView             `json:"hourly"`
	Daily    []BarView             `json:"daily"`
	Channels []ChannelView         `json:"channels,omitempty"`
}

type ChannelView struct {
	Name         string                `json:"name"`
	State        string                `json:"state"`
	Status       string                `json:"status"`
	Since        time.Time             `json:"since"`
	Counts       string                `json:"counts"`
	Doing        string                `json:"doing"`
	Until        time.Time             `json:"until,omitzero"`
	Windows      map[string]WindowView `json:"windows"`
	LastFailure  *FailureView          `json:"last_failure"`
	Hourly       []BarView             `json:"hourly"`
	Daily        []BarView             `json:"daily"`
	Decisions    []DecisionView        `json:"recent_decisions"`
	StateRunbook string                `json:"state_runbook"`
	// Probes are the synthetic checks of the channel, apart from its real
	// traffic above; absent when it was never probed.
	Probes *ProbeView `json:"probes,omitempty"`
	// LearnedDeadlines are the channel's deadlines per kind of wait and
	// size class it has observations of, so an operator can see what
	// adaptive_deadlines would cut at; absent when no handler learns them
	// or before their first observation.
	LearnedDeadlines []LearnedDeadlineView `json:"learned_deadlines,omitempty"`
}

// LearnedDeadlineView is one kind and size class of a channel's
// deadlines (latency.Learned). Until the channel has enough samples of
// it, Learned is false and LimitMs is the configured timeout (0: none).
type LearnedDeadlineView struct {
	Kind       string `json:"kind"`
	Class      string `json:"class"`
	LimitMs    int64  `json:"limit_ms"`
	Learned    bool   `json:"learned"`
	QuantileMs int64  `json:"quantile_ms"`
	// Percentile is which quantile QuantileMs is (99: p99): the
	// duration alone does not say what share of waits it bounds.
	Percentile float64 `json:"percentile"`
	Samples    int     `json:"samples"`
	MedianMs   int64   `json:"median_ms"`
}

// learnedDeadlinesOf is ch's learned deadlines at now (Channel.Learned);
// nil when no handler learns them or it has no observations yet.
func learnedDeadlinesOf(ch *Channel, now time.Time) []LearnedDeadlineView {
	// The learning config is loaded once, so that the percentile shown
	// is the one the deadlines were computed with even across a reload.
	l := ch.learning.Load()
	if l == nil {
		return nil
	}
	learned := ch.Latency.Snapshot(l.Config, l.Ceilings, l.WholeCeilings, now)
	if len(learned) == 0 {
		return nil
	}
	percentile := math.Round(l.Config.Quantile*1000) / 10
	out := make([]LearnedDeadlineView, len(learned))
	for i, e := range learned {
		out[i] = LearnedDeadlineView{Kind: e.Kind.String(), Class: e.Class.String(), LimitMs: e.Deadline.Limit.Milliseconds(),
			Learned: e.Deadline.Learned, QuantileMs: e.Deadline.Quantile.Milliseconds(), Percentile: percentile,
			Samples: e.Deadline.Samples, MedianMs: e.Median.Milliseconds()}
	}
	return out
}

// routeKey is one route of one model, by their names.
type routeKey struct{ model, channel string }

// learnedDeadlinesByRoute is the learned deadlines of every model
// route's channel at now, read once per channel. The snapshot's routes
// carry no channel, so the models are walked again, keyed by names as the
// view is; should two handlers declare one model name, the first one's
// channel is shown.
func (a *App) learnedDeadlinesByRoute(now time.Time) map[routeKey][]LearnedDeadlineView {
	// The models are copied out: a.mu is never held while a learner's
	// lock is taken.
	a.mu.Lock()
	models := slices.Clone(a.models)
	a.mu.Unlock()
	byChannel := map[*Channel][]LearnedDeadlineView{}
	out := map[routeKey][]LearnedDeadlineView{}
	for _, m := range models {
		for _, r := range m.Chain.Routes {
			ch := m.Channels[r.Channel]
			views, done := byChannel[ch]
			if !done {
				views = learnedDeadlinesOf(ch, now)
				byChannel[ch] = views
			}
			key := routeKey{m.Chain.Name, r.Name}
			if _, seen := out[key]; !seen {
				out[key] = views
			}
		}
	}
	return out
}

type WindowView struct {
	Attempts  int64 `json:"attempts"`
	Successes int64 `json:"successes"`
	Down      int64 `json:"down"`
	Limited   int64 `json:"limited"`
	Client    int64 `json:"client"`
	// SuccessRate is over the attempts that judged the upstreams (client
	// errors excluded), null when there were none: no data is not 100 %.
	SuccessRate  *float64 `json:"success_rate"`
	TTFTp50      int64    `json:"ttft_p50_ms"`
	TTFTp95      int64    `json:"ttft_p95_ms"`
	OutputTokens int64    `json:"output_tokens"`
	// InputTokens is the input the upstreams reported, every cache class
	// included, and CacheReadTokens the part read from their prompt
	// caches; CacheReadShare is the second over the first, absent (nil)
	// without input tokens: no share is known, which is not 0.
	InputTokens     int64    `json:"input_tokens"`
	CacheReadTokens int64    `json:"cache_read_tokens"`
	CacheReadShare  *float64 `json:"cache_read_share,omitempty"`
}

type BarView struct {
	Start       time.Time `json:"start"`
	Attempts    int64     `json:"attempts"`
	Successes   int64     `json:"successes"`
	Down        int64     `json:"down"`
	Limited     int64     `json:"limited"`
	Client      int64     `json:"client"`
	SuccessRate *float64  `json:"success_rate"` // as WindowView's
}

type FailureView struct {
	At      time.Time `json:"at"`
	Reason  string    `json:"reason"`
	Status  int       `json:"status"`
	Runbook string    `json:"runbook"`
}

type DecisionView struct {
	journal.Decision
	Runbook string `json:"runbook"`
}

type IncidentView struct {
	Kind     string           `json:"kind"`
	Subject  string           `json:"subject"`
	Start    time.Time        `json:"start"`
	End      time.Time        `json:"end,omitzero"`
	Ongoing  bool             `json:"ongoing"`
	Reasons  map[string]int64 `json:"reasons"`
	Attempts int64            `json:"attempts"`
	Failures int64            `json:"failures"`
}

func windowOf(c history.Counts) WindowView {
	w := WindowView{
		Attempts: c.Attempts, Successes: c.Successes, Down: c.Down, Limited: c.Limited, Client: c.Client,
		SuccessRate: successRate(c), TTFTp50: c.TTFT.Quantile(0.5).Milliseconds(), TTFTp95: c.TTFT.Quantile(0.95).Milliseconds(),
		OutputTokens: c.OutputTokens, InputTokens: c.InputTokens, CacheReadTokens: c.CacheReadTokens,
	}
	if share, ok := c.CacheReadShare(); ok {
		w.CacheReadShare = &share
	}
	return w
}

// successRate is c's success rate, nil when no attempt judged the
// upstreams.
func successRate(c history.Counts) *float64 {
	if rate, ok := c.SuccessRate(); ok {
		return &rate
	}
	return nil
}

func barsOf(bars []history.Bar) []BarView {
	out := make([]BarView, len(bars))
	for i, b := range bars {
		out[i] = BarView{Start: b.Start, Attempts: b.Attempts, Successes: b.Successes, Down: b.Down,
			Limited: b.Limited, Client: b.Client, SuccessRate: successRate(b.Counts)}
	}
	return out
}

func windowsOf(v history.View) map[string]WindowView {
	out := make(map[string]WindowView, len(statusWindows))
	for _, w := range statusWindows {
		out[w.key] = windowOf(v.Windows[w.d])
	}
	return out
}

func durations() []time.Duration {
	ds := make([]time.Duration, len(statusWindows))
	for i, w := range statusWindows {
		ds[i] = w.d
	}
	return ds
}

// channelCondition is what a channel's breaker says: its status, what the
// gateway does about it, and until when.
func channelCondition(h breaker.Snapshot, last5m history.Counts) (status, doing string, until time.Time) {
	switch h.State {
	case breaker.Open:
		return StatusDown, "skipping it (breaker open)", h.OpenUntil
	case breaker.HalfOpen:
		return StatusDegraded, "probing it with a few trial requests", time.Time{}
	case breaker.Parked:
		return StatusLimited, "not sending it anything (parked by the upstream's Retry-After)", h.ParkedUntil
	}
	if last5m.Failing() {
		return StatusDegraded, "serving, with failures failing over", time.Time{}
	}
	return StatusOperational, "serving", time.Time{}
}

// modelCondition is a model's status and since when, from what its
// clients got, never from its channels' attempts alone: down (or rate
// limited) while no channel may be sent anything, since the last one went
// out; degraded while its clients' requests are failing (fleet-wide
// counts of the last FailingWindow, history.Counts.Failing), since the
// first failure of the run; operational otherwise, since the end of the
// last of these.
func modelCondition(name string, routed, working, limitedOnly bool, lastOut time.Time, last history.Counts,
	st *statusState, incidents []history.Incident, now time.Time) (string, time.Time) {
	switch {
	case !working && limitedOnly && routed:
		return StatusLimited, lastOut
	case !working:
		return StatusDown, lastOut
	}
	failing, since := st.history.ModelFailing(name, now)
	if last.Failing() {
		if !failing {
			// Failing on other instances of the fleet, which keep their
			// runs' starts: what is known is that the failures counted
			// are within the window.
			since = now.Add(-history.FailingWindow)
		}
		return StatusDegraded, since
	}
	// since is when this instance last saw its clients recover, zero
	// when it never saw them fail; a model incident that ended later,
	// or the process start, may be later still.
	if st.started.After(since) {
		since = st.started
	}
	for _, in := range incidents {
		if in.Kind == history.ScopeModel && in.Subject == name && !in.Ongoing() && in.End.After(since) {
			since = in.End
		}
	}
	return StatusOperational, since
}

// worse is the worse of two statuses.
func worse(a, b string) string {
	rank := map[string]int{StatusOperational: 0, StatusDegraded: 1, StatusLimited: 2, StatusDown: 3}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

// statusSnapshot builds the status page's data from the registry (current
// state), the history and the journal. hide drops everything that names a
// channel or its URL, for a public page.
func (a *App) statusView(now time.Time, title string, hide bool) StatusView {
	snap := a.Snapshot(now)
	a.closedByClock(snap, now)
	a.endRemoved(snap, now)
	v := StatusView{Title: title, GeneratedAt: now.UTC(), Status: StatusOperational, Hidden: hide}
	legend := map[string]bool{}
	for _, w := range statusWindows {
		v.WindowKeys = append(v.WindowKeys, w.key)
	}
	st := a.status
	// hist and journal are the fleet's with a store; incidents and last
	// failures are this instance's.
	hist, jr := st.sources(now)
	incidents := st.history.Incidents()
	var learned map[routeKey][]LearnedDeadlineView
	if !hide {
		learned = a.learnedDeadlinesByRoute(now)
	}
	for _, m := range snap.Models {
		hv := hist.Model(m.Name, now, durations()...)
		ms := ModelView{Name: m.Name, Counts: "requests", Windows: windowsOf(hv), Hourly: barsOf(hv.Hourly), Daily: barsOf(hv.Daily)}
		working, limitedOnly := false, true
		var lastOut time.Time // when the last channel that went out did
		for _, r := range m.Routes {
			cv := hist.Channel(r.Route.Name, now, durations()...)
			cv.LastFailure = st.history.LastChannelFailure(r.Route.Name)
			status, doing, until := channelCondition(r.Health, cv.Windows[5*time.Minute])
			since := st.stateSince(r.Route.Name)
			if r.Health.Available {
				// Closed, or half-open with a trial slot free: a
				// half-open channel whose trials are all under way may
				// be sent nothing, and every other request is refused.
				working = true
			} else if since.After(lastOut) {
				lastOut = since
			}
			if r.Health.State != breaker.Parked {
				limitedOnly = false
			}
			if hide {
				continue
			}
			cs := ChannelView{Name: r.Route.Name, State: r.Health.State.String(), Status: status, Since: since.UTC(), Counts: "attempts",
				Doing: doing, Until: until, Windows: windowsOf(cv), Hourly: barsOf(cv.Hourly), Daily: barsOf(cv.Daily),
				StateRunbook: RunbookPath("state-" + r.Health.State.String()), Decisions: []DecisionView{}}
			if lf := cv.LastFailure; lf != nil {
				cs.LastFailure = &FailureView{At: lf.At.UTC(), Reason: lf.Reason, Status: lf.Status, Runbook: RunbookPath(lf.Reason)}
				legend[lf.Reason] = true
			}
			for _, d := range jr.Query(journal.Filter{Model: m.Name, Channel: r.Route.Name}, recentDecisions) {
				cs.Decisions = append(cs.Decisions, DecisionView{Decision: d, Runbook: RunbookPath(d.Reason)})
				legend[d.Reason] = true
			}
			cs.Probes = probeViewOf(r.Route.Name, now)
			cs.LearnedDeadlines = learned[routeKey{m.Name, r.Route.Name}]
			ms.Channels = append(ms.Channels, cs)
		}
		ms.Status, ms.Since = modelCondition(m.Name, len(m.Routes) > 0, working, limitedOnly, lastOut,
			hv.Windows[history.FailingWindow], st, incidents, now)
		ms.Since = ms.Since.UTC()
		v.Status = worse(v.Status, ms.Status)
		v.Models = append(v.Models, ms)
	}
	v.Incidents = []IncidentView{}
	for _, in := range incidents {
		if hide && in.Kind == history.ScopeChannel {
			continue
		}
		v.Incidents = append(v.Incidents, IncidentView{Kind: in.Kind, Subject: in.Subject, Start: in.Start.UTC(), End: in.End.UTC(),
			Ongoing: in.Ongoing(), Reasons: in.Reasons, Attempts: in.Attempts, Failures: in.Failures})
		for r := range in.Reasons {
			legend[r] = true
		}
	}
	if v.Models == nil {
		v.Models = []ModelView{}
	}
	for r := range legend {
		v.Legend = append(v.Legend, r)
	}
	sort.Strings(v.Legend)
	return v
}

// DefaultStatusTitle heads a status view that names no title.
const DefaultStatusTitle = "LLM gateway status"

// Status is the running config's status view; an empty one when no
// config has an llm_failover app.
func Status(now time.Time, title string, hide bool) StatusView {
	if title == "" {
		title = DefaultStatusTitle
	}
	if a := active(); a != nil {
		return a.statusView(now, title, hide)
	}
	return StatusView{Title: title, GeneratedAt: now.UTC(), Status: StatusOperational, Models: []ModelView{}, Incidents: []IncidentView{}}
}

// RunbookPath is where llm_status serves the runbook called name,
// relative to the status page (which sets its <base> to its own path).
func RunbookPath(name string) string { return "runbooks/" + name }

// ProbeView is a channel's synthetic checks on the status page.
type ProbeView struct {
	Windows    map[string]WindowView `json:"windows"`
	LastAt     time.Time             `json:"last_at"`
	LastResult string                `json:"last_result"`
	LastReason string                `json:"last_reason,omitempty"`
	// SpentToday is what today's (UTC) probes cost, in dollars.
	SpentToday    string `json:"spent_today"`
	BudgetStopped bool   `json:"budget_stopped"`
}

func probeViewOf(channel string, now time.Time) *ProbeView {
	rec, ok := probes.View(channel, now)
	if !ok || (rec.At.IsZero() && !rec.Stopped) {
		// Never probed; but a budget too small for one probe is shown.
		return nil
	}
	return &ProbeView{Windows: windowsOf(probes.History().Channel(channel, now, durations()...)),
		LastAt: rec.At.UTC(), LastResult: string(rec.Outcome), LastReason: rec.Reason,
		SpentToday: rec.Spent.String(), BudgetStopped: rec.Stopped}
}

// endRemoved ends the ongoing incidents the running config (snap, read
// from the active app) leaves nothing to end: those of the channels and
// models a reload removed, whose breakers no config consults any more,
// and that of a model the reload gave a working channel, whose new
// breakers have no transition to report. It runs when the view is read,
// never when a config starts, so that a config a reload refuses ends
// nothing.
func (a *App) endRemoved(snap Snapshot, now time.Time) {
	channels := map[string]bool{}
	working := map[string]bool{} // by model: present, and whether any channel works
	for _, c := range snap.Channels {
		channels[c.Name] = true
	}
	for _, m := range snap.Models {
		w := working[m.Name]
		for _, r := range m.Routes {
			// Closed only: a channel half-open by the clock has not
			// shown that it works (its trial may fail and trip it
			// again, the same outage), and one whose trial succeeds
			// reports its close by a transition.
			w = w || r.Health.State == breaker.Closed
		}
		working[m.Name] = w
	}
	a.status.history.EndUnless(func(kind, subject string) bool {
		if kind == history.ScopeModel {
			w, present := working[subject]
			return present && !w
		}
		return channels[subject]
	}, now)
}

// closedByClock ends the incident of a channel whose breaker closed by
// the clock: its trip left the window with no trial sent (nothing was
// sent to it), a change no call returned, so no transition ended it.
// Channels sharing a name share an incident: it ends when all of them
// are closed.
func (a *App) closedByClock(snap Snapshot, now time.Time) {
	closed := map[string]bool{}
	for _, c := range snap.Channels {
		ok, seen := closed[c.Name]
		closed[c.Name] = (ok || !seen) && c.Health.State == breaker.Closed
	}
	for name, ok := range closed {
		if ok && a.status.history.ChannelSeenClosed(name, now) {
			a.status.mu.Lock()
			a.status.since[name] = now
			a.status.mu.Unlock()
		}
	}
}
