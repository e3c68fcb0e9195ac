package failoverapp

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
)

// readyTimeout bounds one readiness check.
const readyTimeout = 2 * time.Second

// ReadinessCheck is one condition a handler or app needs to serve (a
// wallet store it cannot serve without, say).
type ReadinessCheck struct {
	// Name says what is checked, e.g. "wallet default".
	Name string
	// Check returns why it is not ready, nil when it is; the error is
	// logged, never shown.
	Check func(ctx context.Context) error
	// Failing is what /ready shows when Check fails, e.g. "store
	// unreachable".
	Failing string
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
func Ready() (unready, degraded []string) {
	now := time.Now()
	for _, s := range caddykit.Jobs.Statuses() {
		if !s.Overdue {
			continue
		}
		last := s.LastSuccess.UTC().Format(time.RFC3339)
		if s.LastSuccess.IsZero() {
			last = "never"
		}
		switch {
		case s.Hung:
			// Most likely waiting on what it talks to (a database that
			// accepts connections and never answers), which every
			// instance shares: as a failing job, degraded.
			degraded = append(degraded, fmt.Sprintf("job %s is hung in a run started %s (last success %s)",
				s.Name, s.LastStart.UTC().Format(time.RFC3339), last))
		case now.Sub(s.LastStart) <= 2*s.Every:
			degraded = append(degraded, fmt.Sprintf("job %s is failing (last success %s)", s.Name, last))
		default:
			unready = append(unready, fmt.Sprintf("job %s is overdue (last success %s)", s.Name, last))
		}
	}
	a := active()
	if a == nil {
		return unready, degraded
	}
	u, d := a.checked()
	return append(unready, u...), append(degraded, d...)
}

// readyCache is how long the checks' outcome is reused: /ready is often
// unauthenticated and polled by every load balancer, and each check may
// cost a database round trip.
const readyCache = 2 * time.Second

// checkOutcome is the outcome of one run of the registered checks.
type checkOutcome struct {
	at                time.Time
	unready, degraded []string
}

// checked runs the registered checks, at most once per readyCache; while
// a run is under way, callers get the last outcome instead of waiting.
// A reason names the check and what failed, never the driver's error,
// which may name the database's host, user and name (it is logged).
func (a *App) checked() (unready, degraded []string) {
	a.mu.Lock()
	last := a.readiness
	if a.checking || (!last.at.IsZero() && time.Since(last.at) < readyCache) {
		a.mu.Unlock()
		return last.unready, last.degraded
	}
	a.checking = true
	checks := append([]ReadinessCheck(nil), a.checks...)
	a.mu.Unlock()

	var out checkOutcome
	for _, c := range checks {
		ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		err := c.Check(ctx)
		cancel()
		if err == nil {
			continue
		}
		a.logger.Warn("readiness check failed", zap.String("check", c.Name), zap.Bool("shared", c.Shared), zap.Error(err))
		reason := c.Name + ": " + c.Failing
		if c.Shared {
			out.degraded = append(out.degraded, reason)
		} else {
			out.unready = append(out.unready, reason)
		}
	}
	out.at = time.Now()
	a.mu.Lock()
	a.readiness, a.checking = out, false
	a.mu.Unlock()
	return out.unready, out.degraded
}
