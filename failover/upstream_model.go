package failover

import "github.com/llmfailover/caddy-llm-failover/chain"

// upstreamModel is the name the route's channel knows the client's model
// by: the route's upstream_model, else the client's own. The answer always
// names the client's model; the ledger, the failover log line and the
// attempt event name this one, so an operator can match them with the
// provider's own bills and logs.
func upstreamModel(route *chain.Route, model string) string {
	if route.UpstreamModel != "" {
		return route.UpstreamModel
	}
	return model
}
