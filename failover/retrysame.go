package failover

import (
	"context"
	"net/http"
	"slices"
	"time"
)

// RetrySame retries a channel once, before the chain moves on, after a
// transient failure: one of Statuses, or a 429 whose Retry-After is at
// most MaxWait. It keeps traffic on the cheaper channel of a cost-ordered
// chain through a blip, within the candidate's time budget.
type RetrySame struct {
	// Statuses are the upstream statuses retried on the same channel.
	Statuses []int
	// MaxWait is the longest Retry-After of a 429 worth waiting for.
	MaxWait time.Duration
}

// wait says whether f is worth retrying on its channel, and after how long.
func (r *RetrySame) wait(f *failure) (time.Duration, bool) {
	if r == nil || f == nil || f.reason != reasonStatus || !slices.Contains(r.Statuses, f.status) {
		return 0, false
	}
	if f.status == http.StatusTooManyRequests {
		return f.retryAfter, f.retryAfter > 0 && f.retryAfter <= r.MaxWait
	}
	return 0, true
}

// sleepCtx waits d, or less when ctx ends first; it reports whether the
// whole wait passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
