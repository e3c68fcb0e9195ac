package llmfailover

import (
	"time"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/journal"
)

// Statuses of a model or a channel, worst last.
const (
	statusOperational = "operational"
	statusDegraded    = "degraded"
	statusLimited     = "rate_limited"
	statusDown        = "down"
)

// degradedBelow is the 5-minute success rate under which a working
// channel shows as degraded, once it has had degradedMinAttempts: yellow
// before customers notice, not on one unlucky request.
const (
	degradedBelow       = 0.95
	degradedMinAttempts = 5
)

// statusWindows are the success-rate windows every view carries.
var statusWindows = []struct {
	key string
	d   time.Duration
}{{"5m", 5 * time.Minute}, {"1h", time.Hour}, {"24h", 24 * time.Hour}}

// recentDecisions is how many failover decisions a channel shows.
const recentDecisions = 5

// statusView is the status page's data, the JSON schema documented in the
// README ("Status page").
type statusView struct {
	Title       string          `json:"title"`
	GeneratedAt time.Time       `json:"generated_at"`
	Status      string          `json:"status"`
	Models      []modelStatus   `json:"models"`
	Incidents   []incidentView  `json:"incidents"`
	Hidden      bool            `json:"-"` // channels hidden: a public page
	WindowKeys  []string        `json:"-"` // for the page, in order
	legend      map[string]bool // reasons shown, for the runbook list
}

type modelStatus struct {
	Name     string                `json:"name"`
	Status   string                `json:"status"`
	Since    time.Time             `json:"since"`
	Windows  map[string]windowView `json:"windows"`
	Hourly   []barView             `json:"hourly"`
	Daily    []barView             `json:"daily"`
	Channels []channelStatus       `json:"channels,omitempty"`
}

type channelStatus struct {
	Name         string                `json:"name"`
	State        string                `json:"state"`
	Status       string                `json:"status"`
	Since        time.Time             `json:"since"`
	Doing        string                `json:"doing"`
	Until        time.Time             `json:"until,omitzero"`
	Windows      map[string]windowView `json:"windows"`
	LastFailure  *failureView          `json:"last_failure"`
	Hourly       []barView             `json:"hourly"`
	Daily        []barView             `json:"daily"`
	Decisions    []decisionView        `json:"recent_decisions"`
	StateRunbook string                `json:"state_runbook"`
	// Probes are the synthetic checks of the channel, apart from its real
	// traffic above; absent when it was never probed.
	Probes *probeView `json:"probes,omitempty"`
}

type windowView struct {
	Attempts     int64   `json:"attempts"`
	Successes    int64   `json:"successes"`
	Down         int64   `json:"down"`
	Limited      int64   `json:"limited"`
	Client       int64   `json:"client"`
	SuccessRate  float64 `json:"success_rate"`
	TTFTp50      int64   `json:"ttft_p50_ms"`
	TTFTp95      int64   `json:"ttft_p95_ms"`
	OutputTokens int64   `json:"output_tokens"`
}

type barView struct {
	Start       time.Time `json:"start"`
	Attempts    int64     `json:"attempts"`
	Successes   int64     `json:"successes"`
	Down        int64     `json:"down"`
	Limited     int64     `json:"limited"`
	Client      int64     `json:"client"`
	SuccessRate float64   `json:"success_rate"`
}

type failureView struct {
	At      time.Time `json:"at"`
	Reason  string    `json:"reason"`
	Status  int       `json:"status"`
	Runbook string    `json:"runbook"`
}

type decisionView struct {
	journal.Decision
	Runbook string `json:"runbook"`
}

type incidentView struct {
	Kind     string           `json:"kind"`
	Subject  string           `json:"subject"`
	Start    time.Time        `json:"start"`
	End      time.Time        `json:"end,omitzero"`
	Ongoing  bool             `json:"ongoing"`
	Reasons  map[string]int64 `json:"reasons"`
	Attempts int64            `json:"attempts"`
	Failures int64            `json:"failures"`
}

func windowOf(c history.Counts) windowView {
	return windowView{
		Attempts: c.Attempts, Successes: c.Successes, Down: c.Down, Limited: c.Limited, Client: c.Client,
		SuccessRate: c.SuccessRate(), TTFTp50: c.TTFT.Quantile(0.5).Milliseconds(), TTFTp95: c.TTFT.Quantile(0.95).Milliseconds(),
		OutputTokens: c.OutputTokens,
	}
}

func barsOf(bars []history.Bar) []barView {
	out := make([]barView, len(bars))
	for i, b := range bars {
		out[i] = barView{Start: b.Start, Attempts: b.Attempts, Successes: b.Successes, Down: b.Down,
			Limited: b.Limited, Client: b.Client, SuccessRate: b.Counts.SuccessRate()}
	}
	return out
}

func windowsOf(v history.View) map[string]windowView {
	out := make(map[string]windowView, len(statusWindows))
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
		return statusDown, "skipping it (breaker open)", h.OpenUntil
	case breaker.HalfOpen:
		return statusDegraded, "probing it with a few trial requests", time.Time{}
	case breaker.Parked:
		return statusLimited, "not sending it anything (parked by the upstream's Retry-After)", h.ParkedUntil
	}
	if last5m.Attempts-last5m.Client >= degradedMinAttempts && last5m.SuccessRate() < degradedBelow {
		return statusDegraded, "serving, with failures failing over", time.Time{}
	}
	return statusOperational, "serving", time.Time{}
}

// worse is the worse of two statuses.
func worse(a, b string) string {
	rank := map[string]int{statusOperational: 0, statusDegraded: 1, statusLimited: 2, statusDown: 3}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

// statusSnapshot builds the status page's data from the registry (current
// state), the history and the journal. hide drops everything that names a
// channel or its URL, for a public page.
func (a *App) statusSnapshot(now time.Time, title string, hide bool) statusView {
	snap := a.Snapshot(now)
	v := statusView{Title: title, GeneratedAt: now.UTC(), Status: statusOperational, Hidden: hide, legend: map[string]bool{}}
	for _, w := range statusWindows {
		v.WindowKeys = append(v.WindowKeys, w.key)
	}
	st := a.status
	// hist and journal are the fleet's with a store; incidents and last
	// failures are this instance's.
	hist, jr := st.sources(now)
	for _, m := range snap.Models {
		hv := hist.Model(m.Name, now, durations()...)
		ms := modelStatus{Name: m.Name, Windows: windowsOf(hv), Hourly: barsOf(hv.Hourly), Daily: barsOf(hv.Daily)}
		working, limitedOnly := false, true
		var worstChannel string
		var earliestBad, latestChange time.Time
		for _, r := range m.Routes {
			cv := hist.Channel(r.Route.Name, now, durations()...)
			cv.LastFailure = st.history.LastChannelFailure(r.Route.Name)
			status, doing, until := channelCondition(r.Health, cv.Windows[5*time.Minute])
			since := st.stateSince(r.Route.Name)
			worstChannel = worse(worstChannel, status)
			if r.Health.State == breaker.Closed || r.Health.State == breaker.HalfOpen {
				working = true
			}
			if r.Health.State != breaker.Parked {
				limitedOnly = false
			}
			if status != statusOperational && (earliestBad.IsZero() || since.Before(earliestBad)) {
				earliestBad = since
			}
			if since.After(latestChange) {
				latestChange = since
			}
			if hide {
				continue
			}
			cs := channelStatus{Name: r.Route.Name, State: r.Health.State.String(), Status: status, Since: since.UTC(),
				Doing: doing, Until: until, Windows: windowsOf(cv), Hourly: barsOf(cv.Hourly), Daily: barsOf(cv.Daily),
				StateRunbook: runbookPath("state-" + r.Health.State.String()), Decisions: []decisionView{}}
			if lf := cv.LastFailure; lf != nil {
				cs.LastFailure = &failureView{At: lf.At.UTC(), Reason: lf.Reason, Status: lf.Status, Runbook: runbookPath(lf.Reason)}
				v.legend[lf.Reason] = true
			}
			for _, d := range jr.Query(journal.Filter{Model: m.Name, Channel: r.Route.Name}, recentDecisions) {
				cs.Decisions = append(cs.Decisions, decisionView{Decision: d, Runbook: runbookPath(d.Reason)})
				v.legend[d.Reason] = true
			}
			cs.Probes = probeViewOf(r.Route.Name, now)
			ms.Channels = append(ms.Channels, cs)
		}
		switch {
		case !working && limitedOnly && len(m.Routes) > 0:
			ms.Status, ms.Since = statusLimited, earliestBad
		case !working:
			ms.Status, ms.Since = statusDown, earliestBad
		case worstChannel != statusOperational && worstChannel != "":
			ms.Status, ms.Since = statusDegraded, earliestBad
		default:
			ms.Status, ms.Since = statusOperational, latestChange
		}
		if ms.Status == statusOperational {
			w := ms.Windows["5m"]
			if w.Attempts-w.Client >= degradedMinAttempts && w.SuccessRate < degradedBelow {
				ms.Status = statusDegraded
			}
		}
		ms.Since = ms.Since.UTC()
		v.Status = worse(v.Status, ms.Status)
		v.Models = append(v.Models, ms)
	}
	v.Incidents = []incidentView{}
	for _, in := range st.history.Incidents() {
		if hide && in.Kind == "channel" {
			continue
		}
		v.Incidents = append(v.Incidents, incidentView{Kind: in.Kind, Subject: in.Subject, Start: in.Start.UTC(), End: in.End.UTC(),
			Ongoing: in.Ongoing(), Reasons: in.Reasons, Attempts: in.Attempts, Failures: in.Failures})
		for r := range in.Reasons {
			v.legend[r] = true
		}
	}
	if v.Models == nil {
		v.Models = []modelStatus{}
	}
	return v
}
