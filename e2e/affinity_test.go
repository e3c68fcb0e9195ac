package e2e

import (
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// Ports of the cache-affinity fleet's two instances.
var (
	portsAffinityA = ports{19613, 19614}
	portsAffinityB = ports{19615, 19616}
)

// affinitySite is a gateway whose model m is served by a cheap channel
// and, at 1.5 times its price, by a dearer one; the history (and the
// cache-affinity table with it) is the fleet's PostgreSQL.
func affinitySite(p ports, cheap, dear string) string {
	return withFailover(globalOptions(p), "history postgres {env.LLMF_E2E_DSN}") + site(p, fmt.Sprintf(`
		channel cheap %s
		channel dear %s
		model m {
			route cheap cost 1 1
			route dear cost 1.5 1.5
		}
`, cheap, dear))
}

// A conversation's turns reach two instances of a fleet sharing a
// PostgreSQL history. The first turn, on instance a, fails over from the
// cheap channel to the dear one, whose (implicit, OpenAI-style) prompt
// cache now holds the conversation. The cheap channel recovers; the next
// turn reaches instance b, which never saw the conversation: it reads the
// fleet's pin and sends the turn to the dear channel, where a cache read
// makes it the cheaper, and journals why. Without the fleet's table b
// would send it to the cold cheap channel.
func TestBinaryCacheAffinityAcrossTheFleet(t *testing.T) {
	caddyBin(t)
	dsn := createDatabase(t, postgresDSN(t))
	cheap := fu.New(fu.FailFirst(1, fu.Status(503, ""), fu.OK().WithUsage(2000, 10)))
	defer cheap.Close()
	dear := fu.New(fu.OK().WithUsage(2000, 10))
	defer dear.Close()
	a := newInstance(t, "affinity-a", portsAffinityA, affinitySite(portsAffinityA, cheap.URL, dear.URL), "LLMF_E2E_DSN="+dsn)
	b := newInstance(t, "affinity-b", portsAffinityB, affinitySite(portsAffinityB, cheap.URL, dear.URL), "LLMF_E2E_DSN="+dsn)

	turn := func(in *instance, n int) {
		t.Helper()
		body := fmt.Sprintf(`{"model":"m","prompt_cache_key":"conversation-7","messages":[{"role":"user","content":%q}]}`,
			strings.Repeat("Refactor the parser so that it streams. ", 40)+fmt.Sprintf("Turn %d.", n))
		if code, _, got := post(t, in.gatewayURL()+"/v1/chat/completions", []byte(body)); code != 200 {
			t.Fatalf("turn %d on %s: %d %s", n, in.name, code, got)
		}
	}
	turn(a, 1)
	if cheap.Hits() != 1 || dear.Hits() != 1 {
		t.Fatalf("turn 1: cheap hit %d times, dear %d; want a failover from cheap to dear", cheap.Hits(), dear.Hits())
	}
	// The pin is written as soon as the turn is served, not with the 5 s
	// history flush.
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var pinned string
	if !waitFor(2*time.Second, func() bool {
		return db.QueryRow("SELECT channel FROM llmf_affinity WHERE model = 'm'").Scan(&pinned) == nil
	}) {
		t.Fatal("instance a wrote no pin to the fleet's table within 2s")
	}
	// The pin names the channel and its identity (name@hash).
	if name, _, _ := strings.Cut(pinned, "@"); name != "dear" {
		t.Fatalf("the fleet's pin names %q, want dear", pinned)
	}
	turn(b, 2)
	if cheap.Hits() != 1 || dear.Hits() != 2 {
		t.Fatalf("turn 2 on instance b: cheap hit %d times, dear %d; want the conversation kept on dear, where its cache is", cheap.Hits(), dear.Hits())
	}
	var journaled failoverapp.DecisionsAnswer
	b.admin("GET", "/llm_failover/decisions?reason=cache_affinity", nil, 200, &journaled)
	if len(journaled.Decisions) != 1 || journaled.Decisions[0].Channel != "dear" || journaled.Decisions[0].Next != "cheap" {
		t.Errorf("instance b's cache_affinity decisions: %+v, want one sending the turn to dear ahead of cheap", journaled.Decisions)
	}
}
