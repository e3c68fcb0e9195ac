package failoverapp

import (
	"context"
	"errors"
	"runtime/debug"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/history/store"
	"github.com/llmfailover/caddy-llm-failover/internal/expiry"
)

// A provider's prompt cache lives on the channel that wrote it, so the
// next turn of a conversation is cheap only on the channel that served
// the last one. The affinity table remembers that channel per model and
// conversation (provider.ConversationKey), for the process: it outlives
// reloads, like the breakers, and a conversation whose entry expired (its
// cache has too) is routed as any request. With a PostgreSQL history
// store the fleet shares the table: each instance writes the turns it
// served there and reads it before its own, so a conversation keeps its
// channel whichever instance its next turn reaches.

// Pin is the channel that served a conversation's last turn and what
// that turn left: Cached, the prompt tokens now in the channel's cache,
// and Output, the turn's output tokens (the next one's estimate).
type Pin struct {
	Channel        string
	Cached, Output int64
}

// maxAffinityEntries bounds the table: about 230 bytes an entry, 23 MB.
const maxAffinityEntries = 100_000

type affinityEntry struct {
	Pin
	expires time.Time
	// shared is the expiry the fleet's table was last given for this
	// entry (zero: never), so that a conversation staying put is written
	// again only once half its lifetime has passed.
	shared time.Time
}

var affinity = struct {
	sync.Mutex
	m map[string]affinityEntry
	// expiry orders m's keys by their entries' expiry: a full table
	// forgets its first, in O(log n) under the lock every request with
	// affinity takes.
	expiry expiry.Queue[string]
}{m: make(map[string]affinityEntry)}

// putAffinityLocked sets k's entry. A full table first forgets the entry
// that expires soonest (an expired one, if any): a forgotten conversation
// is only routed as any request.
func putAffinityLocked(k string, e affinityEntry) {
	if _, known := affinity.m[k]; !known {
		for len(affinity.m) >= maxAffinityEntries && affinity.expiry.Len() > 0 {
			first, _, _ := affinity.expiry.First()
			delete(affinity.m, first)
			affinity.expiry.Remove(first)
		}
	}
	affinity.m[k] = e
	affinity.expiry.Set(k, e.expires)
}

// Affinity is the pin of conversation key of model, unless none was made
// within its lifetime. With a fleet's table, the later of the fleet's pin
// and this process's wins; a table that cannot be read within
// pinReadTimeout leaves this process's.
func (a *App) Affinity(ctx context.Context, model, key string, now time.Time) (Pin, bool) {
	k := model + "\x00" + key
	affinity.Lock()
	local, ok := affinity.m[k]
	affinity.Unlock()
	ok = ok && now.Before(local.expires)
	if h := a.fleetAffinity(); h != nil {
		if p, found := h.pinOf(ctx, model, key, now); found && (!ok || p.Expires.After(local.expires)) {
			local = affinityEntry{Pin: Pin{Channel: p.Channel, Cached: p.Cached, Output: p.Output}, expires: p.Expires, shared: p.Expires}
			affinity.Lock()
			putAffinityLocked(k, local)
			affinity.Unlock()
			return local.Pin, true
		}
	}
	if !ok {
		return Pin{}, false
	}
	return local.Pin, true
}

// RememberAffinity pins conversation key of model to p for ttl (see
// putAffinityLocked for a full table).
func (a *App) RememberAffinity(model, key string, p Pin, ttl time.Duration, now time.Time) {
	k := model + "\x00" + key
	e := affinityEntry{Pin: p, expires: now.Add(ttl)}
	affinity.Lock()
	old, known := affinity.m[k]
	share := !known || old.Channel != p.Channel || now.After(old.shared.Add(-ttl/2))
	if !share {
		e.shared = old.shared
	} else {
		e.shared = e.expires
	}
	putAffinityLocked(k, e)
	affinity.Unlock()
	if share {
		if h := a.fleetAffinity(); h != nil {
			h.sharePin(store.Pin{Model: model, Conversation: key, Channel: p.Channel, Cached: p.Cached, Output: p.Output, Expires: e.expires})
		}
	}
}

// fleetAffinity is the history holder whose store the fleet shares, nil
// without one (no store, or an SQLite file: one instance's).
func (a *App) fleetAffinity() *historyHolder {
	if a.status == nil {
		return nil
	}
	if h := a.status.attached(); h != nil && h.remote {
		return h
	}
	return nil
}

// Bounds of the fleet's table: a lookup waits at most pinReadTimeout on
// the request's path, and after a failed one the process uses its own
// table for pinReadRetry without asking; at most maxPendingPins wait to
// be written (more are dropped: affinity saves money, it is never what
// serves a request).
const (
	pinReadTimeout  = 200 * time.Millisecond
	pinReadRetry    = 10 * time.Second
	pinWriteTimeout = 5 * time.Second
	maxPendingPins  = 10_000
	pinErrorLogGap  = time.Minute
)

// pinQueue is what a history holder shares of the affinity table: the
// pins waiting to be written and when reading or writing last failed.
type pinQueue struct {
	mu         sync.Mutex
	pending    map[string]store.Pin
	readFailed time.Time
	errLogged  time.Time
	// wake is signalled when pending gains a pin; the flusher writes it.
	wake chan struct{}
}

func newPinQueue() pinQueue { return pinQueue{wake: make(chan struct{}, 1)} }

// pinOf reads the fleet's pin of conversation key of model.
func (h *historyHolder) pinOf(ctx context.Context, model, key string, now time.Time) (store.Pin, bool) {
	h.pins.mu.Lock()
	resting := !h.pins.readFailed.IsZero() && now.Sub(h.pins.readFailed) < pinReadRetry
	h.pins.mu.Unlock()
	if resting {
		return store.Pin{}, false
	}
	db, err := h.opened()
	if err != nil {
		return store.Pin{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, pinReadTimeout)
	defer cancel()
	p, ok, err := db.PinOf(ctx, model, key, now)
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			return store.Pin{}, false // the client went away: the store is not at fault
		}
		h.pins.mu.Lock()
		h.pins.readFailed = now
		h.pins.mu.Unlock()
		h.pinError("reading the fleet's cache affinity failed; this instance uses its own for a while", err)
		return store.Pin{}, false
	}
	return p, ok
}

// sharePin queues p to be written to the fleet's table.
func (h *historyHolder) sharePin(p store.Pin) {
	k := p.Model + "\x00" + p.Conversation
	h.pins.mu.Lock()
	if h.pins.pending == nil {
		h.pins.pending = make(map[string]store.Pin)
	}
	if _, ok := h.pins.pending[k]; ok || len(h.pins.pending) < maxPendingPins {
		h.pins.pending[k] = p
	}
	h.pins.mu.Unlock()
	select {
	case h.pins.wake <- struct{}{}:
	default:
	}
}

// writePins writes the pending pins; on failure they are put back, unless
// a later turn's pin replaced them meanwhile.
func (h *historyHolder) writePins(ctx context.Context) (int, error) {
	h.pins.mu.Lock()
	pending := h.pins.pending
	h.pins.pending = nil
	h.pins.mu.Unlock()
	if len(pending) == 0 {
		return 0, nil
	}
	db, err := h.opened()
	if err == nil {
		pins := make([]store.Pin, 0, len(pending))
		for _, p := range pending {
			pins = append(pins, p)
		}
		if err = db.SavePins(ctx, pins); err == nil {
			return len(pins), nil
		}
	}
	h.pins.mu.Lock()
	defer h.pins.mu.Unlock()
	if h.pins.pending == nil {
		h.pins.pending = pending
	} else {
		for k, p := range pending {
			if _, newer := h.pins.pending[k]; !newer && len(h.pins.pending) < maxPendingPins {
				h.pins.pending[k] = p
			}
		}
	}
	return 0, err
}

// writePinsNow is the flusher's prompt write of what sharePin queued.
func (h *historyHolder) writePinsNow() {
	defer func() {
		if r := recover(); r != nil {
			h.logger.Error("writing the fleet's cache affinity panicked", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), pinWriteTimeout)
	defer cancel()
	if _, err := h.writePins(ctx); err != nil {
		h.pinError("writing the fleet's cache affinity failed; it is tried again with the next flush", err)
	}
}

// pinError logs a failure of the fleet's table at most once per
// pinErrorLogGap: on a busy gateway a store outage fails every lookup.
func (h *historyHolder) pinError(msg string, err error) {
	h.pins.mu.Lock()
	now := time.Now()
	quiet := now.Sub(h.pins.errLogged) < pinErrorLogGap
	if !quiet {
		h.pins.errLogged = now
	}
	h.pins.mu.Unlock()
	if !quiet {
		h.logger.Warn(msg, zap.Error(err))
	}
}
