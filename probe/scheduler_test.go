package probe

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/jobs"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// fakeTarget offers routes and records the probes it is sent.
type fakeTarget struct {
	routes []Route
	mu     sync.Mutex
	quiet  map[string]bool // by channel; absent means quiet
	admit  bool
	result Result
	sent   map[string]int
	// delay is how long a probe takes; during it, probes overlap.
	delay time.Duration
	// onProbe, when set, runs as each probe is sent.
	onProbe func()
}

func newFakeTarget(plan Plan, channels ...string) *fakeTarget {
	t := &fakeTarget{quiet: map[string]bool{}, admit: true, result: Result{Outcome: Passed, Cost: 100_000}, sent: map[string]int{}}
	for i, ch := range channels {
		t.routes = append(t.routes, Route{Model: "m", Channel: ch, Plan: plan, ID: i})
	}
	return t
}

func (t *fakeTarget) Routes() []Route { return t.routes }

func (t *fakeTarget) Quiet(r Route, _ time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	q, ok := t.quiet[r.Channel]
	return !ok || q
}

func (t *fakeTarget) Probe(_ context.Context, r Route) (Result, bool) {
	t.mu.Lock()
	if !t.admit {
		t.mu.Unlock()
		return Result{}, false
	}
	t.sent[r.Channel]++
	res, delay, onProbe := t.result, t.delay, t.onProbe
	t.mu.Unlock()
	if onProbe != nil {
		onProbe()
	}
	time.Sleep(delay)
	return res, true
}

func (t *fakeTarget) count(ch string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sent[ch]
}

func mustPlan(t *testing.T, interval time.Duration, budget string) Plan {
	t.Helper()
	p, err := NewPlan(interval, 0, "", budget)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNewPlan(t *testing.T) {
	p := mustPlan(t, 0, "")
	if p.Interval != DefaultInterval || p.MaxTokens != DefaultMaxTokens || p.Prompt != DefaultPrompt || p.Budget != 1_000_000 {
		t.Fatalf("defaults: %+v", p)
	}
	for _, bad := range []struct {
		interval time.Duration
		tokens   int
		budget   string
	}{{-time.Second, 0, ""}, {0, -1, ""}, {0, 0, "-1"}, {0, 0, "a dollar"}} {
		if _, err := NewPlan(bad.interval, bad.tokens, "", bad.budget); err == nil {
			t.Errorf("NewPlan(%v, %d, %q) accepted", bad.interval, bad.tokens, bad.budget)
		}
	}
}

// A route is probed once per interval, only while its channel is quiet,
// and a probe its breaker did not admit is tried again next round.
func TestSchedulerDueRules(t *testing.T) {
	target := newFakeTarget(mustPlan(t, time.Hour, "10"), "a", "busy")
	target.quiet["busy"] = false
	s := NewScheduler([]Target{target}, NewLedger(), nil, zap.NewNop())
	// The job runs every quarter of the shortest interval, and says so.
	if s.Every() != 15*time.Minute {
		t.Fatalf("every %v, want a quarter of the 1h interval", s.Every())
	}
	ctx := context.Background()
	for range 3 {
		if _, err := s.Round(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if target.count("a") != 1 || target.count("busy") != 0 {
		t.Fatalf("probes sent %v: want a once (interval), busy never (not quiet)", target.sent)
	}

	refused := newFakeTarget(mustPlan(t, time.Hour, "10"), "half-open")
	refused.admit = false
	s = NewScheduler([]Target{refused}, NewLedger(), nil, zap.NewNop())
	if _, err := s.Round(ctx); err != nil {
		t.Fatal(err)
	}
	refused.mu.Lock()
	refused.admit = true
	refused.mu.Unlock()
	if _, err := s.Round(ctx); err != nil {
		t.Fatal(err)
	}
	if refused.count("half-open") != 1 {
		t.Fatalf("a probe the breaker refused was not sent at the next round: %v", refused.sent)
	}
	if NewScheduler([]Target{newFakeTarget(mustPlan(t, time.Hour, "1"))}, NewLedger(), nil, zap.NewNop()) != nil {
		t.Fatal("a scheduler with no routes")
	}
}

// Once a channel's probes spent its daily budget, it is not probed again
// that day, and its record says so.
func TestSchedulerBudget(t *testing.T) {
	target := newFakeTarget(mustPlan(t, time.Millisecond, "0.25"), "a")
	ledger := NewLedger()
	s := NewScheduler([]Target{target}, ledger, nil, zap.NewNop())
	for range 10 {
		time.Sleep(2 * time.Millisecond)
		if _, err := s.Round(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// 0.10 a probe: the third crosses 0.25, and none follows.
	if target.count("a") != 3 {
		t.Fatalf("%d probes against a budget of 0.25 at 0.10 each, want 3", target.count("a"))
	}
	rec, ok := ledger.View("a", time.Now())
	if !ok || !rec.Stopped || rec.Spent != wallet.Micros(300_000) || rec.Outcome != Passed {
		t.Fatalf("record %+v", rec)
	}
	if tomorrow, _ := ledger.View("a", time.Now().Add(24*time.Hour)); tomorrow.Spent != 0 || tomorrow.Stopped {
		t.Fatalf("the next day's view keeps the spend: %+v", tomorrow)
	}
	if got := ledger.History().Channel("a", time.Now(), time.Hour).Windows[time.Hour].Attempts; got != 3 {
		t.Fatalf("probe history has %d attempts, want 3", got)
	}
}

// fakeLeader leads when told to.
type fakeLeader struct {
	mu      sync.Mutex
	lead    bool
	err     error
	asked   int
	changed func()
}

func (l *fakeLeader) Run(ctx context.Context, changed func()) {
	l.mu.Lock()
	l.changed = changed
	l.mu.Unlock()
	changed()
	<-ctx.Done()
}

func (l *fakeLeader) Leading() (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked++
	return l.lead, l.err
}

// set changes the lead, and tells Run's caller as an elector does.
func (l *fakeLeader) set(lead bool, err error) {
	l.mu.Lock()
	l.lead, l.err = lead, err
	changed := l.changed
	l.mu.Unlock()
	if changed != nil {
		changed()
	}
}

// With a leader, only the instance that leads probes, asked at every
// round (never a cached answer); an election that cannot tell probes
// nothing and is the job's error.
func TestSchedulerLeader(t *testing.T) {
	target := newFakeTarget(mustPlan(t, time.Millisecond, "10"), "a")
	leader := &fakeLeader{}
	s := NewScheduler([]Target{target}, NewLedger(), leader, zap.NewNop())
	if summary, err := s.Round(context.Background()); err != nil || summary != "another instance probes" || target.count("a") != 0 {
		t.Fatalf("follower: %q %v, %d probes", summary, err, target.count("a"))
	}
	leader.set(false, errors.New("no database"))
	if _, err := s.Round(context.Background()); err == nil {
		t.Fatal("a failed election is no error")
	}
	leader.set(true, nil)
	if _, err := s.Round(context.Background()); err != nil || target.count("a") != 1 {
		t.Fatalf("leader: %v, %d probes", err, target.count("a"))
	}
	// The lead lost between two rounds: the next sends nothing.
	leader.set(false, nil)
	time.Sleep(2 * time.Millisecond)
	if summary, err := s.Round(context.Background()); err != nil || summary != "another instance probes" || target.count("a") != 1 {
		t.Fatalf("after the lead was lost: %q %v, %d probes", summary, err, target.count("a"))
	}
}

// A lead lost while a round runs (the process was frozen past its lease)
// stops the probes of the round that have not gone yet.
func TestSchedulerLeadLostMidRound(t *testing.T) {
	plan := mustPlan(t, time.Hour, "10")
	target := &fakeTarget{quiet: map[string]bool{}, admit: true, result: Result{Outcome: Passed, Cost: 1}, sent: map[string]int{}}
	// Two routes on one channel of unknown cost: the second waits for the
	// first to settle.
	target.routes = []Route{{Model: "m1", Channel: "a", Plan: plan}, {Model: "m2", Channel: "a", Plan: plan, ID: 1}}
	leader := &fakeLeader{lead: true}
	target.onProbe = func() { leader.set(false, nil) }
	s := NewScheduler([]Target{target}, NewLedger(), leader, zap.NewNop())
	summary, err := s.Round(context.Background())
	if err != nil || target.count("a") != 1 {
		t.Fatalf("%q %v: %d probes sent, want the one sent before the lead was lost", summary, err, target.count("a"))
	}
	t.Log(summary)
}

// A follower that takes the lead probes at once, not at its next tick
// (a quarter of a long interval), and one that never leads never probes.
func TestSchedulerRoundWhenLeadGained(t *testing.T) {
	target := newFakeTarget(mustPlan(t, time.Hour, "10"), "a")
	leader := &fakeLeader{}
	s := NewScheduler([]Target{target}, NewLedger(), leader, zap.NewNop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	job := jobs.NewRegistry(nil).Job("prober", s.Every())
	go func() {
		defer close(done)
		s.Run(ctx, job)
	}()
	defer func() { cancel(); <-done }()
	time.Sleep(100 * time.Millisecond)
	if target.count("a") != 0 {
		t.Fatal("a follower probed")
	}
	leader.set(true, nil)
	deadline := time.Now().Add(10 * time.Second)
	for target.count("a") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the new leader did not probe within 10s of taking the lead")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// manyRoutes is a target with n routes (models) on one channel, each
// probe costing cost and taking delay, so that a round's probes overlap.
func manyRoutes(plan Plan, n int, cost, maxCost wallet.Micros, delay time.Duration) *fakeTarget {
	t := &fakeTarget{quiet: map[string]bool{}, admit: true, result: Result{Outcome: Passed, Cost: cost}, sent: map[string]int{}, delay: delay}
	for i := range n {
		t.routes = append(t.routes, Route{Model: fmt.Sprintf("m%d", i), Channel: "a", Plan: plan, ID: i, MaxCost: maxCost})
	}
	return t
}

// Probes of one round run at once; together they may not spend more than
// the channel's daily budget allows. Of cost unknown in advance, they go
// one at a time and the budget is overshot by one probe at most, as when
// probes ran one after another (0.10 each against 0.35: four, not ten).
func TestSchedulerBudgetUnderConcurrency(t *testing.T) {
	target := manyRoutes(mustPlan(t, time.Hour, "0.35"), 10, 100_000, 0, 20*time.Millisecond)
	ledger := NewLedger()
	s := NewScheduler([]Target{target}, ledger, nil, zap.NewNop())
	if _, err := s.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec, _ := ledger.View("a", time.Now())
	if target.count("a") != 4 || rec.Spent != 400_000 {
		t.Fatalf("%d probes at 0.10 against a budget of 0.35 spent %s: want 4 (0.40, one probe over)", target.count("a"), rec.Spent)
	}
	if rec.Held != 0 || !rec.Stopped {
		t.Fatalf("after the round: %+v", rec)
	}
}

// With its maximum cost known, a probe goes only when the day's spend,
// what the probes in flight hold and its own maximum fit in the budget;
// each settles to its real cost, which frees room for later ones, and a
// probe that was not sent releases its hold.
func TestSchedulerBudgetHoldsMaxCost(t *testing.T) {
	target := manyRoutes(mustPlan(t, time.Millisecond, "0.35"), 10, 50_000, 100_000, 20*time.Millisecond)
	ledger := NewLedger()
	s := NewScheduler([]Target{target}, ledger, nil, zap.NewNop())
	if _, err := s.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec, _ := ledger.View("a", time.Now())
	// Three maxima of 0.10 fit in 0.35; they cost 0.05 each.
	if target.count("a") != 3 || rec.Spent != 150_000 || rec.Held != 0 || rec.Stopped {
		t.Fatalf("first round: %d probes, record %+v; want 3 probes spending 0.15", target.count("a"), rec)
	}
	for range 5 {
		time.Sleep(2 * time.Millisecond)
		if _, err := s.Round(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	rec, _ = ledger.View("a", time.Now())
	// 0.35 - 0.15 = 0.20: two more maxima, costing 0.10; then 0.10 is
	// left, one more, and 0.05 holds no maximum.
	if target.count("a") != 6 || rec.Spent != 300_000 || rec.Held != 0 || !rec.Stopped {
		t.Fatalf("later rounds: %d probes, record %+v; want 6 probes spending 0.30, stopped", target.count("a"), rec)
	}

	refused := manyRoutes(mustPlan(t, time.Hour, "0.35"), 3, 50_000, 100_000, 0)
	refused.admit = false
	ledger = NewLedger()
	s = NewScheduler([]Target{refused}, ledger, nil, zap.NewNop())
	if _, err := s.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rec, ok := ledger.View("a", time.Now()); !ok || rec.Held != 0 || rec.Spent != 0 {
		t.Fatalf("probes not sent still hold: %+v", rec)
	}
}

// A round whose probes could not check their channel (the probe account
// refused them, or the upstream refused the probe as malformed) is a
// failed run of the job, so that its heartbeat reports failure; a probe
// that found its channel down is a run that did its work.
func TestSchedulerRoundFailsWhenProbesCannotCheck(t *testing.T) {
	target := newFakeTarget(mustPlan(t, time.Hour, "10"), "a")
	target.result = Result{Outcome: ConfigError, Reason: "probe account refused: unknown account \"ops\""}
	s := NewScheduler([]Target{target}, NewLedger(), nil, zap.NewNop())
	if _, err := s.Round(context.Background()); err == nil || !strings.Contains(err.Error(), "unknown account") {
		t.Fatalf("round with a refused probe account: %v", err)
	}
	down := newFakeTarget(mustPlan(t, time.Hour, "10"), "b")
	down.result = Result{Outcome: Failed, Reason: "status 503"}
	s = NewScheduler([]Target{down}, NewLedger(), nil, zap.NewNop())
	if _, err := s.Round(context.Background()); err != nil {
		t.Fatalf("round whose probe found its channel down: %v", err)
	}
}

// A probe cut short because the prober itself stopped (a reload, a
// shutdown: the round's context ended) found nothing about its channel:
// its cost is spent, but it is no failed probe in the channel's probe
// history, its last result or the round's counts.
func TestProbeInterruptedByStopIsNoFailure(t *testing.T) {
	target := newFakeTarget(mustPlan(t, time.Millisecond, ""), "a")
	ctx, cancel := context.WithCancel(context.Background())
	target.onProbe = cancel
	// What the engine reports for an attempt whose context ended.
	target.result = Result{Outcome: Failed, Reason: "stopped", Cost: 50_000}
	ledger := NewLedger()
	s := NewScheduler([]Target{target}, ledger, nil, zap.NewNop())
	summary, _ := s.Round(ctx)
	if target.count("a") != 1 {
		t.Fatalf("%d probes sent", target.count("a"))
	}
	if strings.Contains(string(summary), "1 failed") {
		t.Errorf("round summary counts the interrupted probe as failed: %s", summary)
	}
	if w := ledger.History().Channel("a", time.Now(), time.Hour).Windows[time.Hour]; w.Down != 0 {
		t.Errorf("the channel's probe history has %d down from a probe the prober's stop interrupted", w.Down)
	}
	rec, _ := ledger.View("a", time.Now())
	if rec.Outcome == Failed {
		t.Errorf("the channel's last probe reads %q (%s)", rec.Outcome, rec.Reason)
	}
	if rec.Spent != 50_000 {
		t.Errorf("what the interrupted probe cost is not spent: %s", rec.Spent)
	}
}
