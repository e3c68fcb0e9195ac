// Package llmfailover registers a Caddy HTTP handler, llm_failover, that
// sends OpenAI- and Anthropic-style API requests to a chain of upstream
// channels serving the requested model, and fails over along the chain on
// retryable failures: before anything is sent (circuit breaker), between
// attempts (the candidate walk), and inside a 200 OK stream that turns out
// to be an error (the stream gate).
//
// This package is the handler module itself: its config (this file), its
// Caddyfile directive (caddyfile.go) and the compile step that turns the
// config into the engine's plan (compile.go). The engine is package
// failover; what is one per process or per config is the llm_failover
// app's (package failoverapp); the status page is package status. Build
// Caddy with this module's path and all of them come along.
package llmfailover

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"golang.org/x/net/http/httpguts"

	"github.com/llmfailover/caddy-llm-failover/failover"
	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/provider"

	// The other modules of the plugin: the llm_status page and the
	// llm_wallet app register themselves.
	_ "github.com/llmfailover/caddy-llm-failover/status"
	_ "github.com/llmfailover/caddy-llm-failover/walletapp"
)

func init() {
	caddy.RegisterModule(Handler{})
}

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
	// TraceContent, when set, puts the prompt (the request's system,
	// instructions, messages, input or prompt, as sent) on a traced
	// request's span and the answer's text on its attempts' spans, each
	// cut at this many bytes. Off by default: prompts and answers are the
	// users' data, and a trace store is rarely where they may be kept.
	TraceContent int64 `json:"trace_content,omitempty"`
	// RetryStatus are the upstream statuses that fail over. Network errors
	// and timeouts always do, and so does a status outside 100-599 or a
	// 101. Default: 408, 424 (Bedrock's model error), 429 and every 5xx.
	RetryStatus []int `json:"retry_status,omitempty"`
	// RetrySame, when set, retries a channel once after a transient
	// failure before the chain moves on. Off by default.
	RetrySame *RetrySame `json:"retry_same,omitempty"`
	// StreamResume is "continue" to finish a stream that broke after
	// content on another channel of the model, or "off" (default). A
	// model's own stream_resume overrides it.
	StreamResume string `json:"stream_resume,omitempty"`
	// CacheAffinity keeps each conversation on the channel that served
	// its last turn, where its prompt cache is warm, for this long after
	// that turn (a duration), or "off". Default: 10m.
	CacheAffinity string `json:"cache_affinity,omitempty"`
	// Idempotency answers a request carrying an Idempotency-Key once: a
	// duplicate of it (same client, same key) follows the first while it
	// runs and is answered from its answer afterwards, for every model
	// (a model's own idempotency overrides it). Off by default; it needs
	// authenticated clients (a wallet).
	Idempotency *Idempotency `json:"idempotency,omitempty"`
	// AdaptiveDeadlines, when set, learns each channel's own latency per
	// size class of request, and makes a candidate's header and
	// first-content deadlines and a committed stream's stall limit a
	// bounded multiple of it (docs/reliability.md, "Adaptive deadlines").
	// Off by default: the configured timeouts hold.
	AdaptiveDeadlines *AdaptiveDeadlines `json:"adaptive_deadlines,omitempty"`
	// Hedge bounds hedged requests (a model's hedge_after): how many may
	// be hedged, and who pays for the losing attempt.
	Hedge *Hedge `json:"hedge,omitempty"`
	// StreamGate bounds how long an SSE stream is held back waiting for
	// its first decisive frame.
	StreamGate *StreamGate `json:"stream_gate,omitempty"`
	// StreamIdleTimeout ends a committed stream that has sent nothing for
	// this long, with an error event; what trails a stream's end gets as
	// long, pings or not. It is also the write deadline of each piece of
	// any answer a client is sent (stream, whole answer, replay).
	// Default: 60s.
	StreamIdleTimeout caddy.Duration `json:"stream_idle_timeout,omitempty"`
	// Breaker configures the per-channel circuit breaker. A channel
	// declared by two handlers of one config shares one breaker, so both
	// must give it the same settings.
	Breaker *Breaker `json:"breaker,omitempty"`
	// ProbeAccount is the wallet account synthetic checks are charged to
	// (required when a model probes and a wallet is set; refused without a
	// wallet).
	ProbeAccount string `json:"probe_account,omitempty"`
	// Wallet, when set, makes requests prepaid: a client must present a
	// key of an account whose balance covers the request's largest cost.
	Wallet *Wallet `json:"wallet,omitempty"`
	// Auth "off" declares that the handler serves anyone who reaches it,
	// paid with the channels' credentials; without a wallet and without
	// it, the llm_failover app warns when the handler's server listens
	// beyond loopback.
	Auth string `json:"auth,omitempty"`
	// ForwardPaths are client paths forwarded besides the LLM endpoints
	// the providers serve; a path ending in /* forwards everything under
	// it. Every other path gets a 404 and reaches no upstream.
	ForwardPaths []string `json:"forward_paths,omitempty"`
	// RequestBodyTimeout bounds the reading of a client's request body,
	// so that a body trickled a byte a second cannot hold a connection;
	// such a request gets 408. Default: 60s.
	RequestBodyTimeout caddy.Duration `json:"request_body_timeout,omitempty"`

	engine    *failover.Engine
	defaultRT *reverseproxy.HTTPTransport
}

// Channel is one upstream that serves one or more models.
type Channel struct {
	// Name identifies the channel in routes, logs and metrics.
	Name string `json:"name"`
	// BaseURL is joined with the client's request path and query (less
	// its credential parameters, such as key or api-key):
	// https://openrouter.ai/api + /v1/chat/completions. Default: the
	// provider's own API host, when it has one. One with a user or
	// password is refused, and one with a query for the providers that
	// build the upstream's query themselves (azure, gemini, vertex,
	// bedrock).
	BaseURL string `json:"base_url,omitempty"`
	// ProviderRaw is the kind of upstream the channel is, a module in
	// http.handlers.llm_failover.providers. Default: openai, an
	// OpenAI-compatible host that is sent every API.
	ProviderRaw json.RawMessage `json:"provider,omitempty" caddy:"namespace=http.handlers.llm_failover.providers inline_key=name"`
	// Headers are set on every request to this channel, replacing the
	// client's credentials. Values may hold global placeholders such as
	// {env.OPENAI_API_KEY}, resolved when the config loads. Names that
	// differ only in case, and a name or resolved value that cannot be
	// sent (a control character), are refused.
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
	// PropagateTrace sends each attempt's W3C traceparent to this channel
	// when the request is traced (Caddy's tracing directive), so that a
	// traced upstream (your own vLLM, say) joins the request's trace.
	// Only the gateway's traceparent is sent, never the client's
	// tracestate or baggage. Off by default: it tells the upstream about
	// the gateway's traces.
	PropagateTrace bool `json:"propagate_trace,omitempty"`
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
	Probe *Probe `json:"probe,omitempty"`
	// StreamResume overrides the handler's stream_resume for this model.
	StreamResume string `json:"stream_resume,omitempty"`
	// Idempotency is "on" or "off" for this model, overriding the
	// handler's idempotency; on without the handler's block takes its
	// defaults.
	Idempotency string `json:"idempotency,omitempty"`
	// HedgeAfter starts the model's next channel too when the first has
	// produced no content this long after it was sent: a duration, or
	// "p<NN>" for that quantile of the first channel's own time to first
	// content for requests of the same size. The first to produce
	// content is served; the other is cancelled. Off by default; needs
	// max_hops of at least 2.
	HedgeAfter string `json:"hedge_after,omitempty"`
}

// AdaptiveDeadlines is how channels' deadlines are learned; every field
// left zero takes its default.
type AdaptiveDeadlines struct {
	// Quantile is the high quantile a deadline multiplies. Default 0.99.
	Quantile float64 `json:"quantile,omitempty"`
	// Factor multiplies it: at least 1, finite. Default 3.
	Factor float64 `json:"factor,omitempty"`
	// Floor is the least header or first-content deadline. Default 5s.
	Floor caddy.Duration `json:"floor,omitempty"`
	// StallFloor is the least stall limit of a committed stream. Default
	// 20s: a reasoning model may pause for long.
	StallFloor caddy.Duration `json:"stall_floor,omitempty"`
	// MinSamples is how many answers of a size class a channel needs
	// before its deadline is learned. Default 50.
	MinSamples int `json:"min_samples,omitempty"`
	// Window is how far back answers count. Default 30m.
	Window caddy.Duration `json:"window,omitempty"`
}

// Hedge bounds hedged requests.
type Hedge struct {
	// Budget is the largest share of a model's requests, over any
	// minute, that may be hedged, from 0 to 1. Default (0): 0.05 (5 %).
	Budget float64 `json:"budget,omitempty"`
	// Charge is who pays the losing attempt's upstream cost: "operator"
	// (default; a ledger row records it, the client is not charged) or
	// "client".
	Charge string `json:"charge,omitempty"`
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
	// Refused under policy cost, where it would be ignored.
	Weight int `json:"weight,omitempty"`
}

// Price is a price per million input and output tokens, in dollars, written
// as exact decimals ("0.15").
type Price struct {
	Input  string `json:"input"`
	Output string `json:"output"`
	// CacheRead, CacheWrite and CacheWrite1h price the input a provider
	// read from its prompt cache, or wrote to it for 5 minutes or an
	// hour. Default: the serving channel's provider's rates applied to
	// Input (Claude: 0.1x, 1.25x, 2x; OpenAI and Azure reads 0.5x;
	// Gemini reads 0.25x; docs/wallet.md), logged at load.
	CacheRead    string `json:"cache_read,omitempty"`
	CacheWrite   string `json:"cache_write,omitempty"`
	CacheWrite1h string `json:"cache_write_1h,omitempty"`
}

// Breaker configures the per-channel circuit breaker.
type Breaker struct {
	// Window is how long a failure is remembered. Default: 5m.
	Window caddy.Duration `json:"window,omitempty"`
	// Failures inside the window open the channel. Default: 3.
	Failures int `json:"failures,omitempty"`
	// Cooldown is how long an open channel is skipped. Default: 60s.
	Cooldown caddy.Duration `json:"cooldown,omitempty"`
	// Ratio turns on ratio mode for busy channels.
	Ratio *BreakerRatio `json:"ratio,omitempty"`
	// MaxPark caps how long a 429's Retry-After parks a channel.
	// Default: 5m.
	MaxPark caddy.Duration `json:"max_park,omitempty"`
	// Park is how long a rate limit parks a channel when the upstream
	// names no wait (no Retry-After, no reset header): a rate limit is
	// never counted as an outage. Default: 10s.
	Park caddy.Duration `json:"park,omitempty"`
	// Trials is how many requests a recovering channel is sent at once;
	// the others go to the next channel. Default: 1.
	Trials int `json:"trials,omitempty"`
}

// BreakerRatio opens a channel only when, among at least MinCalls recent
// calls, the share of failures is at least FailureRatio (and the
// breaker's Failures is reached).
type BreakerRatio struct {
	MinCalls     int     `json:"min_calls"`
	FailureRatio float64 `json:"failure_ratio"`
}

// StreamGate bounds how long an SSE stream is held back waiting for its
// first decisive frame.
type StreamGate struct {
	// Timeout is how long. Default: 30s.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// Failover fails over, instead of committing, when the gate expires
	// (a time-to-first-token limit).
	Failover bool `json:"failover,omitempty"`
}

// RetrySame retries a channel once, before the chain moves on, after a
// transient failure: one of Statuses, or a 429 whose Retry-After is at
// most MaxWait. It keeps traffic on the cheaper channel of a cost-ordered
// chain through a blip, within the candidate's time budget.
type RetrySame struct {
	// Statuses are the upstream statuses retried on the same channel;
	// each must also be a retry_status, or the chain never sees it.
	Statuses []int `json:"statuses,omitempty"`
	// MaxWait is the longest Retry-After of a 429 worth waiting for;
	// a 429 without Retry-After, or with a longer one, moves on at once.
	MaxWait caddy.Duration `json:"max_wait,omitempty"`
}

// Idempotency bounds what idempotent requests keep (docs/errors.md,
// "Idempotent requests").
type Idempotency struct {
	// Retention is how long a completed call's answer is kept for its
	// duplicates. Default 5m, which covers SDK retries: answers are
	// model output, which zero-retention setups must not keep long.
	Retention caddy.Duration `json:"retention,omitempty"`
	// MaxAnswer is the largest answer kept; a duplicate of a call whose
	// answer was larger gets 409. Default 1 MiB.
	MaxAnswer int64 `json:"max_answer,omitempty"`
	// MaxStored bounds this instance's memory for kept calls: their
	// answers' bytes (headers and body) and about 256 bytes each. Past it the calls kept
	// longest are forgotten here first; the idempotency store still
	// answers their duplicates. Default 64 MiB.
	MaxStored int64 `json:"max_stored,omitempty"`
	// Grace is how long a call whose client went away keeps running, so
	// that the client's retry finds it. Default 60s.
	Grace caddy.Duration `json:"grace,omitempty"`
	// Lease is how long a fleet waits for an instance that claimed a call
	// and stopped renewing its claim (it died) before another instance
	// runs the call. Default 30s.
	Lease caddy.Duration `json:"lease,omitempty"`
}

// Probe turns on synthetic checks of a model's channels. A channel is
// probed only when nobody else is telling about its health: when it had
// no real traffic for an interval, or when it is half-open (the probe is
// then the trial, so no client request is sent to a channel that may
// still be broken). A busy healthy channel is never probed.
type Probe struct {
	// Interval is how often an idle channel is probed. Default: 90s.
	Interval caddy.Duration `json:"interval,omitempty"`
	// MaxTokens caps the probe's output. Default: 16.
	MaxTokens int `json:"max_tokens,omitempty"`
	// Prompt is the probe's one user message. Default: "Say OK."
	Prompt string `json:"prompt,omitempty"`
	// Budget is what the probes of one channel may cost per UTC day, in
	// dollars, at the route's cost; once spent the channel is not probed
	// until the next day. Default: 1.
	Budget string `json:"budget,omitempty"`
}

// Wallet makes requests prepaid, billed to a wallet of the llm_wallet
// app.
type Wallet struct {
	// Name is the llm_wallet wallet to bill. Default: the only wallet; with
	// no llm_wallet option, an embedded SQLite wallet under Caddy's data
	// directory.
	Name string `json:"name,omitempty"`
	// OnStoreError is "deny" (default: answer 503 when the store is
	// unreachable or slower than the admission timeout) or "allow" (serve
	// unbilled, and log it).
	OnStoreError string `json:"on_store_error,omitempty"`
	// Account, when set, is a placeholder naming the account to bill
	// (e.g. {http.auth.user.id}) instead of the gateway's own API keys.
	Account string `json:"account,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.llm_failover",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision compiles the config, loads the channels' provider and
// transport modules, resolves their headers' placeholders, and readies
// the engine, which registers the handler's channels and models with the
// config's llm_failover app.
func (h *Handler) Provision(ctx caddy.Context) error {
	plan, err := compile(h)
	if err != nil {
		return err
	}
	if plan.Wallet != nil {
		logCachePriceDefaults(ctx.Logger(), plan)
	}
	for i, c := range h.Channels {
		ch := plan.Channels[i]
		if c.ProviderRaw != nil {
			mod, err := ctx.LoadModule(c, "ProviderRaw")
			if err != nil {
				return fmt.Errorf("channel %q: loading provider: %w", c.Name, err)
			}
			ch.Adapter = mod.(provider.Adapter)
		}
		for k, v := range c.Headers {
			val, err := caddykit.Resolve(v)
			if err != nil {
				return fmt.Errorf("channel %q: header %s: %w", c.Name, k, err)
			}
			if !httpguts.ValidHeaderFieldValue(val) {
				// Not quoted: the value is a credential.
				return fmt.Errorf("channel %q: header %s: its value, resolved, holds a control character (a trailing newline?), which cannot be sent", c.Name, k)
			}
			ch.Header.Set(k, val)
		}
		if c.TransportRaw != nil {
			mod, err := ctx.LoadModule(c, "TransportRaw")
			if err != nil {
				return fmt.Errorf("channel %q: loading transport: %w", c.Name, err)
			}
			ch.Transport = mod.(http.RoundTripper)
			continue
		}
		if h.defaultRT == nil {
			h.defaultRT = new(reverseproxy.HTTPTransport)
			if err := h.defaultRT.Provision(ctx); err != nil {
				return fmt.Errorf("provisioning default transport: %w", err)
			}
		}
		ch.Transport = h.defaultRT
	}
	h.engine, err = failover.New(ctx, plan)
	return err
}

// Cleanup releases what Provision took. Caddy calls it on a config that
// failed to provision too, and on the old config during a reload while its
// streams may still be open: nothing here may cut an in-flight request.
// (The channels' health is the app's, which releases it.)
func (h *Handler) Cleanup() error {
	if h.defaultRT != nil {
		return h.defaultRT.Cleanup()
	}
	return nil
}

// ServeHTTP answers an LLM API request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	return h.engine.ServeHTTP(w, r)
}

// ServesAnyone reports whether the handler answers whoever reaches it
// with the operator's credentials: no wallet, and no `auth off` saying
// that this is intended.
func (h *Handler) ServesAnyone() bool { return h.Wallet == nil && h.Auth != "off" }

// ReadsClientKeys reports whether the handler takes wallet keys from the
// client's headers (a wallet without an account placeholder).
func (h *Handler) ReadsClientKeys() bool { return h.Wallet != nil && h.Wallet.Account == "" }

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ failoverapp.OpenToAnyone    = (*Handler)(nil)
	_ failoverapp.ReadsClientKeys = (*Handler)(nil)
)
