package failover

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/latency"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// Hedged requests (a model's hedge_after).
//
// When the first candidate has produced no content hedge_after after it
// was sent, the next channel of the same model is sent the request too;
// whichever commits first (its first content, or its whole answer) is
// served, and the other is cancelled at that moment. Each attempt runs on
// an exchange of its own (a copy of the client's, with its own response
// writer), so that nothing of the loser can reach the client: the race
// is decided when an attempt commits, before it writes anything.
//
// A hedge spends upstream money, so it is bounded: at most one per
// request, at most the hedge budget's share of a model's requests over
// the last minute, never for a request with effects or state upstream,
// never onto a channel that is parked or shares the first one's provider
// account (its rate limits and its outage are the same), and with a
// wallet only when a second reservation of the request's largest cost
// succeeds. The losing attempt's upstream cost (providers bill cancelled
// streams) is the operator's by default: a ledger row records it, the
// client's balance is not touched; hedge charge client bills it to the
// client instead, against that second reservation.

// HedgeRule is a model's hedge_after: a fixed delay, or a quantile of the
// first channel's own time to first content for the request's size
// class (no hedge while that channel has too few observations).
type HedgeRule struct {
	After    time.Duration
	Quantile float64
}

// HedgeOptions bound a handler's hedges.
type HedgeOptions struct {
	// Budget is the largest share of a model's requests over the last
	// minute that may be hedged.
	Budget float64
	// ChargeClient bills the losing attempt to the client.
	ChargeClient bool
}

// DefaultHedgeBudget is the hedge budget when none is set: the extra
// spend users report paying for halving their p99.
const DefaultHedgeBudget = 0.05

// Hedge outcomes, journaled with the channel and next_channel they name.
const (
	// reasonHedge: the first candidate had no content after hedge_after;
	// the next channel was sent the request too.
	reasonHedge reason = "hedge"
	// outcomeHedgeLost: a hedged attempt that another attempt beat to
	// content; it was cancelled, and says nothing of its channel.
	outcomeHedgeLost reason = "hedge_lost"
)

// noHedgeVar is the request variable (Caddy's vars directive) with which
// an operator marks requests never to hedge.
const noHedgeVar = "llm_failover_no_hedge"

// errHedgeLost cancels the attempt another attempt beat to commit.
var errHedgeLost = errors.New("another attempt of the hedged request committed first")

// hedgeDelay is how long the request's first candidate may go without
// content before the second is sent too, or why the request is not
// hedged ("" reason and a delay when it is).
func (e *Engine) hedgeDelay(x *exchange, routes []*chain.Route) (time.Duration, string) {
	rule := x.model.Hedge
	if rule == nil || x.mode != modeChain {
		return 0, "off"
	}
	// Every request of a hedged model counts towards its hedge budget.
	e.hedgeBudget(x.req.Model).count(time.Now())
	switch {
	case len(routes) < 2:
		return 0, "one candidate"
	case x.req.Effects != "":
		return 0, "effects upstream (" + x.req.Effects + ")"
	case x.api == provider.OpenAIResponses && !x.req.StoreOff:
		return 0, "a Responses request stores its response unless it sends store: false"
	case noHedgeMarked(x.r):
		return 0, "marked by the operator"
	case e.channels[routes[0].Channel].account == e.channels[routes[1].Channel].account:
		return 0, "both channels use one provider account"
	}
	if rule.After > 0 {
		return rule.After, ""
	}
	ch := e.channels[routes[0].Channel]
	q, n := ch.health.Latency.Quantile(latency.FirstContent, x.sizeClass(), rule.Quantile, e.learn.Window, time.Now())
	if n < e.learn.MinSamples {
		return 0, "too few observations of the first channel"
	}
	return q, ""
}

// hedgeBudget is the model's hedge budget.
func (e *Engine) hedgeBudget(model string) *hedgeBudget { return e.hedges[model] }

// accountOf is what tells a channel's provider account: a hash of its
// credentials, or its host when it sends none.
func accountOf(ch *Channel, creds []string) string {
	if len(creds) == 0 {
		if ch.Base == nil {
			return "channel:" + ch.Name
		}
		return "host:" + ch.Base.Host
	}
	sorted := slices.Clone(creds)
	slices.Sort(sorted)
	sum := sha256.Sum256([]byte(strings.Join(sorted, "\x00")))
	return "key:" + hex.EncodeToString(sum[:8])
}

// noHedgeMarked reports whether the operator set the no-hedge variable.
func noHedgeMarked(r *http.Request) bool {
	switch v := caddyhttp.GetVar(r.Context(), noHedgeVar).(type) {
	case nil:
		return false
	case bool:
		return v
	case string:
		return v != "" && v != "false" && v != "0"
	}
	return true
}

// race is a hedged request's attempts: the first to commit wins, and
// cancels the other.
type race struct {
	mu      sync.Mutex
	winner  *exchange
	cancels map[*exchange]context.CancelCauseFunc
	claimed chan struct{}
}

// claim is called by an attempt of x as it commits: it reports whether x
// may (it is first, or already won), and cancels the other attempt.
func (r *race) claim(x *exchange) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.winner != nil {
		return r.winner == x
	}
	r.winner = x
	close(r.claimed)
	for other, cancel := range r.cancels {
		if other != x {
			cancel(errHedgeLost)
		}
	}
	return true
}

// lost reports whether another attempt than x's won.
func (r *race) lost(x *exchange) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.winner != nil && r.winner != x
}

// join adds x's attempt, unless one already committed.
func (r *race) join(x *exchange, cancel context.CancelCauseFunc) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.winner != nil {
		return false
	}
	r.cancels[x] = cancel
	return true
}

// runner is one attempt of a race, on its own exchange.
type runner struct {
	x     *exchange
	route *chain.Route
	res   attemptResult
	// attempts is how many attempts it made (retry_same may add one).
	attempts int
	panicked any
	done     chan struct{}
}

// raceEnd is how a hedged first candidate ended.
type raceEnd struct {
	// res is the winner's result, or the last failure's.
	res attemptResult
	// used is how many routes it took: 1, or 2 once a hedge started.
	used int
	// failed are the attempts that failed, in the order they ended.
	failed []*runner
}

// race runs the first candidate, and the second too when the first has
// produced no content after delay and a hedge is allowed.
func (e *Engine) race(x *exchange, routes []*chain.Route, ticket breaker.Ticket, budget, delay time.Duration) raceEnd {
	r := &race{cancels: map[*exchange]context.CancelCauseFunc{}, claimed: make(chan struct{})}
	first := e.run(x, r, routes[0], ticket, budget, x.bill, false)
	timer := time.NewTimer(delay)
	var second *runner
	select {
	case <-first.done:
	case <-r.claimed:
	case <-timer.C:
		second = e.hedge(x, r, routes)
	}
	timer.Stop()
	<-first.done
	end := raceEnd{used: 1}
	runners := []*runner{first}
	if second != nil {
		<-second.done
		end.used = 2
		runners = append(runners, second)
	}
	for _, rn := range runners {
		if rn.panicked != nil {
			// On the request's own goroutine, as for an attempt that is
			// not hedged: Caddy recovers it, and every deferred release
			// (the bill, the idempotent run) runs. The hedge's own
			// reservation is no deferred release's: released here, or
			// its keep-alive would hold the client's money until the
			// store closes.
			if second != nil {
				if hb := second.x.bill; hb != nil && hb != x.bill {
					hb.chargeNothingFor(x)
					hb.close()
				}
			}
			panic(rn.panicked)
		}
	}
	return e.settleRace(x, r, runners, end)
}

// run starts one attempt of the race on a copy of x.
func (e *Engine) run(x *exchange, r *race, route *chain.Route, ticket breaker.Ticket, budget time.Duration, b *bill, hedge bool) *runner {
	ctx, cancel := context.WithCancelCause(x.r.Context())
	rx := x.forRace(ctx, r, b)
	rx.hedge = hedge
	if hedge {
		// The hedge is the request's next attempt, numbered after the
		// first's (its span, its event, its history), not a second
		// number 1; settleRace counts each runner's own attempts.
		rx.attempts = x.attempts + 1
	}
	if !r.join(rx, cancel) {
		// The first attempt committed meanwhile: no hedge.
		cancel(nil)
		e.giveBack(route, ticket)
		if b != nil && b != x.bill {
			b.close()
		}
		return nil
	}
	rn := &runner{x: rx, route: route, done: make(chan struct{})}
	go func() {
		defer close(rn.done)
		defer cancel(nil)
		defer func() {
			if p := recover(); p != nil {
				rn.panicked = p
			}
		}()
		before := rx.attempts
		rn.res = e.candidate(rx, route, ticket, budget)
		rn.attempts = rx.attempts - before
	}()
	return rn
}

// hedge starts the second candidate, when everything that bounds hedges
// allows it now; nil when something does not.
func (e *Engine) hedge(x *exchange, r *race, routes []*chain.Route) *runner {
	route := routes[1]
	ch := e.channels[route.Channel]
	now := time.Now()
	refused := func(why string) *runner {
		hedgesTotal.WithLabelValues(x.req.Model, "refused_"+why).Inc()
		return nil
	}
	if !ch.health.Breaker.Snapshot(now).ParkedUntil.IsZero() {
		return refused("parked")
	}
	ticket, ok := ch.health.Breaker.Admit(now)
	if !ok {
		return refused("breaker")
	}
	if !e.hedgeBudget(x.req.Model).take(e.opts.Hedge.Budget, now) {
		e.giveBack(route, ticket)
		return refused("budget")
	}
	var hb *bill
	if x.bill != nil && !x.bill.free {
		var err error
		if hb, err = e.wallet.reserveHedge(x); err != nil {
			e.giveBack(route, ticket)
			e.logger.Debug("not hedging: the second reservation failed", zap.String("model", x.req.Model), zap.Error(err))
			return refused("wallet")
		}
	}
	budget := time.Until(x.deadline) / time.Duration(len(routes)-1)
	rn := e.run(x, r, route, ticket, budget, hb, true)
	if rn == nil {
		return nil
	}
	e.logger.Info("hedging: no content yet from the first channel; sending the next one too",
		zap.String("model", x.req.Model), zap.String("channel", routes[0].Name), zap.String("hedge_channel", route.Name),
		zap.Duration("elapsed", time.Since(x.start)), traceField(x))
	// About the first attempt, number 1: the request's count is settled
	// when the race ends.
	e.decidedAt(x, 1, routes[0].Name, &failure{reason: reasonHedge}, route.Name)
	hedgesTotal.WithLabelValues(x.req.Model, "started").Inc()
	return rn
}

// giveBack returns the ticket of a hedge that is not sent. A ticket that
// was to report its channel's move from open to half_open (the first
// admission after the cooldown) reports it now: no later admission will.
func (e *Engine) giveBack(route *chain.Route, ticket breaker.Ticket) {
	if ticket.HalfOpened {
		e.app.StateChanged(e.logger, e.channels[route.Channel].health,
			breaker.Transition{From: breaker.Open, To: breaker.HalfOpen}, "cooldown_elapsed")
	}
	ticket.Done()
}

// forRace is a copy of x for one attempt of a race: its own request
// context (cancelled when the other attempt wins), response writer,
// attempt state and bill; the client's request, body and model shared.
func (x *exchange) forRace(ctx context.Context, r *race, b *bill) *exchange {
	c := *x
	c.r = x.r.WithContext(ctx)
	c.w = &raceWriter{w: x.w, header: http.Header{}, race: r, x: &c}
	c.race, c.bill = r, b
	c.meter, c.committedAt, c.timing, c.held, c.resume, c.servedBy = nil, time.Time{}, attemptTiming{}, nil, nil, ""
	c.trace = x.trace.fork(ctx)
	if b != nil && b != x.bill {
		b.x = &c
	}
	return &c
}

// settleRace takes the winner's attempt state back into x, and settles
// what the loser cost.
func (e *Engine) settleRace(x *exchange, r *race, runners []*runner, end raceEnd) raceEnd {
	var winner, loser *runner
	for _, rn := range runners {
		x.attempts += rn.attempts
		switch {
		case rn.x == r.winner:
			winner = rn
		case rn.res.verdict == clientGone && r.lost(rn.x) && x.r.Context().Err() == nil:
			loser = rn
		case rn.res.verdict == retry:
			end.failed = append(end.failed, rn)
		}
	}
	from := runners[len(runners)-1]
	if winner != nil {
		from = winner
	}
	end.res = from.res
	w := from.x
	x.trace.adopt(w.trace)
	x.meter, x.committedAt, x.timing, x.resume, x.servedBy, x.upstreamPath = w.meter, w.committedAt, w.timing, w.resume, w.servedBy, w.upstreamPath
	x.setVar("http.llm_failover.attempts", fmt.Sprint(x.attempts))
	if x.servedBy != "" {
		x.setVar("http.llm_failover.channel", x.servedBy)
	}
	if len(runners) == 1 {
		return end
	}
	// Two reservations, when billed: x.bill is charged for the answer
	// served, the hedge's for the loser (or released).
	hb := runners[1].x.bill
	if hb != nil && hb != x.bill {
		if winner == runners[1] {
			x.bill.channel, x.bill.upstreamModel, x.bill.meter = hb.channel, hb.upstreamModel, hb.meter
		}
		hb.chargeNothingFor(x)
	}
	if winner != nil && loser != nil {
		role := "first"
		if winner == runners[1] {
			role = "hedge"
		}
		e.hedgeDecided(x, winner, loser, hb, role)
	} else if hb != nil {
		hb.close()
	}
	return end
}

// hedgeDecided logs, journals and counts a race's outcome, and settles
// what the loser cost: the operator's, in a ledger row of its own, or with
// hedge charge client the client's, against the hedge's reservation.
func (e *Engine) hedgeDecided(x *exchange, winner, loser *runner, hb *bill, role string) {
	ch := e.channels[loser.route.Channel]
	model := upstreamModel(loser.route, x.req.Model)
	tokens, estimated := loserTokens(loser.x)
	cost := x.model.Cost[ch.Name].CostOf(tokens)
	payer := "operator"
	if hb != nil {
		if e.opts.Hedge.ChargeClient && loser.x.meter != nil {
			payer = "client"
			hb.channel, hb.upstreamModel, hb.meter = ch.Name, model, loser.x.meter
		} else {
			hb.rt.w.RecordAttemptAsync(wallet.Entry{
				Account: hb.res.Account, KeyID: hb.res.KeyID, Model: hb.res.Model, Channel: ch.Name,
				RequestID: hb.res.RequestID, UpstreamModel: model, TraceID: hb.traceID(),
				TokensIn: tokens.Input, TokensOut: tokens.Output,
				Note: fmt.Sprintf("%s: upstream cost %s%s, borne by the operator", outcomeHedgeLost, cost, estimated),
			})
		}
		hb.close()
	}
	hedgesTotal.WithLabelValues(x.req.Model, "won_by_"+role).Inc()
	hedgeCost.WithLabelValues(x.req.Model, payer).Add(float64(cost))
	e.logger.Info("hedge decided",
		zap.String("model", x.req.Model), zap.String("winner", winner.route.Name), zap.String("loser", loser.route.Name),
		zap.String("loser_cost", cost.String()), zap.String("paid_by", payer),
		zap.Int64("loser_tokens_in", tokens.Input), zap.Int64("loser_tokens_out", tokens.Output),
		zap.Duration("elapsed", time.Since(x.start)), traceField(x))
	e.decided(x, loser.route.Name, &failure{reason: outcomeHedgeLost, cost: cost}, winner.route.Name)
}

// loserTokens is what a cancelled attempt's upstream bills, as far as the
// gateway can tell: what it reported, or else the input from the
// request's text and the output from the content it produced; estimated
// says so in a ledger note.
func loserTokens(x *exchange) (wallet.Tokens, string) {
	m := x.meter
	if m == nil {
		return wallet.Tokens{Input: provider.EstimateInputTokens(x.body)}, " (estimated)"
	}
	u := m.Usage()
	t := wallet.Tokens{Input: u.Input, Output: max(u.Output, m.DeliveredTokens())}
	estimated := ""
	if !u.InputKnown {
		t.Input, estimated = provider.EstimateInputTokens(x.body), " (estimated)"
	}
	if !u.OutputKnown {
		estimated = " (estimated)"
	}
	if u.InputKnown {
		t.Input, t.CacheRead, t.CacheWrite, t.CacheWrite1h = u.PlainInput(), u.CacheRead, u.CacheWrite, u.CacheWrite1h
	}
	return t, estimated
}

// reserveHedge reserves, for a hedge, the request's largest cost again,
// under a reservation of its own.
func (rt *walletRuntime) reserveHedge(x *exchange) (*bill, error) {
	// Only what admission set, which no attempt changes: the first
	// attempt is running.
	p := x.bill
	b := bill{rt: rt, x: x, res: p.res, price: p.price, inputBound: p.inputBound, outputBound: p.outputBound,
		resumable: p.resumable, contInBound: p.contInBound, contOutBound: p.contOutBound}
	b.res.ID = p.res.ID + "-hedge"
	b.res.ExpiresAt = time.Now().Add(rt.w.ReservationTTL())
	ctx, cancel := rt.w.AdmissionContext(x.r.Context())
	defer cancel()
	if err := rt.w.Reserve(ctx, b.res); err != nil {
		return nil, err
	}
	b.live = rt.w.KeepAlive(b.res.ID)
	return &b, nil
}

// raceWriter is a raced attempt's response writer: its headers are its
// own until it wins, and it writes nothing unless it won.
type raceWriter struct {
	w      http.ResponseWriter
	header http.Header
	race   *race
	x      *exchange
	won    bool
}

func (rw *raceWriter) Header() http.Header { return rw.header }

func (rw *raceWriter) WriteHeader(status int) {
	if !rw.race.claim(rw.x) {
		return
	}
	rw.won = true
	dst := rw.w.Header()
	for k, v := range rw.header {
		dst[k] = v
	}
	rw.w.WriteHeader(status)
}

func (rw *raceWriter) Write(p []byte) (int, error) {
	if !rw.won {
		if !rw.race.claim(rw.x) {
			return 0, errHedgeLost
		}
		rw.WriteHeader(http.StatusOK)
	}
	return rw.w.Write(p)
}

func (rw *raceWriter) FlushError() error {
	if !rw.won {
		return errHedgeLost
	}
	return http.NewResponseController(rw.w).Flush()
}

// SetWriteDeadline sets the client connection's write deadline for the
// winner only: the loser's attempt, ending, must not clear it under the
// winner's writes.
func (rw *raceWriter) SetWriteDeadline(t time.Time) error {
	if !rw.won {
		return nil
	}
	return http.NewResponseController(rw.w).SetWriteDeadline(t)
}

// Unwrap lets http.ResponseController reach the client's writer for what
// raceWriter does not guard itself; only the winner writes.
func (rw *raceWriter) Unwrap() http.ResponseWriter { return rw.w }

// hedgeBudget counts a model's requests and hedges over the last minute,
// in six ten-second buckets.
type hedgeBudget struct {
	mu       sync.Mutex
	start    [6]int64 // each bucket's period (Unix seconds / 10)
	requests [6]int64
	hedges   [6]int64
}

// count adds a request of the model.
func (b *hedgeBudget) count(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := b.bucket(now)
	b.requests[i]++
}

// take reports whether one more hedge keeps hedges within share of the
// requests of the last minute, and counts it if so.
func (b *hedgeBudget) take(share float64, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := b.bucket(now)
	period := now.Unix() / 10
	var requests, hedges int64
	for j := range b.start {
		if period-b.start[j] < int64(len(b.start)) {
			requests += b.requests[j]
			hedges += b.hedges[j]
		}
	}
	if float64(hedges+1) > share*float64(requests) {
		return false
	}
	b.hedges[i]++
	return true
}

// bucket is the bucket of now's period, emptied when it last held an
// older one.
func (b *hedgeBudget) bucket(now time.Time) int {
	period := now.Unix() / 10
	i := int(period % int64(len(b.start)))
	if b.start[i] != period {
		b.start[i], b.requests[i], b.hedges[i] = period, 0, 0
	}
	return i
}
