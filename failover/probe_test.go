package failover

import (
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/probe"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// Every priced route tells the scheduler the most its probe can cost, so
// that concurrent probes hold it against the daily budget: at least the
// plan's whole output at the route's price, and nothing for a free route.
func TestProbeRoutesTellTheirMaxCost(t *testing.T) {
	e := testEngine(t, testPlan(t, Options{}, func(m *Model) {
		plan, err := probe.NewPlan(time.Minute, 0, "", "")
		if err != nil {
			t.Fatal(err)
		}
		m.Probe = &plan
		m.Chain.Routes[1].InputCost, m.Chain.Routes[1].OutputCost = 2_000_000, 8_000_000
	}, testChannel{name: uniqueName("free"), url: "http://127.0.0.1:1"}, testChannel{name: uniqueName("priced"), url: "http://127.0.0.1:1"}))
	routes := prober{e}.Routes()
	if len(routes) != 2 {
		t.Fatalf("%d routes", len(routes))
	}
	if routes[0].MaxCost != 0 {
		t.Errorf("a free route's probe may cost %s", routes[0].MaxCost)
	}
	out := wallet.Price{Output: 8_000_000}.Cost(0, int64(routes[1].Plan.MaxTokens))
	if routes[1].MaxCost < out || routes[1].MaxCost <= 0 {
		t.Errorf("a priced route's probe may cost %s, below its output alone (%s)", routes[1].MaxCost, out)
	}
}
