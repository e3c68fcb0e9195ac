package llmfailover

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("llm_failover", parseCaddyfile)
	// Like reverse_proxy, llm_failover answers requests itself; ordering it
	// just before reverse_proxy spares users an `order` line.
	httpcaddyfile.RegisterDirectiveOrder("llm_failover", httpcaddyfile.Before, "reverse_proxy")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	llm_failover [<matcher>] {
//		channel <name> [<base_url>] {
//			provider openai|anthropic [{ ... }]
//			header <field> <value>
//			transport http { ... }
//			pass_request_header  <field...>
//			pass_response_header <field...>
//			pass_rate_limit_headers
//			propagate_trace
//		}
//		model <name> {
//			policy cost|weighted
//			route <channel> [cost <input_per_mtok> <output_per_mtok>] [upstream_model <name>] [weight <n>]
//			price <input_per_mtok> <output_per_mtok>
//			max_output_tokens <n>
//			max_input_tokens <n>
//			stream_resume continue|off
//			hedge_after <duration>|p<NN>
//		}
//		max_hops            <n>
//		header_timeout      <duration>
//		stream_header_timeout <duration>
//		deadline            <duration>
//		first_byte_timeout  <duration>
//		max_request_body    <size>
//		trace_content       <size>
//		max_response_body   <size>
//		retry_status        <status...>
//		retry_same          <status...> [max_wait <duration>]
//		stream_gate         <duration> [failover]
//		stream_idle_timeout <duration>
//		stream_resume       continue|off
//		adaptive_deadlines [{
//			quantile    p<NN>|<fraction>
//			factor      <x>
//			floor       <duration>
//			stall_floor <duration>
//			min_samples <n>
//			window      <duration>
//		}]
//		hedge {
//			budget <percent>
//			charge operator|client
//		}
//		breaker {
//			window    <duration>
//			failures  <n>
//			cooldown  <duration>
//			ratio     <min_calls> <failure_ratio>
//			max_park  <duration>
//			park      <duration>
//			trials    <n>
//		}
//		wallet [<name>] {
//			on_store_error  deny|allow
//			account         <placeholder>
//		}
//		probe_account  <account>
//		auth           off
//		forward_path   <path...>
//		request_body_timeout <duration>
//	}
//
// and inside a model block:
//
//	probe [{
//		interval   <duration>
//		max_tokens <n>
//		prompt     <text>
//		budget     <dollars>
//	}]
//
// What is one per process is set in global options: the history store,
// the probe leader, heartbeats and max_held_bytes in llm_failover
// (package failoverapp), the wallet's store and reservation_ttl in
// llm_wallet (package walletapp).
//
// The parser checks syntax; what the values mean is checked once, by the
// same code that checks JSON configs, and a mistake found there is reported
// at the line of the element it is about.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	start := caddykit.Position(d)
	at := map[string]string{}
	for d.NextBlock(0) {
		opt := d.Val()
		switch opt {
		case "channel", "model":
		default:
			if first, dup := at[optionKey(opt)]; dup {
				return d.Errf("%s specified more than once (first at %s)", opt, first)
			}
			at[optionKey(opt)] = caddykit.Position(d)
		}
		var err error
		switch opt {
		case "channel":
			err = h.unmarshalChannel(d, at)
		case "model":
			err = h.unmarshalModel(d, at)
		case "max_hops":
			h.MaxHops, err = caddykit.IntArg(d, 1)
		case "header_timeout":
			h.HeaderTimeout, err = caddykit.DurationArg(d)
		case "stream_header_timeout":
			h.StreamHeaderTimeout, err = caddykit.DurationArg(d)
		case "deadline":
			h.Deadline, err = caddykit.DurationArg(d)
		case "first_byte_timeout":
			h.FirstByteTimeout, err = caddykit.DurationOrOffArg(d)
		case "max_request_body":
			h.MaxRequestBody, err = caddykit.SizeArg(d)
		case "max_response_body":
			h.MaxResponseBody, err = caddykit.SizeArg(d)
		case "trace_content":
			h.TraceContent, err = caddykit.SizeArg(d)
		case "retry_status":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			h.RetryStatus = []int{}
			for _, a := range args {
				code, cerr := strconv.Atoi(a)
				if cerr != nil {
					return d.Errf("retry_status: %q is not an HTTP status code", a)
				}
				h.RetryStatus = append(h.RetryStatus, code)
			}
		case "retry_same":
			h.RetrySame, err = unmarshalRetrySame(d)
		case "idempotency":
			h.Idempotency, err = unmarshalIdempotency(d)
		case "stream_resume":
			h.StreamResume, err = resumeArg(d)
		case "cache_affinity":
			if !d.NextArg() {
				return d.Errf("cache_affinity needs off or a duration")
			}
			h.CacheAffinity = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "stream_gate":
			g := new(StreamGate)
			if g.Timeout, err = caddykit.DurationArg(d); err == nil && d.NextArg() {
				if d.Val() != "failover" {
					return d.Errf("stream_gate: unknown option %q (want failover)", d.Val())
				}
				g.Failover = true
				if d.NextArg() {
					return d.ArgErr()
				}
			}
			h.StreamGate = g
		case "stream_idle_timeout":
			h.StreamIdleTimeout, err = caddykit.DurationArg(d)
		case "adaptive_deadlines":
			h.AdaptiveDeadlines, err = unmarshalAdaptive(d)
		case "hedge":
			h.Hedge, err = unmarshalHedge(d)
		case "heartbeat", "history", "probe_leader", "max_held_bytes":
			return d.Errf("%s is one per process: it moved to the global llm_failover option: { llm_failover { %s ... } }", opt, opt)
		case "breaker":
			err = h.unmarshalBreaker(d)
		case "wallet":
			err = h.unmarshalWallet(d)
		case "auth":
			if !d.NextArg() {
				return d.ArgErr()
			}
			h.Auth = d.Val()
		case "forward_path":
			if h.ForwardPaths = d.RemainingArgs(); len(h.ForwardPaths) == 0 {
				return d.ArgErr()
			}
		case "request_body_timeout":
			h.RequestBodyTimeout, err = caddykit.DurationArg(d)
		case "probe_account":
			if !d.NextArg() {
				return d.ArgErr()
			}
			h.ProbeAccount = d.Val()
		default:
			return d.Errf("unrecognized subdirective '%s'", opt)
		}
		if err == nil && singleArgument[opt] {
			err = caddykit.NoMoreArgs(d)
		}
		if err != nil {
			return err
		}
	}
	if _, err := compile(h); err != nil {
		where := start
		var ce *configError
		if errors.As(err, &ce) && at[ce.at] != "" {
			where = at[ce.at]
		}
		return fmt.Errorf("%w, at %s", err, where)
	}
	return nil
}

// singleArgument lists the options that take exactly one argument.
var singleArgument = map[string]bool{
	"max_hops": true, "header_timeout": true, "stream_header_timeout": true, "deadline": true, "first_byte_timeout": true,
	"max_request_body": true, "max_response_body": true, "stream_idle_timeout": true, "trace_content": true,
	"auth": true, "request_body_timeout": true, "probe_account": true,
	"window": true, "failures": true, "cooldown": true, "max_park": true, "park": true, "trials": true,
}

func (h *Handler) unmarshalChannel(d *caddyfile.Dispenser, at map[string]string) error {
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 {
		return d.Errf("channel needs a name and, unless its provider has a default, a base URL")
	}
	// The last definition wins: of two with one name, the second is the
	// mistake.
	at[channelKey(args[0])] = caddykit.Position(d)
	c := &Channel{Name: args[0]}
	if len(args) == 2 {
		c.BaseURL = args[1]
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "provider":
			if !d.NextArg() {
				return d.ArgErr()
			}
			if c.ProviderRaw != nil {
				return d.Err("provider already specified")
			}
			name := d.Val()
			if _, err := caddy.GetModule(provider.Namespace + "." + name); err != nil {
				return d.Errf("channel %q: unknown provider %q: the providers are %s", c.Name, name, strings.Join(moduleNames(provider.Namespace), ", "))
			}
			unm, err := caddyfile.UnmarshalModule(d, provider.Namespace+"."+name)
			if err != nil {
				return err
			}
			if _, ok := unm.(provider.Adapter); !ok {
				return d.Errf("provider module '%s' is not a provider adapter", name)
			}
			c.ProviderRaw = caddyconfig.JSONModuleObject(unm, "name", name, nil)
		case "header":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.Errf("header needs a field and a value")
			}
			if c.Headers == nil {
				c.Headers = map[string]string{}
			}
			field := http.CanonicalHeaderKey(args[0])
			if _, dup := c.Headers[field]; dup {
				return d.Errf("channel %q: header %s specified more than once", c.Name, field)
			}
			c.Headers[field] = args[1]
		case "transport":
			if !d.NextArg() {
				return d.ArgErr()
			}
			if c.TransportRaw != nil {
				return d.Err("transport already specified")
			}
			name := d.Val()
			if _, err := caddy.GetModule("http.reverse_proxy.transport." + name); err != nil {
				return d.Errf("channel %q: unknown transport %q: the transports are %s", c.Name, name, strings.Join(moduleNames("http.reverse_proxy.transport"), ", "))
			}
			unm, err := caddyfile.UnmarshalModule(d, "http.reverse_proxy.transport."+name)
			if err != nil {
				return err
			}
			if _, ok := unm.(http.RoundTripper); !ok {
				return d.Errf("transport module '%s' is not a RoundTripper", name)
			}
			c.TransportRaw = caddyconfig.JSONModuleObject(unm, "protocol", name, nil)
		case "pass_request_header", "pass_response_header":
			opt := d.Val()
			names := d.RemainingArgs()
			if len(names) == 0 {
				return d.ArgErr()
			}
			if opt == "pass_request_header" {
				c.PassRequestHeaders = append(c.PassRequestHeaders, names...)
			} else {
				c.PassResponseHeaders = append(c.PassResponseHeaders, names...)
			}
		case "pass_rate_limit_headers":
			if d.NextArg() {
				return d.ArgErr()
			}
			c.PassRateLimitHeaders = true
		case "propagate_trace":
			if d.NextArg() {
				return d.ArgErr()
			}
			c.PropagateTrace = true
		default:
			return d.Errf("unrecognized channel option '%s'", d.Val())
		}
	}
	h.Channels = append(h.Channels, c)
	return nil
}

func (h *Handler) unmarshalModel(d *caddyfile.Dispenser, at map[string]string) error {
	if !d.NextArg() {
		return d.Errf("model needs a name")
	}
	name := d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	// The last definition wins: of two with one name, the second is the
	// mistake.
	at[modelKey(name)] = caddykit.Position(d)
	m := &Model{Name: name}
	seen := caddykit.Seen{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if d.Val() != "route" {
			if err := seen.Once(d, fmt.Sprintf("model %q: ", name)); err != nil {
				return err
			}
		}
		switch d.Val() {
		case "policy":
			if !d.NextArg() {
				return d.ArgErr()
			}
			m.Policy = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "route":
			where := caddykit.Position(d)
			r, err := unmarshalRoute(d)
			if err != nil {
				return err
			}
			// The last route to a channel wins: when a channel is routed
			// twice, the second route is the mistake.
			at[routeKey(name, r.Channel)] = where
			m.Routes = append(m.Routes, r)
		case "price":
			p, err := priceArgs(d)
			if err != nil {
				return err
			}
			if d.NextArg() {
				return d.Errf("price: unknown option %q (want cache_read, cache_write or cache_write_1h)", d.Val())
			}
			m.Price = p
		case "max_output_tokens", "max_input_tokens":
			opt := d.Val()
			n, err := caddykit.IntArg(d, 1)
			if err == nil {
				err = caddykit.NoMoreArgs(d)
			}
			if err != nil {
				return err
			}
			if opt == "max_output_tokens" {
				m.MaxOutputTokens = int64(n)
			} else {
				m.MaxInputTokens = int64(n)
			}
		case "stream_resume":
			var err error
			if m.StreamResume, err = resumeArg(d); err != nil {
				return err
			}
		case "hedge_after":
			if !d.NextArg() {
				return d.ArgErr()
			}
			m.HedgeAfter = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "idempotency":
			if !d.NextArg() || (d.Val() != "on" && d.Val() != "off") {
				return d.Errf("idempotency: want on or off")
			}
			m.Idempotency = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "probe":
			p, err := unmarshalProbe(d)
			if err != nil {
				return err
			}
			m.Probe = p
		default:
			return d.Errf("unrecognized model option '%s'", d.Val())
		}
	}
	h.Models = append(h.Models, m)
	return nil
}

func unmarshalRoute(d *caddyfile.Dispenser) (Route, error) {
	var r Route
	if !d.NextArg() {
		return r, d.Errf("route needs a channel name")
	}
	r.Channel = d.Val()
	seen := map[string]bool{}
	for d.NextArg() {
		if seen[d.Val()] {
			return r, d.Errf("route %s: %s specified more than once", r.Channel, d.Val())
		}
		seen[d.Val()] = true
		switch d.Val() {
		case "cost":
			p, err := priceArgs(d)
			if err != nil {
				return r, err
			}
			r.Cost = p
		case "upstream_model":
			if !d.NextArg() {
				return r, d.ArgErr()
			}
			r.UpstreamModel = d.Val()
		case "weight":
			n, err := caddykit.IntArg(d, 1)
			if err != nil {
				return r, err
			}
			r.Weight = n
		default:
			return r, d.Errf("unrecognized route option '%s' (want cost, upstream_model or weight)", d.Val())
		}
	}
	return r, nil
}

func (h *Handler) unmarshalBreaker(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	b := new(Breaker)
	var err error
	seen := caddykit.Seen{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if err := seen.Once(d, "breaker: "); err != nil {
			return err
		}
		switch opt {
		case "window":
			b.Window, err = caddykit.DurationArg(d)
		case "failures":
			b.Failures, err = caddykit.IntArg(d, 1)
		case "cooldown":
			b.Cooldown, err = caddykit.DurationArg(d)
		case "max_park":
			b.MaxPark, err = caddykit.DurationArg(d)
		case "park":
			b.Park, err = caddykit.DurationArg(d)
		case "trials":
			b.Trials, err = caddykit.IntArg(d, 1)
		case "ratio":
			r := new(BreakerRatio)
			if r.MinCalls, err = caddykit.IntArg(d, 1); err != nil {
				return err
			}
			// IntArg consumed one argument; the ratio follows it.
			if !d.NextArg() {
				return d.Errf("ratio needs <min_calls> <failure_ratio>")
			}
			if r.FailureRatio, err = strconv.ParseFloat(d.Val(), 64); err != nil {
				return d.Errf("ratio: failure ratio %q is not a number", d.Val())
			}
			b.Ratio = r
			err = caddykit.NoMoreArgs(d)
		default:
			return d.Errf("unrecognized breaker option '%s'", d.Val())
		}
		if err == nil && singleArgument[opt] {
			err = caddykit.NoMoreArgs(d)
		}
		if err != nil {
			return err
		}
	}
	h.Breaker = b
	return nil
}

func (h *Handler) unmarshalWallet(d *caddyfile.Dispenser) error {
	w := new(Wallet)
	if d.NextArg() {
		switch w.Name = d.Val(); w.Name {
		case "sqlite", "postgres":
			return d.Errf("wallet %s: the store moved to the global llm_wallet option: { llm_wallet [<name>] { store %s ... } }, and the handler says wallet [<name>]", w.Name, w.Name)
		}
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	seen := caddykit.Seen{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if err := seen.Once(d, "wallet: "); err != nil {
			return err
		}
		switch opt {
		case "on_store_error":
			if !d.NextArg() {
				return d.ArgErr()
			}
			w.OnStoreError = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "account":
			if !d.NextArg() {
				return d.ArgErr()
			}
			w.Account = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "reservation_ttl":
			return d.Errf("wallet: reservation_ttl moved to the global llm_wallet option: { llm_wallet [<name>] { reservation_ttl %s } }", strings.Join(d.RemainingArgs(), " "))
		default:
			return d.Errf("unrecognized wallet option '%s'", opt)
		}
	}
	h.Wallet = w
	return nil
}

// priceArgs reads "<input_per_mtok> <output_per_mtok> [cache_read <p>]
// [cache_write <p>] [cache_write_1h <p>]"; the option (price or cost)
// names itself in the error. Any other word after the two prices is left
// for the caller (a route's upstream_model, weight).
func priceArgs(d *caddyfile.Dispenser) (*Price, error) {
	opt := d.Val()
	if !d.NextArg() {
		return nil, d.Errf("%s needs <input_per_mtok> <output_per_mtok>", opt)
	}
	p := &Price{Input: d.Val()}
	if !d.NextArg() {
		return nil, d.Errf("%s needs <input_per_mtok> <output_per_mtok>", opt)
	}
	p.Output = d.Val()
	for d.NextArg() {
		var dst *string
		switch d.Val() {
		case "cache_read":
			dst = &p.CacheRead
		case "cache_write":
			dst = &p.CacheWrite
		case "cache_write_1h":
			dst = &p.CacheWrite1h
		default:
			d.Prev()
			return p, nil
		}
		word := d.Val()
		if !d.NextArg() {
			return nil, d.Errf("%s: %s needs a price per million tokens", opt, word)
		}
		*dst = d.Val()
	}
	return p, nil
}

// unmarshalRetrySame parses retry_same <status...> [max_wait <duration>].
func unmarshalRetrySame(d *caddyfile.Dispenser) (*RetrySame, error) {
	r := &RetrySame{}
	for d.NextArg() {
		if d.Val() == "max_wait" {
			var err error
			if r.MaxWait, err = caddykit.DurationArg(d); err != nil {
				return nil, err
			}
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			break
		}
		code, err := strconv.Atoi(d.Val())
		if err != nil {
			return nil, d.Errf("retry_same: %q is not an HTTP status code", d.Val())
		}
		r.Statuses = append(r.Statuses, code)
	}
	if len(r.Statuses) == 0 {
		return nil, d.Errf("retry_same needs at least one status")
	}
	return r, nil
}

// unmarshalIdempotency parses `idempotency [{ retention <d> max_answer
// <size> max_stored <size> grace <d> lease <d> }]`.
func unmarshalIdempotency(d *caddyfile.Dispenser) (*Idempotency, error) {
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	idem := new(Idempotency)
	seen := caddykit.Seen{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.Once(d, "idempotency: "); err != nil {
			return nil, err
		}
		var err error
		switch opt := d.Val(); opt {
		case "retention":
			idem.Retention, err = caddykit.DurationArg(d)
		case "grace":
			idem.Grace, err = caddykit.DurationArg(d)
		case "lease":
			idem.Lease, err = caddykit.DurationArg(d)
		case "max_answer":
			idem.MaxAnswer, err = caddykit.SizeArg(d)
		case "max_stored":
			idem.MaxStored, err = caddykit.SizeArg(d)
		default:
			return nil, d.Errf("idempotency: unknown option %q (want retention, max_answer, max_stored, grace or lease)", opt)
		}
		if err != nil {
			return nil, err
		}
	}
	return idem, nil
}

// unmarshalAdaptive parses `adaptive_deadlines [{ quantile <q|pNN>
// factor <x> floor <d> stall_floor <d> min_samples <n> window <d> }]`.
func unmarshalAdaptive(d *caddyfile.Dispenser) (*AdaptiveDeadlines, error) {
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	a := new(AdaptiveDeadlines)
	seen := caddykit.Seen{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.Once(d, "adaptive_deadlines: "); err != nil {
			return nil, err
		}
		var err error
		switch opt := d.Val(); opt {
		case "quantile":
			if !d.NextArg() {
				return nil, d.ArgErr()
			}
			if a.Quantile, err = parseQuantile(d.Val()); err != nil {
				return nil, d.Errf("adaptive_deadlines: quantile: %v", err)
			}
			err = caddykit.NoMoreArgs(d)
		case "factor":
			if !d.NextArg() {
				return nil, d.ArgErr()
			}
			if a.Factor, err = strconv.ParseFloat(d.Val(), 64); err != nil || !(a.Factor >= 1) || math.IsInf(a.Factor, 1) {
				return nil, d.Errf("adaptive_deadlines: factor: want a number of at least 1, got %q", d.Val())
			}
			err = caddykit.NoMoreArgs(d)
		case "floor":
			a.Floor, err = caddykit.DurationArg(d)
		case "stall_floor":
			a.StallFloor, err = caddykit.DurationArg(d)
		case "window":
			a.Window, err = caddykit.DurationArg(d)
		case "min_samples":
			a.MinSamples, err = caddykit.IntArg(d, 1)
			if err == nil {
				err = caddykit.NoMoreArgs(d)
			}
		default:
			return nil, d.Errf("adaptive_deadlines: unknown option %q (want quantile, factor, floor, stall_floor, min_samples or window)", opt)
		}
		if err != nil {
			return nil, err
		}
	}
	return a, nil
}

// unmarshalHedge parses `hedge { budget <percent> charge operator|client }`.
func unmarshalHedge(d *caddyfile.Dispenser) (*Hedge, error) {
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	h := new(Hedge)
	seen := caddykit.Seen{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.Once(d, "hedge: "); err != nil {
			return nil, err
		}
		opt := d.Val()
		if !d.NextArg() {
			return nil, d.ArgErr()
		}
		switch opt {
		case "budget":
			v := strings.TrimSuffix(d.Val(), "%")
			pct, err := strconv.ParseFloat(v, 64)
			if err != nil || v == d.Val() {
				return nil, d.Errf("hedge: budget: want a percentage such as 5%%, got %q", d.Val())
			}
			if !(pct > 0) {
				// 0 is the JSON's "default" (5%), never "no hedges".
				return nil, d.Errf("hedge: budget: want a percentage above 0%%, got %q (to hedge nothing, remove the models' hedge_after)", d.Val())
			}
			h.Budget = pct / 100
		case "charge":
			h.Charge = d.Val()
		default:
			return nil, d.Errf("hedge: unknown option %q (want budget or charge)", opt)
		}
		if err := caddykit.NoMoreArgs(d); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// parseQuantile reads a quantile written as a fraction (0.99) or as a
// percentile (p99, p99.9).
func parseQuantile(s string) (float64, error) {
	v, pct := strings.CutPrefix(s, "p")
	q, err := strconv.ParseFloat(v, 64)
	if pct {
		q /= 100
	}
	// Negated so that NaN, which fails every comparison, is refused too.
	if err != nil || !(q > 0 && q < 1) {
		return 0, fmt.Errorf("want a quantile such as p99 or 0.99, got %q", s)
	}
	return q, nil
}

// resumeArg parses stream_resume's one argument.
func resumeArg(d *caddyfile.Dispenser) (string, error) {
	if !d.NextArg() {
		return "", d.ArgErr()
	}
	v := d.Val()
	if err := caddykit.NoMoreArgs(d); err != nil {
		return "", err
	}
	if err := compileResume(v); err != nil {
		return "", d.Errf("stream_resume: %v", err)
	}
	return v, nil
}

// unmarshalProbe reads `probe [{ interval <d>; max_tokens <n>; prompt <text>; budget <dollars> }]`.
func unmarshalProbe(d *caddyfile.Dispenser) (*Probe, error) {
	if err := caddykit.NoMoreArgs(d); err != nil {
		return nil, err
	}
	p := &Probe{}
	seen := caddykit.Seen{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.Once(d, "probe: "); err != nil {
			return nil, err
		}
		var err error
		switch d.Val() {
		case "interval":
			if p.Interval, err = caddykit.DurationArg(d); err == nil {
				err = caddykit.NoMoreArgs(d)
			}
		case "max_tokens":
			if p.MaxTokens, err = caddykit.IntArg(d, 1); err == nil {
				err = caddykit.NoMoreArgs(d)
			}
		case "prompt":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return nil, d.ArgErr()
			}
			p.Prompt = strings.Join(args, " ")
		case "budget":
			if !d.NextArg() {
				return nil, d.ArgErr()
			}
			p.Budget = d.Val()
			err = caddykit.NoMoreArgs(d)
		default:
			return nil, d.Errf("unrecognized probe option '%s' (want interval, max_tokens, prompt or budget)", d.Val())
		}
		if err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)

// moduleNames lists the names of the modules registered in namespace,
// sorted: what a config error offers instead of a misspelt one.
func moduleNames(namespace string) []string {
	var names []string
	for _, m := range caddy.GetModules(namespace) {
		names = append(names, m.ID.Name())
	}
	return names
}
