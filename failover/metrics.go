package failover

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
	walletTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "wallet_operations_total",
		Help: "Wallet operations by kind and result.",
	}, []string{"op", "result"})
	walletCharged = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "wallet_charged_micros_total",
		Help: "Money charged, in millionths of a dollar, by model.",
	}, []string{"model"})
	resumesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "resumes_total",
		Help: "Broken streams continued on another channel, by model, outcome (resumed; broken: the continuation broke too; failed: none continued) and the form the continuation was asked in (prefill, instructed; none when it failed).",
	}, []string{"model", "outcome", "form"})
)

func registerMetrics(reg prometheus.Registerer) error {
	return caddykit.Register(reg, requestsTotal, attemptsTotal, attemptDuration, channelSkipped,
		walletTotal, walletCharged, resumesTotal)
}
