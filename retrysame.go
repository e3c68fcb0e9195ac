package llmfailover

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
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

// tryRoute is try, plus at most one retry on the same channel when
// retry_same asks for it and the candidate's budget leaves room. The
// failed attempt is recorded like any other (the breaker counts it); the
// retry needs a fresh ticket, so a half-open channel whose trial slots
// are taken moves on.
func (h *Handler) tryRoute(x *exchange, route *chain.Route, ticket breaker.Ticket, budget time.Duration) attemptResult {
	began := time.Now()
	res := h.try(x, route, ticket, budget)
	if res.done || x.probe {
		return res
	}
	wait, ok := h.RetrySame.wait(res.fail)
	left := budget - time.Since(began) - wait
	if !ok || left <= 0 {
		return res
	}
	h.logger.Warn("retrying the same channel",
		zap.String("model", x.req.Model), zap.String("channel", route.Name),
		zap.Int("attempt", x.attempts), zap.String("reason", res.fail.reason),
		zap.Int("upstream_status", res.fail.status), zap.Duration("wait", wait))
	h.app.decided(x, route.Name, res.fail, route.Name)
	if !sleepCtx(x.r.Context(), wait) {
		return res
	}
	if ticket, ok = h.channels[route.Channel].state.breaker.Admit(time.Now()); !ok {
		return res
	}
	x.attempts++
	x.setVar("http.llm_failover.attempts", strconv.Itoa(x.attempts))
	return h.try(x, route, ticket, left)
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
