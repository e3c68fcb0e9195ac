package e2e

import (
	"fmt"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// Ports of the prober test's two instances.
var (
	portsProbeA = ports{19451, 19450}
	portsProbeB = ports{19453, 19452}
)

// probeSite probes an idle channel every 300ms, electing one prober per
// fleet through the PostgreSQL database in LLMF_E2E_DSN.
func probeSite(p ports, upstream string) string {
	return withFailover(globalOptions(p), "probe_leader postgres {env.LLMF_E2E_DSN}") + fmt.Sprintf(`http://:%d {
	bind 127.0.0.1
	llm_failover {
		channel shared %s
		model gpt-probe {
			route shared
			probe {
				interval 300ms
			}
		}
	}
}
`, p.HTTP, upstream)
}

// Two instances on one PostgreSQL: only one probes (probes cost money and
// must not multiply with the fleet); kill -9 it and the other takes over
// within a few intervals. Each instance's channel points at its own fake
// upstream, so the probes are counted per instance.
func TestBinaryOneProberPerFleet(t *testing.T) {
	caddyBin(t)
	dsn := createDatabase(t, postgresDSN(t))
	upA, upB := fu.New(fu.OKNamed("a")), fu.New(fu.OKNamed("b"))
	defer upA.Close()
	defer upB.Close()
	a := newInstance(t, "probe-a", portsProbeA, probeSite(portsProbeA, upA.URL), "LLMF_E2E_DSN="+dsn)
	b := newInstance(t, "probe-b", portsProbeB, probeSite(portsProbeB, upB.URL), "LLMF_E2E_DSN="+dsn)

	if !waitFor(15*time.Second, func() bool { return upA.Hits()+upB.Hits() >= 4 }) {
		a.dumpLog()
		b.dumpLog()
		t.Fatalf("no probes: a %d, b %d", upA.Hits(), upB.Hits())
	}
	time.Sleep(time.Second) // several more rounds
	ha, hb := upA.Hits(), upB.Hits()
	if (ha == 0) == (hb == 0) {
		t.Fatalf("probes per instance: a %d, b %d; want exactly one prober", ha, hb)
	}
	leader, follower, followerUp := a, b, upB
	if hb > 0 {
		leader, follower, followerUp = b, a, upA
	}
	leader.kill9()
	before := followerUp.Hits()
	if !waitFor(10*time.Second, func() bool { return followerUp.Hits() > before }) {
		follower.dumpLog()
		t.Fatalf("%s did not take over probing after %s was killed", follower.name, leader.name)
	}
}
