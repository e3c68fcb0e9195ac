package failover

import (
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// resumedTrailer is the HTTP trailer that names the channels of a resumed
// answer ("a -> b"). The headers left with the first attempt, so it is
// announced (Trailer:) when a stream that may be resumed is committed and
// set only when a continuation was committed.
const resumedTrailer = "X-Llm-Failover-Resumed"

// resumeState follows one request whose committed stream may be
// continued on another channel (stream_resume continue).
type resumeState struct {
	transcript *provider.Transcript
	// Set when the stream broke and a continuation is to be sought.
	wanted   bool
	from     string // the channel whose stream broke
	errEvent []byte // the original failure's error event
	// cur is the continuation the attempt in flight sends.
	cur *continuation
}

// continuation is one attempt's request to continue a broken stream:
// the body sent, parsed, and the Splice that joins its answer.
type continuation struct {
	form   provider.ContinuationForm
	body   []byte
	req    provider.Request
	splice *provider.Splice
}

// pending reports whether a broken stream waits for its continuation.
func (rs *resumeState) pending() bool { return rs != nil && rs.wanted }

// build returns a continuation in form. Each attempt gets its own: a
// Splice, and an instructed one's Joiner, keep what they have read of
// one channel's answer, which says nothing of the next channel's.
func (rs *resumeState) build(x *exchange, form provider.ContinuationForm) (*continuation, error) {
	body, splice, err := rs.transcript.Continue(x.body, form)
	var req provider.Request
	if err == nil {
		// Parsed again: an adapter edits the body at the offsets it holds.
		req, err = x.api.ParseRequest(body)
	}
	if err != nil {
		return nil, err
	}
	return &continuation{form: form, body: body, req: req, splice: splice}, nil
}

// continuationFor picks how ch is asked to continue: its adapter's form,
// or the instructed one once its upstream model refused a prefill (or a
// prefill cannot be built: only white space was delivered).
func (e *Engine) continuationFor(x *exchange, ch *Channel, route *chain.Route) (*continuation, error) {
	form := continuationForm(ch, x.api)
	if form == provider.Prefill && ch.health.RefusesPrefill(upstreamModel(route, x.req.Model)) {
		form = provider.Instructed
	}
	c, err := x.resume.build(x, form)
	if err != nil && form == provider.Prefill {
		c, err = x.resume.build(x, provider.Instructed)
	}
	return c, err
}

// continuationForm is how a channel's adapter continues a stream of api.
func continuationForm(ch *Channel, api provider.API) provider.ContinuationForm {
	if c, ok := ch.Adapter.(provider.Continuer); ok {
		return c.ContinuationForm(api)
	}
	return provider.CannotContinue
}

// mayResume reports whether a broken stream of x may be continued: the
// wallet then reserves for one continuation too (billing.go).
func (e *Engine) mayResume(x *exchange) bool {
	return streaming(x) && x.model.resumable[x.api]
}

// resumableAPIs says, per client API, whether stream_resume can ever
// continue a stream of m: it is on, the API's streams can be continued,
// and a channel after the first (a resume goes only to the channels
// after the one that broke) has a provider that can continue them.
// Otherwise no request of m holds money for a continuation that cannot
// happen: a 402 for money only such a continuation needed was false.
func (e *Engine) resumableAPIs(m *Model) (out [provider.NumAPIs]bool) {
	if m.Resume != ResumeContinue {
		return out
	}
	for api, c := range m.ByAPI {
		if c == nil || len(c.Routes) < 2 || !provider.API(api).Resumable() {
			continue
		}
		for _, r := range c.Routes[1:] {
			if continuationForm(e.channels[r.Channel], provider.API(api)) != provider.CannotContinue {
				out[api] = true
				break
			}
		}
	}
	return out
}

// watchForResume prepares an attempt's stream for stream_resume and
// returns the downstream to relay it to. A first attempt's text is
// collected, a break deferred, and the trailer announced at commit. A
// billed request is resumed only if its reservation covers a continuation,
// so no resume can overdraw. A continuation's stream gate always fails
// over: an empty continuation is never committed into the client's stream.
func (e *Engine) watchForResume(x *exchange, opts *streamgate.Options, d streamgate.Downstream) streamgate.Downstream {
	if x.mode == modeContinue {
		opts.GateFailover = true
		return d
	}
	x.resume = nil
	if x.model.Resume != ResumeContinue || (x.bill != nil && !x.bill.resumable) {
		return d
	}
	t := x.api.NewTranscript(resumeTextCap(x))
	if t == nil {
		return d
	}
	x.resume = &resumeState{transcript: t}
	observe := opts.Observe
	opts.Observe = func(ev streamgate.Event) {
		if observe != nil {
			observe(ev)
		}
		t.Event(ev)
	}
	opts.DeferBreak = true
	// A stream that will be resumed is also judged by its content, not
	// only its bytes: an upstream that keeps pinging but stopped
	// answering is a break too. Never sooner than 20 s (a reasoning
	// pause is no stall), unless stream_idle_timeout says less.
	opts.StallFloor = min(resumeStallFloor, e.opts.StreamIdleTimeout)
	return announcing{Downstream: d, header: x.w.Header()}
}

// resumeStallFloor is the least content silence that breaks a stream
// that will be resumed; the gate raises it to 8 times the longest pause
// the stream made before (streamgate.Options.StallFloor).
const resumeStallFloor = 20 * time.Second

// announcing declares the resumed trailer when its stream is committed:
// a trailer must be announced before the headers go out.
type announcing struct {
	streamgate.Downstream
	header http.Header
}

func (a announcing) Commit() error {
	a.header.Add("Trailer", resumedTrailer)
	return a.Downstream.Commit()
}

// resumeTextCap bounds the collected text by the model's output bound, at
// a generous 16 bytes a token.
func resumeTextCap(x *exchange) int {
	tokens := x.model.MaxOutput
	if x.req.MaxOutput > 0 {
		tokens = min(tokens, x.req.MaxOutput)
	}
	return int(min(tokens*16, 16<<20))
}

// broke records a first attempt's deferred break; it reports whether a
// continuation may be sought (else the caller ends the stream with the
// deferred error event).
func (e *Engine) broke(x *exchange, ch *Channel, out streamgate.Result) bool {
	rs := x.resume
	if rs == nil || out.Deferred == nil {
		return false
	}
	rs.errEvent = out.Deferred
	// The instructed form asks least of the delivered text: if it cannot
	// be built, no form can.
	if _, err := rs.build(x, provider.Instructed); err != nil {
		e.logger.Info("broken stream not resumed", zap.String("model", x.req.Model),
			zap.String("channel", ch.Name), zap.String("why", err.Error()))
		return false
	}
	rs.wanted, rs.from = true, ch.Name
	return true
}

// resume continues a broken stream on the candidates after the channel
// that broke, each in turn, until one's continuation is committed. When
// none is, the client gets the original failure's error event.
//
// The client is waiting mid-stream, so a resume does not get a fresh
// deadline: from the break, its first continued content must come within
// stream_idle_timeout (the silence the gateway tolerates from a committed
// stream), shared equally by the channels it tries, and each of them must
// send its headers within stream_header_timeout (the request streams).
//
// It returns what the client got in the end: the continuation's result,
// or broke, the broken stream's, when none could continue it.
func (e *Engine) resume(x *exchange, rest []*chain.Route, broke attemptResult) attemptResult {
	rs := x.resume
	if x.bill != nil {
		x.bill.continuing()
	}
	var able []*chain.Route
	for _, route := range rest {
		if continuationForm(e.channels[route.Channel], x.api) != provider.CannotContinue {
			able = append(able, route)
		}
	}
	if len(able) == 0 {
		e.logger.Info("broken stream not resumed", zap.String("model", x.req.Model), zap.String("channel", rs.from),
			zap.String("why", "no channel after it can continue a stream of this API"))
	}
	x.mode = modeContinue
	end := e.walk(x, able, nil, time.Now().Add(e.resumeBound()))
	switch {
	case end.answered && end.res.verdict == clientGone:
		return end.res
	case end.answered:
		next := able[len(able)-len(end.rest)-1].Name
		outcome := string(reasonResumed)
		if end.res.verdict == broken {
			outcome = "broken" // the continuation itself broke off
		}
		form := rs.cur.form.String()
		resumesTotal.WithLabelValues(x.req.Model, outcome, form).Inc()
		x.w.Header().Set(resumedTrailer, oneLine(rs.from)+" -> "+oneLine(next)+" ("+form+")")
		delivered := provider.EstimateTokens([]byte(rs.transcript.Text()))
		e.logger.Warn("broken stream resumed",
			zap.String("model", x.req.Model), zap.String("channel", rs.from),
			zap.String("next_channel", next), zap.String("reason", string(reasonResumed)), zap.String("form", form),
			zap.Int("delivered_bytes", len(rs.transcript.Text())), zap.Int64("delivered_tokens", delivered))
		e.decided(x, rs.from, &failure{reason: reasonResumed, delivered: delivered, form: form}, next)
		x.trace.resumed(form)
		return end.res
	case x.r.Context().Err() != nil:
		return attemptResult{verdict: clientGone}
	}
	resumesTotal.WithLabelValues(x.req.Model, "failed", "none").Inc()
	w := &idleWriter{w: x.w, rc: http.NewResponseController(x.w), idle: e.opts.StreamIdleTimeout}
	defer w.done()
	if _, err := w.Write(rs.errEvent); err == nil {
		_ = w.Flush()
	}
	return broke
}

// spliced is the client side of a continuation: the headers went out with
// the first attempt, so committing writes only the seam comment, and each
// event is rewritten by the Splice into the first attempt's message.
type spliced struct {
	w        *idleWriter
	onCommit func() bool
	seam     string
	splice   *provider.Splice
	p        streamgate.Parser
	out      []byte
}

var _ streamgate.Downstream = (*spliced)(nil)

func (s *spliced) Commit() error {
	if !s.onCommit() {
		return errHedgeLost
	}
	_, err := s.w.Write([]byte(s.seam))
	return err
}

func (s *spliced) Write(p []byte) (int, error) {
	s.out = s.out[:0]
	s.p.Feed(p, func(ev streamgate.Event) { s.out = s.splice.Rewrite(s.out, ev) })
	if len(s.out) > 0 {
		if _, err := s.w.Write(s.out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (s *spliced) Flush() error { return s.w.Flush() }

// resumeBound is how long a resume has, from the break, to its first
// continued content (see resume).
func (e *Engine) resumeBound() time.Duration {
	return e.opts.StreamIdleTimeout
}

// seamComment is the SSE comment that marks where a continuation begins,
// and in which form it was asked; clients ignore it, people reading the
// stream see it.
func seamComment(from, to string, form provider.ContinuationForm) string {
	return ": llm-failover resumed from " + oneLine(from) + " on " + oneLine(to) + " (" + form.String() + ")\n\n"
}

// oneLine keeps a channel name (an operator's label) on one line of an
// SSE comment or a trailer.
func oneLine(name string) string {
	return strings.NewReplacer("\r", " ", "\n", " ").Replace(name)
}
