// Package failoverapp is the llm_failover Caddy app (module ID
// llm_failover) and its global option: what is one per process, or one
// per config, rather than one per handler.
//
// It owns what outlives a config (each channel's health, keyed by the
// channel's identity; the status history and decision journal; what
// probes found and spent; the bytes buffered across every request), the
// config's registrations (channels, models, probe and doctor targets,
// readiness checks: values and interfaces handlers hand it while they
// provision, never the handlers themselves), the background jobs it
// starts (the prober, the history flush) and the heartbeats attached to
// jobs, the events it emits, the status read model the llm_status page
// renders, the admin API (admin.api.llm_failover) and the `caddy
// llm-failover` command.
//
// It knows nothing of how a request is relayed: attempts, relays and
// resumes are package failover's, which reports their outcomes here.
package failoverapp

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/internal/pgconf"
	"github.com/llmfailover/caddy-llm-failover/probe"
)

func init() {
	caddy.RegisterModule(new(App))
}

// App is the llm_failover app. Handlers get it with ctx.App, which
// creates it with defaults when the config has no llm_failover global
// option.
type App struct {
	// HistoryRaw keeps the status page's history and the decision
	// journal in a database (a module in llm_failover.history_stores:
	// sqlite or postgres), so that they survive restarts and, on
	// PostgreSQL, add up across a fleet. Default: memory only.
	HistoryRaw json.RawMessage `json:"history,omitempty" caddy:"namespace=llm_failover.history_stores inline_key=backend"`
	// ProbeLeader makes the instances of a fleet that share a PostgreSQL
	// database elect one of them to run the synthetic checks; another
	// takes over when it dies. Default: every instance probes.
	ProbeLeader *ProbeLeader `json:"probe_leader,omitempty"`
	// Heartbeats attach heartbeat receivers (Healthchecks, Uptime Kuma,
	// Cronitor, or a generic POST) to background jobs by name: prober,
	// history_flush, wallet_sweep.<wallet>. See the jobs view at
	// /llm_failover/jobs.
	Heartbeats []caddykit.HeartbeatConfig `json:"heartbeats,omitempty"`
	// MaxHeldBytes caps the bytes held in memory across every in-flight
	// request of the process (held stream frames, buffered answers);
	// beyond it new attempts get 503. Default: 256 MiB.
	MaxHeldBytes int64 `json:"max_held_bytes,omitempty"`

	ctx    caddy.Context
	events *caddyevents.App
	logger *zap.Logger
	memory *Memory

	// status is the process's history and decision journal; history the
	// store module they flush to (nil: memory only) and historyKey the
	// pool reference Start took on its open store.
	status     *statusState
	history    HistoryBackend
	historyKey string
	holder     *historyHolder // the open store Start attached, nil without one
	leaderDSN  string
	released   bool // Cleanup gave the status reference back
	started    bool // Start ran (Cleanup without it after validation warns instead)

	mu       sync.Mutex
	handlers int // Handler's count
	channels []*registeredChannel
	// learning is how this config's handlers learn their channels'
	// deadlines (Learn), applied at Start.
	learning map[*Channel]*Learning
	models   []Model
	probes   []probe.Target
	doctors  []Doctor
	checks   []ReadinessCheck
	// readiness is the checks' last outcome; checking is set while they
	// run (readiness.go).
	readiness checkOutcome
	checking  bool
	// What Start started, for Stop (or Start's own failure) to undo.
	prober *prober
	// idempotencyKeys are the idempotency stores this config holds.
	idempotencyKeys []string
	// probeTraces traces synthetic checks while the config traces
	// requests (tracing.go); nil otherwise.
	probeTraces      *sdktrace.TracerProvider
	detachHeartbeats func()
}

// ProbeLeader is the database the instances of a fleet elect their prober
// on.
type ProbeLeader struct {
	// DSN is the PostgreSQL connection string; it may be a placeholder
	// such as {env.LEADER_DSN}. It is a secret: it appears in no log line.
	DSN string `json:"dsn"`
}

// DefaultMaxHeldBytes caps the bytes of buffered answers held at once.
const DefaultMaxHeldBytes = 256 << 20

// CaddyModule returns the Caddy module information.
func (*App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "llm_failover",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision loads the history store module and checks the options; it
// opens, starts and pings nothing, so that `caddy validate` changes
// nothing.
func (a *App) Provision(ctx caddy.Context) error {
	a.ctx = ctx
	a.logger = ctx.Logger()
	ev, err := ctx.App("events")
	if err != nil {
		return fmt.Errorf("loading events app: %w", err)
	}
	a.events = ev.(*caddyevents.App)
	if a.MaxHeldBytes < 0 {
		return fmt.Errorf("max_held_bytes must not be negative, got %d", a.MaxHeldBytes)
	}
	limit := a.MaxHeldBytes
	if limit == 0 {
		limit = DefaultMaxHeldBytes
	}
	a.memory = &Memory{limit: limit}
	if a.HistoryRaw != nil {
		mod, err := ctx.LoadModule(a, "HistoryRaw")
		if err != nil {
			return fmt.Errorf("loading history store: %w", err)
		}
		a.history = mod.(HistoryBackend)
	}
	if a.ProbeLeader != nil {
		// The DSN may be an {env.*} placeholder; it is a secret, never logged.
		if a.leaderDSN, err = caddykit.Resolve(a.ProbeLeader.DSN); err != nil {
			return fmt.Errorf("probe_leader DSN: %w", err)
		}
		// Like the history's and the wallet's: a DSN that cannot parse
		// would fail every election, and no instance would probe.
		if err := pgconf.Validate(a.leaderDSN); err != nil {
			return fmt.Errorf("probe_leader: %w", err)
		}
	}
	if err := caddykit.ValidateHeartbeats(a.Heartbeats); err != nil {
		return err
	}
	if err := a.checkHeartbeatNames(); err != nil {
		return err
	}
	if a.status, err = loadStatusState(); err != nil {
		return fmt.Errorf("loading the status history: %w", err)
	}
	return registerMetrics(ctx.GetMetricsRegistry())
}

// Start opens the history store, attaches the heartbeats, applies this
// config's breaker settings to its channels (surviving ones included) and
// starts the prober, in that order, after warning about handlers that
// serve anyone. Caddy starts apps only once the whole config has
// provisioned, so a config that fails to load changes no running breaker;
// on a reload the settings apply when the replaced config stops (Stop),
// so that a config refused when it starts changes none either.
// When one step fails, Start undoes the ones before it: Caddy never stops
// an app whose Start failed, and a prober left running would probe for
// ever under a config that was refused.
func (a *App) Start() (err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.started = true
	a.warnConfigRisks()
	defer func() {
		// The prober starts last, so a failed Start has none to wait for.
		if err != nil {
			stopStarted(a.prober, a.detachHeartbeats)
			a.prober, a.detachHeartbeats = nil, nil
		}
	}()
	if err := a.checkHeartbeatJobs(); err != nil {
		return err
	}
	if err := a.startHistory(); err != nil {
		return err
	}
	if a.detachHeartbeats, err = caddykit.AttachHeartbeats(a.Heartbeats); err != nil {
		return err
	}
	// The shared breakers and learners take this config's settings only
	// once it runs. On a reload the config this one replaces hands them
	// over as it stops (Stop), which Caddy does only once every app of
	// this config started: one refused here, or by an app that starts
	// after this one, changes nothing (a shortened cooldown, once
	// applied, cannot be given back). With no config running, now.
	if prev := active(); prev == nil || prev == a {
		a.applySettingsLocked()
	}
	a.probeTraces = startProbeTracing(a.ctx, a.logger)
	a.prober = startProber(a.probes, a.leaderDSN, a.logger)
	return nil
}

// applySettingsLocked gives this config's channels (surviving ones
// included) its breaker settings and adaptive_deadlines; a.mu is held.
func (a *App) applySettingsLocked() {
	for _, c := range a.channels {
		c.ch.Breaker.SetConfig(c.cfg)
		c.ch.learning.Store(a.learning[c.ch])
	}
}

// Stop ends what Start started: the prober, then the heartbeats. The
// breakers, the history and the open store outlive the config (Cleanup
// releases the store).
//
// It waits for the prober's running round without holding a.mu: a probe
// of that round may change a breaker, and reporting the transition takes
// a.mu (transitioned), so waiting under the lock deadlocked a reload (the
// soak found it: the reload never returned, and every later one waited on
// Caddy's config lock behind it).
func (a *App) Stop() error {
	a.mu.Lock()
	p, detach, tp := a.prober, a.detachHeartbeats, a.probeTraces
	a.prober, a.detachHeartbeats = nil, nil
	a.mu.Unlock()
	stopStarted(p, detach)
	// The config that runs now (the one replacing this, or, when this
	// one was stopped because another of its apps failed to start, the
	// one it was to replace) takes the shared channels' settings.
	if act := active(); act != nil && act != a {
		act.mu.Lock()
		act.applySettingsLocked()
		act.mu.Unlock()
	}
	// After the prober: its last round's spans are flushed too.
	a.mu.Lock()
	a.probeTraces = nil
	a.mu.Unlock()
	stopProbeTracing(tp, a.logger)
	return nil
}

// stopStarted stops a prober and detaches heartbeats, either may be nil.
func stopStarted(p *prober, detachHeartbeats func()) {
	if p != nil {
		p.stop()
	}
	if detachHeartbeats != nil {
		detachHeartbeats()
	}
}

// Cleanup releases this config's references: its channels' health, the
// history store and the history. Caddy calls it on a config that failed
// to load too, and on the old config during a reload while its streams
// may still be open: nothing here cuts an in-flight request.
func (a *App) Cleanup() error {
	if !a.started && validated(a.ctx) {
		a.warnConfigRisks()
	}
	a.releaseHistory()
	a.releaseIdempotency()
	a.releaseChannels()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.status == nil || a.released {
		return nil
	}
	// a.status stays: the old config's requests still record into it.
	a.released = true
	_, err := statusStates.Delete(statusStateKey)
	return err
}

// warnConfigRisks logs what a config allows but an operator rarely
// means: a public server answering anyone with the channels'
// credentials, an access log writing wallet keys in clear. It needs
// every handler provisioned, so it runs when the app starts and, under
// `caddy validate` (which never starts apps), when the validated config
// is cleaned up.
func (a *App) warnConfigRisks() {
	warnUnauthenticated(a.ctx, a.logger)
	warnKeysInAccessLog(a.ctx, a.logger)
}

// validated reports whether ctx was cancelled by caddy.Validate once the
// config provisioned; Caddy marks that only by the cause's text.
func validated(ctx caddy.Context) bool {
	cause := context.Cause(ctx)
	return cause != nil && cause.Error() == "validation complete"
}

// active is the app of the running config, nil when there is none (no
// config, or one without an llm_failover handler or option).
func active() *App {
	app, err := caddy.ActiveContext().AppIfConfigured("llm_failover")
	if err != nil {
		return nil
	}
	return app.(*App)
}

// Memory is the config's share of the process memory budget.
func (a *App) Memory() *Memory { return a.memory }

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
