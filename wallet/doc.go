// Package wallet keeps prepaid balances that can never be overdrawn.
//
// A request's life in the wallet:
//
//  1. Authenticate maps the client's API key (stored only as a SHA-256 hash)
//     to an account.
//  2. MaxCost bounds what the request can cost at the model's Price, and
//     Reserve holds that amount back in one transaction, or refuses with
//     ErrInsufficientFunds when balance − reserved cannot cover it.
//  3. The caller counts the attempt's tokens (the wallet knows token counts,
//     not API formats); attempts that fail get a zero-cost ledger row via
//     RecordAttempt.
//  4. Settle charges the real cost, capped at the reservation, releases the
//     rest and writes one ledger row. It happens at most once per
//     reservation; anything a crashed or disconnected path leaves behind is
//     released by Sweep once the reservation expires.
//
// Because every charge is capped at a reservation that was itself covered
// by the available balance, balance ≥ reserved ≥ 0 holds at all times, also
// with several gateway instances sharing one PostgreSQL database; the
// schema's CHECK constraints enforce it a second time.
//
// Throughput: each store has one writer goroutine that runs the writes
// submitted concurrently (Reserve, Settle, RecordAttempt, ...) in one
// transaction, each isolated from the others' failures, and commits them
// together, while every caller still waits for its own committed result;
// the request path's statements are prepared once; and successful
// Authenticate lookups are cached for a few seconds (see Store).
//
// All money is integer Micros (millionths of a dollar); times are stored as
// Unix microseconds so the SQLite and PostgreSQL stores share every query.
package wallet
