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

// Route is one channel of one model a Target offers to probe.
type Route struct {
	Model   string
	Channel string
	Plan    Plan
	// ID is the Target's own handle on the route.
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

// Target sends probes and judges their answers exactly as it judges real
// traffic.
type Target interface {
	// Routes lists the routes the target offers to probe.
	Routes() []Route
	// Quiet reports whether nothing but a probe tells about the route's
	// channel at now: it is half-open (the probe is then its trial), or
	// closed with no real traffic for the route's interval. An open or
	// parked channel, or one no probe can be written for, is never quiet.
	Quiet(r Route, now time.Time) bool
	// Probe sends one probe of the route; sent is false when the
	// channel's breaker admitted nothing (its trial slots are taken by
	// clients).
	Probe(ctx context.Context, r Route) (res Result, sent bool)
}

// Leader is the election of the one instance of a fleet that probes.
type Leader interface {
	// Campaign tries to take or keep the lead.
	Campaign(ctx context.Context) (bool, error)
	// Resign gives the lead up.
	Resign()
}

// Scheduler runs rounds of the probes that are due. It is made for one
// config and run by it until that config stops.
type Scheduler struct {
	targets []Target
	ledger  *Ledger
	leader  Leader // nil: this instance always probes
	logger  *zap.Logger
	every   time.Duration

	mu   sync.Mutex
	last map[routeKey]time.Time // when each route was last probed

	// Only the round goroutine touches these.
	campaigned time.Time // when this instance last asked to lead
	leading    bool
}

type routeKey struct {
	target         int
	model, channel string
}

// NewScheduler returns the scheduler of the targets' routes, recording
// into ledger; nil when no target offers one.
func NewScheduler(targets []Target, ledger *Ledger, leader Leader, logger *zap.Logger) *Scheduler {
	s := &Scheduler{ledger: ledger, leader: leader, logger: logger, last: map[routeKey]time.Time{}}
	for _, t := range targets {
		routes := t.Routes()
		if len(routes) == 0 {
			continue
		}
		s.targets = append(s.targets, t)
		for _, c := range routes {
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

// Every is the shortest interval of any route: how often the job is
// meant to run.
func (s *Scheduler) Every() time.Duration { return s.every }

// Run runs a round every tick, recorded as job, until ctx ends; then it
// gives the lead up.
func (s *Scheduler) Run(ctx context.Context, job *jobs.Job) {
	if s.leader != nil {
		defer s.leader.Resign()
	}
	// The tick is a fraction of the shortest interval, so that a route
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

// Round probes every route that is due, concurrently, and waits for them.
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
		for _, c := range t.Routes() {
			key := routeKey{i, c.Model, c.Channel}
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

// due decides whether the route is probed now: its interval has passed
// since its last probe, its channel is quiet, and its channel's daily budget is
// not spent.
func (s *Scheduler) due(t Target, c Route, key routeKey, now time.Time) bool {
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
