package llmfailover

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
)

func init() {
	caddy.RegisterModule(new(App))
}

// Events the registry emits through Caddy's events app, for status pages,
// probes and heartbeats to subscribe to instead of polling:
//
//	llm_failover.channel_state  a breaker changed state (also the clock-driven
//	                            open → half_open): channel, base_url (redacted),
//	                            from, to, reason (the attempt outcome that caused
//	                            it, cooldown_elapsed, last_resort_succeeded, probe_failed or reset)
//	llm_failover.attempt        one upstream attempt ended: model, channel,
//	                            attempt (1-based), outcome (ok or the failure
//	                            reason), upstream_status (0 when none), duration_ms
//
// Nothing is built when nobody subscribes.
const (
	EventChannelState = "llm_failover.channel_state"
	EventAttempt      = "llm_failover.attempt"
)

// App is the llm_failover app: the channel registry of one config. Every
// llm_failover handler registers its channels and models into it while it
// provisions (handlers get it with ctx.App, which creates it on demand, so
// a config needs no "llm_failover" app section). The admin API and the
// metrics read the active config's registry through Snapshot; the hop loop
// reports state changes and attempts through it.
//
// It owns the view of channel health, not the health itself: breakers live
// in the package-level pool (state.go) so that they survive `caddy reload`.
// It must not know how requests are relayed.
type App struct {
	ctx    caddy.Context
	events *caddyevents.App
	logger *zap.Logger

	// status is the history and decision journal, shared across reloads.
	status *statusState
	// historyCfg is the store the handlers asked for (nil: memory only)
	// and historyKey the pool reference Start took on it.
	historyCfg *HistoryStoreConfig
	historyKey string

	mu       sync.Mutex
	channels []registeredChannel
	models   []registeredModel
	handlers []*Handler
	// prober runs the synthetic checks while the config runs.
	prober *prober
}

// registeredChannel is one handler's channel and the breaker settings its
// config wants for it.
type registeredChannel struct {
	state *channelState
	cfg   breaker.Config
}

// registeredModel is one handler's model; its routes index channels.
type registeredModel struct {
	chain    *chain.Model
	channels []*channel
}

// CaddyModule returns the Caddy module information.
func (*App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "llm_failover",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision gets the events app the registry emits through.
func (a *App) Provision(ctx caddy.Context) error {
	a.ctx = ctx
	a.logger = ctx.Logger()
	ev, err := ctx.App("events")
	if err != nil {
		return fmt.Errorf("loading events app: %w", err)
	}
	a.events = ev.(*caddyevents.App)
	if a.status, err = loadStatusState(); err != nil {
		return fmt.Errorf("loading the status history: %w", err)
	}
	return nil
}

// Start applies this config's breaker settings to the channels, surviving
// ones included. Caddy starts apps only once the whole config has
// provisioned, so a config that fails to load changes no running breaker.
func (a *App) Start() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.channels {
		c.state.breaker.SetConfig(c.cfg)
	}
	warnUnauthenticated(a.ctx, a.logger)
	if a.prober = newProber(a.handlers, a.logger); a.prober != nil {
		a.prober.start()
	}
	return a.startHistory()
}

// Stop ends the synthetic checks; the breakers outlive the config.
func (a *App) Stop() error {
	a.mu.Lock()
	p := a.prober
	a.mu.Unlock()
	if p != nil {
		p.stop()
	}
	return nil
}

// register adds a provisioned handler's channels and models.
func (a *App) register(h *Handler, cfg breaker.Config) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, ch := range h.channels {
		a.channels = append(a.channels, registeredChannel{state: ch.state, cfg: cfg})
	}
	for _, name := range h.modelList {
		a.models = append(a.models, registeredModel{chain: h.models[name].chain, channels: h.channels})
	}
	a.handlers = append(a.handlers, h)
}

// activeRegistry is the registry of the running config, nil when there is
// none (no config, or one without an llm_failover handler).
func activeRegistry() *App {
	app, err := caddy.ActiveContext().AppIfConfigured("llm_failover")
	if err != nil {
		return nil
	}
	return app.(*App)
}

// Snapshot is the registry's view of channel health at one instant: the
// one type the admin API and the metrics (and next the status page) read.
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
	index := make(map[*channelState]int, len(a.channels))
	for _, c := range a.channels {
		if _, seen := index[c.state]; seen {
			continue
		}
		index[c.state] = len(s.Channels)
		s.Channels = append(s.Channels, ChannelStatus{Name: c.state.name, BaseURL: c.state.baseURL, Health: c.state.breaker.Snapshot(now)})
	}
	for _, m := range a.models {
		ms := ModelStatus{Name: m.chain.Name, Policy: m.chain.Policy, MaxHops: m.chain.MaxHops}
		for _, r := range m.chain.Routes {
			cs := &s.Channels[index[m.channels[r.Channel].state]]
			ms.Routes = append(ms.Routes, RouteStatus{Route: r, Health: cs.Health})
			if m.chain.Policy == chain.Weighted {
				cs.Weights = append(cs.Weights, ModelWeight{Model: m.chain.Name, Score: chain.Score(r.Weight, cs.Health.SuccessRate)})
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
	var states []*channelState
	for _, c := range a.channels {
		if c.state.name == name && !slices.Contains(states, c.state) {
			states = append(states, c.state)
		}
	}
	a.mu.Unlock()
	for _, st := range states {
		if tr := st.breaker.Reset(now); tr.Changed() {
			a.stateChanged(a.logger, st, tr, "reset")
		}
	}
	return len(states) > 0
}

// stateChanged reports one breaker transition, once: a metric, a log line
// and an event. reason is what caused it.
func (a *App) stateChanged(logger *zap.Logger, st *channelState, tr breaker.Transition, reason string) {
	breakerTransitions.WithLabelValues(st.name, tr.To.String()).Inc()
	logger.Warn("breaker state changed", zap.String("channel", st.name),
		zap.String("from", tr.From.String()), zap.String("to", tr.To.String()), zap.String("reason", reason))
	if a.events.ShouldEmit(EventChannelState) {
		a.events.Emit(a.ctx, EventChannelState, map[string]any{
			"channel": st.name, "base_url": st.baseURL,
			"from": tr.From.String(), "to": tr.To.String(), "reason": reason,
		})
	}
	a.transitioned(st, tr, reason)
}

// attempted reports one attempt's outcome as an event.
func (a *App) attempted(model, upstreamModel, channel string, attempt int, outcome string, upstreamStatus int, took time.Duration) {
	if !a.events.ShouldEmit(EventAttempt) {
		return
	}
	a.events.Emit(a.ctx, EventAttempt, map[string]any{
		"model": model, "upstream_model": upstreamModel, "channel": channel, "attempt": attempt,
		"outcome": outcome, "upstream_status": upstreamStatus, "duration_ms": took.Milliseconds(),
	})
}

// Interface guards
var (
	_ caddy.App         = (*App)(nil)
	_ caddy.Provisioner = (*App)(nil)
)
