package failover

import (
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/latency"
)

// When every channel is open, the last resort must skip a channel that is
// also inside a Retry-After: the upstream asked for nothing until then.
func TestLastResortSkipsOpenChannelThatIsAlsoParked(t *testing.T) {
	now := time.Now()
	chs := health{
		{Name: "a", health: &failoverapp.Channel{Breaker: breaker.New(breaker.Config{})}},
		{Name: "b", health: &failoverapp.Channel{Breaker: breaker.New(breaker.Config{})}},
	}
	for _, ch := range chs {
		for range 3 {
			ch.health.Breaker.RecordFailure(now)
		}
	}
	// a opened first, so its cooldown ends first, but it is rate limited
	// for longer than b's cooldown.
	chs[0].health.Breaker.Park(now, 2*time.Minute)
	m, err := chain.New("m", chain.Cost, 3, []chain.Route{{Channel: 0, Name: "a"}, {Channel: 1, Name: "b"}})
	if err != nil {
		t.Fatal(err)
	}
	var s chain.Scratch
	plan := m.Plan(&chs, now.Add(time.Second), &s)
	if len(plan.Candidates) != 0 || len(plan.LastResorts) != 1 || plan.LastResorts[0].Name != "b" {
		t.Fatalf("candidates %v last resorts %v, want none and a last resort of b", plan.Candidates, plan.LastResorts)
	}

	// With b parked too, there is no last resort: the client gets a Retry-After.
	chs[1].health.Breaker.Park(now, time.Minute)
	plan = m.Plan(&chs, now.Add(time.Second), &s)
	if len(plan.Candidates) != 0 || len(plan.LastResorts) != 0 || plan.RetryAt.IsZero() {
		t.Fatalf("candidates %v last resorts %v retry at %v, want none and a Retry-After", plan.Candidates, plan.LastResorts, plan.RetryAt)
	}
}

// BenchmarkPlan measures the per-request hot path: breaker checks through
// the real health adapter plus chain resolution, for a 3-route model.
func BenchmarkPlan(b *testing.B) {
	now := time.Now()
	mk := func(policy chain.Policy, open int) (*chain.Model, health) {
		var chs health
		var routes []chain.Route
		for i, name := range []string{"a", "b", "c"} {
			br := breaker.New(breaker.Config{})
			for range 20 {
				br.RecordSuccess(now)
			}
			if i == open {
				for range 3 {
					br.RecordFailure(now)
				}
			}
			chs = append(chs, &Channel{Name: name, health: &failoverapp.Channel{Name: name, Breaker: br}})
			routes = append(routes, chain.Route{Channel: i, Name: name, InputCost: int64(i + 1), OutputCost: int64(i + 1), Weight: 100 - 10*i})
		}
		m, err := chain.New("m", policy, 3, routes)
		if err != nil {
			b.Fatal(err)
		}
		return m, chs
	}
	for _, bc := range []struct {
		name   string
		policy chain.Policy
		open   int
	}{
		{"cost", chain.Cost, -1},
		{"cost/first_open", chain.Cost, 0},
		{"weighted", chain.Weighted, -1},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m, chs := mk(bc.policy, bc.open)
			b.ReportAllocs()
			for b.Loop() {
				// As in Engine.serve.
				var scratch chain.Scratch
				p := m.Plan(&chs, now, &scratch)
				if len(p.Candidates) == 0 {
					b.Fatal("no candidates")
				}
			}
		})
	}
}

// Under adaptive_deadlines a channel much slower than its own usual is
// weighed down under policy weighted; as slow as usual, or without
// adaptive_deadlines, its weight is its success rate alone.
func TestSlowChannelWeighsLess(t *testing.T) {
	cfg := latency.Config{}.WithDefaults()
	start := time.Now().Add(-15 * time.Minute)
	mk := func(slowdown *latency.Config) *Channel {
		ch := &Channel{Name: "a", health: &failoverapp.Channel{Breaker: breaker.New(breaker.Config{}), Latency: latency.NewLearner()},
			slowdown: slowdown}
		// Its usual: 100 ms to first content, over the last quarter hour.
		for i := range 900 {
			ch.health.Latency.Observe(latency.FirstContent, 0, 100*time.Millisecond, cfg.Window, start.Add(time.Duration(i)*time.Second))
		}
		for range 10 {
			ch.health.Breaker.RecordSuccess(time.Now())
		}
		return ch
	}
	adaptive, fixed := mk(&cfg), mk(nil)
	hs := health{adaptive, fixed}
	if a, f := hs.SuccessRate(0), hs.SuccessRate(1); a != f || a != 1 {
		t.Fatalf("as usual: weights %v and %v, want 1", a, f)
	}
	// Lately ten times slower than usual.
	now := time.Now()
	for _, ch := range hs {
		for range 200 {
			ch.health.Latency.Observe(latency.FirstContent, 0, time.Second, cfg.Window, now)
		}
	}
	if a := hs.SuccessRate(0); a > 0.2 {
		t.Errorf("ten times slower than usual: weight %v, want about 0.1", a)
	}
	if f := hs.SuccessRate(1); f != 1 {
		t.Errorf("without adaptive_deadlines: weight %v, want its success rate, 1", f)
	}
}
