package llmfailover

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
)

// RetrySame retries a channel once, before the chain moves on, after a
// transient failure: one of Statuses, or a 429 whose Retry-After is at
// most MaxWait. It keeps traffic on the cheaper channel of a cost-ordered
// chain through a blip, within the candidate's time budget. Off by
// default: the chain moves on at once.
type RetrySame struct {
	// Statuses are the upstream statuses retried on the same channel;
	// each must also be a retry_status, or the chain never sees it.
	Statuses []int `json:"statuses,omitempty"`
	// MaxWait is the longest Retry-After of a 429 worth waiting for;
	// a 429 without Retry-After, or with a longer one, moves on at once.
	MaxWait caddy.Duration `json:"max_wait,omitempty"`
}

// wait says whether f is worth retrying on its channel, and after how long.
func (r *RetrySame) wait(f *failure) (time.Duration, bool) {
	if r == nil || f == nil || f.reason != reasonStatus || !slices.Contains(r.Statuses, f.status) {
		return 0, false
	}
	if f.status == http.StatusTooManyRequests {
		return f.retryAfter, f.retryAfter > 0 && f.retryAfter <= time.Duration(r.MaxWait)
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

// unmarshalRetrySame parses retry_same <status...> [max_wait <duration>].
func unmarshalRetrySame(d *caddyfile.Dispenser) (*RetrySame, error) {
	r := &RetrySame{}
	for d.NextArg() {
		if d.Val() == "max_wait" {
			var err error
			if r.MaxWait, err = caddykit.DurationArg(d); err != nil {
				return nil, err
			}
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			break
		}
		code, err := strconv.Atoi(d.Val())
		if err != nil {
			return nil, d.Errf("retry_same: %q is not an HTTP status code", d.Val())
		}
		r.Statuses = append(r.Statuses, code)
	}
	if len(r.Statuses) == 0 {
		return nil, d.Errf("retry_same needs at least one status")
	}
	return r, nil
}

// checkRetrySame rejects a retry_same that could never apply.
func (h *Handler) checkRetrySame() error {
	r := h.RetrySame
	if r == nil {
		return nil
	}
	if len(r.Statuses) == 0 {
		return mistake(optionKey("retry_same"), "retry_same needs at least one status")
	}
	if r.MaxWait < 0 {
		return mistake(optionKey("retry_same"), "retry_same: max_wait must not be negative, got %s", time.Duration(r.MaxWait))
	}
	retried := h.RetryStatus
	if retried == nil {
		retried = DefaultRetryStatus
	}
	for _, s := range r.Statuses {
		if !slices.Contains(retried, s) {
			return mistake(optionKey("retry_same"), "retry_same: %d is not a retry_status, so it never fails over and is never retried", s)
		}
		if s == http.StatusTooManyRequests && r.MaxWait == 0 {
			return mistake(optionKey("retry_same"), "retry_same: 429 needs max_wait, the longest Retry-After worth waiting for")
		}
	}
	return nil
}
