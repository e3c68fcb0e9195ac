package failoverapp

import (
	"context"
	"fmt"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
)

// readyTimeout bounds one readiness check.
const readyTimeout = 2 * time.Second

// ReadinessCheck is one condition a handler or app needs to serve (a
// wallet store it cannot serve without, say).
type ReadinessCheck struct {
	// Name says what is checked, e.g. "wallet default".
	Name string
	// Check returns why it is not ready, nil when it is.
	Check func(ctx context.Context) error
	// Shared marks a dependency every instance shares (a PostgreSQL
	// database) or one the instance serves without (on_store_error
	// allow): its failure is reported, but does not make the instance
	// unready. Every instance would go unready at once, and a load
	// balancer would drop every site this Caddy serves.
	Shared bool
}

// Readiness registers a check.
func (a *App) Readiness(c ReadinessCheck) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.checks = append(a.checks, c)
}

// Ready returns why the running config cannot serve (unready: a
// background job that stopped running, or a failing check of the
// instance's own), and what it serves despite (degraded: a job that runs
// but fails, or a failing Shared check). Both empty means ready.
//
// A job that runs on schedule but fails is failing on what it talks to,
// and what it talks to is shared (a database, an upstream): making every
// instance unready for it would only take the sites down with it. A job
// that stopped running is this process's own fault.
func Ready(ctx context.Context) (unready, degraded []string) {
	now := time.Now()
	for _, s := range caddykit.Jobs.Statuses() {
		if !s.Overdue {
			continue
		}
		last := s.LastSuccess.UTC().Format(time.RFC3339)
		if s.LastSuccess.IsZero() {
			last = "never"
		}
		if now.Sub(s.LastStart) <= 2*s.Every {
			degraded = append(degraded, fmt.Sprintf("job %s is failing (last success %s)", s.Name, last))
		} else {
			unready = append(unready, fmt.Sprintf("job %s is overdue (last success %s)", s.Name, last))
		}
	}
	a := active()
	if a == nil {
		return unready, degraded
	}
	a.mu.Lock()
	checks := append([]ReadinessCheck(nil), a.checks...)
	a.mu.Unlock()
	for _, c := range checks {
		ctx, cancel := context.WithTimeout(ctx, readyTimeout)
		err := c.Check(ctx)
		cancel()
		switch {
		case err == nil:
		case c.Shared:
			degraded = append(degraded, fmt.Sprintf("%s: %v", c.Name, err))
		default:
			unready = append(unready, fmt.Sprintf("%s: %v", c.Name, err))
		}
	}
	return unready, degraded
}
