package failoverapp

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/latency"
	"github.com/llmfailover/caddy-llm-failover/probe"
)

// The collectors live at package level and are registered into every
// config's registry: Caddy makes a new registry per config load, and
// package-level collectors keep their counts across `caddy reload`.
var (
	breakerTransitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "breaker_transitions_total",
		Help: "Breaker state changes by channel and new state.",
	}, []string{"channel", "to"})
	heldBytesGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "held_bytes",
		Help: "Bytes of answers held in memory across every request (held stream frames, buffered answers); max_held_bytes caps it.",
	}, func() float64 { return float64(HeldBytes()) })
	learnedDeadlineFired = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "learned_deadline_fired_total",
		Help: "Attempts cut by a learned deadline (adaptive_deadlines), by channel and kind of wait (header, first_content, gap).",
	}, []string{"channel", "kind"})
)

// LearnedDeadlineFired counts one attempt on channel cut by a learned
// deadline (latency.Deadline.Learned) of kind, a latency.Kind's name, so
// that the cuts adaptive_deadlines makes can be told from the configured
// timeouts' and alerted on per channel.
func LearnedDeadlineFired(channel, kind string) {
	learnedDeadlineFired.WithLabelValues(channel, kind).Inc()
}

func init() {
	caddykit.AddMetrics("llm_failover", append(probe.Collectors(),
		breakerTransitions, breakerStates{}, heldBytesGauge, caddykit.JobMetrics{},
		learnedDeadlineFired, learnedDeadlines{channels: activeChannels}, probeBudgets{channels: activeProbedChannels})...)
}

// registerMetrics registers every collector of the plugin
// (caddykit.RegisterAll), these included.
func registerMetrics(reg prometheus.Registerer) error {
	return caddykit.RegisterAll(reg)
}

var breakerStateDesc = prometheus.NewDesc("caddy_llm_failover_breaker_state",
	"Current breaker state per channel: 0 closed, 1 half_open, 2 open, 3 parked.",
	[]string{"channel"}, nil)

// breakerStates reads the running config's channels at scrape time: an
// open breaker closes by the clock, not by an event a gauge could be set
// on. Channels sharing a name (two sites with different keys) report the
// highest state value among them.
type breakerStates struct{}

func (breakerStates) Describe(ch chan<- *prometheus.Desc) { ch <- breakerStateDesc }

func (breakerStates) Collect(ch chan<- prometheus.Metric) {
	snap := activeSnapshot()
	for i, c := range snap.Channels {
		if i > 0 && snap.Channels[i-1].Name == c.Name {
			continue
		}
		state := c.Health.State
		for _, same := range snap.Channels[i+1:] {
			if same.Name != c.Name {
				break
			}
			state = max(state, same.Health.State)
		}
		ch <- prometheus.MustNewConstMetric(breakerStateDesc, prometheus.GaugeValue, float64(state), c.Name)
	}
}

var learnedDeadlineDesc = prometheus.NewDesc("caddy_llm_failover_learned_deadline_seconds",
	"Deadline learned per channel, kind of wait and request size class (prompt/output: s, m, l), "+
		"for the kinds and classes with enough samples; the others wait the configured timeout.",
	[]string{"channel", "kind", "class"}, nil)

// learnedDeadlines reads the channels' learners at scrape time, so that
// serving a request costs nothing and a deadline that drifts with traffic
// or expires with its window is current. channels lists the channels to
// read, each once. Channels sharing a name (two sites with different
// keys) report the longest deadline among them.
type learnedDeadlines struct {
	channels func() []*Channel
}

func (learnedDeadlines) Describe(ch chan<- *prometheus.Desc) { ch <- learnedDeadlineDesc }

func (l learnedDeadlines) Collect(ch chan<- prometheus.Metric) {
	type key struct {
		channel string
		kind    latency.Kind
		class   latency.Class
	}
	now := time.Now()
	limits := map[key]time.Duration{}
	for _, c := range l.channels() {
		for _, e := range c.Learned(now) {
			if !e.Deadline.Learned {
				continue
			}
			k := key{c.Name, e.Kind, e.Class}
			limits[k] = max(limits[k], e.Deadline.Limit)
		}
	}
	for k, limit := range limits {
		ch <- prometheus.MustNewConstMetric(learnedDeadlineDesc, prometheus.GaugeValue, limit.Seconds(),
			k.channel, k.kind.String(), k.class.String())
	}
}

// activeChannels lists the running config's channels, each once; none
// when no config has an llm_failover app.
func activeChannels() []*Channel {
	a := active()
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*Channel
	for _, c := range a.channels {
		if !slices.Contains(out, c.ch) {
			out = append(out, c.ch)
		}
	}
	return out
}

var probeBudgetSpentDesc = prometheus.NewDesc("caddy_llm_failover_probe_budget_spent",
	"1 while a channel's daily probe budget is spent and its probes are stopped.",
	[]string{"channel"}, nil)

// probeBudgets reads, at scrape time, whether the day's probe budget of
// each channel the running config probes is spent: a gauge set when it
// ran out went on saying so, and paging, for a channel a reload removed
// (or stopped probing), as only that channel's next probe on a new day
// set it back. channels lists the probed channels' names.
type probeBudgets struct {
	channels func() []string
}

func (probeBudgets) Describe(ch chan<- *prometheus.Desc) { ch <- probeBudgetSpentDesc }

func (p probeBudgets) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	seen := map[string]bool{}
	for _, name := range p.channels() {
		if seen[name] {
			continue
		}
		seen[name] = true
		rec, ok := probes.View(name, now)
		if !ok {
			continue
		}
		v := 0.0
		if rec.Stopped {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(probeBudgetSpentDesc, prometheus.GaugeValue, v, name)
	}
}

// activeProbedChannels lists the channels the running config probes; none
// when no config has an llm_failover app.
func activeProbedChannels() []string {
	a := active()
	if a == nil {
		return nil
	}
	a.mu.Lock()
	targets := slices.Clone(a.probes)
	a.mu.Unlock()
	var out []string
	for _, t := range targets {
		for _, r := range t.Routes() {
			out = append(out, r.Channel)
		}
	}
	return out
}
