package failoverapp

import "github.com/llmfailover/caddy-llm-failover/idempotency"

// The idempotency table is the process's, like the breakers: a call's
// duplicates find its flight or kept answer across `caddy reload`, and
// every handler of the process shares it (a key is scoped to a client,
// never to a handler).
var idempotencyTable = idempotency.NewTable()

// Idempotency is the process's idempotency table.
func (*App) Idempotency() *idempotency.Table { return idempotencyTable }
