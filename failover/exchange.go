package failover

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// reason names what became of an attempt, in logs, metrics, the
// decision journal, the history and the runbooks (docs/runbooks/<reason>.md):
// a failure's cause, or one of the outcomes that are not failures.
type reason string

// Failure reasons.
const (
	reasonStatus        reason = "status"
	reasonDial          reason = "dial_error"
	reasonNetwork       reason = "network_error"
	reasonHeaderTimeout reason = "header_timeout"
	reasonBudget        reason = "budget_exhausted"
	reasonFirstByte     reason = "first_byte_timeout"
	reasonErrorFrame    reason = "stream_error_frame"
	reasonClosedEarly   reason = "stream_closed_early"
	reasonGateTimeout   reason = "stream_gate_timeout"
	reasonErrorBody     reason = "error_body"
	reasonBadBody       reason = "malformed_body"
	reasonTooLarge      reason = "response_too_large"
	reasonLineTooLarge  reason = "stream_line_too_large"
	reasonRedirect      reason = "redirect"
	reasonContentType   reason = "unexpected_content_type"
	reasonOverloaded    reason = "gateway_overloaded"
	// reasonAccountRefused: the channel's own provider account refused
	// (its balance, its quota, its key; provider.ChannelRefusal), which
	// another channel's account may not.
	reasonAccountRefused reason = "account_refused"
	// A committed stream the upstream cut, or left silent.
	reasonTruncated reason = "truncated"
	reasonStalled   reason = "stalled"
)

// Outcomes that are not failures of the channel.
const (
	outcomeOK          reason = "ok"
	outcomeClientGone  reason = "client_gone"
	outcomeRateLimited reason = "rate_limited"
	// reasonResumed journals a broken stream continued on another channel.
	reasonResumed reason = "resumed"
	// reasonPrefillRefused: a continuation's model takes no prefill; the
	// channel is asked again at once in the instructed form.
	reasonPrefillRefused reason = "prefill_refused"
	// reasonStoredContextMissing: the channel answered that it does not
	// have the context a request refers to (previous_response_id,
	// conversation, a stored prompt): it is of another provider account
	// than the one that stored it, which another channel may be.
	reasonStoredContextMissing reason = "stored_context_missing"
	// reasonRestarted: an instructed continuation started the answer
	// over and said something else; it is abandoned unseen.
	reasonRestarted reason = "continuation_restarted"
	// reasonAffinity journals a conversation's turn sent first to the
	// channel holding its prompt cache, ahead of the chain's own choice
	// (journaled with that choice as next_channel).
	reasonAffinity reason = "cache_affinity"
	// reasonProbeFailed opens a channel whose synthetic check failed.
	reasonProbeFailed reason = "probe_failed"
	// reasonDrill is the failure a drill makes a channel have.
	reasonDrill reason = "drill"
	// reasonNoWorkingChannel is a model incident: every channel was open.
	reasonNoWorkingChannel reason = history.NoWorkingChannel
)

// reasons lists every reason but outcomeOK: each is shown to operators
// somewhere (a log line, a metric label, the journal, the status page)
// and has a runbook, docs/runbooks/<reason>.md.
var reasons = []reason{
	reasonStatus, reasonDial, reasonNetwork, reasonHeaderTimeout, reasonBudget, reasonFirstByte,
	reasonErrorFrame, reasonClosedEarly, reasonGateTimeout, reasonErrorBody, reasonBadBody,
	reasonTooLarge, reasonLineTooLarge, reasonRedirect, reasonContentType, reasonOverloaded, reasonAccountRefused,
	reasonTruncated, reasonStalled, reasonLearnedDeadline,
	outcomeClientGone, outcomeRateLimited, reasonResumed, reasonPrefillRefused, reasonRestarted, reasonAffinity,
	reasonStoredContextMissing,
	reasonProbeFailed, reasonNoWorkingChannel, reasonDrill, reasonHedge, outcomeHedgeLost,
}

// failure is one failure of one attempt.
type failure struct {
	reason  reason
	status  int    // upstream status; 0 when no response arrived
	message string // the upstream's own error message, when it sent one
	// detail is what went wrong locally (a dial error, a timeout). It names
	// internal addresses, so it goes to logs, never to clients.
	detail string
	// retryAfter is how long the upstream asked to be left alone; hinted
	// says whether it asked at all.
	retryAfter time.Duration
	hinted     bool
	timeout    bool
	// frameStatus is the HTTP status an in-stream error event stood for
	// (provider.API.ErrorFrameStatus); 0 for other failures.
	frameStatus int
	// delivered: for a resumed stream, the tokens the client had when it
	// broke, and form, how its continuation was asked for (journaled with
	// reason "resumed").
	delivered int64
	form      string
	// cost is what a hedge's losing attempt cost upstream (outcome
	// hedge_lost), journaled with it.
	cost wallet.Micros
	// learned is the learned deadline that ended the attempt
	// (adaptive_deadlines), journaled with it; nil for other failures.
	learned *learnedTimeout
}

// rateLimited reports whether the failure is a rate limit: a 429, or an
// in-stream error event standing for one. A rate limit is never an
// outage: it parks the channel instead of counting against it.
func (f *failure) rateLimited() bool {
	return f.status == http.StatusTooManyRequests || f.frameStatus == http.StatusTooManyRequests
}

// channelFault reports whether the failure says something about the
// channel's health. An answer over max_response_body is the request's
// doing (it asked for that much), a gateway over max_held_bytes the
// load's, and a continuation's refused prefill or restarted answer the
// form's and the model's, so they fail over without counting.
func (f *failure) channelFault() bool {
	switch f.reason {
	case reasonTooLarge, reasonOverloaded, reasonPrefillRefused, reasonRestarted, reasonStoredContextMissing:
		return false
	}
	return true
}

func (f *failure) String() string {
	if f.status != 0 {
		return fmt.Sprintf("%s %d", f.reason, f.status)
	}
	return string(f.reason)
}

// mode is what an exchange is doing, which decides how its attempts are
// admitted, retried and recorded.
type mode uint8

const (
	// modeChain: a client request walking its model's chain.
	modeChain mode = iota
	// modeLastResort: every channel was open; the request is the one
	// last-resort trial of the channel whose cooldown ends first.
	modeLastResort
	// modeContinue: a committed stream broke and is being continued on
	// another channel (stream_resume).
	modeContinue
	// modeSynthetic: a synthetic check (probe.go), recorded apart from
	// real traffic and judged by its own rules.
	modeSynthetic
	// modeDoctor: the doctor's check of a route (doctor.go): sent to an
	// open channel too, and recorded nowhere, not even by the breaker.
	modeDoctor
	// modeDrill: a drill request (drill.go): one channel made to fail
	// inside the gateway, the rest sent whatever their breakers say; only
	// its failovers are journaled.
	modeDrill
)

// exchange is one request on its way through the chain.
type exchange struct {
	w     http.ResponseWriter
	r     *http.Request
	repl  *caddy.Replacer
	id    string // requestID's, once made
	api   provider.API
	req   provider.Request
	body  []byte
	model *Model
	// servedBy is the channel whose answer was committed, "" before one
	// was; affinityKey names the request's conversation (cache affinity),
	// "" when it has none or affinity is off.
	servedBy, affinityKey string
	mode                  mode
	start                 time.Time
	deadline              time.Time
	attempts              int
	// ticket is the current attempt's breaker ticket: a trial's commit
	// closes its half-open channel (attempt.go).
	ticket breaker.Ticket
	bill   *bill
	// meter counts the current attempt's usage (the bill's meter when a
	// wallet bills the request).
	meter *provider.Meter
	// committedAt is when the current attempt's answer was committed to
	// the client: its time to first content.
	committedAt time.Time
	// timing is what the current attempt took, for its channel's learned
	// latencies (deadlines.go).
	timing attemptTiming
	held   []*heldReader
	// resume follows a stream that may be continued elsewhere (resume.go).
	resume *resumeState
	// upstreamPath is the path the current attempt was sent to, for the
	// doctor's hints.
	upstreamPath string
	// drill is a drill request's plan and path (drill.go); nil otherwise.
	drill *drillState
	// trace is the request's spans (tracing.go); nil when untraced.
	trace *requestTrace
	// client is who the wallet found the client to be, once an
	// idempotent request was authenticated ahead of its admission, so
	// that admission does not look the key up again.
	client struct{ account, keyID string }
	// race is the hedged request's race this exchange is one attempt of
	// (hedge.go); nil when the request is not hedged. hedge: this is the
	// hedge's attempt, not the first candidate's.
	race  *race
	hedge bool
}

// newExchange starts an exchange for r, answered through w.
func newExchange(w http.ResponseWriter, r *http.Request, api provider.API, m mode) *exchange {
	x := &exchange{w: w, r: r, api: api, mode: m, start: time.Now()}
	x.repl, _ = r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	return x
}

// releaseHeld gives back the bytes of the attempt's buffered answers.
func (x *exchange) releaseHeld() {
	for _, hr := range x.held {
		hr.release()
	}
	x.held = x.held[:0]
}

// verdict is what became of one attempt.
type verdict uint8

const (
	// retry: it failed before anything reached the client; the next
	// candidate may answer.
	retry verdict = iota
	// served: the client has the channel's answer.
	served
	// passed: the client has an error answer every channel would give (a
	// non-retryable 4xx), passed through.
	passed
	// broken: the client has part of an answer the upstream then cut,
	// left silent or ended with an error event: too late to fail over.
	broken
	// clientGone: the client left; it says nothing about the channel.
	clientGone
)

func (v verdict) String() string {
	switch v {
	case retry:
		return "failed"
	case served:
		return "served"
	case passed:
		return "passed"
	case broken:
		return "broken"
	case clientGone:
		return "client_gone"
	}
	return "verdict(" + strconv.Itoa(int(v)) + ")"
}

// attemptParent is the context an attempt runs in: the request's, with
// the attempt's span when traced.
func (x *exchange) attemptParent() context.Context {
	if x.trace != nil && x.trace.attemptCtx != nil {
		return x.trace.attemptCtx
	}
	return x.r.Context()
}

// attemptResult says what became of one attempt.
type attemptResult struct {
	verdict verdict
	fail    *failure // retry and broken: what went wrong
	status  int      // passed: the status the client got
}

// done reports whether the exchange is over: the client has an answer,
// or is gone.
func (r attemptResult) done() bool { return r.verdict != retry }

func retryWith(f *failure) attemptResult { return attemptResult{verdict: retry, fail: f} }

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

// streaming reports whether the client asked for a stream.
func streaming(x *exchange) bool {
	return provider.Streaming(x.r.URL.Path, x.req)
}
