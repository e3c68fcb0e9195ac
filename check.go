package llmfailover

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/provider"
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

// Element keys, shared by check and the Caddyfile parser's positions.
func optionKey(opt string) string           { return "option " + opt }
func channelKey(name string) string         { return "channel " + name }
func modelKey(name string) string           { return "model " + name }
func routeKey(model, channel string) string { return "route " + model + "\x00" + channel }

// check finds every mistake in the handler's configuration that needs no
// running server: the one place where the configuration is validated,
// whether it came from a Caddyfile (the parser calls it and adds the line)
// or from JSON (Provision calls it). Zero values mean "the default".
func (h *Handler) check() error {
	if h.MaxHops < 0 {
		return mistake(optionKey("max_hops"), "max_hops must be at least 1, got %d", h.MaxHops)
	}
	for _, d := range []struct {
		opt string
		v   caddy.Duration
	}{
		{"header_timeout", h.HeaderTimeout}, {"stream_header_timeout", h.StreamHeaderTimeout}, {"deadline", h.Deadline}, {"first_byte_timeout", h.FirstByteTimeout},
		{"stream_gate", h.StreamGate}, {"stream_idle_timeout", h.StreamIdleTimeout}, {"request_body_timeout", h.RequestBodyTimeout},
	} {
		if d.v < 0 {
			return mistake(optionKey(d.opt), "%s must not be negative, got %s", d.opt, time.Duration(d.v))
		}
	}
	for _, s := range []struct {
		opt string
		v   int64
	}{{"max_request_body", h.MaxRequestBody}, {"max_response_body", h.MaxResponseBody}} {
		if s.v < 0 {
			return mistake(optionKey(s.opt), "%s must not be negative, got %d", s.opt, s.v)
		}
	}
	for _, s := range h.RetryStatus {
		if s < 100 || s > 599 {
			return mistake(optionKey("retry_status"), "retry_status: %d is not an HTTP status code", s)
		}
	}
	if err := h.checkRetrySame(); err != nil {
		return err
	}
	if err := checkResume(optionKey("stream_resume"), h.StreamResume); err != nil {
		return err
	}
	if err := h.Breaker.config().Validate(); err != nil {
		return mistake(optionKey("breaker"), "breaker: %w", err)
	}
	switch h.Auth {
	case "", "off":
	default:
		return mistake(optionKey("auth"), "auth: want off, got %q (wallet keys and account placeholders are set with wallet)", h.Auth)
	}
	if h.Auth == "off" && h.Wallet != nil {
		return mistake(optionKey("auth"), "auth off and a wallet contradict each other: a wallet authenticates every request")
	}
	if h.MaxHeldBytes < 0 {
		return mistake(optionKey("max_held_bytes"), "max_held_bytes must not be negative, got %d", h.MaxHeldBytes)
	}
	for _, p := range h.ForwardPaths {
		if !strings.HasPrefix(p, "/") || provider.CheckPath(p) != nil {
			return mistake(optionKey("forward_path"), "forward_path: %q is not a clean absolute path", p)
		}
	}
	if w := h.Wallet; w != nil {
		switch w.OnStoreError {
		case "", "deny", "allow":
		default:
			return mistake(optionKey("wallet"), "wallet: on_store_error: want deny or allow, got %q", w.OnStoreError)
		}
	}

	channels := make(map[string]bool, len(h.Channels))
	for i, c := range h.Channels {
		if c.Name == "" {
			return mistake("", "channel %d has no name", i)
		}
		if channels[c.Name] {
			return mistake(channelKey(c.Name), "channel %q is defined twice", c.Name)
		}
		channels[c.Name] = true
		adapter, err := decodeAdapter(c.ProviderRaw)
		if err != nil {
			return mistake(channelKey(c.Name), "channel %q: provider: %w", c.Name, err)
		}
		if _, err := channelBase(c, adapter); err != nil {
			return mistake(channelKey(c.Name), "channel %q: %w", c.Name, err)
		}
	}

	if len(h.Models) == 0 {
		return mistake("", "no models configured")
	}
	models := make(map[string]bool, len(h.Models))
	for _, m := range h.Models {
		if m.Name == "" {
			return mistake("", "a model has no name")
		}
		if models[m.Name] {
			return mistake(modelKey(m.Name), "model %q is defined twice", m.Name)
		}
		models[m.Name] = true
		if err := checkResume(modelKey(m.Name), m.StreamResume); err != nil {
			return err
		}
		if _, err := chain.ParsePolicy(m.Policy); err != nil {
			return mistake(modelKey(m.Name), "model %q: %w", m.Name, err)
		}
		if len(m.Routes) == 0 {
			return mistake(modelKey(m.Name), "model %q has no routes", m.Name)
		}
		if len(m.Routes) > chain.MaxRoutes {
			return mistake(modelKey(m.Name), "model %q has %d routes; at most %d are allowed", m.Name, len(m.Routes), chain.MaxRoutes)
		}
		if m.MaxOutputTokens < 0 {
			return mistake(modelKey(m.Name), "model %q: max_output_tokens must not be negative", m.Name)
		}
		if m.MaxInputTokens < 0 || m.MaxInputTokens > provider.MaxTokenLimit {
			return mistake(modelKey(m.Name), "model %q: max_input_tokens must be between 0 and %d", m.Name, provider.MaxTokenLimit)
		}
		if _, err := m.Price.parse(); err != nil {
			return mistake(modelKey(m.Name), "model %q: price: %w", m.Name, err)
		}
		if _, err := m.Probe.plan(); err != nil {
			return mistake(modelKey(m.Name), "model %q: probe: %w", m.Name, err)
		}
		if m.Probe != nil && h.Wallet != nil && h.ProbeAccount == "" {
			return mistake(modelKey(m.Name), "model %q: probe: with a wallet, probes need a probe_account to be charged to", m.Name)
		}
		routed := make(map[string]bool, len(m.Routes))
		for _, r := range m.Routes {
			at := routeKey(m.Name, r.Channel)
			if !channels[r.Channel] {
				return mistake(at, "model %q: route to unknown channel %q", m.Name, r.Channel)
			}
			if routed[r.Channel] {
				return mistake(at, "model %q routes channel %q twice", m.Name, r.Channel)
			}
			routed[r.Channel] = true
			if _, err := r.Cost.parse(); err != nil {
				return mistake(at, "model %q: route %s: cost: %w", m.Name, r.Channel, err)
			}
			if r.Weight < 0 {
				return mistake(at, "model %q: route %s: weight must not be negative", m.Name, r.Channel)
			}
		}
	}
	return nil
}

// decodeAdapter reads a channel's provider configuration without
// provisioning it, for the checks that need only its settings; a channel
// without one is OpenAI-compatible.
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
	base, err := url.Parse(raw)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("base URL %q must be an absolute http(s) URL", raw)
	}
	base.Path = strings.TrimSuffix(base.Path, "/")
	if err := adapter.CheckBaseURL(base); err != nil {
		return nil, fmt.Errorf("base URL %q: %w", raw, err)
	}
	return base, nil
}
