package llmfailover

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"golang.org/x/net/http/httpguts"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/failover"
	"github.com/llmfailover/caddy-llm-failover/internal/redact"
	"github.com/llmfailover/caddy-llm-failover/latency"
	"github.com/llmfailover/caddy-llm-failover/probe"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// configError is a configuration mistake tied to the element it is about,
// so that the Caddyfile parser can point at the line the user wrote it on.
type configError struct {
	at  string // an element key; see the key functions below
	err error
}

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

func mistake(at, format string, args ...any) error {
	return &configError{at: at, err: fmt.Errorf(format, args...)}
}

// Element keys, shared by compile and the Caddyfile parser's positions.
func optionKey(opt string) string           { return "option " + opt }
func channelKey(name string) string         { return "channel " + name }
func modelKey(name string) string           { return "model " + name }
func routeKey(model, channel string) string { return "route " + model + "\x00" + channel }

// compile turns the handler's config into the engine's plan, defaults
// applied, or finds its first mistake, keyed by the element it is about.
// It is the one place the config is validated, whether it came from a
// Caddyfile (the parser calls it and names the line) or from JSON
// (Provision calls it and keeps the plan). It touches nothing outside the
// config: the channels' adapters are decoded, not provisioned, and their
// headers' placeholders are left for Provision to resolve.
func compile(h *Handler) (failover.Plan, error) {
	// A JSON config may hold null elements; nothing below expects one.
	for i, c := range h.Channels {
		if c == nil {
			return failover.Plan{}, mistake("", "channel %d is null", i)
		}
	}
	for i, m := range h.Models {
		if m == nil {
			return failover.Plan{}, mistake("", "model %d is null", i)
		}
	}
	opts, err := compileOptions(h)
	if err != nil {
		return failover.Plan{}, err
	}
	p := failover.Plan{Options: opts}
	if w := h.Wallet; w != nil {
		switch w.OnStoreError {
		case "", "deny", "allow":
		default:
			return p, mistake(optionKey("wallet"), "wallet: on_store_error: want deny or allow, got %q", w.OnStoreError)
		}
		p.Wallet = &failover.WalletConfig{Name: w.Name, Allow: w.OnStoreError == "allow", Account: w.Account}
	}

	index := make(map[string]int, len(h.Channels))
	for i, c := range h.Channels {
		if c.Name == "" {
			return p, mistake("", "channel %d has no name", i)
		}
		if _, dup := index[c.Name]; dup {
			return p, mistake(channelKey(c.Name), "channel %q is defined twice", c.Name)
		}
		index[c.Name] = i
		ch, err := compileChannel(c)
		if err != nil {
			return p, mistake(channelKey(c.Name), "channel %q: %w", c.Name, err)
		}
		p.Channels = append(p.Channels, ch)
	}

	if len(h.Models) == 0 {
		return p, mistake("", "no models configured")
	}
	names := make([]string, 0, len(h.Models))
	for _, m := range h.Models {
		if m.Name == "" {
			return p, mistake("", "a model has no name")
		}
		if slices.Contains(names, m.Name) {
			return p, mistake(modelKey(m.Name), "model %q is defined twice", m.Name)
		}
		names = append(names, m.Name)
		pm, err := compileModel(h, m, index, p.Channels, opts.MaxHops)
		if err != nil {
			return p, err
		}
		if pm.Probe != nil && h.Wallet != nil && h.ProbeAccount == "" {
			return p, mistake(modelKey(m.Name), "model %q: probe: with a wallet, probes need a probe_account to be charged to", m.Name)
		}
		p.Models = append(p.Models, pm)
	}
	p.Owner = "serving " + strings.Join(names, ", ")
	return p, nil
}

// compileOptions checks the handler-wide options and applies their
// defaults.
func compileOptions(h *Handler) (failover.Options, error) {
	o := failover.Options{
		MaxHops: h.MaxHops, HeaderTimeout: time.Duration(h.HeaderTimeout), StreamHeaderTimeout: time.Duration(h.StreamHeaderTimeout),
		Deadline: time.Duration(h.Deadline), FirstByteTimeout: time.Duration(h.FirstByteTimeout),
		MaxRequestBody: h.MaxRequestBody, MaxResponseBody: h.MaxResponseBody, RetryStatus: h.RetryStatus,
		StreamIdleTimeout: time.Duration(h.StreamIdleTimeout), RequestBodyTimeout: time.Duration(h.RequestBodyTimeout),
		ForwardPaths: h.ForwardPaths, ProbeAccount: h.ProbeAccount, TraceContent: h.TraceContent,
	}
	if g := h.StreamGate; g != nil {
		o.StreamGate, o.StreamGateFailover = time.Duration(g.Timeout), g.Failover
	}
	if h.MaxHops < 0 {
		return o, mistake(optionKey("max_hops"), "max_hops must be at least 1, got %d", h.MaxHops)
	}
	for _, d := range []struct {
		opt string
		v   time.Duration
	}{
		{"header_timeout", o.HeaderTimeout}, {"stream_header_timeout", o.StreamHeaderTimeout}, {"deadline", o.Deadline},
		{"first_byte_timeout", o.FirstByteTimeout}, {"stream_gate", o.StreamGate}, {"stream_idle_timeout", o.StreamIdleTimeout},
		{"request_body_timeout", o.RequestBodyTimeout},
	} {
		if d.v < 0 {
			return o, mistake(optionKey(d.opt), "%s must not be negative, got %s", d.opt, d.v)
		}
	}
	for _, s := range []struct {
		opt string
		v   int64
	}{{"max_request_body", h.MaxRequestBody}, {"max_response_body", h.MaxResponseBody}, {"trace_content", h.TraceContent}} {
		if s.v < 0 {
			return o, mistake(optionKey(s.opt), "%s must not be negative, got %d", s.opt, s.v)
		}
	}
	var err error
	if o.Hedge, err = compileHedge(h.Hedge); err != nil {
		return o, mistake(optionKey("hedge"), "hedge: %w", err)
	}
	o = o.WithDefaults()
	for _, s := range o.RetryStatus {
		if s < 100 || s > 599 {
			return o, mistake(optionKey("retry_status"), "retry_status: %d is not an HTTP status code", s)
		}
	}
	if o.RetrySame, err = compileRetrySame(h.RetrySame, o.RetryStatus); err != nil {
		return o, mistake(optionKey("retry_same"), "retry_same: %w", err)
	}
	if err := compileResume(h.StreamResume); err != nil {
		return o, mistake(optionKey("stream_resume"), "stream_resume: %w", err)
	}
	switch h.CacheAffinity {
	case "":
		o.CacheAffinity = failover.DefaultCacheAffinity
	case "off":
	default:
		d, err := caddy.ParseDuration(h.CacheAffinity)
		if err != nil || d <= 0 {
			return o, mistake(optionKey("cache_affinity"), "cache_affinity: want off or a positive duration, got %q", h.CacheAffinity)
		}
		o.CacheAffinity = d
	}
	if o.Adaptive, err = compileAdaptive(h.AdaptiveDeadlines); err != nil {
		return o, mistake(optionKey("adaptive_deadlines"), "adaptive_deadlines: %w", err)
	}
	if o.Breaker, err = compileBreaker(h.Breaker); err != nil {
		return o, mistake(optionKey("breaker"), "breaker: %w", err)
	}
	switch h.Auth {
	case "", "off":
	default:
		return o, mistake(optionKey("auth"), "auth: want off, got %q (wallet keys and account placeholders are set with wallet)", h.Auth)
	}
	if h.ProbeAccount != "" && h.Wallet == nil {
		return o, mistake(optionKey("probe_account"), "probe_account needs a wallet: without one probes are charged to nobody")
	}
	if h.Auth == "off" && h.Wallet != nil {
		return o, mistake(optionKey("auth"), "auth off and a wallet contradict each other: a wallet authenticates every request")
	}
	if o.Idempotency, err = compileIdempotency(h); err != nil {
		return o, mistake(optionKey("idempotency"), "idempotency: %w", err)
	}
	for _, p := range h.ForwardPaths {
		if !strings.HasPrefix(p, "/") || provider.CheckPath(p) != nil {
			return o, mistake(optionKey("forward_path"), "forward_path: %q is not a clean absolute path", p)
		}
	}
	return o, nil
}

// compileIdempotency applies the idempotency defaults. A duplicate is
// recognised by its client's identity, so idempotency needs a wallet
// (keys, or an account placeholder behind Caddy's authentication): with
// anonymous clients one client's key would replay another's answer.
func compileIdempotency(h *Handler) (failover.IdempotencyLimits, error) {
	l := failover.IdempotencyLimits{Retention: failover.DefaultIdempotencyRetention, Grace: failover.DefaultIdempotencyGrace,
		Lease:     failover.DefaultIdempotencyLease,
		MaxAnswer: failover.DefaultIdempotencyMaxAnswer, MaxStored: failover.DefaultIdempotencyMaxStored}
	used := h.Idempotency != nil || slices.ContainsFunc(h.Models, func(m *Model) bool { return m.Idempotency == "on" })
	if !used {
		return l, nil
	}
	if h.Wallet == nil {
		return l, errors.New("needs authenticated clients: configure a wallet (keys, or an account placeholder behind basic_auth or forward_auth); with anonymous clients one client's key would replay another's answer")
	}
	if i := h.Idempotency; i != nil {
		if i.Retention < 0 || i.Grace < 0 || i.MaxAnswer < 0 || i.MaxStored < 0 || i.Lease < 0 {
			return l, errors.New("retention, grace, lease, max_answer and max_stored must not be negative")
		}
		l.Lease = cmp.Or(time.Duration(i.Lease), l.Lease)
		l.Retention = cmp.Or(time.Duration(i.Retention), l.Retention)
		l.Grace = cmp.Or(time.Duration(i.Grace), l.Grace)
		l.MaxAnswer = cmp.Or(i.MaxAnswer, l.MaxAnswer)
		l.MaxStored = cmp.Or(i.MaxStored, l.MaxStored)
	}
	if l.MaxAnswer > l.MaxStored {
		return l, fmt.Errorf("max_answer %d is larger than max_stored %d", l.MaxAnswer, l.MaxStored)
	}
	return l, nil
}

// compileRetrySame rejects a retry_same that could never apply.
func compileRetrySame(r *RetrySame, retried []int) (*failover.RetrySame, error) {
	if r == nil {
		return nil, nil
	}
	if len(r.Statuses) == 0 {
		return nil, errors.New("needs at least one status")
	}
	if r.MaxWait < 0 {
		return nil, fmt.Errorf("max_wait must not be negative, got %s", time.Duration(r.MaxWait))
	}
	for _, s := range r.Statuses {
		if !slices.Contains(retried, s) {
			return nil, fmt.Errorf("%d is not a retry_status, so it never fails over and is never retried", s)
		}
		if s == http.StatusTooManyRequests && r.MaxWait == 0 {
			return nil, errors.New("429 needs max_wait, the longest Retry-After worth waiting for")
		}
	}
	return &failover.RetrySame{Statuses: r.Statuses, MaxWait: time.Duration(r.MaxWait)}, nil
}

// compileResume refuses a stream_resume value that is neither mode.
func compileResume(v string) error {
	if v != "" && v != failover.ResumeContinue && v != failover.ResumeOff {
		return fmt.Errorf("unknown mode %q (want continue or off)", v)
	}
	return nil
}

func compileBreaker(b *Breaker) (breaker.Config, error) {
	var c breaker.Config
	if b != nil {
		c = breaker.Config{Window: time.Duration(b.Window), Failures: b.Failures, Cooldown: time.Duration(b.Cooldown),
			MaxPark: time.Duration(b.MaxPark), Park: time.Duration(b.Park), Trials: b.Trials}
		if b.Ratio != nil {
			c.MinCalls, c.FailureRatio = b.Ratio.MinCalls, b.Ratio.FailureRatio
		}
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c.WithDefaults(), nil
}

// compileChannel checks a channel and returns it with its adapter
// decoded (not provisioned) and no transport yet.
func compileChannel(c *Channel) (*failover.Channel, error) {
	adapter, err := decodeAdapter(c.ProviderRaw)
	if err != nil {
		return nil, fmt.Errorf("provider: %w", err)
	}
	base, err := channelBase(c, adapter)
	if err != nil {
		return nil, err
	}
	fields := make(map[string]string, len(c.Headers))
	for k, v := range c.Headers {
		// Go's HTTP client refuses to send these: every request to the
		// channel would fail. A value's placeholders are checked once
		// resolved (Provision).
		if !httpguts.ValidHeaderFieldName(k) {
			return nil, fmt.Errorf("header %q: not a valid header field name", k)
		}
		if !strings.Contains(v, "{") && !httpguts.ValidHeaderFieldValue(v) {
			// Not quoted: the value is a credential.
			return nil, fmt.Errorf("header %s: its value holds a control character (a newline?), which cannot be sent", k)
		}
		field := http.CanonicalHeaderKey(k)
		if other, dup := fields[field]; dup {
			return nil, fmt.Errorf("headers %q and %q are one header: set it once", min(k, other), max(k, other))
		}
		fields[field] = k
	}
	return &failover.Channel{Name: c.Name, Base: base, Adapter: adapter, Header: make(http.Header, len(c.Headers)),
		PropagateTrace: c.PropagateTrace,
		Extras:         &provider.Extras{Request: c.PassRequestHeaders, Response: c.PassResponseHeaders, RateLimit: c.PassRateLimitHeaders}}, nil
}

// compileModel checks a model and builds its chains, price and probe plan.
func compileModel(h *Handler, m *Model, index map[string]int, channels []*failover.Channel, maxHops int) (*failover.Model, error) {
	at := modelKey(m.Name)
	policy, err := chain.ParsePolicy(m.Policy)
	if err != nil {
		return nil, mistake(at, "model %q: %w", m.Name, err)
	}
	if len(m.Routes) == 0 {
		return nil, mistake(at, "model %q has no routes", m.Name)
	}
	if len(m.Routes) > chain.MaxRoutes {
		return nil, mistake(at, "model %q has %d routes; at most %d are allowed", m.Name, len(m.Routes), chain.MaxRoutes)
	}
	if m.MaxOutputTokens < 0 {
		return nil, mistake(at, "model %q: max_output_tokens must not be negative", m.Name)
	}
	if m.MaxInputTokens < 0 || m.MaxInputTokens > provider.MaxTokenLimit {
		return nil, mistake(at, "model %q: max_input_tokens must be between 0 and %d", m.Name, provider.MaxTokenLimit)
	}
	resume := m.StreamResume
	if resume == "" {
		resume = h.StreamResume
	}
	if err := compileResume(m.StreamResume); err != nil {
		return nil, mistake(at, "model %q: stream_resume: %w", m.Name, err)
	}
	pm := &failover.Model{Name: m.Name, MaxOutput: m.MaxOutputTokens, MaxInput: m.MaxInputTokens, Resume: resume,
		Idempotent: m.Idempotency == "on" || (m.Idempotency == "" && h.Idempotency != nil)}
	switch m.Idempotency {
	case "", "on", "off":
	default:
		return nil, mistake(at, "model %q: idempotency: want on or off, got %q", m.Name, m.Idempotency)
	}
	if pm.MaxOutput == 0 {
		pm.MaxOutput = failover.DefaultMaxOutputTokens
	}
	if m.HedgeAfter != "" {
		rule, err := compileHedgeAfter(m.HedgeAfter)
		if err != nil {
			return nil, mistake(at, "model %q: hedge_after: %w", m.Name, err)
		}
		if len(m.Routes) < 2 {
			return nil, mistake(at, "model %q: hedge_after needs a second route to hedge on", m.Name)
		}
		if maxHops < 2 {
			return nil, mistake(at, "model %q: hedge_after needs max_hops of at least 2: the hedge is the request's second channel", m.Name)
		}
		pm.Hedge = rule
	}
	if m.Probe != nil {
		plan, err := probe.NewPlan(time.Duration(m.Probe.Interval), m.Probe.MaxTokens, m.Probe.Prompt, m.Probe.Budget)
		if err != nil {
			return nil, mistake(at, "model %q: probe: %w", m.Name, err)
		}
		pm.Probe = &plan
	}
	routes := make([]chain.Route, 0, len(m.Routes))
	for _, r := range m.Routes {
		rat := routeKey(m.Name, r.Channel)
		i, ok := index[r.Channel]
		if !ok {
			return nil, mistake(rat, "model %q: route to unknown channel %q", m.Name, r.Channel)
		}
		if slices.ContainsFunc(routes, func(cr chain.Route) bool { return cr.Channel == i }) {
			return nil, mistake(rat, "model %q routes channel %q twice", m.Name, r.Channel)
		}
		cost, err := parsePrice(r.Cost)
		if err != nil {
			return nil, mistake(rat, "model %q: route %s: cost: %w", m.Name, r.Channel, err)
		}
		if r.Weight < 0 {
			return nil, mistake(rat, "model %q: route %s: weight must not be negative", m.Name, r.Channel)
		}
		if r.Weight != 0 && policy != chain.Weighted {
			return nil, mistake(rat, "model %q: route %s: weight orders routes only under policy weighted (this model's policy is cost)", m.Name, r.Channel)
		}
		// The wallet never charges less than the dearest channel could
		// cost, unless the operator says otherwise.
		if cost.Input+cost.Output > pm.Price.Input+pm.Price.Output {
			pm.Price = cost
		}
		routes = append(routes, chain.Route{Channel: i, Name: r.Channel, InputCost: int64(cost.Input), OutputCost: int64(cost.Output),
			UpstreamModel: r.UpstreamModel, Weight: r.Weight})
	}
	if m.Price != nil {
		if pm.Price, err = parsePrice(m.Price); err != nil {
			return nil, mistake(at, "model %q: price: %w", m.Name, err)
		}
	}
	pm.Charge = make(map[string]failover.ChargePrice, len(m.Routes))
	pm.Cost = make(map[string]wallet.Price, len(m.Routes))
	for i, r := range m.Routes {
		// The provider's rates depend on the model it serves, which is
		// the client's name for it unless the route renames it.
		ch, upstream := channels[index[r.Channel]], cmp.Or(r.UpstreamModel, m.Name)
		p, defaulted, err := chargePrice(pm.Price, []*Price{m.Price, r.Cost}, ch, upstream)
		if err != nil {
			return nil, mistake(routeKey(m.Name, r.Channel), "model %q: route %s: %w", m.Name, r.Channel, err)
		}
		pm.Charge[r.Channel] = failover.ChargePrice{Price: p, Defaulted: defaulted}
		cost := wallet.Price{Input: wallet.Micros(routes[i].InputCost), Output: wallet.Micros(routes[i].OutputCost)}
		if pm.Cost[r.Channel], _, err = chargePrice(cost, []*Price{r.Cost}, ch, upstream); err != nil {
			return nil, mistake(routeKey(m.Name, r.Channel), "model %q: route %s: cost: %w", m.Name, r.Channel, err)
		}
		// A request that writes the cache is reserved at the dearest
		// route's write prices.
		pm.Price.CacheWrite = max(pm.Price.CacheWrite, p.CacheWrite)
		pm.Price.CacheWrite1h = max(pm.Price.CacheWrite1h, p.CacheWrite1h)
	}
	if pm.Chain, err = chain.New(m.Name, policy, maxHops, routes); err != nil {
		return nil, mistake(at, "model %q: %w", m.Name, err)
	}
	for api := range pm.ByAPI {
		var serving []chain.Route
		for _, r := range routes {
			if channels[r.Channel].Adapter.Serves(provider.API(api)) {
				serving = append(serving, r)
			}
		}
		if len(serving) > 0 {
			pm.ByAPI[api], _ = chain.New(m.Name, policy, pm.Chain.MaxHops, serving)
		}
	}
	return pm, nil
}

func parsePrice(p *Price) (wallet.Price, error) {
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

// chargePrice is what an answer of route is charged at: the model's
// price, with the prompt-cache classes the operator named (in the model's
// price, else the route's cost) and the route's provider's default rates
// for the others; defaulted says which were defaulted.
func chargePrice(model wallet.Price, named []*Price, ch *failover.Channel, upstreamModel string) (p wallet.Price, defaulted []string, err error) {
	p = model
	rates := provider.DefaultCacheRates(ch.Adapter, upstreamModel)
	for _, c := range []struct {
		name string
		pick func(*Price) string
		dst  *wallet.Micros
		rate int64
	}{
		{"cache_read", func(p *Price) string { return p.CacheRead }, &p.CacheRead, rates.Read},
		{"cache_write", func(p *Price) string { return p.CacheWrite }, &p.CacheWrite, rates.Write},
		{"cache_write_1h", func(p *Price) string { return p.CacheWrite1h }, &p.CacheWrite1h, rates.Write1h},
	} {
		given := ""
		for _, n := range named {
			if n != nil && c.pick(n) != "" {
				given = c.pick(n)
				break
			}
		}
		if given == "" {
			// Rounded up: a default never undercuts the rate.
			*c.dst = wallet.Micros((int64(p.Input)*c.rate + 999) / 1000)
			defaulted = append(defaulted, c.name)
			continue
		}
		if *c.dst, err = wallet.ParseMicros(given); err != nil {
			return p, nil, fmt.Errorf("%s price: %w", c.name, err)
		}
	}
	return p, defaulted, nil
}

// decodeAdapter reads a channel's provider configuration without
// provisioning it, for what needs only its settings; a channel without one
// is OpenAI-compatible.
func decodeAdapter(raw json.RawMessage) (provider.Adapter, error) {
	if raw == nil {
		return new(provider.OpenAI), nil
	}
	var which struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(raw, &which); err != nil || which.Name == "" {
		return nil, errors.New(`needs a "name"`)
	}
	info, err := caddy.GetModule(provider.Namespace + "." + which.Name)
	if err != nil {
		return nil, fmt.Errorf("unknown provider %q", which.Name)
	}
	mod := info.New()
	// Non-strict: the inline "name" key is not a field of the module.
	if err := json.Unmarshal(raw, mod); err != nil {
		return nil, fmt.Errorf("%s: %w", which.Name, err)
	}
	adapter, ok := mod.(provider.Adapter)
	if !ok {
		return nil, fmt.Errorf("module %q is not a provider adapter", which.Name)
	}
	// The adapter's own option checks, here too so that the Caddyfile
	// parser can name the line.
	if v, ok := mod.(caddy.Validator); ok {
		if err := v.Validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", which.Name, err)
		}
	}
	return adapter, nil
}

// channelBase is the channel's base URL (its provider's default when it
// gives none), checked by the provider.
func channelBase(c *Channel, adapter provider.Adapter) (*url.URL, error) {
	raw := c.BaseURL
	if raw == "" {
		raw = adapter.DefaultBaseURL()
	}
	if raw == "" {
		return nil, errors.New("needs a base URL: its provider has no default")
	}
	// Errors quote the base URL redacted: its userinfo or its query may
	// hold a credential.
	base, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("the base URL must be an absolute http(s) URL; it does not parse (not quoted: it may hold a credential)")
	}
	if (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("base URL %q must be an absolute http(s) URL", redact.URL(base))
	}
	if base.User != nil {
		// Not quoted: the userinfo is a credential.
		return nil, errors.New("the base URL holds a user or password, which would never be sent: set the channel's credentials with header")
	}
	base.Path = strings.TrimSuffix(base.Path, "/")
	if err := adapter.CheckBaseURL(base); err != nil {
		return nil, fmt.Errorf("base URL %q: %w", redact.URL(base), err)
	}
	return base, nil
}

// logCachePriceDefaults says, once per load, which prompt-cache prices
// came from a provider's default rates rather than the config: discounts
// vary by model, so the operator should see what the wallet will charge.
func logCachePriceDefaults(logger *zap.Logger, plan failover.Plan) {
	for _, m := range plan.Models {
		for channel, p := range m.Charge {
			if len(p.Defaulted) == 0 {
				continue
			}
			logger.Info("prompt-cache prices not configured; charging the provider's default rates (set cache_read, cache_write, cache_write_1h in the model's price)",
				zap.String("model", m.Name), zap.String("channel", channel), zap.Strings("defaulted", p.Defaulted),
				zap.String("cache_read", p.CacheRead.String()), zap.String("cache_write", p.CacheWrite.String()),
				zap.String("cache_write_1h", p.CacheWrite1h.String()))
		}
	}
}

// compileAdaptive checks adaptive_deadlines and fills its defaults; nil
// when it is off.
func compileAdaptive(a *AdaptiveDeadlines) (*latency.Config, error) {
	if a == nil {
		return nil, nil
	}
	switch {
	case !(a.Quantile >= 0 && a.Quantile < 1):
		return nil, fmt.Errorf("quantile must be between 0 and 1, got %v", a.Quantile)
	case a.Factor != 0 && !(a.Factor >= 1 && a.Factor <= math.MaxFloat64):
		return nil, fmt.Errorf("factor must be at least 1, got %v", a.Factor)
	case a.Floor < 0 || a.StallFloor < 0 || a.Window < 0:
		return nil, errors.New("floor, stall_floor and window must not be negative")
	case a.MinSamples < 0:
		return nil, fmt.Errorf("min_samples must not be negative, got %d", a.MinSamples)
	}
	cfg := latency.Config{Quantile: a.Quantile, Factor: a.Factor, Floor: time.Duration(a.Floor),
		StallFloor: time.Duration(a.StallFloor), MinSamples: a.MinSamples, Window: time.Duration(a.Window)}.WithDefaults()
	return &cfg, nil
}

// compileHedge checks the hedge block; a budget left 0 takes its default
// (Options.WithDefaults).
func compileHedge(h *Hedge) (failover.HedgeOptions, error) {
	var o failover.HedgeOptions
	if h == nil {
		return o, nil
	}
	if !(h.Budget >= 0 && h.Budget <= 1) {
		return o, fmt.Errorf("budget must be a share of requests between 0 and 100%%, got %v", h.Budget)
	}
	o.Budget = h.Budget
	switch h.Charge {
	case "", "operator":
	case "client":
		o.ChargeClient = true
	default:
		return o, fmt.Errorf("charge: want operator or client, got %q", h.Charge)
	}
	return o, nil
}

// compileHedgeAfter reads hedge_after: a positive duration, or a
// quantile of the first channel's time to first content (p95, p99.9).
func compileHedgeAfter(v string) (*failover.HedgeRule, error) {
	if strings.HasPrefix(v, "p") {
		q, err := parseQuantile(v)
		if err != nil {
			return nil, err
		}
		return &failover.HedgeRule{Quantile: q}, nil
	}
	d, err := caddy.ParseDuration(v)
	if err != nil || d <= 0 {
		return nil, fmt.Errorf("want a positive duration or a quantile such as p95, got %q", v)
	}
	return &failover.HedgeRule{After: d}, nil
}
