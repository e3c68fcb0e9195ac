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
	// Ref tells the channel's identity (its base URL and credentials)
	// apart from another's of the same name: a reload that changes them
	// makes a new channel, whose first probe is due at once.
	Ref  string
	Plan Plan
	// ID is the Target's own handle on the route.
	ID int
	// MaxCost is the most one probe of the route can cost (its prompt
	// and Plan.MaxTokens at the route's price), held against the daily
	// budget while the probe runs. 0 when the target cannot tell: the
	// channel's probes of unknown cost then go one at a time, and the
	// budget may be overshot by one probe.
	MaxCost wallet.Micros
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
	// Run campaigns for the lead, and proves it alive while it holds it,
	// until ctx ends; then it gives the lead up. It calls changed after
	// its first campaign and whenever the lead changes hands.
	Run(ctx context.Context, changed func())
	// Leading reports whether this instance leads now (not at its last
	// campaign: a lead it can no longer prove is lost at once). When it
	// does not, err says why it cannot tell whether another instance
	// leads; false with nil err means another instance does.
	Leading() (bool, error)
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
	led  bool                   // this instance led at the last round, for the log

	// wake runs a round at once: the lead changed hands.
	wake chan struct{}
}

type routeKey struct {
	target         int
	model, channel string
}

// NewScheduler returns the scheduler of the targets' routes, recording
// into ledger; nil when no target offers one.
func NewScheduler(targets []Target, ledger *Ledger, leader Leader, logger *zap.Logger) *Scheduler {
	s := &Scheduler{ledger: ledger, leader: leader, logger: logger, last: map[routeKey]time.Time{}, wake: make(chan struct{}, 1)}
	for _, t := range targets {
		routes := t.Routes()
		if len(routes) == 0 {
			continue
		}
		s.targets = append(s.targets, t)
		for _, c := range routes {
			// A reload keeps the interval: a route probed by the previous
			// config is not due again before its interval has passed.
			s.last[routeKey{len(s.targets) - 1, c.Model, c.Channel}] = ledger.lastProbed(c)
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

// Every is how often the job runs a round: a quarter of the shortest
// interval of any route, so that a route falls due at most a tick late.
// It is what the job reports and is judged overdue against.
func (s *Scheduler) Every() time.Duration { return max(s.every/4, 10*time.Millisecond) }

// Run runs a round every tick, recorded as job, until ctx ends. With a
// leader it runs the election alongside, runs a round as soon as this
// instance takes the lead (a new leader does not wait for a tick, which
// may be long), and gives the lead up when ctx ends.
func (s *Scheduler) Run(ctx context.Context, job *jobs.Job) {
	if s.leader != nil {
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.leader.Run(ctx, s.poke)
		}()
		defer func() { <-done }()
		// The first round waits for the first campaign, which is
		// bounded: before it nobody can tell who probes.
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		}
	}
	t := time.NewTicker(s.Every())
	defer t.Stop()
	for {
		_ = job.Run(ctx, s.Round)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.wake:
		}
	}
}

// poke asks for a round at once.
func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// leads reports whether this instance probes now.
func (s *Scheduler) leads() (bool, error) {
	if s.leader == nil {
		return true, nil
	}
	return s.leader.Leading()
}

// Round probes every route that is due, concurrently, and waits for them.
// With a leader, only while this instance leads: the lead is asked again
// before each probe goes, so a leader that lost it (its process was
// frozen past its lease) starts no probe alongside the new one.
func (s *Scheduler) Round(ctx context.Context) (jobs.Summary, error) {
	lead, err := s.leads()
	if s.leader != nil {
		s.mu.Lock()
		changed := lead != s.led
		s.led = lead
		s.mu.Unlock()
		switch {
		case changed && lead:
			s.logger.Info("prober: this instance leads the probes of the fleet")
		case changed:
			s.logger.Info("prober: this instance no longer leads the probes")
		}
	}
	if err != nil {
		s.logger.Warn("prober: leader election failed; not probing", zap.Error(err))
		return "", err
	}
	if !lead {
		// True as the elector tells it: a session that proved itself
		// alive within the election's timeout holds the lead.
		return "another instance probes", nil
	}
	now := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	counts := map[Outcome]int{}
	var unsent string // the first probe that could not check its channel
	lostLead := 0
	for i, t := range s.targets {
		for _, c := range t.Routes() {
			key := routeKey{i, c.Model, c.Channel}
			if !s.due(t, c, key, now) || !s.ledger.claim(c) {
				// Not due, or a probe of the route is under way (another
				// config's, during a reload): probes never pile up.
				continue
			}
			wg.Go(func() {
				defer s.ledger.unclaim(c)
				h := s.hold(ctx, c, now)
				if h == nil {
					return
				}
				if lead, _ := s.leads(); !lead {
					h.release()
					mu.Lock()
					lostLead++
					mu.Unlock()
					return
				}
				res, sent := t.Probe(ctx, c)
				if !sent {
					h.release()
					return // the trial slots are taken by clients
				}
				if ctx.Err() != nil {
					// The prober stopped (a reload, a shutdown) under the
					// probe: what it cost is spent, but it found nothing
					// about the channel.
					h.interrupted(res.Cost, time.Now())
					return
				}
				s.mu.Lock()
				s.last[key] = now
				s.mu.Unlock()
				s.ledger.noteProbed(c, now)
				h.settle(res, time.Now())
				if res.Outcome != Passed {
					s.logger.Warn("probe did not pass", zap.String("model", c.Model), zap.String("channel", c.Channel),
						zap.String("result", string(res.Outcome)), zap.String("reason", res.Reason))
				}
				mu.Lock()
				counts[res.Outcome]++
				if res.Outcome == ConfigError && unsent == "" {
					unsent = c.Channel + ": " + res.Reason
				}
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	summary := fmt.Sprintf("probes: %d passed, %d failed, %d rate limited, %d config errors",
		counts[Passed], counts[Failed], counts[Limited], counts[ConfigError])
	if lostLead > 0 {
		summary += fmt.Sprintf("; lead lost, %d not sent", lostLead)
	}
	if n := counts[ConfigError]; n > 0 {
		// The job could not do its work (a probe account that does not
		// exist, a probe the upstream refuses as malformed): a failed run,
		// so that its heartbeat and readiness say so. A probe that failed
		// on the channel did its work.
		return jobs.Summary(summary), fmt.Errorf("%d probe(s) could not check their channel (first: %s)", n, unsent)
	}
	return jobs.Summary(summary), nil
}

// due decides whether the route may be probed now: its interval has
// passed since its last probe and its channel is quiet. Its budget is
// checked when the probe holds its cost (hold).
func (s *Scheduler) due(t Target, c Route, key routeKey, now time.Time) bool {
	s.mu.Lock()
	last := s.last[key]
	s.mu.Unlock()
	return now.Sub(last) >= c.Plan.Interval && t.Quiet(c, now)
}

// hold holds the probe's cost against its channel's daily budget; nil
// when the budget has no room for it now.
func (s *Scheduler) hold(ctx context.Context, c Route, now time.Time) *Hold {
	h, stopped, spent := s.ledger.hold(ctx, c, c.Plan.Budget, now)
	if stopped {
		s.logger.Warn("what is left of the daily probe budget cannot cover another probe; no more probes of this channel today",
			zap.String("channel", c.Channel), zap.String("spent", spent.String()), zap.String("budget", c.Plan.Budget.String()),
			zap.String("probe_max_cost", c.MaxCost.String()))
	}
	return h
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
)

// Collectors are the package's metrics, for a config's registry.
// Whether a channel's day's budget is spent is read at scrape time by
// whoever knows which channels the running config probes (Ledger.View):
// a gauge set here would go on saying "spent" for a channel a reload
// removed, which no probe ever rolls into a new day.
func Collectors() []prometheus.Collector { return []prometheus.Collector{total, spend} }
