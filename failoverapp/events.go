package failoverapp

import (
	"time"

	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/breaker"
)

// Events the app emits through Caddy's events app, for status pages,
// probes and heartbeats to subscribe to instead of polling:
//
//	llm_failover.channel_state  a breaker changed state (also the clock-driven
//	                            open → half_open): channel, base_url (redacted),
//	                            from, to, reason (the attempt outcome that caused
//	                            it, cooldown_elapsed, last_resort_succeeded,
//	                            probe_failed or reset)
//	llm_failover.attempt        one upstream attempt ended: model,
//	                            upstream_model, channel, attempt (1-based),
//	                            outcome (ok or the failure reason),
//	                            upstream_status (0 when none), duration_ms
//
// Nothing is built when nobody subscribes.
const (
	EventChannelState = "llm_failover.channel_state"
	EventAttempt      = "llm_failover.attempt"
)

// StateChanged reports one breaker transition, once: a metric, a log line
// (to logger, the handler's), an event and the history's incidents. cause
// is what caused it.
func (a *App) StateChanged(logger *zap.Logger, ch *Channel, tr breaker.Transition, cause string) {
	breakerTransitions.WithLabelValues(ch.Name, tr.To.String()).Inc()
	logger.Warn("breaker state changed", zap.String("channel", ch.Name),
		zap.String("from", tr.From.String()), zap.String("to", tr.To.String()), zap.String("reason", cause))
	if a.events.ShouldEmit(EventChannelState) {
		a.events.Emit(a.ctx, EventChannelState, map[string]any{
			"channel": ch.Name, "base_url": ch.BaseURL,
			"from": tr.From.String(), "to": tr.To.String(), "reason": cause,
		})
	}
	a.transitioned(ch, tr, cause)
}

// Attempt is one upstream attempt's end, as the attempt event reports it.
type Attempt struct {
	Model, UpstreamModel, Channel string
	// Number is the attempt's place in its request, from 1.
	Number int
	// Outcome is "ok" or the failure reason.
	Outcome        string
	UpstreamStatus int
	Took           time.Duration
}

// Attempted emits the attempt event.
func (a *App) Attempted(at Attempt) {
	if !a.events.ShouldEmit(EventAttempt) {
		return
	}
	a.events.Emit(a.ctx, EventAttempt, map[string]any{
		"model": at.Model, "upstream_model": at.UpstreamModel, "channel": at.Channel, "attempt": at.Number,
		"outcome": at.Outcome, "upstream_status": at.UpstreamStatus, "duration_ms": at.Took.Milliseconds(),
	})
}
