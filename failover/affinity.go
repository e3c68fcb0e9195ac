package failover

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"

	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// Cache affinity: a conversation's next turn goes first to the channel
// that served its last one, where the provider's prompt cache holds its
// prefix, as long as that channel is a candidate at all. It only reorders
// the candidates the chain planned: an open or parked channel is not one,
// and a channel of another model never is. Under the cost policy the warm
// channel goes first only when it is the cheaper for this request, its
// cached prefix priced as a cache read.

// preferCachedChannel moves the channel that served x's conversation last
// to the front of candidates, when the model's policy agrees, and notes
// the conversation's key for rememberCachedChannel. A model with one
// route has nothing to prefer.
func (e *Engine) preferCachedChannel(x *exchange, candidates []*chain.Route) {
	if e.opts.CacheAffinity <= 0 || len(x.model.ByAPI[x.api].Routes) < 2 {
		return
	}
	x.affinityKey = conversationKey(x)
	if x.affinityKey == "" {
		return
	}
	pin, ok := e.app.Affinity(x.r.Context(), x.req.Model, x.affinityKey, x.start)
	if !ok {
		return
	}
	// A pin names the channel's identity, not only its name: a channel a
	// reload gave another base URL or key (or another site's channel of
	// the same name) has no cache of the conversation.
	i := slices.IndexFunc(candidates, func(r *chain.Route) bool { return e.pinRef(r) == pin.Channel })
	if i <= 0 {
		return
	}
	if x.model.ByAPI[x.api].Policy == chain.Cost && !x.model.warmIsCheaper(x.body, pin, candidates[i], candidates[0]) {
		return
	}
	// Affinity overruled the chain: the journal says so, naming the
	// channel the chain would have tried first.
	e.decided(x, candidates[i].Name, &failure{reason: reasonAffinity}, candidates[0].Name)
	r := candidates[i]
	copy(candidates[1:i+1], candidates[:i])
	candidates[0] = r
}

// conversationKey is x's conversation key. A key the client chose (a
// prompt_cache_key, a session header) is scoped to the client's identity
// when the gateway knows one (the wallet's account, else Caddy's
// authenticated user), so that another client choosing the same key
// cannot steer its turns; a prompt's own hash is not: clients sending the
// same long prompt share the provider's cache for it.
func conversationKey(x *exchange) string {
	k := provider.ConversationKey(x.r.Header, x.body)
	if k == "" || strings.HasPrefix(k, "pfx:") {
		return k
	}
	who := ""
	if x.bill != nil {
		who = x.bill.res.Account
	} else if x.repl != nil {
		if id, ok := x.repl.GetString("http.auth.user.id"); ok {
			who = id
		}
	}
	if who == "" {
		return k
	}
	sum := sha256.Sum256([]byte(who))
	return hex.EncodeToString(sum[:8]) + "/" + k
}

// warmIsCheaper reports whether warm, whose cache holds pin.Cached tokens
// of body's prompt, costs no more for this request than cold, the chain's
// first choice, which reads none of them from its cache and, when body
// asks for caching, writes them again. Both are priced at their routes'
// cost, the output estimated as the last turn's.
func (m *Model) warmIsCheaper(body []byte, pin failoverapp.Pin, warm, cold *chain.Route) bool {
	in := provider.EstimateInputTokens(body)
	cached := min(max(pin.Cached, 0), in)
	warmCost := m.Cost[warm.Name].CostOf(wallet.Tokens{Input: in - cached, CacheRead: cached, Output: pin.Output})
	coldTokens := wallet.Tokens{Input: in, Output: pin.Output}
	switch write, write1h := provider.CacheWrites(body); {
	case write1h:
		coldTokens.Input, coldTokens.CacheWrite1h = in-cached, cached
	case write:
		coldTokens.Input, coldTokens.CacheWrite = in-cached, cached
	}
	return warmCost <= m.Cost[cold.Name].CostOf(coldTokens)
}

// rememberCachedChannel records the channel whose answer x's client got,
// and what its cache now holds of the conversation, for its next turn.
func (e *Engine) rememberCachedChannel(x *exchange, res attemptResult) {
	if x.affinityKey == "" || x.servedBy == "" || res.verdict != served || x.meter == nil {
		return
	}
	i := slices.IndexFunc(x.model.Chain.Routes, func(r chain.Route) bool { return r.Name == x.servedBy })
	if i < 0 {
		return
	}
	u := x.meter.Usage()
	pin := failoverapp.Pin{Channel: e.pinRef(&x.model.Chain.Routes[i]), Cached: u.CacheRead + u.CacheWrite + u.CacheWrite1h, Output: outputTokens(x.meter)}
	if e.cachesImplicitly(x.model, x.servedBy) {
		// The whole prompt is cached, not only what was read or written.
		pin.Cached = max(pin.Cached, u.Input)
	}
	e.app.RememberAffinity(x.req.Model, x.affinityKey, pin, e.opts.CacheAffinity, time.Now())
}

// pinRef is how a pin names route's channel: its name and its identity's
// Ref, so that a pin never moves a request to another channel of the
// same name.
func (e *Engine) pinRef(r *chain.Route) string {
	if h := e.channels[r.Channel].health; h != nil {
		return r.Name + "@" + h.Ref
	}
	return r.Name
}

// cachesImplicitly reports whether the provider of model's route on
// channel caches every served prompt unasked.
func (e *Engine) cachesImplicitly(m *Model, channel string) bool {
	for _, r := range m.Chain.Routes {
		if r.Name == channel {
			upstream := r.UpstreamModel
			if upstream == "" {
				upstream = m.Name
			}
			return provider.DefaultCacheRates(e.channels[r.Channel].Adapter, upstream).Implicit
		}
	}
	return false
}
