package llmfailover

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
)

// When every channel is open, the last resort must skip a channel that is
// also inside a Retry-After: the upstream asked for nothing until then.
func TestLastResortSkipsOpenChannelThatIsAlsoParked(t *testing.T) {
	now := time.Now()
	chs := []*channel{
		{name: "a", state: &channelState{breaker: breaker.New(breaker.Config{})}},
		{name: "b", state: &channelState{breaker: breaker.New(breaker.Config{})}},
	}
	for _, ch := range chs {
		for range 3 {
			ch.state.breaker.RecordFailure(now)
		}
	}
	// a opened first, so its cooldown ends first, but it is rate limited
	// for longer than b's cooldown.
	chs[0].state.breaker.Park(now, 2*time.Minute)
	m, err := chain.New("m", chain.Cost, 3, []chain.Route{{Channel: 0, Name: "a"}, {Channel: 1, Name: "b"}})
	if err != nil {
		t.Fatal(err)
	}
	var s chain.Scratch
	plan := m.Plan((*health)(&chs), now.Add(time.Second), &s)
	if len(plan.Candidates) != 0 || len(plan.LastResorts) != 1 || plan.LastResorts[0].Name != "b" {
		t.Fatalf("candidates %v last resorts %v, want none and a last resort of b", plan.Candidates, plan.LastResorts)
	}

	// With b parked too, there is no last resort: the client gets a Retry-After.
	chs[1].state.breaker.Park(now, time.Minute)
	plan = m.Plan((*health)(&chs), now.Add(time.Second), &s)
	if len(plan.Candidates) != 0 || len(plan.LastResorts) != 0 || plan.RetryAt.IsZero() {
		t.Fatalf("candidates %v last resorts %v retry at %v, want none and a Retry-After", plan.Candidates, plan.LastResorts, plan.RetryAt)
	}
}

// provisionContext is a caddy.Context for loading a handler outside a
// running Caddy: it has a config, which handlers need to get the channel
// registry app (a bare caddy.NewContext has none).
func provisionContext(t testing.TB) (caddy.Context, context.CancelFunc) {
	t.Helper()
	base, err := caddy.ProvisionContext(&caddy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return caddy.NewContext(base)
}
