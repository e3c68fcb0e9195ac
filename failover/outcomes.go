package failover

import (
	"net/http"
	"time"

	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/journal"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// This file turns an attempt's outcome into what the app keeps of it: a
// history attempt and a journal decision.

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

// reportedInput is the input the upstream reported for an attempt, every
// cache class included, and the part of it read from the prompt cache;
// 0, 0 without a meter or a reported input. The total is the classes'
// sum, as input_tokens_total counts them, so the cache-read share never
// exceeds 1 whatever an upstream reported.
func reportedInput(m *provider.Meter) (all, cacheRead int64) {
	if m == nil {
		return 0, 0
	}
	u := m.Usage()
	if !u.InputKnown {
		return 0, 0
	}
	cacheRead = max(u.CacheRead, 0)
	return u.PlainInput() + cacheRead + max(u.CacheWrite, 0) + max(u.CacheWrite1h, 0), cacheRead
}

// recordHistory adds one attempt of real traffic to the history. ttft is
// its time to first content; 0 when it committed nothing.
func (e *Engine) recordHistory(x *exchange, ch *Channel, res attemptResult, outcome reason, status int, ttft time.Duration) {
	class, ok := historyClass(res, outcome, status)
	if !ok {
		return
	}
	at := history.Attempt{At: time.Now(), Model: x.req.Model, Channel: ch.Name, Class: class, Status: status, TTFT: ttft, OutputTokens: outputTokens(x.meter)}
	at.InputTokens, at.CacheReadTokens = reportedInput(x.meter)
	if res.fail != nil {
		at.Reason = string(res.fail.reason)
	} else if res.verdict == passed {
		at.Reason, at.Status = string(reasonStatus), res.status
	}
	e.app.Record(at)
}

// recordServed adds what the client of an answered request got to its
// model's history: the model's status on the status page is what its
// clients saw, its channels' what their attempts saw. A client that left
// says nothing there; requests_total counts every ending.
func (e *Engine) recordServed(x *exchange, res attemptResult) {
	q := history.Attempt{At: time.Now(), Model: x.req.Model, Class: history.Success, OutputTokens: outputTokens(x.meter)}
	q.InputTokens, q.CacheReadTokens = reportedInput(x.meter)
	if !x.committedAt.IsZero() {
		q.TTFT = x.committedAt.Sub(x.start)
	}
	switch res.verdict {
	case clientGone:
		requestsTotal.WithLabelValues(x.req.Model, string(outcomeClientGone)).Inc()
	case broken: // the client saw its stream end in an error
		requestsTotal.WithLabelValues(x.req.Model, "broken").Inc()
		x.trace.brokeOff(res)
	case passed:
		if res.status >= 400 {
			// An upstream's error answer passed back: the client got
			// an error, not an answer.
			requestsTotal.WithLabelValues(x.req.Model, "passed").Inc()
			break
		}
		requestsTotal.WithLabelValues(x.req.Model, "served").Inc()
	default:
		requestsTotal.WithLabelValues(x.req.Model, "served").Inc()
	}
	switch {
	case res.verdict == clientGone:
		return
	case res.verdict == broken:
		q.Class = history.Down
		if res.fail != nil {
			q.Reason, q.Status = string(res.fail.reason), res.fail.status
		}
	case res.verdict == passed && res.status >= 400:
		q.Class, q.Reason, q.Status = clientClassOf(res.status), string(reasonStatus), res.status
	}
	e.app.Served(q)
}

// recordFailed adds a request no channel answered, refused with status,
// to its model's history.
func (e *Engine) recordFailed(x *exchange, status int, why string) {
	e.app.Served(history.Attempt{At: time.Now(), Model: x.req.Model, Class: clientClassOf(status), Reason: why, Status: status})
}

// clientClassOf is what an error status tells about a model's service.
func clientClassOf(status int) history.Class {
	switch {
	case status == http.StatusTooManyRequests:
		return history.Limited
	case status >= 500 || status == http.StatusRequestTimeout:
		return history.Down
	}
	return history.Client
}

// decided journals one failover decision, of the exchange's latest
// attempt.
func (e *Engine) decided(x *exchange, channel string, f *failure, next string) {
	e.decidedAt(x, x.attempts, channel, f, next)
}

// decidedAt journals one decision about attempt number attempt.
func (e *Engine) decidedAt(x *exchange, attempt int, channel string, f *failure, next string) {
	d := journal.Decision{
		At: time.Now(), RequestID: requestID(x), TraceID: x.trace.traceID(), Model: x.req.Model, Channel: channel, Attempt: attempt,
		Reason: string(f.reason), UpstreamStatus: f.status, Elapsed: time.Since(x.start), Remaining: time.Until(x.deadline), Next: next,
		DeliveredTokens: f.delivered, Form: f.form,
	}
	d.CostMicros = int64(f.cost)
	if f.learned != nil {
		d.DeadlineKind, d.Deadline = f.learned.kind.String(), f.learned.deadline.Limit
	}
	e.app.Decided(d)
	x.trace.decided(d)
}
