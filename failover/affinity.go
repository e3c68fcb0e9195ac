package failover

import (
	"time"

	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// Cache affinity: a conversation's next turn goes first to the channel
// that served its last one, where the provider's prompt cache holds its
// prefix, as long as that channel is a candidate at all. It only reorders
// the candidates the chain planned: an open or parked channel is not one,
// and a channel of another model never is.

// preferCachedChannel moves the channel that served x's conversation last
// to the front of candidates, and notes the conversation's key for
// rememberCachedChannel. A model with one route has nothing to prefer.
func (e *Engine) preferCachedChannel(x *exchange, candidates []*chain.Route) {
	if e.opts.CacheAffinity <= 0 || len(x.model.ByAPI[x.api].Routes) < 2 {
		return
	}
	x.affinityKey = provider.ConversationKey(x.r.Header, x.body)
	if x.affinityKey == "" {
		return
	}
	name := e.app.AffinityChannel(x.req.Model, x.affinityKey, x.start)
	for i, r := range candidates {
		if r.Name != name {
			continue
		}
		if i > 0 {
			// Affinity overruled the chain: the journal says so, naming
			// the channel the chain would have tried first.
			e.decided(x, name, &failure{reason: reasonAffinity}, candidates[0].Name)
			copy(candidates[1:i+1], candidates[:i])
			candidates[0] = r
		}
		return
	}
}

// rememberCachedChannel records the channel whose answer x's client got,
// for the conversation's next turn.
func (e *Engine) rememberCachedChannel(x *exchange, res attemptResult) {
	if x.affinityKey == "" || x.servedBy == "" || res.verdict != served {
		return
	}
	e.app.RememberAffinity(x.req.Model, x.affinityKey, x.servedBy, e.opts.CacheAffinity, time.Now())
}
