package failover

import (
	"context"
	"fmt"
	"time"

	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// drillTimeout bounds one drill request, its whole walk.
const drillTimeout = 60 * time.Second

// drillState is a drill request's channel made to fail and the path it
// took.
type drillState struct {
	failed string
	path   []failoverapp.DrillStep
}

// step notes one attempt of the drill request.
func (d *drillState) step(channel string, res attemptResult) {
	s := failoverapp.DrillStep{Channel: channel, Outcome: "ok"}
	switch {
	case res.fail != nil:
		s.Outcome, s.Status = string(res.fail.reason), res.fail.status
	case res.verdict == passed:
		s.Outcome, s.Status = string(reasonStatus), res.status
	case res.verdict == clientGone:
		s.Outcome = "stopped"
	}
	d.path = append(d.path, s)
}

// Drill sends, for each model (or the one called model), one request per
// channel of its chain that has a fallback, with that channel made to
// fail. A chain of one channel is a finding of its own.
func (d doctor) Drill(ctx context.Context, model string) (runs []failoverapp.DrillRun, found bool) {
	for _, name := range d.e.modelList {
		if model != "" && name != model {
			continue
		}
		found = true
		m := d.e.models[name]
		routes := m.Chain.Routes
		if len(routes) == 1 {
			runs = append(runs, failoverapp.DrillRun{Model: name, Failed: routes[0].Name, Path: []failoverapp.DrillStep{},
				Problem: "the model has one channel: nothing to fail over to", Took: "0s"})
			continue
		}
		for i := range routes[:len(routes)-1] {
			runs = append(runs, d.e.drill(ctx, m, i))
		}
	}
	return runs, found
}

// drill sends one request of model m as if it had reached the chain's
// route i (in the static order; a weighted chain's varies) and that
// route's channel failed: the channels after it must answer it.
func (e *Engine) drill(ctx context.Context, m *Model, i int) (run failoverapp.DrillRun) {
	start := time.Now()
	failed := &m.Chain.Routes[i]
	run = failoverapp.DrillRun{Model: m.Name, Failed: failed.Name, Path: []failoverapp.DrillStep{}}
	defer func() {
		run.Took = time.Since(start).Round(time.Millisecond).String()
		run.Problem = terminalLine(e.liveSecrets().String(e.secrets.Message(run.Problem)))
	}()
	// The request is written in an API the next channel serves: it is
	// the fallback under test.
	var api provider.API
	ok := false
	for _, r := range m.Chain.Routes[i+1:] {
		if api, ok = probeAPI(e.channels[r.Channel], m, &r); ok {
			break
		}
	}
	if !ok {
		run.Problem = "no channel after it serves an API a request can be written in"
		return run
	}
	var routes []*chain.Route
	for j := range m.ByAPI[api].Routes {
		r := &m.ByAPI[api].Routes[j]
		if r.Name == failed.Name || len(routes) > 0 {
			routes = append(routes, r)
		}
	}
	if len(routes) == 0 {
		run.OK = true
		run.Problem = fmt.Sprintf("%s does not serve the %s API the channels after it do: requests in it never reach it", failed.Name, api)
		return run
	}
	ctx, cancel := context.WithTimeout(ctx, drillTimeout)
	defer cancel()
	x, w, err := checkExchange(ctx, m, api, false, modeDrill)
	if err != nil {
		run.Problem = err.Error()
		return run
	}
	x.drill = &drillState{failed: failed.Name}
	end := e.walk(x, routes, nil, time.Now().Add(min(e.opts.Deadline, drillTimeout)))
	run.Path = append(run.Path, x.drill.path...)
	switch {
	case end.answered && end.res.verdict == served && !x.committedAt.IsZero():
		run.OK = true
	case end.answered && end.res.verdict == passed:
		run.Problem = fmt.Sprintf("answered %d: %s", end.res.status, e.quote(api.UpstreamMessage(w.body.Bytes())))
	case end.last != nil && end.last.reason == reasonDrill:
		run.Problem = "no other channel was tried: the chain has nothing after it that serves this request"
	case end.last != nil:
		run.Problem = "every other channel failed; the last: " + end.last.String() + " " + end.last.message
	default:
		run.Problem = "no answer"
	}
	return run
}
