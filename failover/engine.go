// Package failover is the request engine of the llm_failover handler:
// it takes a client's LLM API request (its path, body and credentials),
// admits it (the wallet's reservation), walks the model's chain of
// channels (the one candidate walk: admission, budgets, retry_same,
// attempts and their timers), relays the answer (the stream gate for
// SSE, whole JSON checked before it is committed, errors passed back
// masked), continues a broken stream elsewhere (stream_resume), and
// records every outcome once with the llm_failover app. It also offers
// the app the targets its synthetic checks and its doctor use, so that
// they are sent and judged the way client traffic is.
//
// It knows the providers through package provider and must not know
// their JSON itself; the config's syntax and the compile step are the
// handler's (the root package), and app-wide state is failoverapp's.
package failover

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/internal/redact"
	"github.com/llmfailover/caddy-llm-failover/latency"
	"github.com/llmfailover/caddy-llm-failover/probe"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// Channel is one upstream, ready to be sent requests.
type Channel struct {
	Name      string
	Base      *url.URL
	Header    http.Header // the channel's own headers, placeholders resolved
	Adapter   provider.Adapter
	Transport http.RoundTripper
	Extras    *provider.Extras
	// PropagateTrace sends the attempt's W3C traceparent upstream (only
	// it: never the client's tracestate or baggage); off by default, as
	// it tells the upstream about the gateway's traces.
	PropagateTrace bool

	health *failoverapp.Channel
	// account tells channels apart by provider account (their
	// credentials, or their host when they carry none): a hedge never
	// goes to a channel of the first one's account.
	account string
	// slowdown, under adaptive_deadlines, weighs the channel down while
	// it is much slower than its usual (policy weighted); nil otherwise.
	slowdown *latency.Config
}

// Model is a model clients can ask for and the routes that serve it.
type Model struct {
	Name string
	// Chain holds every route, for the views; ByAPI holds, per client
	// API, the routes whose provider serves it (nil when none does), so
	// that planning never spends a hop on a channel that cannot answer.
	Chain *chain.Model
	ByAPI [provider.NumAPIs]*chain.Model
	// Price is what the wallet reserves for (plain input and output), and
	// Charge, per channel name, what it charges an answer of that
	// channel, prompt-cache classes included.
	Price  wallet.Price
	Charge map[string]ChargePrice
	// Cost, per channel name, is what an answer of that route costs the
	// operator, prompt-cache classes included (its provider's default
	// rates where the route's cost names none): how cache affinity
	// prices a warm channel against the chain's first (affinity.go).
	Cost map[string]wallet.Price
	// MaxOutput and MaxInput bound, for the wallet, the output of a
	// request that sets no limit and the input stored upstream.
	MaxOutput, MaxInput int64
	// Probe is the model's synthetic checks; nil when it has none.
	Probe *probe.Plan
	// Resume is the model's stream_resume.
	Resume string
	// Idempotent: a request carrying an Idempotency-Key is answered once
	// (idempotency.go).
	Idempotent bool
	// Hedge is the model's hedge_after (hedge.go); nil: never hedged.
	Hedge *HedgeRule

	// resumable: per client API, whether a broken stream can be
	// continued (stream_resume continue, a resumable API, and a channel
	// besides the first that can continue it).
	resumable [provider.NumAPIs]bool
	// charged is the model's series of wallet_charged_micros_total (with
	// a wallet), looked up once rather than on every settlement.
	charged prometheus.Counter
}

// WalletConfig makes a handler's requests prepaid.
type WalletConfig struct {
	// Name is the llm_wallet wallet to bill ("" for the only one).
	Name string
	// Allow serves unbilled when the store fails (on_store_error allow).
	Allow bool
	// Account, when set, is a placeholder naming the account to bill.
	Account string
}

// ChargePrice is the price an answer of one route is charged at; the
// prompt-cache classes named in Defaulted came from its provider's
// default rates, not the operator's config.
type ChargePrice struct {
	wallet.Price
	Defaulted []string
}

// Plan is a handler's compiled config: what New needs to serve it.
type Plan struct {
	Options  Options
	Channels []*Channel
	Models   []*Model
	Wallet   *WalletConfig // nil: unbilled
	// Owner describes the handler ("serving <models>") in config errors
	// that involve another one (a channel both declare).
	Owner string
}

// Engine serves one handler's requests.
type Engine struct {
	opts      Options
	channels  []*Channel
	models    map[string]*Model
	modelList []string
	retry     [600]bool
	wallet    *walletRuntime
	app       *failoverapp.App
	memory    *failoverapp.Memory
	logger    *zap.Logger
	secrets   *redact.Secrets
	// live are the adapters whose credentials change as they run
	// (Vertex's access tokens), masked as secrets are.
	live     []provider.LiveCredentialed
	liveMask atomic.Pointer[liveMask]
	// idem keeps idempotent calls beyond this process (idempotency.go);
	// nil when no model is idempotent.
	idem *failoverapp.IdempotencyStore
	// learn is how the channels' latencies are learned (deadlines.go):
	// adaptive_deadlines' config, or the defaults when only a hedge_after
	// quantile needs them; nil when nothing does.
	learn *latency.Config
	// hedges counts, per hedged model, requests and hedges against the
	// hedge budget.
	hedges map[string]*hedgeBudget
}

// New readies the plan's engine: it registers the channels (getting their
// shared health), the models, the synthetic checks, the doctor and the
// wallet's readiness with the config's llm_failover app, and gets the
// wallet.
func New(ctx caddy.Context, p Plan) (*Engine, error) {
	e := &Engine{opts: p.Options, channels: p.Channels, models: make(map[string]*Model, len(p.Models)), logger: ctx.Logger()}
	for _, s := range e.opts.RetryStatus {
		e.retry[s] = true
	}
	app, err := ctx.App("llm_failover")
	if err != nil {
		return nil, fmt.Errorf("loading the llm_failover app: %w", err)
	}
	e.app = app.(*failoverapp.App)
	e.memory = e.app.Memory()
	owner := e.app.Handler(p.Owner)
	var secrets []string
	for _, ch := range e.channels {
		creds := provider.ChannelCredentials(ch.Base, ch.Header, ch.Adapter)
		secrets = append(secrets, creds...)
		ch.account = accountOf(ch, creds)
		id := failoverapp.NewChannelID(ch.Name, ch.Base, creds)
		if ch.health, err = e.app.Channel(id, e.opts.Breaker, owner); err != nil {
			return nil, err
		}
	}
	e.secrets = redact.NewSecrets(secrets...)
	for _, ch := range e.channels {
		if lc, ok := ch.Adapter.(provider.LiveCredentialed); ok {
			e.live = append(e.live, lc)
		}
	}
	if a := e.opts.Adaptive; a != nil {
		e.learn = a
		// What bounds each learned deadline where it applies (armLearned,
		// learnStall): a streamed answer's, and a whole one's.
		ceilings := [latency.NumKinds]time.Duration{
			latency.Header:       e.opts.HeaderTimeoutFor(true),
			latency.FirstContent: e.opts.HeaderTimeoutFor(true) + e.opts.StreamGate,
			latency.Gap:          e.opts.StreamIdleTimeout,
		}
		whole := [latency.NumKinds]time.Duration{
			latency.Header:       e.opts.HeaderTimeoutFor(false),
			latency.FirstContent: e.opts.HeaderTimeoutFor(false),
			latency.Gap:          e.opts.StreamIdleTimeout,
		}
		for _, ch := range e.channels {
			e.app.Learn(ch.health, failoverapp.Learning{Config: *a, Ceilings: ceilings, WholeCeilings: whole})
			ch.slowdown = a
		}
	}
	probing := false
	for _, m := range p.Models {
		m.resumable = e.resumableAPIs(m)
		e.models[m.Name] = m
		e.modelList = append(e.modelList, m.Name)
		healths := make([]*failoverapp.Channel, len(e.channels))
		for i, ch := range e.channels {
			healths[i] = ch.health
		}
		e.app.Model(failoverapp.Model{Chain: m.Chain, Channels: healths})
		probing = probing || m.Probe != nil
		if m.Hedge != nil {
			if e.hedges == nil {
				e.hedges = map[string]*hedgeBudget{}
			}
			e.hedges[m.Name] = new(hedgeBudget)
			if m.Hedge.Quantile > 0 && e.learn == nil {
				cfg := latency.Config{}.WithDefaults()
				e.learn = &cfg
			}
		}
	}
	if p.Wallet != nil {
		rt, err := provisionWallet(ctx, *p.Wallet, e.logger)
		if err != nil {
			return nil, fmt.Errorf("wallet: %w", err)
		}
		e.useWallet(rt)
		if slices.ContainsFunc(p.Models, func(m *Model) bool { return m.Idempotent }) {
			dsn, shared := rt.w.SharedDSN()
			if e.idem, err = e.app.IdempotencyStore(dsn, shared); err != nil {
				return nil, err
			}
		}
		// A wallet that refuses requests without its store makes the
		// instance unready without it, unless the store is shared by
		// every instance (PostgreSQL): then its outage is reported, and
		// billed requests meet on_store_error.
		w := e.wallet.w
		e.app.Readiness(failoverapp.ReadinessCheck{Name: "wallet " + w.Name(), Shared: p.Wallet.Allow || w.Remote(),
			Failing: "store unreachable",
			Check: func(ctx context.Context) error {
				st, err := w.Store()
				if err == nil {
					err = st.Ping(ctx)
				}
				return err
			}})
	}
	if probing {
		e.app.Probes(prober{e})
	}
	e.app.Doctors(doctor{e})
	return e, registerMetrics(ctx.GetMetricsRegistry())
}

// ServeHTTP answers one client request.
func (e *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	return e.serve(w, r)
}

// health adapts the engine's channels to chain.Health.
type health []*Channel

func (hs health) Available(i int, now time.Time) bool {
	return hs[i].health.Breaker.Available(now)
}

func (hs health) ReadyAt(i int, now time.Time) (time.Time, bool) {
	b := hs[i].health.Breaker
	// A channel that is open and also inside a Retry-After counts as
	// parked: the upstream asked not to be sent anything until then, so
	// it must not get a last resort.
	return b.ReadyAt(now), !b.Snapshot(now).ParkedUntil.IsZero()
}

func (hs health) SuccessRate(i int) float64 {
	rate, _ := hs[i].health.Breaker.SuccessRate()
	if cfg := hs[i].slowdown; cfg != nil {
		// Much slower than its own usual (twice its median time to first
		// content, lately) weighs a channel down in proportion; it is
		// never a failure by itself.
		if s := hs[i].health.Latency.Slowdown(*cfg, time.Now()); s >= slowWeighsDown {
			rate /= s
		}
	}
	return rate
}

// slowWeighsDown is how much slower than its usual a channel must be for
// policy weighted to send it less.
const slowWeighsDown = 2
