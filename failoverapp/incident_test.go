package failoverapp

import (
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/latency"
)

// A channel that opened and then got no traffic (a backup its primary no
// longer needs) closes by the clock once its trip leaves the window, with
// no call reporting it. The status page showed its incident ongoing for
// ever after (and counted every later attempt into it), next to the
// channel shown closed and serving.
func TestChannelIncidentEndsWhenTheBreakerClosesByTheClock(t *testing.T) {
	now := time.Now()
	ch := &Channel{Name: "idle-backup", Breaker: breaker.New(breaker.Config{}), Latency: latency.NewLearner()}
	a := modelApp(t, now, []chain.Route{{Channel: 0, Name: ch.Name}}, ch)

	var tr breaker.Transition
	for range 3 {
		tr = ch.Breaker.RecordFailure(now)
	}
	if tr != (breaker.Transition{From: breaker.Closed, To: breaker.Open}) {
		t.Fatalf("transition %+v, want closed->open", tr)
	}
	a.transitioned(ch, tr, "status")

	later := now.Add(10 * time.Minute) // cooldown and window long past, no traffic
	v := a.statusView(later, "t", false)
	if got := v.Models[0].Channels[0].State; got != breaker.Closed.String() {
		t.Fatalf("channel state %s, want closed", got)
	}
	for _, in := range v.Incidents {
		if in.Kind == history.ScopeChannel && in.Subject == ch.Name && in.Ongoing {
			t.Fatalf("the channel's incident is still ongoing (since %s) while its breaker is closed", in.Start)
		}
	}
}

// A model incident is an outage its clients have: it lasts until one of
// its channels works again. Reading the page while the model's only
// channel is half-open by the clock (its cooldown over, no trial sent
// yet) must not end it: the trial may fail, and then the same outage
// would start a second incident, so that how many incidents an outage
// shows depends on how often someone looked.
func TestModelIncidentNotEndedByAPageViewWhileHalfOpen(t *testing.T) {
	now := time.Now()
	ch := &Channel{Name: "only", Breaker: breaker.New(breaker.Config{Failures: 1, Window: time.Minute, Cooldown: time.Second, Trials: 1}),
		Latency: latency.NewLearner()}
	a := modelApp(t, now, []chain.Route{{Channel: 0, Name: ch.Name}}, ch)

	tr := ch.Breaker.RecordFailure(now)
	if tr != (breaker.Transition{From: breaker.Closed, To: breaker.Open}) {
		t.Fatalf("transition %+v, want closed->open", tr)
	}
	a.transitioned(ch, tr, "status")

	halfOpen := now.Add(2 * time.Second) // past the cooldown, within the window
	v := a.statusView(halfOpen, "t", false)
	if got := v.Models[0].Channels[0].State; got != breaker.HalfOpen.String() {
		t.Fatalf("channel state %s, want half_open", got)
	}
	ongoing := 0
	for _, in := range v.Incidents {
		if in.Kind == history.ScopeModel && in.Subject == "m" && in.Ongoing {
			ongoing++
		}
	}
	if ongoing != 1 {
		t.Errorf("reading the page while the only channel waits for its trial ended the model's outage: %+v", v.Incidents)
	}
}
