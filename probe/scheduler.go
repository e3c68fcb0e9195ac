package probe

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/jobs"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// Check is one synthetic check a Target offers: one channel of one model.
type Check struct {
	Model   string
	Channel string
	Plan    Plan
	// ID is the Target's own handle on the check (its route).
	ID int
}

// Result is what one probe found.
type Result struct {
	Outcome Outcome
	// Reason is why it did not pass ("" when it did).
	Reason string
	// Cost is what it cost at the route's price.
	Cost wallet.Micros
	// TTFT is its time to first content; 0 when nothing was committed.
	TTFT time.Duration
}

// Target sends synthetic checks and judges their answers exactly as it
// judges real traffic.
type Target interface {
	// Checks lists the checks the target offers.
	Checks() []Check
	// Quiet reports whether nothing but a probe tells about the check's
	// channel at now: it is half-open (the probe is then its trial), or
	// closed with no real traffic for the check's interval. An open or
	// parked channel, or one no probe can be written for, is never quiet.
	Quiet(c Check, now time.Time) bool
	// Probe sends the check; sent is false when the channel's breaker
	// admitted nothing (its trial slots are taken by clients).
	Probe(ctx context.Context, c Check) (r Result, sent bool)
}

// Leader is the election of the one instance of a fleet that probes.
type Leader interface {
	// Campaign tries to take or keep the lead.
	Campaign(ctx context.Context) (bool, error)
	// Resign gives the lead up.
	Resign()
}

// Scheduler runs rounds of the checks that are due. It is made for one
// config and run by it until that config stops.
type Scheduler struct {
	targets []Target
	ledger  *Ledger
	leader  Leader // nil: this instance always probes
	logger  *zap.Logger
	every   time.Duration

	mu   sync.Mutex
	last map[checkKey]time.Time // when each check last ran

	// Only the round goroutine touches these.
	campaigned time.Time // when this instance last asked to lead
	leading    bool
}

type checkKey struct {
	target         int
	model, channel string
}

// NewScheduler returns the scheduler of the targets' checks, recording
// into ledger; nil when no target offers a check.
func NewScheduler(targets []Target, ledger *Ledger, leader Leader, logger *zap.Logger) *Scheduler {
	s := &Scheduler{ledger: ledger, leader: leader, logger: logger, last: map[checkKey]time.Time{}}
	for _, t := range targets {
		checks := t.Checks()
		if len(checks) == 0 {
			continue
		}
		s.targets = append(s.targets, t)
		for _, c := range checks {
			if s.every == 0 || c.Plan.Interval < s.every {
				s.every = c.Plan.Interval
			}
		}
	}
	if len(s.targets) == 0 {
		return nil
	}
	return s
}

// Every is the shortest interval of any check: how often the job is
// meant to run.
func (s *Scheduler) Every() time.Duration { return s.every }

// Run runs a round every tick, recorded as job, until ctx ends; then it
// gives the lead up.
func (s *Scheduler) Run(ctx context.Context, job *jobs.Job) {
	if s.leader != nil {
		defer s.leader.Resign()
	}
	// The tick is a fraction of the shortest interval, so that a check
	// falls due at most a tick late.
	t := time.NewTicker(max(s.every/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		_ = job.Run(ctx, s.Round)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Round probes every check that is due, concurrently, and waits for them.
func (s *Scheduler) Round(ctx context.Context) (jobs.Summary, error) {
	if s.leader != nil {
		// Once per interval, not per tick: a follower's campaign opens a
		// connection. A dead leader is replaced within an interval.
		if time.Since(s.campaigned) >= s.every {
			s.campaigned = time.Now()
			lead, err := s.leader.Campaign(ctx)
			if err != nil {
				s.leading = false
				s.logger.Warn("prober: leader election failed; not probing", zap.Error(err))
				return "", err
			}
			s.leading = lead
		}
		if !s.leading {
			return "another instance probes", nil
		}
	}
	now := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	counts := map[Outcome]int{}
	for i, t := range s.targets {
		for _, c := range t.Checks() {
			key := checkKey{i, c.Model, c.Channel}
			if !s.due(t, c, key, now) {
				continue
			}
			wg.Go(func() {
				res, sent := t.Probe(ctx, c)
				if !sent {
					return // the trial slots are taken by clients
				}
				s.mu.Lock()
				s.last[key] = now
				s.mu.Unlock()
				s.ledger.finished(c, res, time.Now())
				if res.Outcome != Passed {
					s.logger.Warn("probe did not pass", zap.String("model", c.Model), zap.String("channel", c.Channel),
						zap.String("result", string(res.Outcome)), zap.String("reason", res.Reason))
				}
				mu.Lock()
				counts[res.Outcome]++
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	return jobs.Summary(fmt.Sprintf("probes: %d passed, %d failed, %d rate limited, %d config errors",
		counts[Passed], counts[Failed], counts[Limited], counts[ConfigError])), nil
}

// due decides whether the check runs now: its interval has passed since
// it last ran, its channel is quiet, and its channel's daily budget is
// not spent.
func (s *Scheduler) due(t Target, c Check, key checkKey, now time.Time) bool {
	s.mu.Lock()
	last := s.last[key]
	s.mu.Unlock()
	if now.Sub(last) < c.Plan.Interval || !t.Quiet(c, now) {
		return false
	}
	over, stopped, spent := s.ledger.overBudget(c.Channel, c.Plan.Budget, now)
	if stopped {
		s.logger.Warn("daily probe budget spent; no more probes of this channel today",
			zap.String("channel", c.Channel), zap.String("spent", spent.String()), zap.String("budget", c.Plan.Budget.String()))
	}
	return !over
}

// The collectors live at package level, like the ledger's keeper, and
// are registered into every config's registry.
var (
	total = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "probes_total",
		Help: "Synthetic checks by channel and result (passed, failed, rate_limited, probe_config_error).",
	}, []string{"channel", "result"})
	spend = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "probe_spend_dollars_total",
		Help: "What synthetic checks cost, at the route's cost, by channel.",
	}, []string{"channel"})
	budgetSpent = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "probe_budget_spent",
		Help: "1 while a channel's daily probe budget is spent and its probes are stopped.",
	}, []string{"channel"})
)

// Collectors are the package's metrics, for a config's registry.
func Collectors() []prometheus.Collector { return []prometheus.Collector{total, spend, budgetSpent} }
