package chain

import (
	"math"
	"strings"
	"testing"
	"time"
)

// fakeHealth is a Health backed by maps; a channel missing from down is
// available, one missing from rate has a success rate of 1.
type fakeHealth struct {
	down map[int]downState
	rate map[int]float64
}

type downState struct {
	readyAt time.Time
	parked  bool
}

func (h *fakeHealth) Available(ch int, now time.Time) bool {
	_, d := h.down[ch]
	return !d
}

func (h *fakeHealth) ReadyAt(ch int, now time.Time) (time.Time, bool) {
	d, ok := h.down[ch]
	if !ok {
		return now, false
	}
	return d.readyAt, d.parked
}

func (h *fakeHealth) SuccessRate(ch int) float64 {
	if r, ok := h.rate[ch]; ok {
		return r
	}
	return 1
}

func healthy() *fakeHealth {
	return &fakeHealth{down: map[int]downState{}, rate: map[int]float64{}}
}

func names(rs []*Route) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = r.Name
	}
	return strings.Join(s, ",")
}

func mustNew(t testing.TB, policy Policy, maxHops int, routes []Route) *Model {
	t.Helper()
	m, err := New("m", policy, maxHops, routes)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m
}

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func TestParsePolicy(t *testing.T) {
	for in, want := range map[string]Policy{"": Cost, "cost": Cost, "weighted": Weighted} {
		got, err := ParsePolicy(in)
		if err != nil || got != want {
			t.Errorf("ParsePolicy(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"Cost", "random", " cost"} {
		if _, err := ParsePolicy(in); err == nil {
			t.Errorf("ParsePolicy(%q) succeeded, want error", in)
		}
	}
	if Cost.String() != "cost" || Weighted.String() != "weighted" {
		t.Errorf("String() = %q, %q", Cost.String(), Weighted.String())
	}
}

func TestNewSortsByTotalCost(t *testing.T) {
	in := []Route{
		{Channel: 0, Name: "a", InputCost: 5, OutputCost: 15},  // 20
		{Channel: 1, Name: "b", InputCost: 1, OutputCost: 2},   // 3
		{Channel: 2, Name: "c", InputCost: 10, OutputCost: 10}, // 20, tie with a
		{Channel: 3, Name: "d", InputCost: 0, OutputCost: 3},   // 3, tie with b
		{Channel: 4, Name: "e", InputCost: 2, OutputCost: 100}, // 102
		{Channel: 5, Name: "f", InputCost: 19, OutputCost: 1},  // 20, tie with a, c
	}
	orig := append([]Route(nil), in...)
	m := mustNew(t, Cost, 3, in)
	got := make([]string, len(m.Routes))
	for i, r := range m.Routes {
		got[i] = r.Name
	}
	if g := strings.Join(got, ","); g != "b,d,a,c,f,e" {
		t.Errorf("route order = %s, want b,d,a,c,f,e", g)
	}
	for i := range in {
		if in[i] != orig[i] {
			t.Fatalf("New reordered or modified its input: %+v", in)
		}
	}
	if m.Name != "m" || m.Policy != Cost || m.MaxHops != 3 || m.Explore != DefaultExplore {
		t.Errorf("model = %+v", m)
	}
}

func TestNewDefaultWeight(t *testing.T) {
	in := []Route{{Name: "a"}, {Name: "b", Weight: 7}, {Name: "c", Weight: -3}}
	m := mustNew(t, Weighted, 1, in)
	want := map[string]int{"a": 1, "b": 7, "c": 1}
	for _, r := range m.Routes {
		if r.Weight != want[r.Name] {
			t.Errorf("route %s weight = %d, want %d", r.Name, r.Weight, want[r.Name])
		}
	}
	if in[0].Weight != 0 {
		t.Errorf("New set the weight on the caller's slice")
	}
}

func TestNewErrors(t *testing.T) {
	many := make([]Route, MaxRoutes+1)
	if _, err := New("m", Cost, 1, many[:MaxRoutes]); err != nil {
		t.Errorf("New with %d routes: %v", MaxRoutes, err)
	}
	tests := []struct {
		name    string
		maxHops int
		routes  []Route
		want    string
	}{
		{"no routes", 1, nil, "no routes"},
		{"empty routes", 1, []Route{}, "no routes"},
		{"too many", 1, many, "17 routes"},
		{"zero hops", 0, []Route{{Name: "a"}}, "max hops"},
		{"negative hops", -1, []Route{{Name: "a"}}, "max hops"},
	}
	for _, tt := range tests {
		m, err := New("gpt-x", Cost, tt.maxHops, tt.routes)
		if err == nil || m != nil {
			t.Errorf("%s: New = %v, %v; want error", tt.name, m, err)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "gpt-x") {
			t.Errorf("%s: error %q does not mention %q and the model", tt.name, err, tt.want)
		}
	}
}

func fourRoutes() []Route {
	return []Route{
		{Channel: 10, Name: "d", InputCost: 40},
		{Channel: 11, Name: "b", InputCost: 20},
		{Channel: 12, Name: "a", InputCost: 10},
		{Channel: 13, Name: "c", InputCost: 30},
	}
}

func TestPlanCostOrder(t *testing.T) {
	m := mustNew(t, Cost, 4, fourRoutes())
	var s Scratch
	p := m.Plan(healthy(), t0, &s)
	if got := names(p.Candidates); got != "a,b,c,d" {
		t.Errorf("candidates = %s, want a,b,c,d", got)
	}
	if len(p.Skipped) != 0 || len(p.LastResorts) != 0 || !p.RetryAt.IsZero() {
		t.Errorf("plan = %+v", p)
	}
	// The same chain every time under the cost policy.
	for i := 0; i < 100; i++ {
		if got := names(m.Plan(healthy(), t0, &s).Candidates); got != "a,b,c,d" {
			t.Fatalf("plan %d: candidates = %s", i, got)
		}
	}
}

func TestPlanMaxHops(t *testing.T) {
	m := mustNew(t, Cost, 3, fourRoutes())
	var s Scratch
	h := healthy()
	p := m.Plan(h, t0, &s)
	if got := names(p.Candidates); got != "a,b,c" {
		t.Errorf("candidates = %s, want a,b,c", got)
	}
	if len(p.Skipped) != 0 {
		t.Errorf("skipped = %s, want none", names(p.Skipped))
	}

	// The cheapest is down: skip it and let the fourth fill in.
	h.down[12] = downState{readyAt: t0.Add(time.Minute)}
	p = m.Plan(h, t0, &s)
	if got := names(p.Candidates); got != "b,c,d" {
		t.Errorf("candidates = %s, want b,c,d", got)
	}
	if got := names(p.Skipped); got != "a" {
		t.Errorf("skipped = %s, want a", got)
	}
	if len(p.LastResorts) != 0 || !p.RetryAt.IsZero() {
		t.Errorf("last resorts %s, retry at %v with available candidates", names(p.LastResorts), p.RetryAt)
	}

	// Two down in the middle: only two remain.
	h.down[11] = downState{readyAt: t0.Add(time.Minute), parked: true}
	h.down[13] = downState{readyAt: t0.Add(time.Minute)}
	delete(h.down, 12)
	p = m.Plan(h, t0, &s)
	if got := names(p.Candidates); got != "a,d" {
		t.Errorf("candidates = %s, want a,d", got)
	}
	if got := names(p.Skipped); got != "b,c" {
		t.Errorf("skipped = %s, want b,c", got)
	}

	// MaxHops 1 stops at the first available route; later unavailable
	// routes are never looked at.
	m1 := mustNew(t, Cost, 1, fourRoutes())
	p = m1.Plan(h, t0, &s)
	if names(p.Candidates) != "a" || len(p.Skipped) != 0 {
		t.Errorf("max 1: candidates = %s, skipped = %s; want a and none", names(p.Candidates), names(p.Skipped))
	}
}

func TestPlanLastResort(t *testing.T) {
	m := mustNew(t, Cost, 2, fourRoutes())
	var s Scratch
	h := healthy()
	h.down[12] = downState{readyAt: t0.Add(30 * time.Second)}              // a, open
	h.down[11] = downState{readyAt: t0.Add(10 * time.Second)}              // b, open, soonest open
	h.down[13] = downState{readyAt: t0.Add(5 * time.Second), parked: true} // c, parked, soonest overall
	h.down[10] = downState{readyAt: t0.Add(20 * time.Second)}              // d, open
	p := m.Plan(h, t0, &s)
	if len(p.Candidates) != 0 || names(p.LastResorts) != "b,d,a" {
		t.Errorf("candidates = %s, last resorts = %s; want none and b,d,a (soonest first, parked c left out)", names(p.Candidates), names(p.LastResorts))
	}
	if got := names(p.Skipped); got != "a,b,c,d" {
		t.Errorf("skipped = %s, want a,b,c,d", got)
	}
	if want := t0.Add(5 * time.Second); !p.RetryAt.Equal(want) {
		t.Errorf("RetryAt = %v, want %v (the parked c is the first back)", p.RetryAt, want)
	}

	// Ties on ReadyAt keep the cost order.
	h.down[12] = downState{readyAt: t0.Add(10 * time.Second)}
	if p = m.Plan(h, t0, &s); names(p.LastResorts) != "a,b,d" {
		t.Errorf("tie: last resorts = %s, want a,b,d", names(p.LastResorts))
	}
}

func TestPlanMixedParkedLastResortOpen(t *testing.T) {
	m := mustNew(t, Cost, 3, fourRoutes())
	var s Scratch
	h := healthy()
	h.down[12] = downState{readyAt: t0.Add(time.Second), parked: true}
	h.down[11] = downState{readyAt: t0.Add(2 * time.Second), parked: true}
	h.down[13] = downState{readyAt: t0.Add(time.Hour)} // the only open one, far off
	h.down[10] = downState{readyAt: t0.Add(3 * time.Second), parked: true}
	p := m.Plan(h, t0, &s)
	if names(p.LastResorts) != "c" || len(p.Candidates) != 0 || !p.RetryAt.Equal(t0.Add(time.Second)) {
		t.Errorf("plan = last resorts %s, candidates %s, retry at %v; want a last resort of c, retry at +1s", names(p.LastResorts), names(p.Candidates), p.RetryAt)
	}
}

func TestPlanAllParked(t *testing.T) {
	m := mustNew(t, Cost, 2, fourRoutes())
	var s Scratch
	h := healthy()
	h.down[12] = downState{readyAt: t0.Add(40 * time.Second), parked: true}
	h.down[11] = downState{readyAt: t0.Add(15 * time.Second), parked: true}
	h.down[13] = downState{readyAt: t0.Add(25 * time.Second), parked: true}
	h.down[10] = downState{readyAt: t0.Add(20 * time.Second), parked: true}
	p := m.Plan(h, t0, &s)
	if len(p.Candidates) != 0 || len(p.LastResorts) != 0 {
		t.Errorf("candidates = %s, last resorts = %s; want none", names(p.Candidates), names(p.LastResorts))
	}
	if want := t0.Add(15 * time.Second); !p.RetryAt.Equal(want) {
		t.Errorf("RetryAt = %v, want %v", p.RetryAt, want)
	}
	if got := names(p.Skipped); got != "a,b,c,d" {
		t.Errorf("skipped = %s, want a,b,c,d", got)
	}
}

func TestPlanWeighted(t *testing.T) {
	routes := []Route{
		{Channel: 0, Name: "primary", InputCost: 1, Weight: 100},
		{Channel: 1, Name: "backup", InputCost: 2, Weight: 80},
		{Channel: 2, Name: "last", InputCost: 3, Weight: 10},
	}
	m := mustNew(t, Weighted, 3, routes)
	m.Explore = 0
	var s Scratch
	h := healthy()
	if got := names(m.Plan(h, t0, &s).Candidates); got != "primary,backup,last" {
		t.Errorf("healthy: %s, want primary,backup,last", got)
	}
	// 100 × 0.7² = 49 < 80.
	h.rate[0] = 0.7
	if got := names(m.Plan(h, t0, &s).Candidates); got != "backup,primary,last" {
		t.Errorf("primary at 0.7: %s, want backup,primary,last", got)
	}
	// 100 × 0.9² = 81 > 80.
	h.rate[0] = 0.9
	if got := names(m.Plan(h, t0, &s).Candidates); got != "primary,backup,last" {
		t.Errorf("primary at 0.9: %s, want primary,backup,last", got)
	}
	// Recovered.
	h.rate[0] = 1.0
	if got := names(m.Plan(h, t0, &s).Candidates); got != "primary,backup,last" {
		t.Errorf("recovered: %s, want primary,backup,last", got)
	}
	// Weighted ordering leaves the cost order in m.Routes alone.
	if m.Routes[0].Name != "primary" || m.Routes[1].Name != "backup" || m.Routes[2].Name != "last" {
		t.Errorf("Plan reordered m.Routes")
	}
	// A dead channel (rate 0) sinks to the bottom.
	h.rate[0], h.rate[1] = 1, 0
	if got := names(m.Plan(h, t0, &s).Candidates); got != "primary,last,backup" {
		t.Errorf("backup at 0: %s, want primary,last,backup", got)
	}
	// Ties keep the cost order.
	h.rate[1] = 1
	m2 := mustNew(t, Weighted, 3, []Route{{Channel: 0, Name: "x", InputCost: 2, Weight: 5}, {Channel: 1, Name: "y", InputCost: 1, Weight: 5}})
	m2.Explore = 0
	if got := names(m2.Plan(h, t0, &s).Candidates); got != "y,x" {
		t.Errorf("tie: %s, want y,x", got)
	}
	// Unavailable channels are skipped after ordering.
	h.down[1] = downState{readyAt: t0.Add(time.Minute)}
	h.rate[0] = 0.5 // 25 < 80, but backup is down
	p := m.Plan(h, t0, &s)
	if names(p.Candidates) != "primary,last" || names(p.Skipped) != "backup" {
		t.Errorf("backup down: candidates %s, skipped %s", names(p.Candidates), names(p.Skipped))
	}
}

func TestPlanExploreDeterministicAtZero(t *testing.T) {
	m := mustNew(t, Weighted, 4, fourRoutes())
	m.Explore = 0
	var s Scratch
	h := healthy()
	h.rate[10], h.rate[11], h.rate[12], h.rate[13] = 0.9, 0.8, 0.5, 1
	for i := 0; i < 2000; i++ {
		if got := names(m.Plan(h, t0, &s).Candidates); got != "c,d,b,a" {
			t.Fatalf("plan %d: %s, want c,d,b,a", i, got)
		}
	}
}

func TestPlanExploreAlways(t *testing.T) {
	m := mustNew(t, Weighted, 4, fourRoutes())
	m.Explore = 1
	var s Scratch
	h := healthy()
	h.rate[10], h.rate[11], h.rate[12], h.rate[13] = 0.9, 0.8, 0.5, 1 // best: c
	firsts := map[string]int{}
	for i := 0; i < 3000; i++ {
		p := m.Plan(h, t0, &s)
		if len(p.Candidates) != 4 {
			t.Fatalf("plan %d: %d candidates", i, len(p.Candidates))
		}
		first := p.Candidates[0].Name
		if first == "c" {
			t.Fatalf("plan %d: first candidate is the best-ranked c (%s)", i, names(p.Candidates))
		}
		firsts[first]++
	}
	// Every lower-ranked route gets explored.
	for _, n := range []string{"a", "b", "d"} {
		if firsts[n] == 0 {
			t.Errorf("route %s never explored: %v", n, firsts)
		}
	}

	// Two routes: always the other one.
	m2 := mustNew(t, Weighted, 2, fourRoutes()[:2]) // d (40), b (20) → sorted b, d
	m2.Explore = 1
	for i := 0; i < 200; i++ {
		if got := names(m2.Plan(healthy(), t0, &s).Candidates); got != "d,b" {
			t.Fatalf("two routes, explore 1: %s, want d,b", got)
		}
	}
	// One route: nothing to explore.
	m1 := mustNew(t, Weighted, 2, fourRoutes()[:1])
	m1.Explore = 1
	if got := names(m1.Plan(healthy(), t0, &s).Candidates); got != "d" {
		t.Errorf("one route: %s", got)
	}
}

// An exploring request puts a lower-ranked route first; the best route must
// still be its next hop, not pushed out of the chain by MaxHops.
func TestPlanExploreKeepsBestAsFallback(t *testing.T) {
	m := mustNew(t, Weighted, 2, fourRoutes())
	m.Explore = 1
	var s Scratch
	h := healthy()
	h.rate[10], h.rate[11], h.rate[12], h.rate[13] = 0.9, 0.8, 0.5, 1 // c, d, b, a
	for i := 0; i < 500; i++ {
		p := m.Plan(h, t0, &s)
		if len(p.Candidates) != 2 || p.Candidates[1].Name != "c" {
			t.Fatalf("plan %d: candidates %s, want an explored route then c", i, names(p.Candidates))
		}
	}
	// The rest of the ranking keeps its order behind the explored route.
	m.MaxHops = 4
	for i := 0; i < 500; i++ {
		got := names(m.Plan(h, t0, &s).Candidates)
		switch got {
		case "d,c,b,a", "b,c,d,a", "a,c,d,b":
		default:
			t.Fatalf("plan %d: %s, want the explored route moved to the front", i, got)
		}
	}
}

func TestPlanExploreDefaultShare(t *testing.T) {
	m := mustNew(t, Weighted, 3, []Route{
		{Channel: 0, Name: "best", Weight: 100},
		{Channel: 1, Name: "mid", Weight: 50},
		{Channel: 2, Name: "low", Weight: 10},
	})
	if m.Explore != DefaultExplore {
		t.Fatalf("Explore = %v, want %v", m.Explore, DefaultExplore)
	}
	var s Scratch
	h := healthy()
	const n = 10000
	explored := 0
	for i := 0; i < n; i++ {
		if m.Plan(h, t0, &s).Candidates[0].Name != "best" {
			explored++
		}
	}
	// 5% expected: 500 ± ~22 (1σ); the bounds are far outside noise.
	if share := float64(explored) / n; share < 0.02 || share > 0.09 {
		t.Errorf("explored share = %.4f, want within [0.02, 0.09]", share)
	}
}

func TestPlanUsesScratch(t *testing.T) {
	m := mustNew(t, Cost, 4, fourRoutes())
	var s Scratch
	h := healthy()
	h.down[12] = downState{readyAt: t0}
	p := m.Plan(h, t0, &s)
	if &p.Candidates[0] != &s.cands[0] || &p.Skipped[0] != &s.skipped[0] {
		t.Errorf("plan slices do not point into the scratch")
	}
	if p.Candidates[0] != &m.Routes[1] {
		t.Errorf("candidates do not point at the model's routes")
	}
}

var sinkInt int

func benchPlan(b *testing.B, m *Model, h Health) {
	b.ReportAllocs()
	for b.Loop() {
		var s Scratch
		p := m.Plan(h, t0, &s)
		sinkInt += len(p.Candidates)
	}
}

func benchRoutes() []Route {
	return []Route{
		{Channel: 0, Name: "openai", InputCost: 2500, OutputCost: 10000, Weight: 100},
		{Channel: 1, Name: "azure", InputCost: 2500, OutputCost: 10000, Weight: 80},
		{Channel: 2, Name: "openrouter", InputCost: 2600, OutputCost: 10400, Weight: 20},
	}
}

func BenchmarkPlanCost(b *testing.B) {
	m := mustNew(b, Cost, 3, benchRoutes())
	benchPlan(b, m, healthy())
}

func BenchmarkPlanWeighted(b *testing.B) {
	m := mustNew(b, Weighted, 3, benchRoutes())
	h := healthy()
	h.rate[0], h.rate[1] = 0.7, 0.95
	benchPlan(b, m, h)
}

func TestPlanAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	h := healthy()
	h.rate[0] = 0.7
	h.down[2] = downState{readyAt: t0.Add(time.Second)}
	for _, policy := range []Policy{Cost, Weighted} {
		m := mustNew(t, policy, 3, benchRoutes())
		m.Explore = 0.5
		n := testing.AllocsPerRun(1000, func() {
			var s Scratch
			p := m.Plan(h, t0, &s)
			sinkInt += len(p.Candidates)
		})
		if n != 0 {
			t.Errorf("%v: Plan allocates %v times per call, want 0", policy, n)
		}
	}
}

// Score is the one weighted-policy formula, shared by the planner and the
// admin API's weights.
func TestScore(t *testing.T) {
	for _, c := range []struct {
		weight int
		rate   float64
		want   float64
	}{{100, 1, 100}, {100, 0.7, 49}, {80, 1, 80}, {1, 0, 0}} {
		if got := Score(c.weight, c.rate); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("Score(%d, %v) = %v, want %v", c.weight, c.rate, got, c.want)
		}
	}
}
