package llmfailover

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// Causes of an attempt's cancellation, told apart with context.Cause.
var (
	errBudget        = errors.New("candidate time budget exhausted")
	errHeaderTimeout = errors.New("no response headers within header_timeout")
	errFirstByte     = errors.New("no response byte within first_byte_timeout")
)

// Failure reasons, as they appear in logs and metrics.
const (
	reasonStatus        = "status"
	reasonDial          = "dial_error"
	reasonNetwork       = "network_error"
	reasonHeaderTimeout = "header_timeout"
	reasonBudget        = "budget_exhausted"
	reasonFirstByte     = "first_byte_timeout"
	reasonErrorFrame    = "stream_error_frame"
	reasonClosedEarly   = "stream_closed_early"
	reasonGateTimeout   = "stream_gate_timeout"
	reasonErrorBody     = "error_body"
	reasonBadBody       = "malformed_body"
	reasonTooLarge      = "response_too_large"
	reasonLineTooLarge  = "stream_line_too_large"
	reasonRedirect      = "redirect"
	reasonContentType   = "unexpected_content_type"
	reasonOverloaded    = "gateway_overloaded"
)

// failure is one retryable failure of one attempt.
type failure struct {
	reason  string
	status  int    // upstream status; 0 when no response arrived
	message string // the upstream's own error message, when it sent one
	// detail is what went wrong locally (a dial error, a timeout). It names
	// internal addresses, so it goes to logs, never to clients.
	detail     string
	retryAfter time.Duration
	timeout    bool
	// delivered: for a resumed stream, the tokens the client had when it
	// broke (journaled with reason "resumed").
	delivered int64
}

// channelFault reports whether the failure says something about the
// channel's health. An answer over max_response_body is the request's
// doing (it asked for that much), and a gateway over max_held_bytes the
// load's, so they fail over without counting.
func (f *failure) channelFault() bool {
	return f.reason != reasonTooLarge && f.reason != reasonOverloaded
}

func (f *failure) String() string {
	if f.status != 0 {
		return fmt.Sprintf("%s %d", f.reason, f.status)
	}
	return f.reason
}

// exchange is one client request on its way through the chain.
type exchange struct {
	w        http.ResponseWriter
	r        *http.Request
	repl     *caddy.Replacer
	api      provider.API
	req      provider.Request
	body     []byte
	model    *model
	start    time.Time
	deadline time.Time
	attempts int
	bill     *bill
	probe    bool // every channel was open; this request probes one
	// synthetic marks a synthetic check (probe.go): it is recorded apart
	// from real traffic.
	synthetic bool
	// meter counts the current attempt's usage (the bill's meter when a
	// wallet bills the request).
	meter *provider.Meter
	// committedAt is when the current attempt's answer was committed to
	// the client: its time to first content.
	committedAt time.Time
	held        []*heldReader
	// resume follows a stream that may be continued elsewhere (resume.go).
	resume *resumeState
}

// releaseHeld gives back the bytes of the attempt's buffered answers.
func (x *exchange) releaseHeld() {
	for _, hr := range x.held {
		hr.release()
	}
	x.held = x.held[:0]
}

// attemptResult says what became of one attempt.
type attemptResult struct {
	done       bool     // the client has its answer (or is gone); stop
	fail       *failure // retryable failure; try the next candidate
	clientGone bool
	passed     int // status of a non-2xx answer passed to the client untouched
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request) error {
	if h.wallet != nil {
		// Counted from entry, before the body is read, so that a reload
		// never closes the store under this request.
		defer h.wallet.w.Enter()()
	}
	x := &exchange{w: w, r: r, api: provider.APIFromPath(r.URL.Path), start: time.Now()}
	x.repl, _ = r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)

	if h.refusePath(x) {
		return nil
	}
	if x.api == provider.OpenAIModels && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		if refusal := h.authorizeListing(x); refusal != nil {
			return h.refuse(x, *refusal)
		}
		return h.listModels(w, r)
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return h.refuse(x, provider.Error{Status: http.StatusMethodNotAllowed, Message: r.Method + " is not supported here; LLM API requests are POSTs"})
	}
	body, err := h.readBodyBounded(w, r)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return h.refuse(x, provider.Error{Status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("request body is larger than %d bytes", h.MaxRequestBody)})
		}
		// The client went away or sent a broken body: nobody to answer.
		return h.refuse(x, provider.Error{Status: http.StatusBadRequest, Message: "reading request body: " + err.Error()})
	}
	x.body = body
	if x.req, err = x.api.ParseRequest(body); err != nil {
		return h.refuse(x, provider.Error{Status: http.StatusBadRequest, Message: err.Error()})
	}
	x.setVar("http.llm_failover.model", x.req.Model)
	if x.model = h.models[x.req.Model]; x.model == nil {
		return h.refuse(x, provider.Error{Status: http.StatusNotFound, Code: "model_not_found",
			Message: fmt.Sprintf("The model %q does not exist or is not served by this gateway", x.req.Model)})
	}
	if x.model.byAPI[x.api] == nil {
		return h.refuse(x, provider.Error{Status: http.StatusBadRequest,
			Message: fmt.Sprintf("model %q is not served over the %s API by any of its channels", x.req.Model, x.api)})
	}

	if h.wallet != nil {
		var refusal *provider.Error
		if x.bill, refusal = h.wallet.admit(x, h.mayResume(x)); refusal != nil {
			return h.refuse(x, *refusal)
		}
		// Whatever happens from here on, the reservation is settled or
		// released exactly once, panics included.
		defer x.bill.close()
	}

	var scratch chain.Scratch
	// A pointer into the handler, not the slice itself: converting a
	// slice to the Health interface would allocate on every request.
	plan := x.model.byAPI[x.api].Plan((*health)(&h.channels), x.start, &scratch)
	candidates := plan.Candidates
	var probe breaker.Ticket
	if len(candidates) == 0 {
		// Every channel is open or parked. At most one request per
		// channel per cooldown probes; every other is refused at once.
		var route *chain.Route
		if route, probe = h.admitProbe(plan.Probes, x.start); route == nil {
			return h.refuseUnavailable(x, plan.Skipped, plan.RetryAt, len(plan.Probes) == 0)
		}
		x.probe = true
		candidates = []*chain.Route{route}
		h.logger.Warn("every channel is open; probing the one whose cooldown ends first",
			zap.String("model", x.req.Model), zap.String("channel", route.Name))
	}
	for _, r := range plan.Skipped {
		if !x.probe || r != candidates[0] {
			h.skipped(x, r)
		}
	}

	x.deadline = x.start.Add(time.Duration(h.Deadline))
	var last *failure
	var retryAfter time.Duration
	for i, route := range candidates {
		if r.Context().Err() != nil {
			break
		}
		remaining := time.Until(x.deadline)
		if remaining <= 0 {
			break
		}
		ticket, ok := probe, x.probe
		if !x.probe {
			// A half-open channel admits a bounded number of trials;
			// when they are taken the request moves on at once.
			if ticket, ok = h.channels[route.Channel].state.breaker.Admit(time.Now()); !ok {
				h.skipped(x, route)
				continue
			}
		}
		// An equal share of what is left, so that a silent channel cannot
		// take the time its backups need.
		budget := remaining / time.Duration(len(candidates)-i)
		x.attempts++
		x.setVar("http.llm_failover.attempts", strconv.Itoa(x.attempts))
		res := h.tryRoute(x, route, ticket, budget)
		if res.done {
			if x.resume != nil && x.resume.continuing {
				h.resume(x, candidates[i+1:])
			}
			return nil
		}
		last = res.fail
		if res.fail.retryAfter > 0 && (retryAfter == 0 || res.fail.retryAfter < retryAfter) {
			retryAfter = res.fail.retryAfter
		}
		next := ""
		if i+1 < len(candidates) {
			next = candidates[i+1].Name
		}
		h.logger.Warn("failover",
			zap.String("model", x.req.Model),
			zap.String("channel", route.Name),
			zap.String("upstream_model", upstreamModel(route, x.req.Model)),
			zap.Int("attempt", x.attempts),
			zap.String("reason", res.fail.reason),
			zap.Int("upstream_status", res.fail.status),
			zap.String("upstream_message", res.fail.message),
			zap.String("detail", res.fail.detail),
			zap.Duration("elapsed", time.Since(x.start)),
			zap.Duration("remaining_budget", time.Until(x.deadline)),
			zap.String("next_channel", next))
		h.app.decided(x, route.Name, res.fail, next)
	}

	if r.Context().Err() != nil {
		requestsTotal.WithLabelValues(x.req.Model, "client_gone").Inc()
		h.logger.Info("client went away before an answer was committed",
			zap.String("model", x.req.Model), zap.Int("attempts", x.attempts), zap.Duration("elapsed", time.Since(x.start)))
		return nil
	}
	if x.attempts == 0 && time.Now().Before(x.deadline) {
		// Every candidate's trial slots filled up after planning.
		return h.refuseUnavailable(x, nil, time.Now(), false)
	}
	requestsTotal.WithLabelValues(x.req.Model, "exhausted").Inc()
	e := exhausted(x, last)
	h.logger.Error("all channels failed",
		zap.String("model", x.req.Model), zap.Int("attempts", x.attempts),
		zap.Int("status", e.Status), zap.Duration("elapsed", time.Since(x.start)))
	setRetryAfter(w.Header(), retryAfter)
	return h.refuse(x, e)
}

// admitProbe lets one of the open channels, soonest to recover first, be
// probed, if its breaker allows a probe now.
func (h *Handler) admitProbe(probes []*chain.Route, now time.Time) (*chain.Route, breaker.Ticket) {
	for _, r := range probes {
		if t, ok := h.channels[r.Channel].state.breaker.AdmitProbe(now); ok {
			return r, t
		}
	}
	return nil, breaker.Ticket{}
}

// refuseUnavailable answers a request no channel may be sent: 503 with a
// Retry-After of the soonest recovery (at least a second). It logs nothing
// per request: the state changes that led here were logged once each.
func (h *Handler) refuseUnavailable(x *exchange, skipped []*chain.Route, retryAt time.Time, allParked bool) error {
	for _, r := range skipped {
		h.skipped(x, r)
	}
	wait := max(time.Until(retryAt), time.Second)
	setRetryAfter(x.w.Header(), wait)
	why := "open after failures"
	if allParked {
		why = "rate limited"
	}
	requestsTotal.WithLabelValues(x.req.Model, "unavailable").Inc()
	if c := h.logger.Check(zapcore.DebugLevel, "every channel is unavailable; refusing without sending"); c != nil {
		c.Write(zap.String("model", x.req.Model), zap.Bool("all_parked", allParked), zap.Duration("retry_after", wait))
	}
	return h.refuse(x, provider.Error{Status: http.StatusServiceUnavailable,
		Message: fmt.Sprintf("every channel serving model %q is %s; retry after %s", x.req.Model, why, wait.Round(time.Second))})
}

// skipped counts a channel left out of a request because of its breaker.
func (h *Handler) skipped(x *exchange, r *chain.Route) {
	channelSkipped.WithLabelValues(r.Name).Inc()
	if c := h.logger.Check(zapcore.DebugLevel, "channel skipped: breaker open"); c != nil {
		c.Write(zap.String("model", x.req.Model), zap.String("channel", r.Name),
			zap.String("state", h.channels[r.Channel].state.breaker.State(x.start).String()))
	}
}

// try sends one attempt and records its outcome. The ticket's trial slot
// is freed however the attempt ends, panics included: a leaked slot would
// keep a recovering channel refused for good.
func (h *Handler) try(x *exchange, route *chain.Route, ticket breaker.Ticket, budget time.Duration) attemptResult {
	defer ticket.Done()
	if ticket.HalfOpened {
		h.app.stateChanged(h.logger, h.channels[route.Channel].state,
			breaker.Transition{From: breaker.Open, To: breaker.HalfOpen}, "cooldown_elapsed")
	}
	began := time.Now()
	res := h.attempt(x, route, budget)
	x.releaseHeld()
	h.scrubFailure(res.fail)
	h.record(x, route, res, time.Since(began))
	return res
}

// exhausted builds the error a client gets when no channel answered.
func exhausted(x *exchange, last *failure) provider.Error {
	e := provider.Error{Status: http.StatusBadGateway}
	what := "no channel could be tried before the deadline"
	if last != nil {
		what = "the last failed with " + last.String()
		switch {
		case last.timeout:
			e.Status = http.StatusGatewayTimeout
		case last.status >= 400:
			e.Status = last.status
		case last.reason == reasonErrorFrame && strings.Contains(last.message, "rate"):
			e.Status = http.StatusTooManyRequests
		}
		if last.message != "" {
			what += ": " + last.message
		}
	} else if x.attempts == 0 {
		e.Status = http.StatusGatewayTimeout
	}
	e.Message = fmt.Sprintf("model %q: %d channel(s) tried, none answered; %s", x.req.Model, x.attempts, what)
	return e
}

// attempt sends the request to one channel and, if its answer is good,
// commits it to the client.
func (h *Handler) attempt(x *exchange, route *chain.Route, budget time.Duration) attemptResult {
	ch := h.channels[route.Channel]
	if f := h.overloaded(); f != nil {
		return attemptResult{fail: f}
	}
	ctx, cancel := context.WithCancelCause(x.r.Context())
	defer cancel(nil)
	// Every timer below is stopped when the answer is committed: none of
	// them may cut a stream that is already on its way to the client.
	budgetTimer := time.AfterFunc(budget, func() { cancel(errBudget) })
	defer budgetTimer.Stop()
	headerTimer := time.AfterFunc(h.headerTimeout(x), func() { cancel(errHeaderTimeout) })
	var firstByte *time.Timer
	if h.FirstByteTimeout > 0 {
		firstByte = time.AfterFunc(time.Duration(h.FirstByteTimeout), func() { cancel(errFirstByte) })
		defer firstByte.Stop()
	}

	body, req := x.body, x.req
	if x.resume != nil && x.resume.continuing {
		body, req = x.resume.body, x.resume.req
	}
	if x.bill != nil {
		body = x.bill.prepare(body)
		x.meter = x.bill.meter
	} else {
		// Unbilled, the history still counts the output tokens: a meter
		// reads the answer on its way past and asks the upstream nothing.
		x.meter = x.api.NewMeter()
	}
	out, err := ch.adapter.NewRequest(ctx, provider.Call{
		API: x.api, Base: ch.base, Client: x.r, Body: body, Request: req,
		UpstreamModel: route.UpstreamModel, Header: ch.headers, PassHeader: ch.extras.Request,
		Continuation: x.resume != nil && x.resume.continuing,
	})
	if err != nil {
		headerTimer.Stop()
		return attemptResult{fail: &failure{reason: reasonNetwork, detail: "building the upstream request: " + err.Error()}}
	}
	res, err := ch.rt.RoundTrip(out)
	headerTimer.Stop()
	if err != nil {
		return x.transportFailure(ctx, err)
	}
	defer res.Body.Close()

	if res.StatusCode < len(h.retry) && h.retry[res.StatusCode] {
		return attemptResult{fail: statusFailure(x.api, res)}
	}
	if x.resume != nil && x.resume.continuing && (res.StatusCode != http.StatusOK || !ch.adapter.IsStream(res.Header)) {
		// A continuation joins a stream the client already has: anything
		// but a stream (a refused prefill's 400) is this channel's failure,
		// never the client's answer.
		return attemptResult{fail: statusFailure(x.api, res)}
	}
	src := ch.adapter.ResponseBody(res)
	if route.UpstreamModel != "" && route.UpstreamModel != x.req.Model {
		// The client sees the model it asked for, never the route's rename.
		src = provider.RestoreModel(src, x.req.Model)
	}
	if firstByte != nil {
		src = &firstByteReader{r: src, t: firstByte}
	}
	commit := func() {
		x.committedAt = time.Now()
		budgetTimer.Stop()
		if firstByte != nil {
			firstByte.Stop()
		}
		x.setVar("http.llm_failover.channel", ch.name)
		if x.bill != nil && res.StatusCode >= 200 && res.StatusCode < 300 {
			// Only a successful answer that reached the client is billed:
			// an error the upstream passed back cost it nothing.
			x.bill.servedBy(ch.name, upstreamModel(route, x.req.Model))
		}
	}
	switch {
	case res.StatusCode >= 300 && res.StatusCode < 400:
		// No LLM API redirects; a channel that does is misconfigured or
		// compromised, and its Location must not steer the client.
		return attemptResult{fail: &failure{reason: reasonRedirect, status: res.StatusCode}}
	case res.StatusCode < 200 || res.StatusCode >= 300:
		// Not retryable and not a success: every channel would say the
		// same, so the client gets this answer, secrets masked.
		out := h.relayError(ctx, x, ch, res, src, commit)
		out.passed = res.StatusCode
		return out
	case ch.adapter.IsStream(res.Header):
		return h.relayStream(ctx, cancel, x, ch, res, src, commit)
	case provider.IsLineStream(ch.adapter, res.Header):
		commit()
		idle := newIdleReader(src, time.Duration(h.StreamIdleTimeout), cancel)
		defer idle.stop()
		h.passThrough(x, ch, res, idle)
		return attemptResult{done: true}
	case ch.adapter.IsJSON(res.Header):
		return h.relayJSON(ctx, x, ch, res, src, commit)
	default:
		// A CDN's HTML page or a captive portal, not an API answer.
		return attemptResult{fail: &failure{reason: reasonContentType, status: res.StatusCode,
			detail: "content type " + strconv.Quote(res.Header.Get("Content-Type"))}}
	}
}

// relayError passes back an error answer every channel would give (a 4xx),
// read whole and bounded so that a credential the upstream echoed in it is
// masked before the client sees it.
func (h *Handler) relayError(ctx context.Context, x *exchange, ch *channel, res *http.Response, src io.Reader, commit func()) attemptResult {
	body, fail := h.readAnswer(ctx, x, res, src)
	if fail != nil {
		return *fail
	}
	body = []byte(h.secrets.String(string(body)))
	commit()
	return h.writeAnswer(x, ch, res, body)
}

// relayStream holds an SSE answer in the stream gate until it shows
// content (commit) or an error (fail over).
func (h *Handler) relayStream(ctx context.Context, cancel context.CancelCauseFunc, x *exchange, ch *channel, res *http.Response, src io.Reader, commit func()) attemptResult {
	client := &idleWriter{w: x.w, rc: http.NewResponseController(x.w), idle: time.Duration(h.StreamIdleTimeout)}
	defer client.done()
	opts := x.api.GateOptions()
	release, over := h.holdFrames(streamgate.DefaultMaxHeld)
	if over != nil {
		return attemptResult{fail: over}
	}
	defer release()
	var d streamgate.Downstream = &downstream{w: client, res: res, onCommit: func() { release(); commit() },
		copyHeader: func(dst, src http.Header) { h.copyResponseHeader(ch, dst, src) }}
	continuing := x.resume != nil && x.resume.continuing
	if continuing {
		d = &spliced{w: client, seam: seamComment(x.resume.from, ch.name), splice: x.resume.splice, onCommit: func() { release(); commit() }}
	}
	opts.GateTimeout = time.Duration(h.StreamGate)
	opts.GateFailover = h.StreamGateFailover
	opts.IdleTimeout = time.Duration(h.StreamIdleTimeout)
	if x.bill != nil {
		x.bill.streamOptions(&opts)
	} else {
		opts.Observe = x.meter.Event
	}
	d = h.watchForResume(x, &opts, d)
	out := streamgate.Relay(src, cancel, d, opts)
	if x.r.Context().Err() != nil && out.Outcome != streamgate.Complete {
		return attemptResult{done: true, clientGone: true}
	}
	switch out.Outcome {
	case streamgate.Complete:
		return attemptResult{done: true}
	case streamgate.ClientGone:
		return attemptResult{done: true, clientGone: true}
	case streamgate.Truncated, streamgate.Stalled:
		if !continuing && h.broke(x, ch, out) {
			return attemptResult{done: true, fail: &failure{reason: out.Outcome.String()}}
		}
		if out.Deferred != nil {
			// Nothing will continue it: end it as without stream_resume.
			if _, err := client.Write(out.Deferred); err == nil {
				_ = client.Flush()
			}
		}
		h.logger.Warn("committed stream ended abnormally; error event sent to the client",
			zap.String("model", x.req.Model), zap.String("channel", ch.name),
			zap.String("outcome", out.Outcome.String()), zap.Int64("bytes_sent", out.BytesSent), zap.String("error", h.secrets.String(errString(out.Err))))
		return attemptResult{done: true, fail: &failure{reason: out.Outcome.String()}}
	case streamgate.UpstreamError:
		f := &failure{reason: reasonErrorFrame, status: 0, message: x.api.UpstreamMessage(out.ErrorData)}
		if out.Committed {
			// The error event was forwarded and ended a stream the client
			// already has: it cannot fail over, only count against the
			// channel.
			if !continuing && h.broke(x, ch, out) {
				return attemptResult{done: true, fail: f}
			}
			if out.Deferred != nil {
				// Held back for a resume that will not happen: forward it.
				if _, err := client.Write(out.Deferred); err == nil {
					_ = client.Flush()
				}
			}
			return attemptResult{done: true, fail: f}
		}
		if status := x.api.ErrorFrameRefusal(out.ErrorData); status != 0 && !continuing {
			// The upstream refused the request itself: every channel would.
			_ = h.refuse(x, provider.Error{Status: status, Message: f.message})
			return attemptResult{done: true}
		}
		return attemptResult{fail: f}
	case streamgate.GateTimeout:
		return attemptResult{fail: &failure{reason: reasonGateTimeout, timeout: true}}
	case streamgate.Oversized:
		return attemptResult{fail: &failure{reason: reasonLineTooLarge,
			detail: fmt.Sprintf("a line over %d bytes before any content", streamgate.DefaultMaxHeld)}}
	default: // ClosedEarly
		if f := causeFailure(ctx); f != nil {
			return attemptResult{fail: f}
		}
		return attemptResult{fail: &failure{reason: reasonClosedEarly}}
	}
}

// relayJSON reads a whole non-streaming answer before committing it, so a
// body cut mid-way or a 200 that carries an error object fails over
// instead of reaching the client.
func (h *Handler) relayJSON(ctx context.Context, x *exchange, ch *channel, res *http.Response, src io.Reader, commit func()) attemptResult {
	body, fail := h.readAnswer(ctx, x, res, src)
	if fail != nil {
		return *fail
	}
	switch err := x.api.CheckBody(body); {
	case errors.Is(err, provider.ErrErrorBody):
		return attemptResult{fail: &failure{reason: reasonErrorBody, status: res.StatusCode, message: x.api.UpstreamMessage(body)}}
	case err != nil:
		return attemptResult{fail: &failure{reason: reasonBadBody, status: res.StatusCode, detail: err.Error()}}
	}
	x.meter.Body(body)
	commit()
	return h.writeAnswer(x, ch, res, body)
}

// readAnswer reads a whole answer, at most max_response_body of it; a
// failure says why it could not.
func (h *Handler) readAnswer(ctx context.Context, x *exchange, res *http.Response, src io.Reader) ([]byte, *attemptResult) {
	held := &heldReader{r: src, cap: h.MaxHeldBytes}
	// The answer is held until written; the count is released when this
	// attempt ends, which is after the write.
	x.held = append(x.held, held)
	body, err := io.ReadAll(io.LimitReader(held, h.MaxResponseBody+1))
	switch {
	case errors.Is(err, errHeldBytes):
		return nil, &attemptResult{fail: &failure{reason: reasonOverloaded, status: http.StatusServiceUnavailable, message: err.Error()}}
	case err != nil && x.r.Context().Err() != nil:
		return nil, &attemptResult{done: true, clientGone: true}
	case err != nil:
		if f := causeFailure(ctx); f != nil {
			return nil, &attemptResult{fail: f}
		}
		return nil, &attemptResult{fail: &failure{reason: reasonBadBody, status: res.StatusCode, detail: "reading body: " + err.Error()}}
	case int64(len(body)) > h.MaxResponseBody:
		return nil, &attemptResult{fail: &failure{reason: reasonTooLarge, status: res.StatusCode}}
	}
	return body, nil
}

// writeAnswer sends a whole answer to the client.
func (h *Handler) writeAnswer(x *exchange, ch *channel, res *http.Response, body []byte) attemptResult {
	hdr := x.w.Header()
	h.copyResponseHeader(ch, hdr, res.Header)
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	x.w.WriteHeader(res.StatusCode)
	if _, err := x.w.Write(body); err != nil {
		return attemptResult{done: true, clientGone: true}
	}
	// Not flushed: the handler returns at once (a billed answer's
	// settlement is written after it, see bill.close), and the server
	// sends headers and body in one write.
	return attemptResult{done: true}
}

// passThrough copies an answer the gateway does not inspect, flushing as
// bytes arrive so that unknown streaming formats still stream.
func (h *Handler) passThrough(x *exchange, ch *channel, res *http.Response, src io.Reader) {
	h.copyResponseHeader(ch, x.w.Header(), res.Header)
	if res.ContentLength >= 0 && !res.Uncompressed {
		x.w.Header().Set("Content-Length", strconv.FormatInt(res.ContentLength, 10))
	}
	x.w.WriteHeader(res.StatusCode)
	out := &idleWriter{w: x.w, rc: http.NewResponseController(x.w), idle: time.Duration(h.StreamIdleTimeout)}
	defer out.done()
	buf := make([]byte, 16<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := out.Write(buf[:n]); werr != nil {
				return
			}
			_ = out.Flush()
		}
		if err != nil {
			return
		}
	}
}

// record feeds an attempt's outcome to the breaker, the metrics and the
// events. Only failures the channel caused count against it.
func (h *Handler) record(x *exchange, route *chain.Route, res attemptResult, took time.Duration) {
	ch := h.channels[route.Channel]
	now := time.Now()
	outcome := "ok"
	status := 0
	reason := "" // what caused a state change, when it is not the outcome
	var tr breaker.Transition
	switch {
	case res.fail == nil && res.clientGone:
		outcome = "client_gone" // never the channel's fault
	case res.fail == nil:
		tr = ch.state.breaker.RecordSuccess(now)
		if x.probe {
			// The channel proved itself while every channel was open:
			// close it now rather than at the end of its cooldown.
			if reset := ch.state.breaker.Reset(now); reset.Changed() {
				tr = breaker.Transition{From: tr.From, To: reset.To}
				reason = "probe_succeeded"
			}
		}
	case res.fail.status == http.StatusTooManyRequests && res.fail.retryAfter > 0:
		// A rate limit is not an outage: park the channel for as long as
		// it asked, without counting a failure.
		outcome, status = "rate_limited", res.fail.status
		var until time.Time
		until, tr = ch.state.breaker.Park(now, res.fail.retryAfter)
		if tr.Changed() {
			h.logger.Info("channel parked by Retry-After", zap.String("channel", ch.name), zap.Time("until", until))
		}
	case !res.fail.channelFault():
		outcome, status = res.fail.reason, res.fail.status
	default:
		outcome, status = res.fail.reason, res.fail.status
		tr = ch.state.breaker.RecordFailure(now)
	}
	if x.bill != nil && res.fail != nil && !res.done {
		x.bill.attemptFailed(ch.name, upstreamModel(route, x.req.Model), res.fail.reason)
	}
	if res.done && !res.clientGone && !x.synthetic && !x.resume.sending() {
		requestsTotal.WithLabelValues(x.req.Model, "served").Inc()
	}
	attemptsTotal.WithLabelValues(x.req.Model, ch.name, outcome).Inc()
	attemptDuration.WithLabelValues(ch.name).Observe(took.Seconds())
	h.app.attempted(x.req.Model, upstreamModel(route, x.req.Model), ch.name, x.attempts, outcome, status, took)
	var ttft time.Duration
	if !x.committedAt.IsZero() {
		ttft = x.committedAt.Sub(now.Add(-took))
	}
	if !x.synthetic {
		// Probes keep a history of their own (probe.go).
		ch.state.touch(now)
		h.app.recordHistory(x.req.Model, ch.name, res, outcome, status, ttft, outputTokens(x.meter))
	}
	if tr.Changed() {
		if reason == "" {
			reason = outcome
		}
		h.app.stateChanged(h.logger, ch.state, tr, reason)
	}
}

// transportFailure classifies an error from RoundTrip.
func (x *exchange) transportFailure(ctx context.Context, err error) attemptResult {
	if x.r.Context().Err() != nil {
		return attemptResult{done: true, clientGone: true}
	}
	if f := causeFailure(ctx); f != nil {
		return attemptResult{fail: f}
	}
	var dial reverseproxy.DialError
	if errors.As(err, &dial) {
		return attemptResult{fail: &failure{reason: reasonDial, detail: err.Error()}}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return attemptResult{fail: &failure{reason: reasonHeaderTimeout, detail: err.Error(), timeout: true}}
	}
	return attemptResult{fail: &failure{reason: reasonNetwork, detail: err.Error()}}
}

// causeFailure reports the failure behind one of the attempt's own timers.
func causeFailure(ctx context.Context) *failure {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errBudget):
		return &failure{reason: reasonBudget, detail: cause.Error(), timeout: true}
	case errors.Is(cause, errHeaderTimeout):
		return &failure{reason: reasonHeaderTimeout, detail: cause.Error(), timeout: true}
	case errors.Is(cause, errFirstByte):
		return &failure{reason: reasonFirstByte, detail: cause.Error(), timeout: true}
	}
	return nil
}

// statusFailure reads (a bounded part of) a retryable error answer so that
// its message can be logged and quoted to the client.
func statusFailure(api provider.API, res *http.Response) *failure {
	f := &failure{reason: reasonStatus, status: res.StatusCode}
	if ra, ok := provider.RetryAfter(res.Header, time.Now()); ok {
		f.retryAfter = ra
	}
	if b, err := io.ReadAll(io.LimitReader(res.Body, 64<<10)); err == nil || len(b) > 0 {
		f.message = api.UpstreamMessage(b)
	}
	return f
}

// downstream lets the stream gate commit and write to the client.
type downstream struct {
	w        *idleWriter
	res      *http.Response
	onCommit func()
	// copyHeader copies the answer's headers a client may see.
	copyHeader func(dst, src http.Header)
}

func (d *downstream) Commit() error {
	d.onCommit()
	d.copyHeader(d.w.w.Header(), d.res.Header)
	d.w.w.WriteHeader(d.res.StatusCode)
	return d.w.Flush()
}

func (d *downstream) Write(p []byte) (int, error) { return d.w.Write(p) }
func (d *downstream) Flush() error                { return d.w.Flush() }

// firstByteReader stops the first-byte watchdog at the first byte.
type firstByteReader struct {
	r    io.Reader
	t    *time.Timer
	seen bool
}

func (f *firstByteReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if n > 0 && !f.seen {
		f.seen = true
		f.t.Stop()
	}
	return n, err
}

func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	return buf.Bytes(), err
}

func (h *Handler) refuse(x *exchange, e provider.Error) error {
	hdr := x.w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("X-Content-Type-Options", "nosniff")
	x.w.WriteHeader(e.Status)
	_, _ = x.w.Write(x.api.ErrorBody(e))
	return nil
}

func (x *exchange) setVar(key, val string) {
	if x.repl != nil {
		x.repl.Set(key, val)
	}
}

func setRetryAfter(h http.Header, d time.Duration) {
	if d > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10))
	}
}
