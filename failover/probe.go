package failover

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/probe"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// prober is the engine as the target of its models' synthetic checks: a
// check is one route of a model that probes, sent through the same walk
// as client traffic.
type prober struct{ e *Engine }

// Checks lists one check per route of every model that probes.
func (p prober) Routes() []probe.Route {
	var out []probe.Route
	for _, name := range p.e.modelList {
		m := p.e.models[name]
		if m.Probe == nil {
			continue
		}
		for i := range m.Chain.Routes {
			r := &m.Chain.Routes[i]
			ref := ""
			if h := p.e.channels[r.Channel].health; h != nil {
				ref = h.Ref
			}
			out = append(out, probe.Route{Model: name, Channel: r.Name, Ref: ref, Plan: *m.Probe, ID: i, MaxCost: p.e.probeMaxCost(m, r)})
		}
	}
	return out
}

// probeMaxCost is the most one probe of route can cost, at the route's
// price: its body's input bound and the plan's output cap, as a client
// request's reservation is bounded. 0 (unknown) when the probe cannot be
// built; probeChannel then reports the config error.
func (e *Engine) probeMaxCost(m *Model, route *chain.Route) wallet.Micros {
	api, ok := probeAPI(e.channels[route.Channel], m, route)
	if !ok {
		return 0
	}
	// The longer limit field (max_completion_tokens), so that the bound
	// covers a probe written with either.
	_, _, body, err := provider.ProbeRequest(api, m.Name, m.Probe.Prompt, m.Probe.MaxTokens, true, true)
	if err != nil {
		return 0
	}
	body, _ = api.AskUsage(body, provider.Request{})
	cost, _ := wallet.MaxCost(wallet.Estimate{BodyBytes: len(body), MaxOutput: int64(m.Probe.MaxTokens)},
		wallet.Price{Input: wallet.Micros(route.InputCost), Output: wallet.Micros(route.OutputCost)})
	return cost
}

// Quiet reports whether nothing but a probe tells about the check's
// channel: it is half-open (the probe is then its trial, so that no
// client request is sent to a channel that may still be broken), or
// closed without real traffic for an interval. An open or parked channel
// may be sent nothing, and a busy one tells by itself.
func (p prober) Quiet(c probe.Route, now time.Time) bool {
	m := p.e.models[c.Model]
	route := &m.Chain.Routes[c.ID]
	ch := p.e.channels[route.Channel]
	switch ch.health.Breaker.State(now) {
	case breaker.Open, breaker.Parked:
		return false
	case breaker.Closed:
		if now.Sub(ch.health.LastTraffic()) < c.Plan.Interval {
			return false
		}
	}
	_, ok := probeAPI(ch, m, route)
	return ok
}

// probeAPI is the API a probe of route speaks: the one its channel serves
// the model over, by the name the channel knows it by.
func probeAPI(ch *Channel, m *Model, route *chain.Route) (provider.API, bool) {
	name := route.UpstreamModel
	if name == "" {
		name = m.Name
	}
	return provider.ProbeAPI(ch.Adapter, name)
}

// Probe sends one probe of the route.
func (p prober) Probe(ctx context.Context, c probe.Route) (probe.Result, bool) {
	m := p.e.models[c.Model]
	return p.e.probeChannel(ctx, m, &m.Chain.Routes[c.ID])
}

// probeChannel sends one synthetic check through the same walk as client
// traffic (admission, adapter, timers, stream gate, breaker, metrics) and
// reports its result; ok is false when the channel's breaker admitted
// nothing (its trial slots are taken by clients). The answer goes to a
// ResponseWriter that keeps only its status.
func (e *Engine) probeChannel(ctx context.Context, m *Model, route *chain.Route) (res probe.Result, sent bool) {
	ch := e.channels[route.Channel]
	api, _ := probeAPI(ch, m, route)
	model := upstreamModel(route, m.Name)
	completionTokens := ch.health.UsesCompletionTokens(model)
	path, hdr, body, err := provider.ProbeRequest(api, m.Name, m.Probe.Prompt, m.Probe.MaxTokens, true, completionTokens)
	if err != nil {
		e.logger.Error("building a probe", zap.String("channel", ch.Name), zap.Error(err))
		return probe.Result{Outcome: probe.ConfigError, Reason: err.Error()}, true
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://probe.invalid"+path, bytes.NewReader(body))
	if err != nil {
		return probe.Result{Outcome: probe.ConfigError, Reason: err.Error()}, true
	}
	r.Header = hdr
	w := &probeWriter{header: http.Header{}}
	x := newExchange(w, r, api, modeSynthetic)
	x.model = m
	x.body, _ = api.AskUsage(body, provider.Request{}) // the probe pays for what it used
	if x.req, err = api.ParseRequest(x.body); err != nil {
		return probe.Result{Outcome: probe.ConfigError, Reason: err.Error()}, true
	}
	// Its own trace, when the config traces requests; ended after the
	// bill is closed.
	traceSynthetic(ctx, x, e.app.ProbeTracer())
	defer x.trace.end(x)
	if e.wallet != nil {
		// The operator's system account pays for probes.
		rt := *e.wallet
		rt.account = e.opts.ProbeAccount
		x.repl = caddy.NewReplacer()
		bill, refusal := rt.admit(x, false)
		if refusal != nil {
			e.logger.Warn("probe account refused; probe not sent", zap.String("channel", ch.Name),
				zap.String("account", e.opts.ProbeAccount), zap.String("reason", refusal.Message))
			return probe.Result{Outcome: probe.ConfigError, Reason: "probe account refused: " + refusal.Message}, true
		}
		x.bill = bill
		defer x.bill.close()
	}
	began := time.Now()
	end := e.walk(x, []*chain.Route{route}, nil, began.Add(min(e.opts.Deadline, m.Probe.Interval)))
	if x.attempts == 0 {
		return probe.Result{}, false
	}
	if !completionTokens && api == provider.OpenAIChat && provider.WantsCompletionTokens(w.status, w.refusal) &&
		ch.health.LearnCompletionTokens(model) {
		// A reasoning model of OpenAI's or Azure's refuses max_tokens:
		// its checks give max_completion_tokens from now on, this one
		// at once (not recorded: it said nothing of the channel).
		e.logger.Info("probes of this model give their limit as max_completion_tokens", zap.String("channel", ch.Name), zap.String("model", model))
		return e.probeChannel(ctx, m, route)
	}
	res.Outcome, res.Reason = probeOutcome(end)
	if meter := x.meter; meter != nil {
		u := meter.Usage()
		res.Cost = wallet.Price{Input: wallet.Micros(route.InputCost), Output: wallet.Micros(route.OutputCost)}.Cost(u.Input, u.Output)
	}
	if !x.committedAt.IsZero() {
		res.TTFT = x.committedAt.Sub(began)
	}
	return res, true
}

// judgeSynthetic judges a probe's attempt before it is recorded: it
// passes only when content was committed with a 2xx; a 400 or 422 (or an
// in-stream refusal) is the probe's own parameters, not the channel, and
// is not recorded; any other refusal a client would get passed through
// (401, 403, 404) is the channel failing, and becomes a failure for the
// breaker.
func judgeSynthetic(x *exchange, res attemptResult) (judged attemptResult, record bool) {
	switch {
	case res.verdict == passed && (res.status == http.StatusBadRequest || res.status == http.StatusUnprocessableEntity):
		return res, false
	case res.verdict == passed:
		return retryWith(&failure{reason: reasonStatus, status: res.status}), true
	case res.verdict == served && x.committedAt.IsZero():
		return retryWith(&failure{reason: reasonClosedEarly}), true
	}
	return res, true
}

// probeOutcome is a probe's result and its reason, from how its walk
// ended.
func probeOutcome(end walkEnd) (probe.Outcome, string) {
	res := end.res
	if !end.answered {
		res = retryWith(end.last)
	}
	switch {
	case res.verdict == passed:
		return probe.ConfigError, fmt.Sprintf("%s %d", reasonStatus, res.status)
	case res.verdict == clientGone:
		return probe.Failed, "stopped"
	case res.fail != nil && res.fail.status == http.StatusTooManyRequests:
		return probe.Limited, string(res.fail.reason)
	case res.fail != nil:
		return probe.Failed, res.fail.String()
	}
	return probe.Passed, ""
}

// probeWriter is a probe's ResponseWriter: it keeps the status and
// discards the body, whose tokens the meter has counted on the way.
type probeWriter struct {
	header http.Header
	status int
	// refusal is the start of an error answer's body (at most
	// maxProbeRefusal), for what it asks of the next check.
	refusal []byte
}

// maxProbeRefusal bounds what a probeWriter keeps of an error answer.
const maxProbeRefusal = 4 << 10

func (w *probeWriter) Header() http.Header { return w.header }
func (w *probeWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *probeWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if w.status >= 400 && len(w.refusal) < maxProbeRefusal {
		w.refusal = append(w.refusal, p[:min(len(p), maxProbeRefusal-len(w.refusal))]...)
	}
	return len(p), nil
}

// Flush lets the stream gate flush as it does to a client.
func (w *probeWriter) Flush() {}

// Interface guards
var (
	_ probe.Target = prober{}
	_ http.Flusher = (*probeWriter)(nil)
)
