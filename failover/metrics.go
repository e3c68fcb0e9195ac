package failover

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// The collectors live at package level and are registered into every
// config's registry: Caddy makes a new registry per config load, and
// package-level collectors keep their counts across `caddy reload`.
var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "requests_total",
		Help: "Requests by model and how they ended: served, broken (a committed stream that ended in an error), exhausted, unavailable, passed (an upstream's error answer passed back), refused (by the wallet: 401, 402, 503), client_gone.",
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
	hedgesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "hedges_total",
		Help: "Hedged requests by model and outcome: started, won_by_first, won_by_hedge, or refused_<why> (budget, wallet, parked, breaker) when a hedge was due but not sent.",
	}, []string{"model", "outcome"})
	hedgeCost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "hedge_cost_micros_total",
		Help: "Upstream cost of hedges' losing attempts, in millionths of a dollar at the routes' cost (estimated when the upstream reported no usage), by model and who paid (operator, client).",
	}, []string{"model", "paid_by"})
	inputTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "input_tokens_total",
		Help: "Input tokens of the answers channels served, as the upstreams reported them, by model, channel and class (plain, cache_read, cache_write): a channel's cache-read share is its cache_read over the sum.",
	}, []string{"model", "channel", "class"})

	// The OpenTelemetry GenAI client metrics, named as an OpenTelemetry
	// Prometheus exporter names them, with the conventions' buckets. Each
	// upstream attempt of real traffic is one operation; the labels are
	// the conventions' attributes, none of them taken from an answer (an
	// upstream must not choose label values).
	genAIDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gen_ai_client_operation_duration_seconds",
		Help:    "GenAI operation duration (gen_ai.client.operation.duration): one upstream attempt, from sending it until its answer ended or it failed; error_type is the upstream's status for a status failure, the failure reason for others, hedge_lost or client_gone for an attempt cancelled before it ended, empty on success.",
		Buckets: genAISecondsBuckets,
	}, genAILabels("error_type"))
	genAITimeToFirstChunk = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gen_ai_client_operation_time_to_first_chunk_seconds",
		Help:    "Time from sending a streaming attempt until its first content was committed to the client (gen_ai.client.operation.time_to_first_chunk).",
		Buckets: genAISecondsBuckets,
	}, genAILabels())
	genAITokens = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gen_ai_client_token_usage",
		Help:    "Tokens an upstream attempt reported, by gen_ai_token_type input (every cache class) or output (gen_ai.client.token.usage).",
		Buckets: []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864},
	}, genAILabels("gen_ai_token_type"))
)

var genAISecondsBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}

// genAILabels are the GenAI metrics' labels, then extra.
func genAILabels(extra ...string) []string {
	return append([]string{"gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "server_address"}, extra...)
}

// countGenAI records one attempt of real traffic in the GenAI metrics:
// took is from sending it until it ended.
func countGenAI(x *exchange, ch *Channel, route *chain.Route, res attemptResult, took time.Duration) {
	if x.mode != modeChain && x.mode != modeLastResort && x.mode != modeContinue {
		return
	}
	op, prov, model, addr := x.api.Operation(), provider.ProviderNameOf(ch.Adapter), upstreamModel(route, x.req.Model), ""
	if ch.Base != nil {
		addr = ch.Base.Hostname()
	}
	et := errorType(res)
	if res.verdict == clientGone {
		// Cancelled, never a success: beaten by the other attempt of a
		// hedged race, or its client left.
		et = string(outcomeClientGone)
		if x.race != nil && x.race.lost(x) {
			et = string(outcomeHedgeLost)
		}
	}
	genAIDuration.WithLabelValues(op, prov, model, addr, et).Observe(took.Seconds())
	if !x.committedAt.IsZero() && streaming(x) {
		genAITimeToFirstChunk.WithLabelValues(op, prov, model, addr).Observe(x.committedAt.Sub(time.Now().Add(-took)).Seconds())
	}
	if x.meter == nil {
		return
	}
	u := x.meter.Usage()
	if u.InputKnown {
		genAITokens.WithLabelValues(op, prov, model, addr, "input").Observe(float64(u.Input))
	}
	if u.OutputKnown {
		genAITokens.WithLabelValues(op, prov, model, addr, "output").Observe(float64(u.Output))
	}
}

func init() {
	caddykit.AddMetrics("llm_failover", requestsTotal, attemptsTotal, attemptDuration, channelSkipped,
		walletTotal, walletCharged, resumesTotal, hedgesTotal, hedgeCost, inputTokens, genAIDuration, genAITimeToFirstChunk, genAITokens, idempotentTotal)
}

// registerMetrics registers every collector of the plugin
// (caddykit.RegisterAll), these included.
func registerMetrics(reg prometheus.Registerer) error {
	return caddykit.RegisterAll(reg)
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
