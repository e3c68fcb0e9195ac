package probe

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

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
	defer t.mu.Unlock()
	if !t.admit {
		return Result{}, false
	}
	t.sent[r.Channel]++
	return t.result, true
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
	if s.Every() != time.Hour {
		t.Fatalf("every %v", s.Every())
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
	lead      bool
	err       error
	campaigns int
	resigned  bool
}

func (l *fakeLeader) Campaign(context.Context) (bool, error) {
	l.campaigns++
	return l.lead, l.err
}
func (l *fakeLeader) Resign() { l.resigned = true }

// With a leader, only the instance that leads probes; a failed election
// probes nothing and is the job's error.
func TestSchedulerLeader(t *testing.T) {
	target := newFakeTarget(mustPlan(t, time.Hour, "10"), "a")
	leader := &fakeLeader{}
	s := NewScheduler([]Target{target}, NewLedger(), leader, zap.NewNop())
	if summary, err := s.Round(context.Background()); err != nil || summary != "another instance probes" || target.count("a") != 0 {
		t.Fatalf("follower: %q %v, %d probes", summary, err, target.count("a"))
	}
	leader.lead, leader.err = false, errors.New("no database")
	s.campaigned = time.Time{}
	if _, err := s.Round(context.Background()); err == nil {
		t.Fatal("a failed election is no error")
	}
	leader.lead, leader.err = true, nil
	s.campaigned = time.Time{}
	if _, err := s.Round(context.Background()); err != nil || target.count("a") != 1 {
		t.Fatalf("leader: %v, %d probes", err, target.count("a"))
	}
}
