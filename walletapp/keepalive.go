package walletapp

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/jobs"
)

// Keep-alive: a reservation expires reservation_ttl after it was made, and
// the sweeper releases it uncharged, so a request that outlives the TTL (a
// long stream: the client decides how long it lasts) would be free. Each
// store therefore keeps the reservations of its live requests from
// expiring: every TTL/3 one Extend per TTL moves them all another TTL
// ahead (in the store's memory, where lease-served reservations live; the
// lease rows themselves are kept by the renewer below). A live request
// costs a map insert and delete, not a ticker of its own; a request that
// exited without settling (its settlement failed) is no longer extended,
// so its reservation expires and is swept, as after a crash.

// liveSet is the reservations a store's live requests hold, by ID, with
// each one's wallet TTL.
type liveSet struct {
	mu  sync.Mutex
	ids map[string]time.Duration
	// minTTL is the shortest TTL of the wallets using the store: it sets
	// how often the holder extends and sweeps.
	minTTL time.Duration
}

func (l *liveSet) add(id string, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ids == nil {
		l.ids = map[string]time.Duration{}
	}
	l.ids[id] = ttl
}

func (l *liveSet) remove(id string) {
	l.mu.Lock()
	delete(l.ids, id)
	l.mu.Unlock()
}

// noteTTL records a wallet's TTL; the holder's loop reads the minimum.
func (l *liveSet) noteTTL(ttl time.Duration) {
	l.mu.Lock()
	if l.minTTL == 0 || ttl < l.minTTL {
		l.minTTL = ttl
	}
	l.mu.Unlock()
}

// byTTL snapshots the live IDs grouped by TTL.
func (l *liveSet) byTTL() map[time.Duration][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[time.Duration][]string{}
	for id, ttl := range l.ids {
		out[ttl] = append(out[ttl], id)
	}
	return out
}

// tick is the holder loop's period: a third of the shortest TTL (so a
// reservation is extended twice before it could expire), at most
// SweepEvery.
func (l *liveSet) tick() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.minTTL == 0 {
		return SweepEvery
	}
	return max(min(l.minTTL/3, SweepEvery), 10*time.Millisecond)
}

// extend moves every live reservation's expiry a TTL ahead of now.
func (h *storeHolder) extend() {
	groups := h.live.byTTL()
	if len(groups) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now()
	for ttl, ids := range groups {
		if _, err := h.store.Extend(ctx, ids, now.Add(ttl)); err != nil {
			keepAliveTotal.WithLabelValues("error").Inc()
			h.logger.Error("extending live reservations failed; they expire unless a later extension succeeds",
				zap.Int("count", len(ids)), zap.Error(err))
			continue
		}
		keepAliveTotal.WithLabelValues("ok").Inc()
	}
}

// Leases: the store serves reservations from credit leases (see package
// wallet) that expire unless extended, and gives back the spare money of
// idle ones; both happen in Store.Renew, which the renewer calls every
// leaseRenewEvery. Most calls write nothing: the leases' expiry moves once
// a third of lease_ttl has passed.
const leaseRenewEvery = time.Second

// renewerStallLimit is how long the renewer may go without a successful
// run before the sweeper's runs fail: leases not renewed stop being served
// from (every request then waits for a grow), and the sweeper's heartbeat
// is the one operators watch.
const renewerStallLimit = 10 * leaseRenewEvery

// renewer renews the store's leases until the holder stops, each tick a
// run of the lease job (recorded, visible in /llm_failover/jobs, pinging
// the heartbeats attached to it). It stops after the sweeper, which may
// still need leases for draining requests. A panic is logged and the
// renewer goes on.
func (h *storeHolder) renewer() {
	defer close(h.renewed)
	t := time.NewTicker(leaseRenewEvery)
	defer t.Stop()
	for {
		select {
		case <-h.done:
			return
		case <-t.C:
		}
		h.renewRecovering()
	}
}

func (h *storeHolder) renewRecovering() {
	defer func() {
		if r := recover(); r != nil {
			h.logger.Error("credit lease renewer panicked; it runs again at the next tick",
				zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = runJobs(ctx, h.namedJobs(h.leaseJob, LeaseJobPrefix), func(ctx context.Context) (jobs.Summary, error) {
		if err := h.store.Renew(ctx); err != nil {
			keepAliveTotal.WithLabelValues("error").Inc()
			h.logger.Error("renewing credit leases failed; a lease that is not renewed in time is no longer served from",
				zap.Error(err))
			return "", err
		}
		return "renewed", nil
	})
}

// renewerStalled reports, for the sweeper's run, a renewer that has not
// succeeded for renewerStallLimit, so that one heartbeat (the sweeper's)
// covers both jobs.
func (h *storeHolder) renewerStalled(now time.Time) error {
	st := h.leaseJob.Status(now)
	since := st.LastSuccess
	if since.IsZero() {
		since = h.opened
	}
	if now.Sub(since) <= renewerStallLimit {
		return nil
	}
	msg := "never succeeded"
	if st.LastError != "" {
		msg = "last error: " + st.LastError
	}
	return fmt.Errorf("credit lease renewer %s has not succeeded for %s (%s)", st.Name, now.Sub(since).Round(time.Second), msg)
}
