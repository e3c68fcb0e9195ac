package failoverapp

import (
	"context"
	"hash/fnv"

	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/internal/leader"
	"github.com/llmfailover/caddy-llm-failover/jobs"
	"github.com/llmfailover/caddy-llm-failover/probe"
)

// ProberJob is the prober's name in the jobs view and for heartbeats.
const ProberJob = "prober"

// Probes registers a handler's synthetic checks; the prober runs them
// while the config runs.
func (a *App) Probes(t probe.Target) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.probes = append(a.probes, t)
}

// prober runs one config's synthetic checks, as the job "prober", which
// it holds (jobs.Job.Acquire) while it runs: a config without probes, or
// one that stopped, leaves no job behind to go overdue.
type prober struct {
	job    *jobs.Job
	cancel context.CancelFunc
	done   chan struct{}
}

// proberLockKey is the advisory lock the probing instance holds.
func proberLockKey() int64 {
	f := fnv.New64a()
	_, _ = f.Write([]byte("caddy-llm-failover prober"))
	return int64(f.Sum64())
}

// startProber starts the checks of targets, nil when none offers one.
// With a leader DSN only the instance holding the lock probes, while it
// proves itself alive (internal/leader: a frozen or partitioned leader is
// replaced within about SessionTimeout + CampaignEvery); the scheduler
// runs the election on its own goroutine and asks it before each probe.
func startProber(targets []probe.Target, leaderDSN string, logger *zap.Logger) *prober {
	var elector probe.Leader
	if leaderDSN != "" {
		elector = leader.New(leaderDSN, proberLockKey())
	}
	s := probe.NewScheduler(targets, probes, elector, logger.Named("prober"))
	if s == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &prober{job: caddykit.Jobs.Job(ProberJob, s.Every()), cancel: cancel, done: make(chan struct{})}
	p.job.Acquire()
	go func() {
		defer close(p.done)
		s.Run(ctx, p.job)
	}()
	return p
}

// stop ends the rounds, waits for the one running, gives the lead up and
// retires the job.
func (p *prober) stop() {
	p.cancel()
	<-p.done
	p.job.Release()
}
