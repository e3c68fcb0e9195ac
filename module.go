// Package llmfailover registers a Caddy HTTP handler, llm_failover, that
// sends OpenAI- and Anthropic-style API requests to a chain of upstream
// channels serving the requested model, and fails over along the chain on
// retryable failures: before anything is sent (circuit breaker), between
// attempts (the hop loop), and inside a 200 OK stream that turns out to be
// an error (the stream gate).
package llmfailover

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/internal/redact"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Defaults, from the design this handler implements.
const (
	DefaultMaxHops         = 3                 // ROUTING_CHAIN_MAX
	DefaultHeaderTimeout   = 240 * time.Second // UPSTREAM_HEADERS_TIMEOUT_MS
	DefaultDeadline        = 540 * time.Second
	DefaultMaxRequestBody  = 10 << 20
	DefaultMaxResponseBody = 64 << 20
	// DefaultMaxOutputTokens bounds, for the wallet, the output of a request
	// that sets no limit of its own.
	DefaultMaxOutputTokens = 16384
)

// DefaultRetryStatus are the statuses that walk the chain: timeouts, rate
// limits and server errors. Every other status is the same answer from
// every channel and goes straight back to the client.
var DefaultRetryStatus = []int{408, 429, 500, 502, 503, 504, 529}

// Handler is the llm_failover HTTP handler. It answers the request itself
// (it never calls the next handler), like reverse_proxy.
//
// Placeholders it sets, for access logs and later handlers:
//
// Placeholder | Description
// ------------|-------------
// `{http.llm_failover.model}` | the model the client asked for
// `{http.llm_failover.channel}` | the channel that answered (empty when none did)
// `{http.llm_failover.attempts}` | how many channels were tried
type Handler struct {
	// Channels are the upstreams requests can be sent to.
	Channels []*Channel `json:"channels,omitempty"`
	// Models map a model name to the routes (channels) that serve it.
	Models []*Model `json:"models,omitempty"`
	// MaxHops caps how many channels one request tries. Default: 3.
	MaxHops int `json:"max_hops,omitempty"`
	// HeaderTimeout bounds the wait for response headers of each attempt.
	// Default: 240s.
	HeaderTimeout caddy.Duration `json:"header_timeout,omitempty"`
	// StreamHeaderTimeout bounds the wait for response headers of a
	// streaming request (a body with "stream": true, or a :stream path),
	// when it is shorter than HeaderTimeout: a provider answers a stream's
	// headers at once, while the 240s of HeaderTimeout exist for
	// non-streaming jobs that answer only when done. Default: 30s.
	StreamHeaderTimeout caddy.Duration `json:"stream_header_timeout,omitempty"`
	// Deadline bounds a request from its arrival until a response is
	// committed; each candidate gets an equal share of what remains, so
	// that a silent first channel cannot eat the whole deadline. It never
	// cuts a response that has been committed. Default: 540s.
	Deadline caddy.Duration `json:"deadline,omitempty"`
	// FirstByteTimeout, when set, fails an attempt over when no byte of the
	// response body arrives this long after the request was sent. Off by
	// default.
	FirstByteTimeout caddy.Duration `json:"first_byte_timeout,omitempty"`
	// MaxRequestBody caps the client's request body (413 beyond it).
	// Default: 10 MiB.
	MaxRequestBody int64 `json:"max_request_body,omitempty"`
	// MaxResponseBody caps a non-streaming upstream answer, which is read
	// whole before it is committed. Default: 64 MiB.
	MaxResponseBody int64 `json:"max_response_body,omitempty"`
	// RetryStatus are the upstream statuses that fail over. Network errors
	// and timeouts always do. Default: 408 429 500 502 503 504 529.
	RetryStatus []int `json:"retry_status,omitempty"`
	// RetrySame, when set, retries a channel once after a transient
	// failure before the chain moves on. Off by default.
	RetrySame *RetrySame `json:"retry_same,omitempty"`
	// StreamResume is "continue" to finish an Anthropic Messages stream
	// that broke after content on another channel of the model, or "off"
	// (default). A model's own stream_resume overrides it. See resume.go.
	StreamResume string `json:"stream_resume,omitempty"`
	// StreamGate bounds how long an SSE stream is held back waiting for
	// its first decisive frame. Default: 30s.
	StreamGate caddy.Duration `json:"stream_gate,omitempty"`
	// StreamGateFailover fails over, instead of committing, when the
	// stream gate expires (a time-to-first-token limit).
	StreamGateFailover bool `json:"stream_gate_failover,omitempty"`
	// StreamIdleTimeout ends a committed stream that has sent nothing for
	// this long, with an error event. Default: 60s.
	StreamIdleTimeout caddy.Duration `json:"stream_idle_timeout,omitempty"`
	// Breaker configures the per-channel circuit breaker.
	Breaker *BreakerConfig `json:"breaker,omitempty"`
	// Heartbeats attach heartbeat receivers (Healthchecks, Uptime Kuma,
	// Cronitor, or a generic POST) to background jobs by name, e.g. the
	// wallet's sweeper, wallet_sweep.<wallet>. See the jobs view at
	// /llm_failover/jobs for the names.
	Heartbeats []caddykit.HeartbeatConfig `json:"heartbeats,omitempty"`
	// History keeps the status page's history and the decision journal
	// in SQLite or PostgreSQL, so they survive restarts (and, on
	// PostgreSQL, add up across instances). Default: memory only.
	History *HistoryStoreConfig `json:"history,omitempty"`
	// ProbeAccount is the wallet account synthetic checks are charged to
	// (required when a model probes and a wallet is set).
	ProbeAccount string `json:"probe_account,omitempty"`
	// ProbeLeader is the DSN of a PostgreSQL database the instances of a
	// fleet share: only the instance holding its advisory lock probes,
	// and another takes over when it dies.
	ProbeLeader string `json:"probe_leader,omitempty"`
	// Wallet, when set, makes requests prepaid: a client must present a
	// key of an account whose balance covers the request's largest cost.
	Wallet *WalletConfig `json:"wallet,omitempty"`
	// Auth "off" declares that the handler serves anyone who reaches it,
	// paid with the channels' credentials; without a wallet and without
	// it, Provision warns when the handler's server listens beyond
	// loopback. See the README's client authentication recipes.
	Auth string `json:"auth,omitempty"`
	// ForwardPaths are client paths forwarded besides the LLM endpoints
	// the providers serve; a path ending in /* forwards everything under
	// it. Every other path gets a 404 and reaches no upstream.
	ForwardPaths []string `json:"forward_paths,omitempty"`
	// MaxHeldBytes caps the bytes held in memory across every in-flight
	// request of the handler (held stream frames, buffered answers);
	// beyond it new attempts get 503. Default: 256 MiB.
	MaxHeldBytes int64 `json:"max_held_bytes,omitempty"`
	// RequestBodyTimeout bounds the reading of a client's request body,
	// so that a body trickled a byte a second cannot hold a connection.
	// Default: 60s.
	RequestBodyTimeout caddy.Duration `json:"request_body_timeout,omitempty"`

	channels    []*channel
	channelByID map[string]int
	models      map[string]*model
	modelList   []string
	retry       [600]bool
	wallet      *walletRuntime
	app         *App
	logger      *zap.Logger
	defaultRT   *reverseproxy.HTTPTransport
	poolKeys    []string
	// detachHeartbeats undoes this config's heartbeat attachments.
	detachHeartbeats func()
	// probeLeaderDSN is ProbeLeader with its placeholders resolved.
	probeLeaderDSN string
	secrets        *redact.Secrets
}

// Channel is one upstream that serves one or more models.
type Channel struct {
	// Name identifies the channel in routes, logs and metrics.
	Name string `json:"name"`
	// BaseURL is joined with the client's request path and query:
	// https://openrouter.ai/api + /v1/chat/completions. Default: the
	// provider's own API host, when it has one.
	BaseURL string `json:"base_url,omitempty"`
	// ProviderRaw is the kind of upstream the channel is, a module in
	// http.handlers.llm_failover.providers. Default: openai, an
	// OpenAI-compatible host that is sent every API.
	ProviderRaw json.RawMessage `json:"provider,omitempty" caddy:"namespace=http.handlers.llm_failover.providers inline_key=name"`
	// Headers are set on every request to this channel, replacing the
	// client's credentials. Values may hold global placeholders such as
	// {env.OPENAI_API_KEY}, resolved when the config loads.
	Headers map[string]string `json:"headers,omitempty"`
	// TransportRaw configures the channel's HTTP transport; it is one of
	// reverse_proxy's transports. Default: reverse_proxy's http transport.
	TransportRaw json.RawMessage `json:"transport,omitempty" caddy:"namespace=http.reverse_proxy.transport inline_key=protocol"`
	// PassRequestHeaders names client headers forwarded to this channel
	// besides its provider's allowlist.
	PassRequestHeaders []string `json:"pass_request_headers,omitempty"`
	// PassResponseHeaders names answer headers passed back to clients
	// besides its provider's allowlist.
	PassResponseHeaders []string `json:"pass_response_headers,omitempty"`
	// PassRateLimitHeaders passes the upstream account's rate-limit
	// headers (x-ratelimit-*, anthropic-ratelimit-*) back to clients.
	PassRateLimitHeaders bool `json:"pass_rate_limit_headers,omitempty"`
}

// Model is a model clients can ask for and the routes that serve it.
type Model struct {
	Name string `json:"name"`
	// Policy is "cost" (default: cheapest first) or "weighted".
	Policy string `json:"policy,omitempty"`
	// Routes are the channels serving this model.
	Routes []Route `json:"routes"`
	// Price is what the wallet charges per million tokens. Default: the
	// most expensive route's cost.
	Price *Price `json:"price,omitempty"`
	// MaxOutputTokens bounds the output of a request that sets no limit of
	// its own, for the wallet's reservation. Default: 16384.
	MaxOutputTokens int64 `json:"max_output_tokens,omitempty"`
	// MaxInputTokens bounds, for the wallet, the input of a request that
	// refers to state the upstream keeps (previous_response_id,
	// conversation, a stored prompt), whose size the body does not show:
	// typically the model's context window. Without it a billed gateway
	// refuses such requests with 400.
	MaxInputTokens int64 `json:"max_input_tokens,omitempty"`
	// Probe, when set, runs synthetic checks of the model's idle and
	// half-open channels.
	Probe *ProbeConfig `json:"probe,omitempty"`
	// StreamResume overrides the handler's stream_resume for this model.
	StreamResume string `json:"stream_resume,omitempty"`
}

// Route is one channel serving a model.
type Route struct {
	Channel string `json:"channel"`
	// Cost is the channel's price per million tokens, used to order the
	// chain cheapest first.
	Cost *Price `json:"cost,omitempty"`
	// UpstreamModel is the name the channel knows this same model by (a
	// dated snapshot, a deployment name); never another model.
	UpstreamModel string `json:"upstream_model,omitempty"`
	// Weight is the route's weight under the weighted policy. Default: 1.
	Weight int `json:"weight,omitempty"`
}

// Price is a price per million input and output tokens, in dollars, written
// as exact decimals ("0.15").
type Price struct {
	Input  string `json:"input"`
	Output string `json:"output"`
}

func (p *Price) parse() (wallet.Price, error) {
	if p == nil {
		return wallet.Price{}, nil
	}
	in, err := wallet.ParseMicros(p.Input)
	if err != nil {
		return wallet.Price{}, fmt.Errorf("input price: %w", err)
	}
	out, err := wallet.ParseMicros(p.Output)
	if err != nil {
		return wallet.Price{}, fmt.Errorf("output price: %w", err)
	}
	return wallet.Price{Input: in, Output: out}, nil
}

// BreakerConfig configures the per-channel circuit breaker.
type BreakerConfig struct {
	// Window is how long a failure is remembered. Default: 5m.
	Window caddy.Duration `json:"window,omitempty"`
	// Failures inside the window open the channel. Default: 3.
	Failures int `json:"failures,omitempty"`
	// Cooldown is how long an open channel is skipped. Default: 60s.
	Cooldown caddy.Duration `json:"cooldown,omitempty"`
	// MinCalls and FailureRatio turn on ratio mode for busy channels: the
	// channel opens only when, among at least MinCalls recent calls, the
	// share of failures is at least FailureRatio (and Failures is reached).
	MinCalls     int     `json:"min_calls,omitempty"`
	FailureRatio float64 `json:"failure_ratio,omitempty"`
	// MaxPark caps how long a 429's Retry-After parks a channel.
	// Default: 5m.
	MaxPark caddy.Duration `json:"max_park,omitempty"`
	// HalfOpenTrials is how many requests a recovering channel is sent at
	// once; the others go to the next channel. Default: 1.
	HalfOpenTrials int `json:"half_open_trials,omitempty"`
}

func (c *BreakerConfig) config() breaker.Config {
	if c == nil {
		return breaker.Config{}.WithDefaults()
	}
	return breaker.Config{
		Window:       time.Duration(c.Window),
		Failures:     c.Failures,
		Cooldown:     time.Duration(c.Cooldown),
		MinCalls:     c.MinCalls,
		FailureRatio: c.FailureRatio,
		MaxPark:      time.Duration(c.MaxPark),
		Trials:       c.HalfOpenTrials,
	}.WithDefaults()
}

// channel is a provisioned Channel.
type channel struct {
	name    string
	base    *url.URL
	headers http.Header
	adapter provider.Adapter
	rt      http.RoundTripper
	state   *channelState
	extras  *provider.Extras
}

// model is a provisioned Model.
type model struct {
	// chain holds every route, for status views; byAPI holds, per client
	// API, the routes whose provider serves it (nil when none does), so
	// that planning never spends a hop on a channel that cannot answer.
	chain     *chain.Model
	byAPI     [provider.NumAPIs]*chain.Model
	price     wallet.Price
	maxOutput int64
	maxInput  int64
	probe     *probePlan // nil when the model is not probed
	resume    string     // stream_resume; "" means the handler's
	// resumable: per client API, whether stream_resume can continue a
	// broken stream (resume.go); computed once in Provision.
	resumable [provider.NumAPIs]bool
	// charged is the model's series of wallet_charged_micros_total (with a
	// wallet), looked up once rather than on every settlement.
	charged prometheus.Counter
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.llm_failover",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets up the handler.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if err := h.check(); err != nil {
		return err
	}
	if h.MaxHops == 0 {
		h.MaxHops = DefaultMaxHops
	}
	if h.HeaderTimeout == 0 {
		h.HeaderTimeout = caddy.Duration(DefaultHeaderTimeout)
	}
	if h.StreamHeaderTimeout == 0 {
		h.StreamHeaderTimeout = caddy.Duration(DefaultStreamHeaderTimeout)
	}
	if h.Deadline == 0 {
		h.Deadline = caddy.Duration(DefaultDeadline)
	}
	if h.MaxRequestBody == 0 {
		h.MaxRequestBody = DefaultMaxRequestBody
	}
	if h.MaxResponseBody == 0 {
		h.MaxResponseBody = DefaultMaxResponseBody
	}
	if h.RetryStatus == nil {
		h.RetryStatus = DefaultRetryStatus
	}
	if h.StreamGate == 0 {
		h.StreamGate = caddy.Duration(streamgate.DefaultGateTimeout)
	}
	if h.MaxHeldBytes == 0 {
		h.MaxHeldBytes = DefaultMaxHeldBytes
	}
	if h.RequestBodyTimeout == 0 {
		h.RequestBodyTimeout = caddy.Duration(DefaultRequestBodyTimeout)
	}
	if h.StreamIdleTimeout == 0 {
		h.StreamIdleTimeout = caddy.Duration(streamgate.DefaultIdleTimeout)
	}
	for _, s := range h.RetryStatus {
		h.retry[s] = true
	}
	breakerCfg := h.Breaker.config()

	repl := caddy.NewReplacer()
	h.channelByID = make(map[string]int, len(h.Channels))
	for i, c := range h.Channels {
		adapter := provider.Adapter(new(provider.OpenAI))
		if c.ProviderRaw != nil {
			mod, err := ctx.LoadModule(c, "ProviderRaw")
			if err != nil {
				return fmt.Errorf("channel %q: loading provider: %w", c.Name, err)
			}
			adapter = mod.(provider.Adapter)
		}
		base, err := channelBase(c, adapter)
		if err != nil {
			return fmt.Errorf("channel %q: %w", c.Name, err)
		}
		ch := &channel{name: c.Name, base: base, adapter: adapter, headers: make(http.Header, len(c.Headers)),
			extras: &provider.Extras{Request: c.PassRequestHeaders, Response: c.PassResponseHeaders, RateLimit: c.PassRateLimitHeaders}}
		for k, v := range c.Headers {
			val, err := repl.ReplaceOrErr(v, true, true)
			if err != nil {
				return fmt.Errorf("channel %q: header %s: %w", c.Name, k, err)
			}
			ch.headers.Set(k, val)
		}
		if c.TransportRaw != nil {
			mod, err := ctx.LoadModule(c, "TransportRaw")
			if err != nil {
				return fmt.Errorf("channel %q: loading transport: %w", c.Name, err)
			}
			ch.rt = mod.(http.RoundTripper)
		} else {
			if h.defaultRT == nil {
				h.defaultRT = new(reverseproxy.HTTPTransport)
				if err := h.defaultRT.Provision(ctx); err != nil {
					return fmt.Errorf("provisioning default transport: %w", err)
				}
			}
			ch.rt = h.defaultRT
		}
		key := channelIdentity(c.Name, base, provider.ChannelCredentials(ch.headers, adapter))
		st, err := loadChannelState(key, c.Name, base.Redacted(), breakerCfg)
		if err != nil {
			return fmt.Errorf("channel %q: %w", c.Name, err)
		}
		h.poolKeys = append(h.poolKeys, key)
		ch.state = st
		h.channelByID[c.Name] = i
		h.channels = append(h.channels, ch)
	}

	h.provisionSecrets()

	h.models = make(map[string]*model, len(h.Models))
	for _, m := range h.Models {
		// check has vetted every value below; only the parsing remains.
		policy, _ := chain.ParsePolicy(m.Policy)
		pm := &model{maxOutput: m.MaxOutputTokens, maxInput: m.MaxInputTokens, resume: m.StreamResume}
		pm.probe, _ = m.Probe.plan()
		if pm.maxOutput == 0 {
			pm.maxOutput = DefaultMaxOutputTokens
		}
		routes := make([]chain.Route, 0, len(m.Routes))
		for _, r := range m.Routes {
			cost, _ := r.Cost.parse()
			// The wallet never charges less than the dearest channel
			// could cost, unless the operator says otherwise.
			if cost.Input+cost.Output > pm.price.Input+pm.price.Output {
				pm.price = cost
			}
			routes = append(routes, chain.Route{
				Channel: h.channelByID[r.Channel], Name: r.Channel,
				InputCost: int64(cost.Input), OutputCost: int64(cost.Output),
				UpstreamModel: r.UpstreamModel, Weight: r.Weight,
			})
		}
		if m.Price != nil {
			pm.price, _ = m.Price.parse()
		}
		var err error
		if pm.chain, err = chain.New(m.Name, policy, h.MaxHops, routes); err != nil {
			return err
		}
		for api := range pm.byAPI {
			var serving []chain.Route
			for _, r := range routes {
				if h.channels[r.Channel].adapter.Serves(provider.API(api)) {
					serving = append(serving, r)
				}
			}
			if len(serving) > 0 {
				pm.byAPI[api], _ = chain.New(m.Name, policy, h.MaxHops, serving)
			}
		}
		pm.resumable = h.resumableAPIs(pm)
		h.models[m.Name] = pm
		h.modelList = append(h.modelList, m.Name)
	}

	if h.Wallet != nil {
		w, err := h.Wallet.provision(ctx, h.logger)
		if err != nil {
			return fmt.Errorf("wallet: %w", err)
		}
		h.useWallet(w)
	}
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return err
	}
	detach, err := caddykit.AttachHeartbeats(h.Heartbeats)
	if err != nil {
		return err
	}
	h.detachHeartbeats = detach
	// The DSN may be an {env.*} placeholder; it is a secret, never logged.
	if h.probeLeaderDSN, err = caddy.NewReplacer().ReplaceOrErr(h.ProbeLeader, true, true); err != nil {
		return fmt.Errorf("probe_leader: %w", err)
	}
	app, err := ctx.App("llm_failover")
	if err != nil {
		return fmt.Errorf("loading channel registry: %w", err)
	}
	h.app = app.(*App)
	if err := h.app.useHistory(h.History); err != nil {
		return err
	}
	h.app.register(h, breakerCfg)
	return nil
}

// Cleanup releases what Provision took. Caddy calls it on a config that
// failed to provision too, and on the old config during a reload while its
// streams may still be open: nothing here may cut an in-flight request.
func (h *Handler) Cleanup() error {
	for _, key := range h.poolKeys {
		_, _ = channelStates.Delete(key)
	}
	h.poolKeys = nil
	if h.detachHeartbeats != nil {
		h.detachHeartbeats()
	}
	if h.defaultRT != nil {
		return h.defaultRT.Cleanup()
	}
	return nil
}

// ServeHTTP answers an LLM API request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	return h.serve(w, r)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
