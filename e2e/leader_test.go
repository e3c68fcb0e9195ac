package e2e

import (
	"syscall"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/internal/leader"
)

// Ports of the frozen-leader test's two instances.
var (
	portsFrozenA = ports{19761, 19762}
	portsFrozenB = ports{19763, 19764}
)

// takeoverBound is the takeover bound internal/leader states: the server
// ends the frozen leader's silent session, then a follower's next
// campaign takes the lock.
const takeoverBound = leader.SessionTimeout + leader.CampaignEvery + leader.CampaignTimeout

// signal sends sig to the instance's process, which this test started.
func (in *instance) signal(sig syscall.Signal) {
	in.t.Helper()
	if err := in.cmd.Process.Signal(sig); err != nil {
		in.t.Fatalf("%s: %v: %v", in.name, sig, err)
	}
}

// A leader whose process is frozen (SIGSTOP: its TCP connection to the
// database stays up, its kernel answers keepalives) loses the lead: the
// other instance probes within the takeover bound. Resumed (SIGCONT), the
// old leader finds its lease run out and its session gone, and does not
// probe alongside the new one. Each instance's channel points at its own
// fake upstream, so the probes are counted per instance.
func TestBinaryFrozenProberIsReplaced(t *testing.T) {
	caddyBin(t)
	dsn := createDatabase(t, postgresDSN(t))
	upA, upB := fu.New(fu.OKNamed("a")), fu.New(fu.OKNamed("b"))
	defer upA.Close()
	defer upB.Close()
	a := newInstance(t, "frozen-a", portsFrozenA, probeSite(portsFrozenA, upA.URL), "LLMF_E2E_DSN="+dsn)
	b := newInstance(t, "frozen-b", portsFrozenB, probeSite(portsFrozenB, upB.URL), "LLMF_E2E_DSN="+dsn)

	if !waitFor(20*time.Second, func() bool { return upA.Hits()+upB.Hits() >= 4 }) {
		t.Fatalf("no probes: a %d, b %d", upA.Hits(), upB.Hits())
	}
	time.Sleep(time.Second) // several more rounds
	ha, hb := upA.Hits(), upB.Hits()
	if (ha == 0) == (hb == 0) {
		t.Fatalf("probes per instance: a %d, b %d; want exactly one prober", ha, hb)
	}
	old, next, oldUp, nextUp := a, b, upA, upB
	if hb > 0 {
		old, next, oldUp, nextUp = b, a, upB, upA
	}

	// Registered after newInstance, so it runs before the instance's
	// stop: a stopped process would not act on SIGTERM.
	stopped := false
	t.Cleanup(func() {
		if stopped {
			_ = old.cmd.Process.Signal(syscall.SIGCONT)
		}
	})
	old.signal(syscall.SIGSTOP)
	stopped = true
	frozeAt := time.Now()
	// A probe on its way when the process stopped may still arrive.
	time.Sleep(200 * time.Millisecond)
	oldHits, nextBefore := oldUp.Hits(), nextUp.Hits()
	if !waitFor(takeoverBound+20*time.Second, func() bool { return nextUp.Hits() > nextBefore }) {
		t.Fatalf("%s did not take over probing %s after %s was frozen (bound %s)",
			next.name, time.Since(frozeAt).Round(time.Second), old.name, takeoverBound)
	}
	took := time.Since(frozeAt)
	t.Logf("%s probes %s after %s was frozen (bound %s)", next.name, took.Round(100*time.Millisecond), old.name, takeoverBound)
	if oldUp.Hits() != oldHits {
		t.Fatalf("the frozen %s probed", old.name)
	}

	old.signal(syscall.SIGCONT)
	stopped = false
	resumedNext := nextUp.Hits()
	time.Sleep(5 * time.Second) // many probe intervals, and a few campaigns
	if old.hasExited() {
		t.Fatalf("%s exited after SIGCONT: %v", old.name, old.waitErr)
	}
	// A probe goroutine that passed its lead check the instant the
	// process stopped may still send its one probe; a second means the
	// old leader went on probing.
	if extra := oldUp.Hits() - oldHits; extra > 1 {
		t.Fatalf("the resumed %s sent %d probes alongside %s", old.name, extra, next.name)
	}
	if nextUp.Hits() <= resumedNext {
		t.Fatalf("%s stopped probing once %s resumed", next.name, old.name)
	}
}
