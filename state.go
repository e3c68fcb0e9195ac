package llmfailover

import (
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/breaker"
)

// channelStates holds what must outlive a config reload: each channel's
// breaker (with its trial accounting), keyed by the channel's identity, so
// that `caddy reload` does not forget that a channel is failing.
var channelStates = caddy.NewUsagePool()

// channelState is one channel's health, shared by every handler (and every
// config generation) that declares the same channel.
type channelState struct {
	name    string
	baseURL string // redacted, for views and events
	breaker *breaker.Breaker
	// lastUsed is when real traffic last reached the channel (Unix
	// nanoseconds), so that only idle channels are probed.
	lastUsed atomic.Int64
}

func (s *channelState) touch(now time.Time) { s.lastUsed.Store(now.UnixNano()) }

// lastTraffic is when real traffic last reached the channel; zero time
// when none has.
func (s *channelState) lastTraffic() time.Time {
	if n := s.lastUsed.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Destruct implements caddy.Destructor.
func (*channelState) Destruct() error { return nil }

// channelIdentity is the pool key of a channel: its name, its base URL and
// a fingerprint of its credentials (provider.ChannelCredentials), so that
// two sites declaring the same name and URL with different keys (two
// accounts at one provider) get two breakers, while a reload that keeps the
// channel keeps its health. The key holds only a hash, never a secret.
func channelIdentity(name string, base *url.URL, credentials []string) string {
	sorted := slices.Sorted(slices.Values(credentials))
	sum := sha256.Sum256([]byte(strings.Join(sorted, "\x00")))
	return name + " " + base.String() + " " + hex.EncodeToString(sum[:8])
}

func loadChannelState(key, name, baseURL string, cfg breaker.Config) (*channelState, error) {
	v, _, err := channelStates.LoadOrNew(key, func() (caddy.Destructor, error) {
		return &channelState{name: name, baseURL: baseURL, breaker: breaker.New(cfg)}, nil
	})
	if err != nil {
		return nil, err
	}
	// A reload keeps the state; the registry applies the new settings to
	// it once the whole config has provisioned (App.Start), so that a
	// config that fails to load cannot change the running breakers.
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
