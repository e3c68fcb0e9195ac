package failoverapp

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/internal/redact"
	"github.com/llmfailover/caddy-llm-failover/latency"
)

// channels holds what must outlive a config reload: each channel's
// breaker (with its trial accounting), keyed by the channel's identity,
// so that `caddy reload` does not forget that a channel is failing.
var channels = caddy.NewUsagePool()

// Channel is one channel's health, shared by every handler (and every
// config generation) that declares the same channel identity.
type Channel struct {
	Name    string
	BaseURL string // redacted, for views and events
	// Ref tells the channel's identity apart from another's of the same
	// name (another base URL or credentials) without holding a secret: a
	// short hash of it, for state kept by name outside the pool, such as
	// cache affinity's pins.
	Ref     string
	Breaker *breaker.Breaker
	// Latency is what the channel's waits usually take, for its learned
	// deadlines (adaptive_deadlines) and hedge_after pNN: kept across
	// reloads like the breaker, as relearning takes traffic.
	Latency *latency.Learner
	// learning is the adaptive_deadlines config of the handler that
	// declared the channel with it last, and the configured timeouts that
	// bound its deadlines, for the views; nil when none does.
	learning atomic.Pointer[Learning]
	// lastUsed is when real traffic last reached the channel (Unix
	// nanoseconds), so that only idle channels are probed.
	lastUsed atomic.Int64
	// noPrefill holds the upstream models that refused a continuation's
	// prefill here: they are asked in the instructed form from then on,
	// across reloads, instead of paying a refused request per resume.
	noPrefill sync.Map // upstream model → struct{}
	// completionTokens holds the upstream models whose checks must give
	// their limit as max_completion_tokens (they refused max_tokens).
	completionTokens sync.Map // upstream model → struct{}
}

// RefusesPrefill reports whether the channel's model refused a prefill.
func (c *Channel) RefusesPrefill(model string) bool {
	_, ok := c.noPrefill.Load(model)
	return ok
}

// noPrefillModels lists the models RefusesPrefill knows, sorted.
func (c *Channel) noPrefillModels() []string {
	var out []string
	c.noPrefill.Range(func(k, _ any) bool {
		out = append(out, k.(string))
		return true
	})
	sort.Strings(out)
	return out
}

// LearnRefusesPrefill records that the channel's model refused a prefill;
// it reports whether this was news.
func (c *Channel) LearnRefusesPrefill(model string) bool {
	_, known := c.noPrefill.LoadOrStore(model, struct{}{})
	return !known
}

// UsesCompletionTokens reports whether the channel's model refused a
// check's max_tokens for max_completion_tokens (provider.WantsCompletionTokens).
func (c *Channel) UsesCompletionTokens(model string) bool {
	_, ok := c.completionTokens.Load(model)
	return ok
}

// LearnCompletionTokens records that the channel's model wants
// max_completion_tokens; it reports whether this was news.
func (c *Channel) LearnCompletionTokens(model string) bool {
	_, known := c.completionTokens.LoadOrStore(model, struct{}{})
	return !known
}

// Learning is how a handler learns a channel's deadlines
// (adaptive_deadlines): its config and, per latency.Kind, the configured
// timeout that bounds the learned one, for a streamed answer (Ceilings)
// and for a whole one (WholeCeilings; latency.Class.Whole).
type Learning struct {
	Config        latency.Config
	Ceilings      [latency.NumKinds]time.Duration
	WholeCeilings [latency.NumKinds]time.Duration
}

// Learn registers that a handler of this config learns the channel's
// deadlines this way. Like the breaker settings, it applies when the
// config starts: a config that is refused changes nothing, and one in
// which no handler learns them clears what an earlier config set, so
// that the views and metrics show no deadline that is not applied.
func (a *App) Learn(ch *Channel, l Learning) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.learning == nil {
		a.learning = map[*Channel]*Learning{}
	}
	a.learning[ch] = &l
}

// Learned is the channel's learned deadlines, per kind and size class
// with observations, for the status page, its JSON and the metrics; nil
// when no handler learns them.
func (c *Channel) Learned(now time.Time) []latency.Learned {
	l := c.learning.Load()
	if l == nil {
		return nil
	}
	return c.Latency.Snapshot(l.Config, l.Ceilings, l.WholeCeilings, now)
}

// Touch records that real traffic reached the channel at now.
func (c *Channel) Touch(now time.Time) { c.lastUsed.Store(now.UnixNano()) }

// LastTraffic is when real traffic last reached the channel; the zero
// time when none has.
func (c *Channel) LastTraffic() time.Time {
	if n := c.lastUsed.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Destruct implements caddy.Destructor.
func (*Channel) Destruct() error { return nil }

// ChannelID is a channel's identity: its name, its base URL and a
// fingerprint of its credentials, so that two sites declaring the same
// name and URL with different keys (two accounts at one provider) get two
// breakers, while a reload that keeps the channel keeps its health. It
// holds only a hash, never a secret.
type ChannelID struct {
	name, baseURL, key string
}

// NewChannelID is the identity of the channel called name at base, with
// credentials (provider.ChannelCredentials).
func NewChannelID(name string, base *url.URL, credentials []string) ChannelID {
	sorted := slices.Sorted(slices.Values(credentials))
	sum := sha256.Sum256([]byte(strings.Join(sorted, "\x00")))
	return ChannelID{name: name, baseURL: redact.URL(base),
		key: name + " " + base.String() + " " + hex.EncodeToString(sum[:8])}
}

// registeredChannel is one handler's channel and the breaker settings
// its config wants for it.
type registeredChannel struct {
	id    ChannelID
	ch    *Channel
	cfg   breaker.Config
	owner string
}

// Channel registers a channel of the handler described by owner, with
// the breaker settings it wants, and returns its health: the same for
// every handler and config that declares the same identity. Two handlers
// of one config that declare one identity with different breaker
// settings are a config error naming both: one breaker cannot follow two
// sets of rules. The app holds the reference until its Cleanup.
func (a *App) Channel(id ChannelID, cfg breaker.Config, owner string) (*Channel, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.channels {
		if c.id == id && c.cfg != cfg {
			return nil, fmt.Errorf("channel %q (%s) is declared by %s and by %s with different breaker settings (%s; %s): "+
				"a channel's breaker is shared, so give both the same breaker block, or the channels different names",
				id.name, id.baseURL, c.owner, owner, describeBreaker(c.cfg), describeBreaker(cfg))
		}
	}
	v, _, err := channels.LoadOrNew(id.key, func() (caddy.Destructor, error) {
		ref := sha256.Sum256([]byte(id.key))
		return &Channel{Name: id.name, BaseURL: id.baseURL, Ref: hex.EncodeToString(ref[:6]),
			Breaker: breaker.New(cfg), Latency: latency.NewLearner()}, nil
	})
	if err != nil {
		return nil, err
	}
	// A reload keeps the health; Start applies the new settings to it
	// once the whole config has provisioned, so that a config that fails
	// to load cannot change the running breakers.
	ch := v.(*Channel)
	a.channels = append(a.channels, &registeredChannel{id: id, ch: ch, cfg: cfg, owner: owner})
	return ch, nil
}

func describeBreaker(c breaker.Config) string {
	s := fmt.Sprintf("failures %d, window %s, cooldown %s, trials %d, max_park %s, park %s", c.Failures, c.Window, c.Cooldown, c.Trials, c.MaxPark, c.Park)
	if c.MinCalls > 0 {
		s += fmt.Sprintf(", ratio %d %g", c.MinCalls, c.FailureRatio)
	}
	return s
}

// releaseChannels gives back the references Channel took.
func (a *App) releaseChannels() {
	a.mu.Lock()
	regs := a.channels
	a.channels = nil
	a.mu.Unlock()
	for _, c := range regs {
		_, _ = channels.Delete(c.id.key)
	}
}

// Model is one model a handler serves, for the views and the incidents.
type Model struct {
	// Chain holds every route; a route's Channel indexes Channels.
	Chain    *chain.Model
	Channels []*Channel
}

// Handler names a handler of this config for config errors that involve
// another one: its place among the config's llm_failover handlers, in the
// order they provision (the JSON's), and what it says of itself.
func (a *App) Handler(describe string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.handlers++
	return fmt.Sprintf("llm_failover handler #%d (%s)", a.handlers, describe)
}

// Model registers a model.
func (a *App) Model(m Model) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.models = append(a.models, m)
}

// Snapshot is the channels' health at one instant: what the admin API,
// the metrics and the status page read.
type Snapshot struct {
	// Channels has one entry per channel identity, sorted by name.
	Channels []ChannelStatus
	// Models are in name order, their routes in cost order.
	Models []ModelStatus
}

// ChannelStatus is one channel's health.
type ChannelStatus struct {
	Name    string
	BaseURL string // redacted
	Health  breaker.Snapshot
	// Weights are the channel's current chain.Score in each model that
	// routes to it under the weighted policy.
	Weights []ModelWeight
	// NoPrefill lists the upstream models that refused a continuation's
	// prefill here, sorted: their continuations are instructed.
	NoPrefill []string
}

// ModelWeight is a channel's score in one weighted model.
type ModelWeight struct {
	Model string
	Score float64
}

// ModelStatus is one model's chain with its channels' health.
type ModelStatus struct {
	Name    string
	Policy  chain.Policy
	MaxHops int
	Routes  []RouteStatus
}

// RouteStatus is one route of a chain and its channel's health.
type RouteStatus struct {
	Route  chain.Route
	Health breaker.Snapshot
}

// Snapshot reads every registered channel's breaker once, at now.
func (a *App) Snapshot(now time.Time) Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	var s Snapshot
	index := make(map[*Channel]int, len(a.channels))
	for _, c := range a.channels {
		if _, seen := index[c.ch]; seen {
			continue
		}
		index[c.ch] = len(s.Channels)
		s.Channels = append(s.Channels, ChannelStatus{Name: c.ch.Name, BaseURL: c.ch.BaseURL, Health: c.ch.Breaker.Snapshot(now), NoPrefill: c.ch.noPrefillModels()})
	}
	for _, m := range a.models {
		ms := ModelStatus{Name: m.Chain.Name, Policy: m.Chain.Policy, MaxHops: m.Chain.MaxHops}
		for _, r := range m.Chain.Routes {
			cs := &s.Channels[index[m.Channels[r.Channel]]]
			ms.Routes = append(ms.Routes, RouteStatus{Route: r, Health: cs.Health})
			if m.Chain.Policy == chain.Weighted {
				cs.Weights = append(cs.Weights, ModelWeight{Model: m.Chain.Name, Score: chain.Score(r.Weight, cs.Health.SuccessRate)})
			}
		}
		s.Models = append(s.Models, ms)
	}
	sort.SliceStable(s.Channels, func(i, j int) bool { return s.Channels[i].Name < s.Channels[j].Name })
	sort.SliceStable(s.Models, func(i, j int) bool { return s.Models[i].Name < s.Models[j].Name })
	return s
}

// reset closes, by hand, every breaker of the channels named name. It
// reports whether any channel has that name.
func (a *App) reset(name string, now time.Time) bool {
	a.mu.Lock()
	var found []*Channel
	for _, c := range a.channels {
		if c.ch.Name == name && !slices.Contains(found, c.ch) {
			found = append(found, c.ch)
		}
	}
	a.mu.Unlock()
	for _, ch := range found {
		if tr := ch.Breaker.Reset(now); tr.Changed() {
			a.StateChanged(a.logger, ch, tr, "reset")
		}
	}
	return len(found) > 0
}
