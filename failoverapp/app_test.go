package failoverapp

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/journal"
	"github.com/llmfailover/caddy-llm-failover/latency"
	"github.com/llmfailover/caddy-llm-failover/probe"
)

// transitionDuringStop is a probe target whose one probe is still running
// when the app stops, and changes its channel's breaker then, as a probe
// that fails a half-open channel does.
type transitionDuringStop struct {
	app      *App
	ch       *Channel
	plan     probe.Plan
	probing  chan struct{}
	stopping chan struct{}
}

func (t *transitionDuringStop) Routes() []probe.Route {
	return []probe.Route{{Model: "m", Channel: t.ch.Name, Plan: t.plan}}
}

func (*transitionDuringStop) Quiet(probe.Route, time.Time) bool { return true }

func (t *transitionDuringStop) Probe(context.Context, probe.Route) (probe.Result, bool) {
	close(t.probing)
	<-t.stopping
	time.Sleep(100 * time.Millisecond) // Stop is waiting for the round
	t.app.transitioned(t.ch, breaker.Transition{From: breaker.HalfOpen, To: breaker.Open}, "probe_failed")
	return probe.Result{Outcome: probe.Failed, Reason: "upstream 503"}, true
}

// Stopping the app (a reload does) while a probe of its round reports a
// breaker transition returns: the soak found the reload hung for ever,
// Stop waiting for the round under the lock the transition needs.
func TestStopWhileAProbeChangesABreaker(t *testing.T) {
	plan, err := probe.NewPlan(time.Hour, 0, "", "")
	if err != nil {
		t.Fatal(err)
	}
	ch := &Channel{Name: "alpha", Breaker: breaker.New(breaker.Config{Failures: 3, Window: time.Minute, Cooldown: time.Minute, Trials: 1}), Latency: latency.NewLearner()}
	a := &App{logger: zap.NewNop(), status: &statusState{history: history.NewRecorder(), journal: journal.New(journal.DefaultSize),
		since: map[string]time.Time{}, started: time.Now()}}
	target := &transitionDuringStop{app: a, ch: ch, plan: plan, probing: make(chan struct{}), stopping: make(chan struct{})}
	a.probes = []probe.Target{target}
	a.prober = startProber(a.probes, "", a.logger)
	select {
	case <-target.probing:
	case <-time.After(10 * time.Second):
		t.Fatal("the probe never ran")
	}
	stopped := make(chan struct{})
	go func() {
		_ = a.Stop()
		close(stopped)
	}()
	close(target.stopping)
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return while a probe of its round changed a breaker: deadlock")
	}
}

// slowRoute is a probe target, one per config, whose probes of its one
// route take until their prober stops (an upstream that is slow to
// answer); all the configs' targets count the probes of the route in
// flight at once.
type slowRoute struct {
	name     string
	plan     probe.Plan
	mu       *sync.Mutex
	inFlight *int
	most     *int
	sent     int
	probing  chan struct{}
}

func (t *slowRoute) Routes() []probe.Route {
	return []probe.Route{{Model: "m", Channel: t.name, Ref: "ref", Plan: t.plan, MaxCost: 1_000}} // a priced route
}

func (*slowRoute) Quiet(probe.Route, time.Time) bool { return true }

func (t *slowRoute) Probe(ctx context.Context, _ probe.Route) (probe.Result, bool) {
	t.mu.Lock()
	t.sent++
	*t.inFlight++
	*t.most = max(*t.most, *t.inFlight)
	first := t.sent == 1
	t.mu.Unlock()
	if first {
		close(t.probing)
	}
	<-ctx.Done()
	t.mu.Lock()
	*t.inFlight--
	t.mu.Unlock()
	return probe.Result{Outcome: probe.Failed, Reason: "stopped"}, true
}

// A reload while a probe is under way (a slow upstream) must not start a
// second probe of the same route alongside it: the new config's prober
// starts before the old one stops (Caddy starts the new config, then
// stops the old), and a reload keeps each route's last probe
// (operations.md), which a probe in flight is too. Probes of one route
// must never pile up, whatever reloads do.
func TestReloadDoesNotProbeARouteWhoseProbeIsUnderWay(t *testing.T) {
	plan, err := probe.NewPlan(time.Hour, 0, "", "")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var inFlight, most int
	name := "slow" + time.Now().Format("150405.000000000")
	target := func() *slowRoute {
		return &slowRoute{name: name, plan: plan, mu: &mu, inFlight: &inFlight, most: &most, probing: make(chan struct{})}
	}
	old, next := target(), target()
	oldProber := startProber([]probe.Target{old}, "", zap.NewNop())
	select {
	case <-old.probing:
	case <-time.After(10 * time.Second):
		t.Fatal("the old config's probe never ran")
	}
	// The reload: the new config's prober starts, then the old one stops.
	newProber := startProber([]probe.Target{next}, "", zap.NewNop())
	defer newProber.stop()
	time.Sleep(300 * time.Millisecond) // the new prober's first round
	oldProber.stop()
	mu.Lock()
	defer mu.Unlock()
	if most > 1 {
		t.Fatalf("%d probes of one route ran at once across a reload (the new config's prober sent %d)", most, next.sent)
	}
}
