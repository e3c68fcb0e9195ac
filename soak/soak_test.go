//go:build linux

package soak

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/backoff"
	"github.com/llmfailover/caddy-llm-failover/internal/binarytest"
)

// TestSoak runs the soak (see the package doc): LLMF_SOAK=60s by default
// (the short run `make test` includes), LLMF_SOAK=30m for the long one
// (`make soak`). The schedule scales with the duration; the one-off
// events happen once at fixed fractions of it.
//
//	0%      traffic starts on both instances; faults and reloads begin
//	10%     resource sample "start" (after warm-up)
//	25%     every PostgreSQL session of the gateways terminated
//	40%     PostgreSQL restarted
//	50%     resource sample "middle"
//	60%     instance b killed with -9, restarted 2s later
//	100%    traffic stops; then the checks, and resource sample "end"
func TestSoak(t *testing.T) {
	bin := caddyBinary(t)
	dur := soakDuration(t)
	base := portBase(t)
	out := outDir(t)
	pg := startPG(t, base+5)
	u := startUpstreams(t)

	env := []string{"LLMF_SOAK_DSN=" + pg.dsn}
	gws := []*gateway{
		newGateway(t, "a", bin, ports{base + 1, base + 2}, env),
		newGateway(t, "b", bin, ports{base + 3, base + 4}, env),
	}
	for _, g := range gws {
		if err := g.writeConfig(gatewayConfig(g.ports, variantA, u), variantA); err != nil {
			t.Fatal(err)
		}
		if err := g.start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, g := range gws {
			if g.running() {
				g.stop()
			}
		}
	})
	keys, err := setupAccounts(gws[0])
	if err != nil {
		t.Fatal(err)
	}

	logf, err := os.Create(filepath.Join(out, "client.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	tl := &timeline{}
	l := newLoad(gws, keys, logf)
	rs := &resources{}
	faultStep, every := clamp(dur/30, 2*time.Second, 5*time.Second), clamp(dur/20, 3*time.Second, 5*time.Second)
	t.Logf("soak: %v of traffic, binary %s, output in %s; fault step %v, a reload every %v", dur, bin, out, faultStep, every)

	tl.start = time.Now()
	l.start(6, uint64(tl.start.UnixNano()))
	ctx, cancel := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); faultSchedule(ctx, u, faultStep, tl) }()
	go func() { defer bg.Done(); reloader(ctx, gws, u, l, every, tl) }()
	// The one-off events, at fractions of the run; a long run also
	// samples resources every tenth of it, to show their trend.
	type step struct {
		frac float64
		do   func()
	}
	steps := []step{
		{0.10, func() { rs.take(l, gws, u, "start", tl) }},
		{0.25, func() {
			w0 := time.Now()
			n, err := pg.terminate()
			tl.pgWindow(w0, time.Now(), fmt.Sprintf("terminated %d PostgreSQL sessions (err %v)", n, err))
			if err != nil {
				t.Errorf("terminating the sessions: %v", err)
			}
		}},
		{0.40, func() {
			sessions, _ := pg.sessions()
			w0 := time.Now()
			err := pg.restart()
			tl.pgWindow(w0, time.Now(), fmt.Sprintf("PostgreSQL restarted (pg_ctl restart -m fast; %d sessions before; err %v)", sessions, err))
			if err != nil {
				t.Errorf("restarting PostgreSQL: %v", err)
			}
		}},
		{0.50, func() { rs.take(l, gws, u, "middle", tl) }},
		{0.60, func() {
			victim := gws[1]
			victim.life.Lock()
			err := hardRestart(victim, 1, l, tl, "kill -9 of instance b", true)
			victim.life.Unlock()
			if err != nil {
				t.Errorf("kill -9 and restart of b: %v", err)
			}
			time.Sleep(3 * time.Second)
			rs.take(l, gws, u, "restarted", tl)
		}},
	}
	if dur >= 10*time.Minute {
		for _, f := range []float64{0.2, 0.3, 0.7, 0.8, 0.9} {
			label := fmt.Sprintf("%.0fm", f*dur.Minutes())
			steps = append(steps, step{f, func() { rs.take(l, gws, u, label, tl) }})
		}
		sort.Slice(steps, func(i, j int) bool { return steps[i].frac < steps[j].frac })
	}
	for _, st := range steps {
		time.Sleep(time.Until(tl.start.Add(time.Duration(st.frac * float64(dur)))))
		st.do()
	}
	time.Sleep(time.Until(tl.start.Add(dur)))
	l.finish()
	tl.stop = time.Now()
	cancel()
	bg.Wait()
	for _, f := range u.fronts {
		f.set(healthy)
	}
	tl.note("traffic stopped")
	logf.Sync()

	c := &checker{t: t, gws: gws, u: u, tl: tl, l: l, rs: rs, keys: keys, out: out}
	c.run()
}

// caddyBinary is the binary under test: LLMF_SOAK_CADDY_BIN (make test
// sets it to the race build), else LLMF_CADDY_BIN (the xcaddy build).
func caddyBinary(t *testing.T) string {
	bin := os.Getenv("LLMF_SOAK_CADDY_BIN")
	if bin == "" {
		bin = os.Getenv("LLMF_CADDY_BIN")
	}
	if bin == "" {
		binarytest.Prerequisite(t, "neither LLMF_SOAK_CADDY_BIN nor LLMF_CADDY_BIN is set; `make test` builds ./caddy-race and sets it")
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(abs); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		t.Fatalf("%s is not an executable file (%v); run `make caddy-race` or `make build`", abs, err)
	}
	return abs
}

// soakDuration is LLMF_SOAK (a Go duration), 60s by default.
func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("LLMF_SOAK")
	if v == "" {
		return 60 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 20*time.Second {
		t.Fatalf("LLMF_SOAK=%q: want a duration of at least 20s", v)
	}
	return d
}

// portBase: the soak listens on base+1..base+4 (two instances' HTTP and
// admin ports) and base+5 (its PostgreSQL). 19600 by default, in the 19xxx
// range the e2e tests use, away from their ports; `make soak` uses 19700
// so that a long soak and `make test` can run side by side.
func portBase(t *testing.T) int {
	v := os.Getenv("LLMF_SOAK_PORT_BASE")
	if v == "" {
		return 19600
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1024 || n > 65000 {
		t.Fatalf("LLMF_SOAK_PORT_BASE=%q: want a port number", v)
	}
	return n
}

// waitFor polls cond every 10ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

func clamp(d, lo, hi time.Duration) time.Duration { return min(max(d, lo), hi) }

var (
	outOnce sync.Once
	outPath string
)

func keepOutput() bool { return os.Getenv("LLMF_SOAK_OUT") != "" }

// outDir holds the client log, the caddy logs and data, and the report:
// LLMF_SOAK_OUT when set, else a temporary directory kept only when the
// test fails.
func outDir(t *testing.T) string {
	outOnce.Do(func() {
		if d := os.Getenv("LLMF_SOAK_OUT"); d != "" {
			outPath = d
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			return
		}
		d, err := os.MkdirTemp("", "llmf-soak-")
		if err != nil {
			t.Fatal(err)
		}
		outPath = d
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("soak output kept in %s", d)
				return
			}
			_ = os.RemoveAll(d)
		})
	})
	return outPath
}

func copyFile(from, to string) {
	in, err := os.Open(from)
	if err != nil {
		return
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return
	}
	defer out.Close()
	_, _ = io.Copy(out, in)
}

// timeline is what happened when, for the judge and the report.
type timeline struct {
	start, stop time.Time

	mu        sync.Mutex
	events    []string
	pgWindows [][2]time.Time // the database was disturbed from .0 to .1
	kills     []killEvent
	reloads   []reloadEvent
}

// killEvent is one kill -9 and restart of an instance.
type killEvent struct {
	inst      int
	at, ready time.Time // killed; answering again
	mid       int64     // billed streams mid-way on it when it was killed
	why       string
}

// killed reports whether a kill of r's instance overlapped r.
func (tl *timeline) killed(r *record) bool {
	for _, k := range tl.kills {
		if k.inst == r.Inst && overlaps(r.Sent, r.Done, k.at, k.ready) {
			return true
		}
	}
	return false
}

// crashed reports whether r was answered by an instance that was killed
// while r was in flight or within crashWindow after r ended (its
// settlement may not have been written).
func (tl *timeline) crashed(r *record) (killedAt time.Time, ok bool) {
	for _, k := range tl.kills {
		if k.inst == r.Inst && r.Done.After(k.at.Add(-crashWindow)) && r.Sent.Before(k.at) {
			return k.at, true
		}
	}
	return time.Time{}, false
}

// hardRestart kills g with -9 and starts it again (the caller holds
// g.life). With waitMid it first waits (at most 10s) until billed streams are
// mid-way on it, so that the kill cuts streams whose money its credit
// leases hold.
func hardRestart(g *gateway, inst int, l *load, tl *timeline, why string, waitMid bool) error {
	if waitMid {
		waitFor(10*time.Second, func() bool { return l.mid[inst].Load() >= 2 })
	}
	k := killEvent{inst: inst, at: time.Now(), mid: l.mid[inst].Load(), why: why}
	if err := g.kill9(); err != nil {
		return err
	}
	tl.note("%s, %d billed streams mid-way on it", why, k.mid)
	time.Sleep(2 * time.Second)
	err := g.start()
	k.ready = time.Now()
	tl.mu.Lock()
	tl.kills = append(tl.kills, k)
	tl.mu.Unlock()
	if err == nil {
		tl.note("instance %s restarted and answering", g.name)
	}
	return err
}

type reloadEvent struct {
	inst    int
	variant int
	at      time.Time
	took    time.Duration
	err     error
}

func (tl *timeline) note(format string, args ...any) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.events = append(tl.events, fmt.Sprintf("%7.1fs  %s", time.Since(tl.start).Seconds(), fmt.Sprintf(format, args...)))
}

func (tl *timeline) pgWindow(from, to time.Time, what string) {
	tl.mu.Lock()
	tl.pgWindows = append(tl.pgWindows, [2]time.Time{from, to})
	tl.mu.Unlock()
	tl.note("%s (%.2fs)", what, to.Sub(from).Seconds())
}

// faultSchedule switches the fronts between healthy and each fault kind:
// every step, two fronts (half the list apart) get the next fault kinds
// in turn, and every fourth step all are healthy, so breakers close
// again. The walk is deterministic: over 32 fault steps every front gets
// every fault kind.
func faultSchedule(ctx context.Context, u *upstreams, step time.Duration, tl *timeline) {
	nf, nk := len(u.fronts), int(numFaults)-1
	for k, j := 0, 0; ; k++ {
		for _, f := range u.fronts {
			f.set(healthy)
		}
		if k%4 != 3 {
			a, b := j%nf, (j+nf/2)%nf
			u.fronts[a].set(fault(1 + j%nk))
			u.fronts[b].set(fault(1 + (j+3)%nk))
			j++
		}
		if !backoff.Sleep(ctx, step) {
			return
		}
	}
}

// reloader runs `caddy reload` on the instances in turn, every `every`,
// each time flipping the instance between config variants A and B.
func reloader(ctx context.Context, gws []*gateway, u *upstreams, l *load, every time.Duration, tl *timeline) {
	for i := 0; ; i++ {
		if !backoff.Sleep(ctx, every/2) {
			return
		}
		g := gws[i%len(gws)]
		g.life.Lock()
		if g.running() {
			g.mu.Lock()
			v := 1 - g.variant
			g.mu.Unlock()
			t0 := time.Now()
			err := g.reload(gatewayConfig(g.ports, v, u), v)
			tl.mu.Lock()
			tl.reloads = append(tl.reloads, reloadEvent{inst: i % len(gws), variant: v, at: t0, took: time.Since(t0), err: err})
			tl.mu.Unlock()
			if err != nil {
				tl.note("reload of %s failed: %v", g.name, strings.TrimSpace(err.Error()))
			}
		}
		g.life.Unlock()
	}
}
