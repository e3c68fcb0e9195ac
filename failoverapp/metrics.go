package failoverapp

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
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
)

func registerMetrics(reg prometheus.Registerer) error {
	return caddykit.Register(reg, append(probe.Collectors(),
		breakerTransitions, breakerStates{}, heldBytesGauge, caddykit.JobMetrics{})...)
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
