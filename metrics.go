package llmfailover

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
)

// The collectors live at package level and are registered into every
// config's registry: Caddy makes a new registry per config load, and
// package-level collectors keep their counts across `caddy reload`.
var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "requests_total",
		Help: "Requests by model and outcome (served, exhausted, rate_limited, client_gone).",
	}, []string{"model", "outcome"})
	attemptsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "attempts_total",
		Help: "Upstream attempts by model, channel and outcome (ok or the failure reason).",
	}, []string{"model", "channel", "outcome"})
	attemptDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "attempt_duration_seconds",
		Help:    "Time from sending an attempt until it committed or failed.",
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 240},
	}, []string{"channel"})
	channelSkipped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "channel_skipped_total",
		Help: "Requests that skipped a channel before sending because its breaker was open or it was parked.",
	}, []string{"channel"})
	breakerTransitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "breaker_transitions_total",
		Help: "Breaker state changes by channel and new state.",
	}, []string{"channel", "to"})
	walletTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "wallet_operations_total",
		Help: "Wallet operations by kind and result.",
	}, []string{"op", "result"})
	walletCharged = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "wallet_charged_micros_total",
		Help: "Money charged, in millionths of a dollar, by model.",
	}, []string{"model"})
	probesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "probes_total",
		Help: "Synthetic checks by channel and result (passed, failed, rate_limited, probe_config_error).",
	}, []string{"channel", "result"})
	probeSpend = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "probe_spend_dollars_total",
		Help: "What synthetic checks cost, at the route's cost, by channel.",
	}, []string{"channel"})
	probeBudgetSpent = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "probe_budget_spent",
		Help: "1 while a channel's daily probe budget is spent and its probes are stopped.",
	}, []string{"channel"})
	resumesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "resumes_total",
		Help: "Broken streams continued on another channel, by model and outcome (resumed; broken: the continuation broke too; failed: none continued).",
	}, []string{"model", "outcome"})
)

func registerMetrics(reg prometheus.Registerer) error {
	return caddykit.Register(reg, requestsTotal, attemptsTotal, attemptDuration, channelSkipped,
		breakerTransitions, breakerStates{}, walletTotal, walletCharged, caddykit.JobMetrics{},
		probesTotal, probeSpend, probeBudgetSpent, resumesTotal)
}

var breakerStateDesc = prometheus.NewDesc("caddy_llm_failover_breaker_state",
	"Current breaker state per channel: 0 closed, 1 half_open, 2 open, 3 parked.",
	[]string{"channel"}, nil)

// breakerStates reads the running config's registry at scrape time: an
// open breaker closes by the clock, not by an event a gauge could be set
// on. Channels sharing a name (two sites with different keys) report the
// highest state value among them.
type breakerStates struct{}

func (breakerStates) Describe(ch chan<- *prometheus.Desc) { ch <- breakerStateDesc }

func (breakerStates) Collect(ch chan<- prometheus.Metric) {
	snap := registrySnapshot()
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
