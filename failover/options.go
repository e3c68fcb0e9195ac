package failover

import (
	"time"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/latency"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// Defaults, from the design the handler implements.
const (
	DefaultMaxHops             = 3                 // ROUTING_CHAIN_MAX
	DefaultHeaderTimeout       = 240 * time.Second // UPSTREAM_HEADERS_TIMEOUT_MS
	DefaultStreamHeaderTimeout = 30 * time.Second
	DefaultDeadline            = 540 * time.Second
	DefaultMaxRequestBody      = 10 << 20
	DefaultMaxResponseBody     = 64 << 20
	DefaultRequestBodyTimeout  = 60 * time.Second
	// DefaultMaxOutputTokens bounds, for the wallet, the output of a
	// request that sets no limit of its own.
	DefaultMaxOutputTokens = 16384
)

// DefaultRetryStatus are the statuses that walk the chain: timeouts, rate
// limits, every server error (a CDN's 520-527 and Anthropic's 529
// included: each is one channel's failure, another may answer) and 424,
// Bedrock's ModelErrorException (the model behind it failed). Every other
// status is the same answer from every channel and goes straight back to
// the client.
var DefaultRetryStatus = func() []int {
	s := []int{408, 424, 429}
	for code := 500; code <= 599; code++ {
		s = append(s, code)
	}
	return s
}()

// Values of stream_resume.
const (
	ResumeOff      = "off"
	ResumeContinue = "continue"
)

// Options are a handler's settings (WithDefaults fills the ones left
// zero).
type Options struct {
	MaxHops             int
	HeaderTimeout       time.Duration
	StreamHeaderTimeout time.Duration
	Deadline            time.Duration
	FirstByteTimeout    time.Duration // 0: off
	MaxRequestBody      int64
	MaxResponseBody     int64
	// TraceContent bounds the prompt and answer text a traced request's
	// spans carry; 0: none (the default).
	TraceContent       int64
	RetryStatus        []int
	RetrySame          *RetrySame // nil: off
	StreamGate         time.Duration
	StreamGateFailover bool
	StreamIdleTimeout  time.Duration
	RequestBodyTimeout time.Duration
	// ForwardPaths are client paths forwarded besides the LLM endpoints;
	// one ending in /* forwards everything under it.
	ForwardPaths []string
	// ProbeAccount is the wallet account synthetic checks are charged to.
	ProbeAccount string
	// Breaker is the breaker settings the handler wants for its channels.
	Breaker breaker.Config
	// Idempotency bounds idempotent requests (idempotency.go); its
	// zero value is the defaults. Models say whether they take them.
	Idempotency IdempotencyLimits
	// CacheAffinity is how long a conversation stays on the channel that
	// served its last turn (where its prompt cache is warm); 0: off.
	CacheAffinity time.Duration
	// Adaptive learns each channel's deadlines from its own latency
	// (deadlines.go); nil: off, the configured timeouts hold.
	Adaptive *latency.Config
	// Hedge bounds hedged requests (hedge.go); models say whether they
	// are hedged.
	Hedge HedgeOptions
}

// IdempotencyLimits bound what idempotent requests keep and hold.
type IdempotencyLimits struct {
	Retention, Grace, Lease time.Duration
	MaxAnswer, MaxStored    int64
}

// The idempotency defaults: a retention that covers SDK retries (answers
// are model output, kept no longer than needed), a grace long enough for
// a client's retry after a network blip.
const (
	DefaultIdempotencyRetention = 5 * time.Minute
	DefaultIdempotencyGrace     = 60 * time.Second
	DefaultIdempotencyLease     = 30 * time.Second
	DefaultIdempotencyMaxAnswer = 1 << 20
	DefaultIdempotencyMaxStored = 64 << 20
)

// DefaultCacheAffinity outlasts the providers' default prompt-cache
// lifetime (Anthropic's 5 minutes, OpenAI's 5 to 10 of idleness).
const DefaultCacheAffinity = 10 * time.Minute

// WithDefaults returns o with every zero setting that has a default set
// to it (first_byte_timeout has none: 0 is off).
func (o Options) WithDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.HeaderTimeout, DefaultHeaderTimeout)
	def(&o.StreamHeaderTimeout, DefaultStreamHeaderTimeout)
	def(&o.Deadline, DefaultDeadline)
	def(&o.StreamGate, streamgate.DefaultGateTimeout)
	def(&o.StreamIdleTimeout, streamgate.DefaultIdleTimeout)
	def(&o.RequestBodyTimeout, DefaultRequestBodyTimeout)
	if o.MaxHops == 0 {
		o.MaxHops = DefaultMaxHops
	}
	if o.MaxRequestBody == 0 {
		o.MaxRequestBody = DefaultMaxRequestBody
	}
	if o.MaxResponseBody == 0 {
		o.MaxResponseBody = DefaultMaxResponseBody
	}
	if o.RetryStatus == nil {
		o.RetryStatus = DefaultRetryStatus
	}
	o.Breaker = o.Breaker.WithDefaults()
	if o.Hedge.Budget == 0 {
		o.Hedge.Budget = DefaultHedgeBudget
	}
	return o
}

// HeaderTimeoutFor is how long an attempt waits for response headers. A
// streaming request gets the shorter stream_header_timeout: a provider
// that streams sends its headers before it generates anything, so a
// silent one is down, not busy. A non-streaming job (a video, a long
// image) may answer only when done and keeps header_timeout.
func (o Options) HeaderTimeoutFor(streaming bool) time.Duration {
	d := o.HeaderTimeout
	if streaming && o.StreamHeaderTimeout > 0 {
		d = min(d, o.StreamHeaderTimeout)
	}
	return d
}
