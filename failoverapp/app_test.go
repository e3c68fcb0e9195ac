package failoverapp

import (
	"context"
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
