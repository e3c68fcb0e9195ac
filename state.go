package llmfailover

import (
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/breaker"
)

// channelStates holds what must outlive a config reload: each channel's
// breaker, keyed by channel name and base URL, so that `caddy reload` does
// not forget that a channel is failing.
var channelStates = caddy.NewUsagePool()

// channelState is one channel's health, shared by every handler (and every
// config generation) that declares the same channel.
type channelState struct {
	name    string
	breaker *breaker.Breaker
}

// Destruct implements caddy.Destructor.
func (*channelState) Destruct() error { return nil }

func loadChannelState(key, name string, cfg breaker.Config) (*channelState, error) {
	v, _, err := channelStates.LoadOrNew(key, func() (caddy.Destructor, error) {
		return &channelState{name: name, breaker: breaker.New(cfg)}, nil
	})
	if err != nil {
		return nil, err
	}
	// A reload keeps the state; Provision applies the new settings to it
	// once the whole handler has provisioned, so that a config that fails
	// to load cannot change the running breakers.
	return v.(*channelState), nil
}

// health adapts a handler's channels to chain.Health.
type health []*channel

func (hs health) Available(i int, now time.Time) bool {
	return hs[i].state.breaker.Available(now)
}

func (hs health) ReadyAt(i int, now time.Time) (time.Time, bool) {
	b := hs[i].state.breaker
	// A channel that is open and also inside a Retry-After counts as
	// parked: the upstream asked not to be sent anything until then, so
	// it must not be the one probed.
	return b.ReadyAt(now), !b.Snapshot(now).ParkedUntil.IsZero()
}

func (hs health) SuccessRate(i int) float64 {
	rate, _ := hs[i].state.breaker.SuccessRate()
	return rate
}

// live is the set of provisioned handlers, which the admin API reads: admin
// modules are separate instances, re-created on every config load, so they
// cannot hold a pointer to a handler.
var live = &liveHandlers{m: make(map[*Handler]struct{})}

type liveHandlers struct {
	mu sync.Mutex
	m  map[*Handler]struct{}
}

func (l *liveHandlers) add(h *Handler) {
	l.mu.Lock()
	l.m[h] = struct{}{}
	l.mu.Unlock()
}

func (l *liveHandlers) remove(h *Handler) {
	l.mu.Lock()
	delete(l.m, h)
	l.mu.Unlock()
}

func (l *liveHandlers) list() []*Handler {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*Handler, 0, len(l.m))
	for h := range l.m {
		out = append(out, h)
	}
	return out
}
