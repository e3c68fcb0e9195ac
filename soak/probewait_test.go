package soak

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// A resource sample counts goroutines between probe rounds: a profile
// taken while a round is under way is taken again, and the first one
// without a round is what is counted.
func TestGoroutinesBetweenProbes(t *testing.T) {
	const (
		round = "1 @ 0x1 0x2\n#\t0x1\tgithub.com/llmfailover/caddy-llm-failover/probe.(*Scheduler).Round.func1+0x2d1\t/x/probe/scheduler.go:220\n"
		idle  = "1 @ 0x3 0x4\n#\t0x3\tnet/http.(*persistConn).readLoop+0x1\t/go/src/net/http/transport.go:2300\n"
	)
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debug/pprof/goroutine" {
			http.NotFound(w, r)
			return
		}
		if asked.Add(1) <= 3 {
			fmt.Fprint(w, "goroutine profile: total 2\n"+round+"\n"+idle)
			return
		}
		fmt.Fprint(w, "goroutine profile: total 1\n"+idle)
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	g := &gateway{name: "a"}
	fmt.Sscan(port, &g.ports.Admin)

	prof, probing, err := g.goroutinesBetweenProbes()
	if err != nil || probing {
		t.Fatalf("probing %v, err %v", probing, err)
	}
	if n := asked.Load(); n != 4 {
		t.Fatalf("asked %d times, want 4 (three with a round under way, then one without)", n)
	}
	if strings.Contains(string(prof), "Round") {
		t.Fatalf("counted a profile with a probe round in it:\n%s", prof)
	}
	if total, own := countGoroutines(prof); total != 1 || own != 0 {
		t.Fatalf("total %d, own %d; want 1 pooled connection's and none of its own", total, own)
	}
}

// The largest group comes first, right under the profile's header line,
// and is counted like the others (it once was not: a leak, which makes
// its group the largest, would not have been seen).
func TestCountGoroutinesCountsTheFirstGroup(t *testing.T) {
	prof := "goroutine profile: total 14\n" +
		"9 @ 0x1\n#\t0x1\tgithub.com/llmfailover/caddy-llm-failover/failover.(*Engine).leaky+0x1\t/x.go:1\n\n" +
		"4 @ 0x2\n#\t0x2\tnet/http.(*persistConn).writeLoop+0x1\t/y.go:2\n\n" +
		"1 @ 0x3\n#\t0x3\tgithub.com/llmfailover/caddy-llm-failover/probe.(*Scheduler).run+0x1\t/z.go:3\n"
	if total, own := countGoroutines([]byte(prof)); total != 14 || own != 10 {
		t.Fatalf("total %d, own %d; want 14 and 10", total, own)
	}
}
