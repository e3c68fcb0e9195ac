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
	inputTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "input_tokens_total",
		Help: "Input tokens of the answers channels served, as the upstreams reported them, by model, channel and class (plain, cache_read, cache_write): a channel's cache-read share is its cache_read over the sum.",
	}, []string{"model", "channel", "class"})
)

func registerMetrics(reg prometheus.Registerer) error {
	return caddykit.Register(reg, requestsTotal, attemptsTotal, attemptDuration, channelSkipped,
		walletTotal, walletCharged, resumesTotal, inputTokens)
}

// countInput adds an answer's reported input, by cache class, to
// input_tokens_total: the cache-read share of each channel, which cache
// affinity exists to raise. Failed attempts and unreported input count
// nothing.
func countInput(x *exchange, channel string, res attemptResult) {
	if x.meter == nil || (res.verdict != served && res.verdict != broken) ||
		(x.mode != modeChain && x.mode != modeLastResort && x.mode != modeContinue) {
		return
	}
	u := x.meter.Usage()
	if !u.InputKnown {
		return
	}
	for _, c := range [...]struct {
		class string
		n     int64
	}{{"plain", u.PlainInput()}, {"cache_read", u.CacheRead}, {"cache_write", u.CacheWrite + u.CacheWrite1h}} {
		if c.n > 0 {
			inputTokens.WithLabelValues(x.req.Model, channel, c.class).Add(float64(c.n))
		}
	}
}
