package failover

import (
	"net/http"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/internal/backoff"
)

// walkEnd is how a walk over the candidates ended.
type walkEnd struct {
	// answered: the client has its answer, or is gone; res is the last
	// attempt's result and rest the candidates after the one that gave it
	// (where a broken stream may be continued).
	answered bool
	res      attemptResult
	rest     []*chain.Route
	// last is the last retryable failure, and retryAfter the shortest
	// Retry-After any candidate asked for, for the client's error when no
	// candidate answered.
	last       *failure
	retryAfter time.Duration
	// overloaded: the gateway's own memory budget kept a candidate from
	// being tried (gateway_overloaded), so the chain was not walked and a
	// client's retry may find room.
	overloaded bool
}

// walk tries routes in order until one answers, or the client, the
// deadline or the routes run out. A hedged model's first candidate races
// the second once hedge_after passes without content (hedge.go); each
// attempt of the race is still run by candidate and try. It is the one owner of an attempt's
// life, for client requests, continuations and synthetic checks alike:
// before each candidate it checks that the client is still there and the
// deadline not passed, then admits the channel (or spends the ticket taken
// for routes[0] before the walk, the last resort's), splits what is left
// of the deadline, counts the attempt, runs retry_same, and has each
// outcome recorded once. Every ticket is released on every path: a
// leaked trial slot would keep a recovering channel refused for good.
func (e *Engine) walk(x *exchange, routes []*chain.Route, taken *breaker.Ticket, deadline time.Time) walkEnd {
	defer func() {
		if taken != nil {
			// Never spent: the client left, or the deadline passed, first.
			taken.Done()
		}
	}()
	x.deadline = deadline
	var end walkEnd
	hedgeAfter, _ := e.hedgeDelay(x, routes)
	for i := 0; i < len(routes); i++ {
		route := routes[i]
		if x.r.Context().Err() != nil || !time.Now().Before(deadline) {
			break
		}
		var ticket breaker.Ticket
		switch {
		case x.mode == modeDoctor || x.mode == modeDrill:
			// The doctor checks a channel whatever its breaker says,
			// and takes none of its trial slots.
		case i == 0 && taken != nil:
			ticket, taken = *taken, nil
		default:
			// A half-open channel admits a bounded number of trials;
			// when they are taken the request moves on at once.
			var ok bool
			if ticket, ok = e.channels[route.Channel].health.Breaker.Admit(time.Now()); !ok {
				if x.mode != modeSynthetic {
					// A probe not sent is no request that skipped the
					// channel: the prober reports it (not sent).
					e.skipped(x, route)
				}
				continue
			}
		}
		// An equal share of what is left, so that a silent channel cannot
		// take the time its backups need.
		budget := time.Until(deadline) / time.Duration(len(routes)-i)
		if i == 0 && hedgeAfter > 0 {
			race := e.race(x, routes, ticket, budget, hedgeAfter)
			for _, rn := range race.failed {
				end.note(rn.res.fail)
				next := ""
				switch other := routes[0]; {
				case race.used == 2 && (rn.route == routes[0] || len(race.failed) == 1):
					// The other attempt was running: the first candidate's
					// failure left it to the hedge, a failed hedge left it
					// to the first.
					if rn.route == routes[0] {
						other = routes[1]
					}
					next = other.Name
				case race.used < len(routes):
					next = routes[race.used].Name
				}
				e.failedOver(x, rn.route, rn.res.fail, next)
			}
			if race.res.done() {
				end.answered, end.res, end.rest = true, race.res, routes[race.used:]
				return end
			}
			i += race.used - 1
			continue
		}
		res := e.candidate(x, route, ticket, budget)
		if res.done() {
			end.answered, end.res, end.rest = true, res, routes[i+1:]
			return end
		}
		end.note(res.fail)
		next := ""
		if i+1 < len(routes) {
			next = routes[i+1].Name
		}
		e.failedOver(x, route, res.fail, next)
	}
	return end
}

// note keeps a failure for the client's error, should no candidate
// answer: the last one, and the shortest Retry-After.
//
// A channel that lacks the request's stored context never replaces
// another channel's failure: the channel that stored it failed, and that
// failure, which a retry may get past, is the client's answer, not an
// error saying the stored response does not exist.
func (end *walkEnd) note(f *failure) {
	if f.reason != reasonStoredContextMissing || end.last == nil || end.last.reason == reasonStoredContextMissing {
		end.last = f
	}
	end.overloaded = end.overloaded || f.reason == reasonOverloaded
	if ra := f.retryAfter; ra > 0 && (end.retryAfter == 0 || ra < end.retryAfter) {
		end.retryAfter = ra
	}
}

// candidate runs one candidate: an attempt and, when retry_same asks for
// it and the budget leaves room, one more on the same channel. The retry
// needs a fresh ticket, so a half-open channel whose trial slots are taken
// moves on.
func (e *Engine) candidate(x *exchange, route *chain.Route, ticket breaker.Ticket, budget time.Duration) attemptResult {
	began := time.Now()
	res := e.try(x, route, ticket, budget)
	if res.done() || (x.mode != modeChain && x.mode != modeContinue) {
		return res
	}
	if res.fail.reason == reasonPrefillRefused {
		// Its model takes no prefill: asked again at once, instructed.
		e.decided(x, route.Name, res.fail, route.Name)
		if ticket, ok := e.channels[route.Channel].health.Breaker.Admit(time.Now()); ok {
			return e.try(x, route, ticket, budget-time.Since(began))
		}
		return res
	}
	wait, ok := e.opts.RetrySame.wait(res.fail)
	left := budget - time.Since(began) - wait
	if !ok || left <= 0 {
		return res
	}
	e.logger.Warn("retrying the same channel",
		zap.String("model", x.req.Model), zap.String("channel", route.Name),
		zap.Int("attempt", x.attempts), zap.String("reason", string(res.fail.reason)),
		zap.Int("upstream_status", res.fail.status), zap.Duration("wait", wait))
	e.decided(x, route.Name, res.fail, route.Name)
	if !backoff.Sleep(x.r.Context(), wait) {
		return res
	}
	if ticket, ok = e.channels[route.Channel].health.Breaker.Admit(time.Now()); !ok {
		return res
	}
	return e.try(x, route, ticket, left)
}

// try sends one attempt and records its outcome. The ticket's trial slot
// is freed however the attempt ends, panics included.
func (e *Engine) try(x *exchange, route *chain.Route, ticket breaker.Ticket, budget time.Duration) attemptResult {
	defer ticket.Done()
	x.ticket = ticket
	defer func() { x.ticket = breaker.Ticket{} }()
	x.attempts++
	if x.race == nil {
		// A raced attempt's count is set when the race is decided: Caddy's
		// replacer is not safe for concurrent use. (Only the race's winner
		// sets the channel, as it commits.)
		x.setVar("http.llm_failover.attempts", strconv.Itoa(x.attempts))
	}
	if ticket.HalfOpened {
		e.app.StateChanged(e.logger, e.channels[route.Channel].health,
			breaker.Transition{From: breaker.Open, To: breaker.HalfOpen}, "cooldown_elapsed")
	}
	// An attempt that ends before it sends (the memory budget, a
	// continuation that cannot be built) read no answer: nothing of the
	// previous attempt's meter is its own.
	x.committedAt, x.timing, x.meter = time.Time{}, attemptTiming{}, nil
	began := time.Now()
	var res attemptResult
	x.trace.startAttempt(x, e.channels[route.Channel], route, ticket)
	defer func() { x.trace.endAttempt(x, res, e.secrets) }()
	func() {
		// Given back however the attempt ends, panics included: the
		// memory budget is the process's, and outlives this request.
		defer x.releaseHeld()
		if x.drill != nil && route.Name == x.drill.failed {
			res = retryWith(&failure{reason: reasonDrill})
		} else {
			res = e.attempt(x, route, budget)
		}
	}()
	e.scrubFailure(res.fail)
	switch x.mode {
	case modeDrill:
		x.drill.step(route.Name, res)
		return res // only its failovers are journaled
	case modeDoctor:
		return res // the doctor reports it, nothing records it
	case modeSynthetic:
		var record bool
		if res, record = judgeSynthetic(x, res); !record {
			// A probe's own mistake says nothing of the channel.
			return res
		}
	}
	e.observe(x, e.channels[route.Channel], res, began)
	e.record(x, route, res, time.Since(began))
	return res
}

// failedOver logs and journals one failover decision: the candidate
// failed and the walk moves on to next ("" when none is left). A
// synthetic check's failure is no failover: the prober reports it.
func (e *Engine) failedOver(x *exchange, route *chain.Route, f *failure, next string) {
	if x.mode == modeSynthetic || x.mode == modeDoctor {
		return
	}
	msg, level := "failover", zapcore.WarnLevel
	switch x.mode {
	case modeContinue:
		msg = "resume attempt failed"
	case modeDrill:
		msg, level = "drill failover", zapcore.InfoLevel // asked for
	}
	e.logger.Log(level, msg,
		zap.String("model", x.req.Model),
		zap.String("channel", route.Name),
		zap.String("upstream_model", upstreamModel(route, x.req.Model)),
		zap.Int("attempt", x.attempts),
		zap.String("reason", string(f.reason)),
		zap.Int("upstream_status", f.status),
		zap.String("upstream_message", f.message),
		detailField(f.detail),
		zap.Duration("elapsed", time.Since(x.start)),
		zap.Duration("remaining_budget", time.Until(x.deadline)),
		zap.String("next_channel", next),
		traceField(x))
	e.decided(x, route.Name, f, next)
}

// record feeds an attempt's outcome to the breaker, the metrics, the
// events and the history, once. Only failures the channel caused count
// against it.
func (e *Engine) record(x *exchange, route *chain.Route, res attemptResult, took time.Duration) {
	ch := e.channels[route.Channel]
	now := time.Now()
	outcome := outcomeOK
	status := 0
	cause := "" // what caused a state change, when it is not the outcome
	var tr breaker.Transition
	switch f := res.fail; {
	case res.verdict == clientGone && x.race != nil && x.race.lost(x):
		outcome = outcomeHedgeLost // beaten by the other attempt: says nothing of the channel
	case res.verdict == clientGone:
		outcome = outcomeClientGone // never the channel's fault
	case f == nil:
		tr = ch.health.Breaker.RecordSuccess(now)
		if x.mode == modeLastResort && res.verdict == served {
			// The channel proved itself while every channel was open:
			// close it now rather than at the end of its cooldown.
			if reset := ch.health.Breaker.Reset(now); reset.Changed() {
				tr = breaker.Transition{From: tr.From, To: reset.To}
				cause = "last_resort_succeeded"
			}
		}
	case f.rateLimited():
		// A rate limit is not an outage: park the channel for as long as
		// it asked (or the configured park when it named no wait),
		// without counting a failure.
		outcome, status = outcomeRateLimited, f.status
		var until time.Time
		until, tr = ch.health.Breaker.Park(now, ch.health.Breaker.ParkFor(f.retryAfter, f.hinted))
		if tr.Changed() {
			e.logger.Info("channel parked by Retry-After", zap.String("channel", ch.Name), zap.Time("until", until))
		}
	case !f.channelFault():
		outcome, status = f.reason, f.status
	case x.mode == modeSynthetic:
		// A failed probe is the only evidence there is for an interval:
		// decisive alone.
		outcome, status = f.reason, f.status
		tr = ch.health.Breaker.RecordFailure(now)
		if trip := ch.health.Breaker.Trip(now); trip.Changed() {
			tr, cause = breaker.Transition{From: tr.From, To: trip.To}, string(reasonProbeFailed)
		}
	default:
		outcome, status = f.reason, f.status
		tr = ch.health.Breaker.RecordFailure(now)
	}
	if x.bill != nil && res.verdict == retry {
		x.bill.attemptFailed(ch.Name, upstreamModel(route, x.req.Model), string(res.fail.reason))
	}
	if x.mode != modeSynthetic {
		// Traffic only, as the status page's channel windows: a probe is
		// counted by probes_total (package probe), and a channel nobody
		// uses must not show a success rate made of its probes.
		attemptsTotal.WithLabelValues(x.req.Model, ch.Name, string(outcome)).Inc()
		attemptDuration.WithLabelValues(ch.Name).Observe(took.Seconds())
	}
	countInput(x, ch.Name, res)
	countGenAI(x, ch, route, res, took)
	e.app.Attempted(failoverapp.Attempt{Model: x.req.Model, UpstreamModel: upstreamModel(route, x.req.Model), Channel: ch.Name,
		Number: x.attempts, Outcome: string(outcome), UpstreamStatus: status, Took: took})
	var ttft time.Duration
	if !x.committedAt.IsZero() {
		ttft = x.committedAt.Sub(now.Add(-took))
	}
	if x.mode != modeSynthetic {
		// Probes keep a history of their own (package probe).
		ch.health.Touch(now)
		e.recordHistory(x, ch, res, outcome, status, ttft)
	}
	if tr.Changed() {
		if cause == "" {
			cause = string(outcome)
		}
		e.app.StateChanged(e.logger, ch.health, tr, cause)
	}
}

// RetrySame retries a channel once, before the chain moves on, after a
// transient failure: one of Statuses, or a 429 whose Retry-After is at
// most MaxWait. It keeps traffic on the cheaper channel of a cost-ordered
// chain through a blip, within the candidate's time budget.
type RetrySame struct {
	// Statuses are the upstream statuses retried on the same channel.
	Statuses []int
	// MaxWait is the longest Retry-After of a 429 worth waiting for.
	MaxWait time.Duration
}

// wait says whether f is worth retrying on its channel, and after how long.
func (r *RetrySame) wait(f *failure) (time.Duration, bool) {
	if r == nil || f == nil || f.reason != reasonStatus || !slices.Contains(r.Statuses, f.status) {
		return 0, false
	}
	if f.status == http.StatusTooManyRequests {
		return f.retryAfter, f.retryAfter > 0 && f.retryAfter <= r.MaxWait
	}
	return 0, true
}

// detailField is a failover line's detail (what went wrong locally: a
// dial error, a timeout), left out when there is none.
func detailField(detail string) zap.Field {
	if detail == "" {
		return zap.Skip()
	}
	return zap.String("detail", detail)
}
