package failover

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

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/latency"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// Causes of an attempt's cancellation, told apart with context.Cause.
var (
	errBudget        = errors.New("candidate time budget exhausted")
	errHeaderTimeout = errors.New("no response headers within header_timeout")
	errFirstByte     = errors.New("no response byte within first_byte_timeout")
	errErrorBody     = fmt.Errorf("an error answer's body did not come within %s", errorBodyWait)
)

// attempt sends the request to one channel and, if its answer is good,
// commits it to the client.
func (e *Engine) attempt(x *exchange, route *chain.Route, budget time.Duration) attemptResult {
	ch := e.channels[route.Channel]
	if f := e.overloaded(); f != nil {
		return retryWith(f)
	}
	ctx, cancel := context.WithCancelCause(x.attemptParent())
	defer cancel(nil)
	// What an adapter buffers to read the answer counts against the
	// memory budget too.
	ctx = provider.WithHolder(ctx, e.memory)
	// Every timer below is stopped when the answer is committed: none of
	// them may cut a stream that is already on its way to the client.
	budgetTimer := time.AfterFunc(budget, func() { cancel(errBudget) })
	defer budgetTimer.Stop()
	headerWait, headerCause, stopLearned := e.armLearned(x, ch, cancel)
	defer stopLearned()
	headerTimer := time.AfterFunc(headerWait, func() { cancel(headerCause) })
	var firstByte *time.Timer
	if e.opts.FirstByteTimeout > 0 {
		firstByte = time.AfterFunc(e.opts.FirstByteTimeout, func() { cancel(errFirstByte) })
		defer firstByte.Stop()
	}

	body, req := x.body, x.req
	var form provider.ContinuationForm
	if x.mode == modeContinue {
		c, err := e.continuationFor(x, ch, route)
		if err != nil {
			headerTimer.Stop()
			return retryWith(&failure{reason: reasonNetwork, detail: buildFailed + err.Error()})
		}
		x.resume.cur, form = c, c.form
		body, req = c.body, c.req
	}
	if x.bill != nil {
		body = x.bill.prepare(body)
		x.meter = x.bill.meter
	} else {
		// Unbilled, the history still counts the output tokens: a meter
		// reads the answer on its way past and asks the upstream nothing.
		x.meter = x.api.NewMeter()
	}
	x.trace.watch(x.meter)
	out, err := ch.Adapter.NewRequest(ctx, provider.Call{
		API: x.api, Base: ch.Base, Client: x.r, Body: body, Request: req,
		UpstreamModel: route.UpstreamModel, Header: ch.Header, PassHeader: ch.Extras.Request,
		Continuation: form,
	})
	if err != nil {
		headerTimer.Stop()
		return retryWith(&failure{reason: reasonNetwork, detail: buildFailed + err.Error()})
	}
	x.upstreamPath = out.URL.Path
	if ch.PropagateTrace {
		x.trace.traceparent(out.Header)
	}
	res, err := ch.Transport.RoundTrip(out)
	headerTimer.Stop()
	if err != nil {
		return x.transportFailure(ctx, err)
	}
	x.timing.headersAt = time.Now()
	defer res.Body.Close()

	switch s := res.StatusCode; {
	case s < 200 || s > 599:
		// No answer: a 101 hands the connection over (its body would
		// never end; closing it ends the connection), and a status
		// outside HTTP's range is a broken upstream. The channel's
		// failure, its body unread.
		return retryWith(&failure{reason: reasonStatus, status: s, detail: "not an answer's status"})
	case e.retry[s]:
		return retryWith(e.errorAnswer(x, res, cancel))
	}
	if x.mode == modeContinue && (res.StatusCode != http.StatusOK || !ch.Adapter.IsStream(res.Header)) {
		// A continuation joins a stream the client already has: anything
		// but a stream is this channel's failure, never the client's
		// answer. A refused prefill says the model wants the instructed
		// form: learned for the channel's model, and asked again at once
		// (candidate).
		f := e.errorAnswer(x, res, cancel)
		if form == provider.Prefill && provider.PrefillRefused(f.status, f.message) {
			f.reason = reasonPrefillRefused
			if model := upstreamModel(route, x.req.Model); ch.health.LearnRefusesPrefill(model) {
				e.logger.Info("channel's model refuses a prefill; its continuations are instructed from now on",
					zap.String("channel", ch.Name), zap.String("upstream_model", model))
			}
		}
		return retryWith(f)
	}
	src := ch.Adapter.ResponseBody(res)
	if route.UpstreamModel != "" && route.UpstreamModel != x.req.Model {
		// The client sees the model it asked for, never the route's rename.
		src = provider.RestoreModel(src, x.req.Model)
	}
	if firstByte != nil {
		src = &firstByteReader{r: src, t: firstByte}
	}
	// commit makes the attempt the client's answer; in a hedged race it
	// first claims the client, and an attempt that lost the race commits
	// nothing (false).
	commit := func() bool {
		if x.race != nil && !x.race.claim(x) {
			return false
		}
		x.committedAt = time.Now()
		if x.ticket.Trial() && res.StatusCode >= 200 && res.StatusCode < 300 {
			// The trial's answer is reaching its client: the channel
			// answers. Closed now, not when a long stream ends, so that
			// its trial slot does not keep every other request off it.
			if tr := ch.health.Breaker.RecordCommitted(x.committedAt); tr.Changed() {
				e.app.StateChanged(e.logger, ch.health, tr, string(outcomeOK))
			}
		}
		budgetTimer.Stop()
		stopLearned()
		if firstByte != nil {
			firstByte.Stop()
		}
		x.setVar("http.llm_failover.channel", ch.Name)
		x.servedBy = ch.Name
		if x.bill != nil && res.StatusCode >= 200 && res.StatusCode < 300 {
			// Only a successful answer that reached the client is billed:
			// an error the upstream passed back cost it nothing.
			x.bill.servedBy(ch.Name, upstreamModel(route, x.req.Model))
		}
		return true
	}
	switch {
	case res.StatusCode >= 300 && res.StatusCode < 400:
		// No LLM API redirects; a channel that does is misconfigured or
		// compromised, and its Location must not steer the client.
		return retryWith(&failure{reason: reasonRedirect, status: res.StatusCode})
	case res.StatusCode >= 300:
		// Not retryable and not a success: every channel would say the
		// same, so the client gets this answer, secrets masked.
		return e.relayError(ctx, x, ch, res, src, commit)
	case ch.Adapter.IsStream(res.Header):
		return e.relayStream(ctx, cancel, x, ch, res, src, commit)
	case provider.IsLineStream(ch.Adapter, res.Header):
		if !commit() {
			return attemptResult{verdict: clientGone}
		}
		idle := newIdleReader(src, e.opts.StreamIdleTimeout, cancel)
		defer idle.stop()
		e.passThrough(x, ch, res, idle)
		return attemptResult{verdict: served}
	case ch.Adapter.IsJSON(res.Header):
		return e.relayJSON(ctx, x, ch, res, src, commit)
	default:
		// A CDN's HTML page or a captive portal, not an API answer.
		return retryWith(&failure{reason: reasonContentType, status: res.StatusCode,
			detail: "content type " + strconv.Quote(res.Header.Get("Content-Type"))})
	}
}

// relayError passes back an error answer every channel would give (a 4xx),
// read whole and bounded so that a credential the upstream echoed in it is
// masked before the client sees it.
func (e *Engine) relayError(ctx context.Context, x *exchange, ch *Channel, res *http.Response, src io.Reader, commit func() bool) attemptResult {
	if enc := res.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		// The transport decodes only the gzip it asked for: a body in any
		// other encoding cannot be read, so nothing in it could be
		// masked. The client gets the status, not the body.
		if !commit() {
			return attemptResult{verdict: clientGone}
		}
		_ = e.refuse(x, provider.Error{Status: res.StatusCode,
			Message: fmt.Sprintf("the upstream answered %d in an encoding the gateway does not read (%s)", res.StatusCode, e.secrets.Message(enc))})
		return attemptResult{verdict: passed, status: res.StatusCode}
	}
	body, fail := e.readAnswer(ctx, x, res, src)
	if fail != nil {
		return *fail
	}
	if x.req.StoredContext != "" && x.mode == modeChain && provider.StoredContextMissing(res.StatusCode, body) {
		// The context the request refers to is not stored where this
		// channel's account looks: another channel may be the account
		// that stored it. Not the client's answer while another
		// channel's failure or answer is left (walkEnd.note), and no
		// fault of the channel.
		return retryWith(&failure{reason: reasonStoredContextMissing, status: res.StatusCode, message: x.api.UpstreamMessage(body)})
	}
	if x.mode != modeContinue && provider.ChannelRefusal(res.StatusCode, res.Header, body) {
		// The channel's account or key refused (its quota, its balance,
		// its key): another channel may serve the request, and this one
		// is not working.
		return retryWith(&failure{reason: reasonAccountRefused, status: res.StatusCode, message: x.api.UpstreamMessage(body)})
	}
	if b, changed := x.api.ClientErrorBody(res.StatusCode, body); changed {
		// Refused in another API's shape: the client's SDK reads its own.
		body = b
		res.Header.Set("Content-Type", "application/json")
	}
	if !commit() {
		return attemptResult{verdict: clientGone}
	}
	out := e.writeAnswer(x, ch, res, body)
	if out.verdict == served {
		out = attemptResult{verdict: passed, status: res.StatusCode}
	}
	return out
}

// relayStream holds an SSE answer in the stream gate until it shows
// content (commit) or an error (fail over).
func (e *Engine) relayStream(ctx context.Context, cancel context.CancelCauseFunc, x *exchange, ch *Channel, res *http.Response, src io.Reader, commit func() bool) attemptResult {
	client := &idleWriter{w: x.w, rc: http.NewResponseController(x.w), idle: e.opts.StreamIdleTimeout}
	defer client.done()
	// The attempt's meter observes and classifies the events, one walk
	// of each serving both where the API allows.
	opts := x.meter.GateOptions()
	// The stream's own buffers are reserved now; what the gate holds back
	// while it waits for the first token is counted as it grows (Hold):
	// max_held_bytes bounds memory, not the streams waiting at once.
	release, over := e.holdFrames(streamBase)
	if over != nil {
		return retryWith(over)
	}
	defer release()
	var d streamgate.Downstream = &downstream{w: client, res: res, onCommit: func() bool { release(); return commit() },
		copyHeader: func(dst, src http.Header) { e.copyResponseHeader(ch, dst, src) }}
	continuing := x.mode == modeContinue
	var join *provider.Joiner
	if continuing {
		c := x.resume.cur
		d = &spliced{w: client, seam: seamComment(x.resume.from, ch.Name, c.form), splice: c.splice, onCommit: func() bool { release(); return commit() }}
		if join = c.splice.Joiner(); join != nil {
			// The instructed answer's text is held until it is known to
			// join the delivered text.
			opts.Classify = join.Classify(opts.Classify)
		}
	}
	opts.GateTimeout = e.opts.StreamGate
	opts.GateFailover = e.opts.StreamGateFailover
	opts.IdleTimeout = e.opts.StreamIdleTimeout
	opts.Hold = e.gateHold
	opts.Scrub = e.scrubber()
	if x.bill != nil {
		opts.Drop = x.bill.hideUsage
	}
	d = e.watchForResume(x, &opts, d)
	e.learnStall(x, ch, &opts)
	if opts.StallFloor == 0 {
		// Pings alone do not keep a committed stream alive: content that
		// stops for stream_idle_timeout ends it, as silence would.
		opts.StallFloor = e.opts.StreamIdleTimeout
	}
	out := streamgate.Relay(src, cancel, d, opts)
	out.Deferred = e.scrubBytes(out.Deferred) // written to the client below, or after a failed resume
	x.trace.gate(out)
	x.timing.atGate, x.timing.longestGap = out.CommittedAtGate, out.LongestGap
	// How the stream ended decides whose doing it was, before whether the
	// client is still there: a client that hangs up right after an
	// upstream cut must not turn the cut into its own departure.
	switch out.Outcome {
	case streamgate.Complete:
		return attemptResult{verdict: served}
	case streamgate.ClientGone:
		return attemptResult{verdict: clientGone}
	case streamgate.Truncated, streamgate.Stalled:
		if out.Outcome == streamgate.Truncated && cancelledByClient(x, out.Err) {
			// The read failed because the client left and took the
			// upstream request with it. A break held back for a resume
			// is still written, as the gate writes it when none is held:
			// the writer may record the answer for the client's retry
			// (an idempotent run's grace ran out), which must end with
			// the error, not as if complete.
			if out.Deferred != nil {
				if _, err := client.Write(out.Deferred); err == nil {
					_ = client.Flush()
				}
			}
			return attemptResult{verdict: clientGone}
		}
		f := &failure{reason: reasonTruncated}
		switch {
		case out.Outcome == streamgate.Stalled:
			f.reason = reasonStalled
		case errors.Is(out.Err, provider.ErrMemoryBudget):
			f = overloadedFailure() // the load's doing, not the channel's
		}
		if errors.Is(out.Err, streamgate.ErrContentStall) {
			if x.learnedStallFailure(f); f.learned != nil {
				e.decided(x, ch.Name, f, "")
			}
		}
		if !continuing && e.broke(x, ch, out) {
			return attemptResult{verdict: broken, fail: f}
		}
		if out.Deferred != nil {
			// Nothing will continue it: end it as without stream_resume.
			if _, err := client.Write(out.Deferred); err == nil {
				_ = client.Flush()
			}
		}
		e.logger.Warn("committed stream ended abnormally; error event sent to the client",
			zap.String("model", x.req.Model), zap.String("channel", ch.Name),
			zap.String("outcome", out.Outcome.String()), zap.Int64("bytes_sent", out.BytesSent), zap.String("error", e.scrubString(errString(out.Err))))
		return attemptResult{verdict: broken, fail: f}
	case streamgate.UpstreamError:
		f := &failure{reason: reasonErrorFrame, message: x.api.UpstreamMessage(out.ErrorData), frameStatus: x.api.ErrorFrameStatus(out.ErrorData)}
		if out.Committed {
			// The error event was forwarded and ended a stream the client
			// already has: it cannot fail over, only count against the
			// channel.
			if x.api.Anthropic() && out.ErrorName != "error" {
				// An error without the event name (an OpenAI-compatible
				// host's `data: {"error":...}`): the Anthropic SDK skips
				// events without a name, and would end as if the answer
				// were whole. It is told in its own format.
				msg := "the upstream ended the stream with an error; the response is incomplete"
				if f.message != "" {
					msg = "the upstream ended the stream with an error: " + e.quote(f.message)
				}
				ev := x.api.ErrorEvent("", msg)
				if out.Deferred != nil {
					out.Deferred = append(out.Deferred, ev...)
				} else if _, err := client.Write(ev); err == nil {
					_ = client.Flush()
				}
			}
			if !continuing && e.broke(x, ch, out) {
				return attemptResult{verdict: broken, fail: f}
			}
			if out.Deferred != nil {
				// Held back for a resume that will not happen: forward it.
				if _, err := client.Write(out.Deferred); err == nil {
					_ = client.Flush()
				}
			}
			return attemptResult{verdict: broken, fail: f}
		}
		if join != nil {
			if why := join.Abandoned(); why != "" {
				return retryWith(&failure{reason: reasonRestarted, detail: why})
			}
		}
		if status := x.api.ErrorFrameRefusal(out.ErrorData); status != 0 && !continuing {
			// The upstream refused the request itself: every channel would.
			_ = e.refuse(x, provider.Error{Status: status, Message: e.quote(f.message)})
			return attemptResult{verdict: passed, status: status}
		}
		return retryWith(f)
	case streamgate.GateTimeout:
		return retryWith(&failure{reason: reasonGateTimeout, timeout: true})
	case streamgate.Oversized:
		return retryWith(&failure{reason: reasonLineTooLarge,
			detail: fmt.Sprintf("a line over %d bytes before any content", streamgate.DefaultMaxHeld)})
	default: // ClosedEarly
		if x.r.Context().Err() != nil {
			return attemptResult{verdict: clientGone}
		}
		if errors.Is(out.Err, provider.ErrMemoryBudget) {
			return retryWith(overloadedFailure())
		}
		if f := causeFailure(ctx); f != nil {
			return retryWith(f)
		}
		return retryWith(&failure{reason: reasonClosedEarly})
	}
}

// cancelledByClient reports whether a read failed because the client left:
// its request's context ended, and the error is that cancellation rather
// than anything the upstream did.
func cancelledByClient(x *exchange, err error) bool {
	return x.r.Context().Err() != nil && errors.Is(err, context.Canceled)
}

// relayJSON reads a whole non-streaming answer before committing it, so a
// body cut mid-way or a 200 that carries an error object fails over
// instead of reaching the client.
func (e *Engine) relayJSON(ctx context.Context, x *exchange, ch *Channel, res *http.Response, src io.Reader, commit func() bool) attemptResult {
	body, fail := e.readAnswer(ctx, x, res, src)
	if fail != nil {
		return *fail
	}
	switch err := x.api.CheckBody(body); {
	case errors.Is(err, provider.ErrErrorBody):
		return retryWith(&failure{reason: reasonErrorBody, status: res.StatusCode, message: x.api.UpstreamMessage(body)})
	case err != nil:
		return retryWith(&failure{reason: reasonBadBody, status: res.StatusCode, detail: err.Error()})
	}
	x.meter.Body(body)
	if !commit() {
		return attemptResult{verdict: clientGone}
	}
	return e.writeAnswer(x, ch, res, body)
}

// readAnswer reads a whole answer, at most max_response_body of it; a
// failure says why it could not.
func (e *Engine) readAnswer(ctx context.Context, x *exchange, res *http.Response, src io.Reader) ([]byte, *attemptResult) {
	held := &heldReader{r: src, memory: e.memory}
	// The answer is held until written; the count is released when this
	// attempt ends, which is after the write.
	x.held = append(x.held, held)
	body, err := readSized(io.LimitReader(held, e.opts.MaxResponseBody+1), res.ContentLength)
	switch {
	case errors.Is(err, provider.ErrMemoryBudget):
		return nil, &attemptResult{verdict: retry, fail: overloadedFailure()}
	case err != nil && x.r.Context().Err() != nil:
		return nil, &attemptResult{verdict: clientGone}
	case err != nil:
		if f := causeFailure(ctx); f != nil {
			return nil, &attemptResult{verdict: retry, fail: f}
		}
		return nil, &attemptResult{verdict: retry, fail: &failure{reason: reasonBadBody, status: res.StatusCode, detail: "reading body: " + err.Error()}}
	case int64(len(body)) > e.opts.MaxResponseBody:
		return nil, &attemptResult{verdict: retry, fail: &failure{reason: reasonTooLarge, status: res.StatusCode}}
	}
	return body, nil
}

// writeAnswer sends a whole answer to the client.
func (e *Engine) writeAnswer(x *exchange, ch *Channel, res *http.Response, body []byte) attemptResult {
	body = e.scrubBytes(body)
	hdr := x.w.Header()
	e.copyResponseHeader(ch, hdr, res.Header)
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	x.w.WriteHeader(res.StatusCode)
	// Written within stream_idle_timeout a piece, as a stream's pieces
	// are: a client that stops reading, TCP open, must not hold the
	// answer's bytes, the goroutine and the reservation for ever, and a
	// slow but reading client of a large answer is not cut. Not flushed:
	// the handler returns at once (a billed answer's settlement is
	// written after it, see bill.close), and the server sends headers and
	// a small body in one write.
	out := &idleWriter{w: x.w, rc: http.NewResponseController(x.w), idle: e.opts.StreamIdleTimeout}
	defer out.done()
	if _, err := out.writePieces(body); err != nil {
		return attemptResult{verdict: clientGone}
	}
	return attemptResult{verdict: served}
}

// passThrough copies a stream of JSON lines, which the gateway does not
// inspect, flushing as lines arrive so that it still streams. Lines go
// out whole and scrubbed, so that a secret split across reads is masked;
// a line longer than maxPassLine goes on as it comes, unscrubbed, rather
// than be held. No Content-Length: scrubbing may change the length.
func (e *Engine) passThrough(x *exchange, ch *Channel, res *http.Response, src io.Reader) {
	e.copyResponseHeader(ch, x.w.Header(), res.Header)
	x.w.WriteHeader(res.StatusCode)
	out := &idleWriter{w: x.w, rc: http.NewResponseController(x.w), idle: e.opts.StreamIdleTimeout}
	defer out.done()
	scrub := e.scrubber()
	buf := make([]byte, 16<<10)
	var line []byte // a line begun in an earlier read
	for {
		n, err := src.Read(buf)
		if n > 0 {
			b := buf[:n]
			if len(line) > 0 {
				line = append(line, b...)
				b = line
			}
			cut := bytes.LastIndexByte(b, '\n') + 1
			if len(b)-cut > maxPassLine {
				cut = len(b)
			}
			if cut > 0 {
				if _, werr := out.Write(scrub(b[:cut])); werr != nil {
					return
				}
				_ = out.Flush()
			}
			line = append(line[:0], b[cut:]...)
		}
		if err != nil {
			if len(line) > 0 {
				_, _ = out.Write(scrub(line))
			}
			return
		}
	}
}

// maxPassLine bounds what passThrough holds of one line.
const maxPassLine = 1 << 20

// transportFailure classifies an error from RoundTrip.
func (x *exchange) transportFailure(ctx context.Context, err error) attemptResult {
	if x.r.Context().Err() != nil {
		return attemptResult{verdict: clientGone}
	}
	if f := causeFailure(ctx); f != nil {
		if l := f.learned; l != nil && l.kind == latency.FirstContent {
			// The first-content deadline passed before any headers came
			// (it may be the shorter of the two): the wait that was
			// silent is the headers'.
			l.kind = latency.Header
			f.detail = l.Error()
		}
		return retryWith(f)
	}
	var dial reverseproxy.DialError
	if errors.As(err, &dial) {
		return retryWith(&failure{reason: reasonDial, detail: err.Error()})
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return retryWith(&failure{reason: reasonHeaderTimeout, detail: err.Error(), timeout: true})
	}
	return retryWith(&failure{reason: reasonNetwork, detail: err.Error()})
}

// causeFailure reports the failure behind one of the attempt's own timers.
func causeFailure(ctx context.Context) *failure {
	var learned learnedTimeout
	switch cause := context.Cause(ctx); {
	case errors.As(cause, &learned):
		return &failure{reason: reasonLearnedDeadline, detail: cause.Error(), timeout: true, learned: &learned}
	case errors.Is(cause, errBudget):
		return &failure{reason: reasonBudget, detail: cause.Error(), timeout: true}
	case errors.Is(cause, errHeaderTimeout):
		return &failure{reason: reasonHeaderTimeout, detail: cause.Error(), timeout: true}
	case errors.Is(cause, errFirstByte):
		return &failure{reason: reasonFirstByte, detail: cause.Error(), timeout: true}
	}
	return nil
}

// errorBodyWait bounds the wait for a retryable error answer's body, read
// only to quote its message: an upstream that sends a 503's headers and
// then nothing must not hold the request for the candidate's budget.
const errorBodyWait = 2 * time.Second

// errorAnswer is statusFailure within errorBodyWait: past it the attempt
// is cancelled, the read ends with what came, and the walk moves on.
func (e *Engine) errorAnswer(x *exchange, res *http.Response, cancel context.CancelCauseFunc) *failure {
	t := time.AfterFunc(errorBodyWait, func() { cancel(errErrorBody) })
	defer t.Stop()
	return statusFailure(x.api, res)
}

// statusFailure reads (a bounded part of) a retryable error answer so that
// its message can be logged and quoted to the client, and when it asks to
// be left alone: Retry-After, or for a 429 without one, the provider's
// rate-limit reset headers.
func statusFailure(api provider.API, res *http.Response) *failure {
	f := &failure{reason: reasonStatus, status: res.StatusCode}
	now := time.Now()
	f.retryAfter, f.hinted = provider.RetryAfter(res.Header, now)
	if !f.hinted && res.StatusCode == http.StatusTooManyRequests {
		f.retryAfter, f.hinted = provider.RateLimitReset(res.Header, now)
	}
	if b, err := readSized(io.LimitReader(res.Body, 64<<10), res.ContentLength); err == nil || len(b) > 0 {
		f.message = api.UpstreamMessage(b) // cut by scrubFailure, once masked
	}
	return f
}

// downstream lets the stream gate commit and write to the client.
type downstream struct {
	w   *idleWriter
	res *http.Response
	// onCommit claims the client for the attempt; false: a hedged race's
	// other attempt has it.
	onCommit func() bool
	// copyHeader copies the answer's headers a client may see.
	copyHeader func(dst, src http.Header)
}

func (d *downstream) Commit() error {
	if !d.onCommit() {
		return errHedgeLost
	}
	d.copyHeader(d.w.w.Header(), d.res.Header)
	d.w.w.WriteHeader(d.res.StatusCode)
	return nil
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

// buildFailed starts the detail of an attempt whose request the adapter
// could not build (credentials it could not use): the doctor tells it
// from an unreachable upstream by it.
const buildFailed = "building the upstream request: "
