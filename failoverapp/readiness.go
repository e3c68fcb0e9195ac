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
}

// Readiness registers a check.
func (a *App) Readiness(c ReadinessCheck) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.checks = append(a.checks, c)
}

// Ready returns why the running config is not ready: a background job
// that is overdue (it has not succeeded for two of its intervals), or a
// registered check that fails. Nothing means ready.
func Ready(ctx context.Context) (reasons []string) {
	for _, s := range caddykit.Jobs.Statuses() {
		if s.Overdue {
			reasons = append(reasons, fmt.Sprintf("job %s is overdue (last success %s)", s.Name, s.LastSuccess.UTC().Format(time.RFC3339)))
		}
	}
	a := active()
	if a == nil {
		return reasons
	}
	a.mu.Lock()
	checks := append([]ReadinessCheck(nil), a.checks...)
	a.mu.Unlock()
	for _, c := range checks {
		ctx, cancel := context.WithTimeout(ctx, readyTimeout)
		err := c.Check(ctx)
		cancel()
		if err != nil {
			reasons = append(reasons, fmt.Sprintf("%s: %v", c.Name, err))
		}
	}
	return reasons
}
