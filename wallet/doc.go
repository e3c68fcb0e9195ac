// Package wallet keeps prepaid balances that can never be overdrawn.
//
// A request's life in the wallet:
//
//  1. Authenticate maps the client's API key (stored only as a SHA-256 hash)
//     to an account; successful lookups are cached for a few seconds.
//  2. MaxCost bounds what the request can cost at the model's Price, and
//     Reserve holds that amount back, or refuses with ErrInsufficientFunds
//     when balance − reserved cannot cover it. Each open Store is an
//     instance holding a credit lease per account (lease.go): a slice of
//     the balance already counted in reserved, from which Reserve is served
//     in memory. Only a Reserve that does not fit writes: it grows the
//     lease with the conditional UPDATE that is the no-overdraft rule.
//  3. The caller counts the attempt's tokens (the wallet knows token counts,
//     not API formats); attempts that fail get a zero-cost ledger row via
//     RecordAttempt.
//  4. Settle charges the real cost, capped at the reservation, and writes a
//     ledger row per entry; the Settles waiting at one moment are one
//     group-committed write (settle.go). What was not charged goes back to
//     the lease, and the lease gives its spare money back to the account
//     when idle, when the account runs low, and at Close. Settle happens at
//     most once per reservation; a reservation nobody settles expires and
//     Sweep releases it, and the leases of an instance that died are
//     released by Sweep on any other once they expire.
//
// Because every lease was taken by that conditional UPDATE and every charge
// is capped at a reservation served from a lease, balance ≥ reserved ≥ 0
// holds at all times, also with several gateway instances sharing one
// PostgreSQL database; the schema's CHECK constraints enforce it a second
// time. The Audit checks reserved against the leases (and any reservation
// rows an older version left).
//
// Throughput: each store has writer goroutines that run the writes
// submitted concurrently in one transaction, each isolated from the others'
// failures, and commit them together, while every caller still waits for
// its own committed result (writer.go); the hot statements are prepared
// once.
//
// All money is integer Micros (millionths of a dollar); times are stored as
// Unix microseconds so the SQLite and PostgreSQL stores share every query.
package wallet
