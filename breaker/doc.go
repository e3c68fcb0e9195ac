// Package breaker is a per-process, per-channel circuit breaker for LLM API
// failover.
//
// Each upstream channel owns one Breaker. A planner asks Available to
// leave out channels that would refuse; the dispatcher asks Admit right
// before sending and gets a Ticket, reports the outcome with RecordSuccess,
// RecordFailure or Park, then calls Ticket.Done. All methods take the
// current time as an argument so the caller owns the clock: tests drive it
// by hand and the package never reads the wall clock itself. The package
// knows nothing of HTTP, Caddy or which failures count: the caller records
// only the failures the channel caused.
//
// # States
//
//   - Closed: traffic flows.
//   - Open: too many outage failures; the channel is skipped until the
//     cooldown deadline.
//   - HalfOpen: the cooldown has passed but the trip, or the failures
//     that caused it, are still inside the window. Admit lets through at most
//     Config.Trials concurrent trials (default 1) and refuses every other
//     request at once, so a channel that is still broken, or now hangs,
//     holds back only its trials. The first success forgets the old
//     failures (Closed), the first failure re-opens it at once.
//   - Parked: the upstream rate limited us and said when to come back.
//
// Open and Parked can hold together; State reports Open first because it is
// the stronger claim about the channel's health. Every re-trip pushes the
// deadline to now+Cooldown: keeping an older, shorter deadline would put a
// channel that just failed its half-open trial straight back into rotation.
//
// # Defaults
//
// Window 5m, Failures 3, Cooldown 60s, MaxPark 5m. State is per process and
// is not shared between Caddy instances, so a decision to skip a channel
// may have been made up to five minutes ago by an earlier request that took
// the failure. The window is therefore long enough to catch a provider that
// fails intermittently, and the cooldown short enough that a channel that
// recovered is not ignored for long: after one minute it gets a half-open
// trial, and a single further failure inside the window sends it back.
//
// # Count mode and ratio mode
//
// With MinCalls == 0 (count mode, the default) the breaker opens when
// Failures outage failures fall inside Window. This is right for channels
// that see a handful of requests per minute, where three failures in five
// minutes really does mean the provider is struggling.
//
// At hundreds of requests per second the same rule opens a healthy channel
// on background noise: three stray 5xx among thousands of successes is not
// an outage. For such channels set MinCalls and FailureRatio (ratio mode).
// The breaker then opens only when both hold: at least Failures failures
// inside Window, and among the most recent outcomes (up to the last 100,
// with at least MinCalls of them recorded) the failure share is at least
// FailureRatio. A reasonable starting point is MinCalls 20 and
// FailureRatio 0.5. Keep count mode for quiet channels: with few calls the
// ratio never gathers MinCalls outcomes quickly, so a dead low-traffic
// channel would keep receiving requests.
//
// # Every channel open
//
// When every channel a request could use is open, refusing all of them
// untried would make the breakers an outage of their own, and letting each
// request through would send the whole load to a broken channel.
// AdmitLastResort lets exactly one request through per channel per trip
// (that is, per cooldown: a failed last resort keeps the deadline, a failed
// trial re-trips with a fresh one); the caller refuses the rest with a
// Retry-After from ReadyAt. A last resort holds a trial slot like a
// half-open trial. A parked channel never gets one.
//
// # Parking versus failures
//
// A 429 is the upstream working as designed, not an outage. Park takes the
// Retry-After delay (see ParseRetryAfter), caps it at MaxPark so a hostile
// or buggy header cannot remove a channel for hours, and never shortens a
// park already in force. Parking records nothing in the failure window or
// the success-rate ring, so a rate-limited channel neither trips the
// breaker nor loses routing weight once the park ends.
//
// # Success rate
//
// Successes and failures are also kept in a 100-slot bit ring that a
// weighted routing policy reads through SuccessRate. The ring is not
// cleared when a half-open trial succeeds or on Reset: routing weight
// should recover with real traffic, while the Failures count still gates
// re-opening.
//
// # Cost
//
// Available and Admit are two atomic loads for a healthy channel; only a
// recovering one takes the mutex. The record methods take
// a mutex and do a bounded amount of work on fixed-size arrays; nothing on
// the hot path allocates.
package breaker
