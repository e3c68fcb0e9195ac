package failover

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

func (e *Engine) serve(w http.ResponseWriter, r *http.Request) error {
	if e.wallet != nil {
		// Counted from entry, before the body is read, so that a reload
		// never closes the store under this request.
		defer e.wallet.w.Enter()()
	}
	x := newExchange(w, r, provider.APIFromPath(r.URL.Path), modeChain)
	traceRequest(x, e.opts.TraceContent)
	// Deferred first, so it runs last: after the bill is closed.
	defer x.trace.end(x)

	if e.refusePath(x) {
		return nil
	}
	if x.api == provider.OpenAIModels && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		if refusal := e.authorizeListing(x); refusal != nil {
			return e.refuse(x, *refusal)
		}
		return e.listModels(w, r)
	}
	if r.Method != http.MethodPost {
		if x.api == provider.OpenAIModels {
			// The model list is read, never posted to.
			w.Header().Set("Allow", "GET, HEAD")
			return e.refuse(x, provider.Error{Status: http.StatusMethodNotAllowed, Message: r.Method + " is not supported here; the model list is read with GET"})
		}
		w.Header().Set("Allow", http.MethodPost)
		return e.refuse(x, provider.Error{Status: http.StatusMethodNotAllowed, Message: r.Method + " is not supported here; LLM API requests are POSTs"})
	}
	body, err := e.readBodyBounded(w, r)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return e.refuse(x, provider.Error{Status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("request body is larger than %d bytes", e.opts.MaxRequestBody)})
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// request_body_timeout: the body was slow, not wrong. A 408,
			// which the official SDKs retry (docs/errors.md), never a
			// 400 that tells the client to fix its request.
			return e.refuse(x, provider.Error{Status: http.StatusRequestTimeout,
				Message: fmt.Sprintf("the request body did not arrive within %s", e.opts.RequestBodyTimeout)})
		}
		// The client went away or sent a broken body: nobody to answer.
		return e.refuse(x, provider.Error{Status: http.StatusBadRequest, Message: "reading request body: " + err.Error()})
	}
	x.body = body
	if x.req, err = x.api.ParseRequest(body); err != nil {
		if enc, ok := contentCoded(r.Header); ok {
			// A compressed body (some SDKs and proxies compress
			// requests) is not JSON as it comes: refused for what it
			// is, 415 with the coding accepted (RFC 9110 15.5.16), not
			// a 400 saying the client's JSON is invalid. (A body
			// labelled so but sent plain is read as it came.)
			w.Header().Set("Accept-Encoding", "identity")
			return e.refuse(x, provider.Error{Status: http.StatusUnsupportedMediaType,
				Message: fmt.Sprintf("request bodies with Content-Encoding %q are not supported; send the body uncompressed", enc)})
		}
		return e.refuse(x, provider.Error{Status: http.StatusBadRequest, Message: err.Error()})
	}
	x.setVar("http.llm_failover.model", x.req.Model)
	x.model = e.models[x.req.Model]
	x.trace.parsed(x)
	if x.model == nil {
		return e.refuse(x, provider.Error{Status: http.StatusNotFound, Code: "model_not_found",
			Message: fmt.Sprintf("The model %q does not exist or is not served by this gateway", x.req.Model)})
	}
	if x.model.ByAPI[x.api] == nil {
		return e.refuse(x, provider.Error{Status: http.StatusBadRequest,
			Message: fmt.Sprintf("model %q is not served over the %s API by any of its channels", x.req.Model, x.api)})
	}

	if x.api == provider.OpenAIResponses && x.req.Background && !provider.Streaming(r.URL.Path, x.req) {
		// Answered upstream with the response queued, to be fetched by id
		// later: a GET this gateway does not serve, and usage it never
		// sees to charge.
		return e.refuse(x, provider.Error{Status: http.StatusBadRequest,
			Message: `"background": true is not supported through this gateway without "stream": true: the response could not be retrieved (GET /v1/responses/{id} is not served) nor billed; stream it, or leave out "background"`})
	}

	// A duplicate of a call is answered before anything is reserved; the
	// call's first run ends after its bill is settled (deferred first).
	answered, run := e.beginIdempotent(x)
	if run != nil {
		r = x.r // the run's context, which outlives its client
		defer e.finishRun(x, run)
	}
	if answered {
		return nil
	}

	if e.wallet != nil {
		var refusal *provider.Error
		if x.bill, refusal = e.wallet.admit(x, e.mayResume(x)); refusal != nil {
			// What the client got, as any other ending: a model whose
			// every request the wallet refuses (a price no balance
			// covers, a store that is down) is not a model with no
			// traffic.
			requestsTotal.WithLabelValues(x.req.Model, "refused").Inc()
			e.recordFailed(x, refusal.Status, string(reasonStatus))
			return e.refuse(x, *refusal)
		}
		// Whatever happens from here on, the reservation is settled or
		// released exactly once, panics included.
		defer x.bill.close()
	}

	var scratch chain.Scratch
	// A pointer into the handler, not the slice itself: converting a
	// slice to the Health interface would allocate on every request.
	plan := x.model.ByAPI[x.api].Plan((*health)(&e.channels), x.start, &scratch)
	candidates := plan.Candidates
	// The request's deadline, known before the walk sets it: a decision
	// journaled ahead of it (cache affinity) states the budget left.
	x.deadline = x.start.Add(e.opts.Deadline)
	e.preferCachedChannel(x, candidates)
	var lastResort *breaker.Ticket
	if len(candidates) == 0 {
		// Every channel is open or parked. At most one request per
		// channel per cooldown is their last resort; every other is
		// refused at once.
		route, ticket := e.admitLastResort(plan.LastResorts, x.start)
		if route == nil {
			return e.refuseUnavailable(x, plan.Skipped, plan.RetryAt, len(plan.LastResorts) == 0)
		}
		x.mode, lastResort = modeLastResort, &ticket
		candidates = []*chain.Route{route}
		e.logger.Warn("every channel is open; trying the one whose cooldown ends first",
			zap.String("model", x.req.Model), zap.String("channel", route.Name))
	}
	for _, r := range plan.Skipped {
		if x.mode != modeLastResort || r != candidates[0] {
			e.skipped(x, r)
		}
	}

	end := e.walk(x, candidates, lastResort, x.start.Add(e.opts.Deadline))
	if end.answered {
		res := end.res
		if x.resume.pending() {
			// The client's first content came with the attempt that
			// broke, not with its continuation's (each try starts its
			// own): the model's time to first content is what its
			// client waited.
			firstContent := x.committedAt
			res = e.resume(x, end.rest, res)
			if !firstContent.IsZero() {
				x.committedAt = firstContent
			}
		}
		e.rememberCachedChannel(x, res)
		e.recordServed(x, res)
		return nil
	}
	if r.Context().Err() != nil {
		requestsTotal.WithLabelValues(x.req.Model, string(outcomeClientGone)).Inc()
		e.logger.Info("client went away before an answer was committed",
			zap.String("model", x.req.Model), zap.Int("attempts", x.attempts), zap.Duration("elapsed", time.Since(x.start)))
		return nil
	}
	if x.attempts == 0 && time.Now().Before(x.deadline) {
		// Every candidate's trial slots filled up after planning.
		return e.refuseUnavailable(x, nil, time.Now(), false)
	}
	requestsTotal.WithLabelValues(x.req.Model, "exhausted").Inc()
	pe := exhausted(x, end.last)
	e.logger.Error("all channels failed",
		zap.String("model", x.req.Model), zap.Int("attempts", x.attempts),
		zap.Int("status", pe.Status), zap.Duration("elapsed", time.Since(x.start)))
	setRetryAfter(w.Header(), end.retryAfter)
	if !end.overloaded {
		chainWalked(w.Header())
	}
	why := string(reasonNoWorkingChannel)
	if end.last != nil {
		why = string(end.last.reason) // the failure the client was answered with
	}
	e.recordFailed(x, pe.Status, why)
	return e.refuse(x, pe)
}

// admitLastResort lets one of the open channels, soonest to recover
// first, take a last-resort request, if its breaker allows one now.
func (e *Engine) admitLastResort(routes []*chain.Route, now time.Time) (*chain.Route, breaker.Ticket) {
	for _, r := range routes {
		if t, ok := e.channels[r.Channel].health.Breaker.AdmitLastResort(now); ok {
			return r, t
		}
	}
	return nil, breaker.Ticket{}
}

// refuseUnavailable answers a request no channel may be sent: 503 with a
// Retry-After of the soonest recovery (at least a second). It logs nothing
// per request: the state changes that led here were logged once each.
func (e *Engine) refuseUnavailable(x *exchange, skipped []*chain.Route, retryAt time.Time, allParked bool) error {
	for _, r := range skipped {
		e.skipped(x, r)
	}
	wait := max(time.Until(retryAt), time.Second)
	setRetryAfter(x.w.Header(), wait)
	chainWalked(x.w.Header())
	why := "open after failures"
	if allParked {
		why = "rate limited"
	}
	requestsTotal.WithLabelValues(x.req.Model, "unavailable").Inc()
	status := http.StatusServiceUnavailable
	if allParked {
		status = http.StatusTooManyRequests // what it is, for the history: a rate limit
	}
	e.recordFailed(x, status, string(reasonNoWorkingChannel))
	if c := e.logger.Check(zapcore.DebugLevel, "every channel is unavailable; refusing without sending"); c != nil {
		c.Write(zap.String("model", x.req.Model), zap.Bool("all_parked", allParked), zap.Duration("retry_after", wait))
	}
	return e.refuse(x, provider.Error{Status: http.StatusServiceUnavailable,
		Message: fmt.Sprintf("every channel serving model %q is %s; retry after %s", x.req.Model, why, wait.Round(time.Second))})
}

// skipped counts a channel left out of a request because of its breaker.
func (e *Engine) skipped(x *exchange, r *chain.Route) {
	channelSkipped.WithLabelValues(r.Name).Inc()
	if c := e.logger.Check(zapcore.DebugLevel, "channel skipped: breaker open"); c != nil {
		c.Write(zap.String("model", x.req.Model), zap.String("channel", r.Name),
			zap.String("state", e.channels[r.Channel].health.Breaker.State(x.start).String()))
	}
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
		case last.reason == reasonAccountRefused:
			// A channel's account or key refused (provider.ChannelRefusal):
			// the request is not at fault, nor the client's wallet, and
			// the client must not read it so.
		case last.status >= 400 && last.status <= 599:
			// A status outside HTTP's range is no answer: a 502.
			e.Status = last.status
		case last.frameStatus >= 400:
			e.Status = last.frameStatus
		}
		if last.message != "" {
			what += ": " + last.message
		}
		if last.reason == reasonStoredContextMissing {
			// No channel has it: the code clients look for (a 404's
			// default would be model_not_found).
			e.Code = "not_found"
			if x.req.StoredContext == "previous_response_id" {
				e.Code = "previous_response_not_found"
			}
		}
	} else if x.attempts == 0 {
		e.Status = http.StatusGatewayTimeout
	}
	e.Message = fmt.Sprintf("model %q: %d channel(s) tried, none answered; %s", x.req.Model, x.attempts, what)
	return e
}

// contentCoded reports the request body's content coding when it has one
// other than identity, cut to a length fit for a message.
func contentCoded(h http.Header) (string, bool) {
	for _, v := range h.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				if len(c) > 32 {
					c = c[:32]
				}
				return c, true
			}
		}
	}
	return "", false
}

func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	return readSized(http.MaxBytesReader(w, r.Body, limit), r.ContentLength)
}

// sizedReadMax bounds the buffer readSized makes from a declared length:
// the length is the sender's word, and a body that is not sent must not
// cost its declared size. Bodies past it grow as they arrive.
const sizedReadMax = 64 << 10

// readSized reads src to its end. A body whose length is declared
// (Content-Length; -1 for none) is read into one buffer of that size,
// up to sizedReadMax, with a byte to spare for the read that finds the
// end: a small body is one allocation of its own size, where io.ReadAll
// makes growing chunks and a final copy (about 1.5 KB and four
// allocations for a 600-byte answer), and bytes.Buffer keeps 512 bytes
// spare. The length is only a hint (an adapter may rewrite the body): a
// longer body grows the buffer as it arrives. Whatever limits the read
// is src's (http.MaxBytesReader, io.LimitReader).
func readSized(src io.Reader, declared int64) ([]byte, error) {
	size := int64(512)
	if declared >= 0 && declared < sizedReadMax {
		size = declared + 1
	}
	buf := make([]byte, 0, size)
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, 1) // by append's growth: doubling
		}
		n, err := src.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// refuse answers the client with pe in its API's error format.
func (e *Engine) refuse(x *exchange, pe provider.Error) error {
	x.trace.refusedWith(pe.Status)
	hdr := x.w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("X-Content-Type-Options", "nosniff")
	x.w.WriteHeader(pe.Status)
	_, _ = x.w.Write(errorAPI(x).ErrorBody(pe))
	return nil
}

// errorAPI is the API whose error format x's refusals use: its path's,
// except that the model list answers an Anthropic SDK (anthropic-version
// set, as listModels and provider.ModelList tell it) in Anthropic's
// format, its errors included, and so does a path no API serves (the
// Message Batches API, /v1/complete): its 404 is for an Anthropic SDK.
func errorAPI(x *exchange) provider.API {
	if (x.api == provider.OpenAIModels || x.api == provider.Unknown) && x.r.Header.Get("Anthropic-Version") != "" {
		return provider.AnthropicMessages
	}
	return x.api
}

func (x *exchange) setVar(key, val string) {
	if x.repl != nil {
		x.repl.Set(key, val)
	}
}

// chainWalked tells the official OpenAI and Anthropic SDKs not to retry
// an answer for which the gateway already walked the whole chain (or
// found every channel unavailable): their own retries would only repeat
// it, and the OpenAI SDK honours a Retry-After of a minute by sleeping
// inside the call. Both SDKs read x-should-retry before anything else;
// Retry-After stays for clients that schedule their own retries.
func chainWalked(h http.Header) {
	h.Set("X-Should-Retry", "false")
}

func setRetryAfter(h http.Header, d time.Duration) {
	if d > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10))
	}
}
