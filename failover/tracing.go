package failover

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/internal/redact"
	"github.com/llmfailover/caddy-llm-failover/journal"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// Tracing. When the site has Caddy's tracing directive, a request arrives
// with a recording span (the HTTP server span Caddy's tracing handler
// started); the gateway adds its own span under it and one child span per
// upstream attempt, with the OpenTelemetry GenAI conventions' attributes
// and ours under llm_failover.*, and an event per failover decision. The
// spans come from the request span's own tracer provider, which Caddy
// does not export otherwise. A request without a recording span costs one
// check: no span, no attribute, no parsing of the answer for them.
// Synthetic checks have no request span: the app's probe tracer (built
// from the same OTEL_* variables) makes each one its own trace.

// instrumentationName names the gateway's tracer.
const instrumentationName = "github.com/llmfailover/caddy-llm-failover"

// Attribute keys: the GenAI conventions', then ours.
const (
	attrOperation     = attribute.Key("gen_ai.operation.name")
	attrProvider      = attribute.Key("gen_ai.provider.name")
	attrRequestModel  = attribute.Key("gen_ai.request.model")
	attrResponseModel = attribute.Key("gen_ai.response.model")
	attrMaxTokens     = attribute.Key("gen_ai.request.max_tokens")
	attrInputTokens   = attribute.Key("gen_ai.usage.input_tokens")
	attrOutputTokens  = attribute.Key("gen_ai.usage.output_tokens")
	attrFinishReasons = attribute.Key("gen_ai.response.finish_reasons")
	attrServerAddress = attribute.Key("server.address")
	attrServerPort    = attribute.Key("server.port")
	attrErrorType     = attribute.Key("error.type")
	attrHTTPStatus    = attribute.Key("http.response.status_code")

	attrRequestID       = attribute.Key("llm_failover.request_id")
	attrStream          = attribute.Key("llm_failover.stream")
	attrClientModel     = attribute.Key("llm_failover.model")
	attrChannel         = attribute.Key("llm_failover.channel")
	attrAttempt         = attribute.Key("llm_failover.attempt")
	attrAttempts        = attribute.Key("llm_failover.attempts")
	attrKind            = attribute.Key("llm_failover.attempt.kind")
	attrBreakerState    = attribute.Key("llm_failover.breaker.state")
	attrOutcome         = attribute.Key("llm_failover.outcome")
	attrReason          = attribute.Key("llm_failover.failover.reason")
	attrTTFC            = attribute.Key("llm_failover.time_to_first_content_ms")
	attrGate            = attribute.Key("llm_failover.stream_gate")
	attrServedBy        = attribute.Key("llm_failover.served_by")
	attrResumed         = attribute.Key("llm_failover.resumed")
	attrForm            = attribute.Key("llm_failover.continuation.form")
	attrCacheRead       = attribute.Key("llm_failover.usage.cache_read_tokens")
	attrReservedMicros  = attribute.Key("llm_failover.wallet.reserved_micros")
	attrChargeMicros    = attribute.Key("llm_failover.wallet.charge_micros")
	attrNext            = attribute.Key("llm_failover.next_channel")
	attrUpstreamStatus  = attribute.Key("llm_failover.upstream_status")
	attrDeliveredTokens = attribute.Key("llm_failover.delivered_tokens")
	attrDeadlineKind    = attribute.Key("llm_failover.deadline.kind")
	attrDeadlineMs      = attribute.Key("llm_failover.deadline_ms")
	attrCostMicros      = attribute.Key("llm_failover.cost_micros")
	attrPrompt          = attribute.Key("llm_failover.prompt")
	attrPromptCut       = attribute.Key("llm_failover.prompt.truncated")
	attrCompletion      = attribute.Key("llm_failover.completion")
	attrCompletionCut   = attribute.Key("llm_failover.completion.truncated")
)

// decisionEvent names the request span's event for a journaled decision.
const decisionEvent = "llm_failover.decision"

// requestTrace is one traced request (or synthetic check): the gateway's
// span and the attempt under way, if any.
type requestTrace struct {
	tracer trace.Tracer
	span   trace.Span
	ctx    context.Context // carries span
	// id is the trace's ID, for the journal, the log and the ledger.
	id string
	// content bounds the prompt and answer text the spans carry
	// (trace_content); 0: none.
	content int
	// attempt and attemptCtx are the current attempt's span and the
	// context carrying it; lastChannel the previous attempt's channel
	// (the same again is a retry_same or a prefill refusal's retry).
	attempt     trace.Span
	attemptCtx  context.Context
	attemptAt   time.Time
	lastChannel string
	// refused is the status the gateway answered with itself (0: none);
	// resumedForm the form of the continuation that resumed the answer.
	refused     int
	resumedForm string
	// cut is why the answer the client got broke off after it was
	// committed ("" when it did not).
	cut string
}

// traceRequest starts the gateway's span under the request's, when the
// request is traced; content is trace_content.
func traceRequest(x *exchange, content int64) {
	parent := trace.SpanFromContext(x.r.Context())
	if !parent.IsRecording() {
		return
	}
	tracer := parent.TracerProvider().Tracer(instrumentationName)
	ctx, span := tracer.Start(x.r.Context(), "llm_failover", trace.WithSpanKind(trace.SpanKindInternal))
	x.trace = &requestTrace{tracer: tracer, span: span, ctx: ctx, id: span.SpanContext().TraceID().String(), content: int(content)}
}

// traceSynthetic makes a synthetic check its own trace, with tracer (the
// app's probe tracer; nil: untraced).
func traceSynthetic(ctx context.Context, x *exchange, tracer trace.Tracer) {
	if tracer == nil {
		return
	}
	ctx, span := tracer.Start(ctx, "llm_failover probe "+x.req.Model, trace.WithSpanKind(trace.SpanKindInternal), trace.WithNewRoot())
	x.trace = &requestTrace{tracer: tracer, span: span, ctx: ctx, id: span.SpanContext().TraceID().String()}
	x.trace.parsed(x)
}

// traceID is the request's trace ID, "" when untraced.
func (t *requestTrace) traceID() string {
	if t == nil {
		return ""
	}
	return t.id
}

// parsed names the span once the request is known.
func (t *requestTrace) parsed(x *exchange) {
	if t == nil {
		return
	}
	op := x.api.Operation()
	model := x.req.Model
	switch {
	case x.model == nil:
		// A model nobody serves is the client's to name: the span is the
		// operation's (span names are a small set trace stores index),
		// and the name it asked for is bounded.
		model = provider.CutMessage(model)
		t.span.SetName("llm_failover " + op)
	case x.mode != modeSynthetic:
		t.span.SetName("llm_failover " + op + " " + x.req.Model)
	}
	t.span.SetAttributes(attrOperation.String(op), attrRequestModel.String(model),
		attrStream.Bool(x.req.Stream), attrRequestID.String(requestID(x)))
	if x.req.MaxOutput > 0 {
		t.span.SetAttributes(attrMaxTokens.Int64(x.req.MaxOutput))
	}
	if t.content > 0 {
		p, cut := provider.Prompt(x.body, t.content)
		t.span.SetAttributes(attrPrompt.String(p), attrPromptCut.Bool(cut))
	}
}

// watch has the attempt's meter read what the answer says of itself, and
// keep its text when trace_content asks.
func (t *requestTrace) watch(m *provider.Meter) {
	if t == nil {
		return
	}
	m.Describe()
	m.KeepText(t.content)
}

// attemptKind says what an attempt is to its request.
func attemptKind(x *exchange, sameChannel bool) string {
	switch {
	case x.mode == modeSynthetic:
		return "probe"
	case x.mode == modeContinue:
		return "continuation"
	case x.mode == modeLastResort:
		return "last_resort"
	case x.hedge:
		return "hedge"
	case sameChannel:
		return "retry_same"
	}
	return "chain"
}

// fork is the request's trace for one attempt of a race (hedge.go): the
// gateway's span shared, the attempt's own, under ctx (the attempt's
// request context, which the race cancels).
func (t *requestTrace) fork(ctx context.Context) *requestTrace {
	if t == nil {
		return nil
	}
	f := *t
	f.ctx = trace.ContextWithSpan(ctx, t.span)
	f.attempt, f.attemptCtx, f.attemptAt = nil, nil, time.Time{}
	return &f
}

// startAttempt starts an attempt's span, a client span named after the
// operation and the model the channel knows.
func (t *requestTrace) startAttempt(x *exchange, ch *Channel, route *chain.Route, ticket breaker.Ticket) {
	if t == nil {
		return
	}
	model := upstreamModel(route, x.req.Model)
	op := x.api.Operation()
	state := ch.health.Breaker.State(time.Now())
	if ticket.HalfOpened {
		state = breaker.HalfOpen
	}
	attrs := []attribute.KeyValue{
		attrOperation.String(op), attrProvider.String(provider.ProviderNameOf(ch.Adapter)), attrRequestModel.String(model),
		attrClientModel.String(x.req.Model), attrChannel.String(ch.Name), attrAttempt.Int(x.attempts),
		attrKind.String(attemptKind(x, t.lastChannel == ch.Name)), attrBreakerState.String(state.String()),
	}
	if ch.Base != nil {
		host, port, err := net.SplitHostPort(ch.Base.Host)
		if err != nil {
			host, port = ch.Base.Host, map[string]string{"http": "80", "https": "443"}[ch.Base.Scheme]
		}
		attrs = append(attrs, attrServerAddress.String(host))
		if p, err := strconv.Atoi(port); err == nil {
			attrs = append(attrs, attrServerPort.Int(p))
		}
	}
	t.attemptAt = time.Now()
	t.attemptCtx, t.attempt = t.tracer.Start(t.ctx, op+" "+model, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrs...), trace.WithTimestamp(t.attemptAt))
	t.lastChannel = ch.Name
}

// endAttempt records how the attempt ended and ends its span. What the
// answer said of itself is the upstream's to choose: secrets masks the
// channels' credentials in it, as in a quoted message.
func (t *requestTrace) endAttempt(x *exchange, res attemptResult, secrets *redact.Secrets) {
	if t == nil || t.attempt == nil {
		return
	}
	s := t.attempt
	outcome := res.verdict.String()
	if res.verdict == clientGone && x.race != nil && x.race.lost(x) {
		outcome = string(outcomeHedgeLost)
	}
	s.SetAttributes(attrOutcome.String(outcome))
	if x.meter != nil {
		u := x.meter.Usage()
		if u.InputKnown {
			s.SetAttributes(attrInputTokens.Int64(u.Input), attrCacheRead.Int64(u.CacheRead))
		}
		if u.OutputKnown {
			s.SetAttributes(attrOutputTokens.Int64(u.Output))
		}
		if t.content > 0 {
			text, cut := x.meter.Text()
			s.SetAttributes(attrCompletion.String(text), attrCompletionCut.Bool(cut))
		}
		d := x.meter.Described()
		if d.Model != "" {
			s.SetAttributes(attrResponseModel.String(provider.CutMessage(secrets.Message(d.Model))))
		}
		if len(d.FinishReasons) > 0 {
			reasons := make([]string, len(d.FinishReasons))
			for i, r := range d.FinishReasons {
				reasons[i] = provider.CutMessage(secrets.Message(r))
			}
			s.SetAttributes(attrFinishReasons.StringSlice(reasons))
		}
	}
	if !x.committedAt.IsZero() {
		s.SetAttributes(attrTTFC.Int64(x.committedAt.Sub(t.attemptAt).Milliseconds()))
	}
	if f := res.fail; f != nil {
		s.SetAttributes(attrErrorType.String(errorType(res)), attrReason.String(string(f.reason)))
		if f.status != 0 {
			s.SetAttributes(attrHTTPStatus.Int(f.status))
		}
		if f.form != "" {
			s.SetAttributes(attrForm.String(f.form))
		}
		s.SetStatus(codes.Error, string(f.reason))
	} else if res.status != 0 {
		s.SetAttributes(attrHTTPStatus.Int(res.status), attrErrorType.String(errorType(res)))
		s.SetStatus(codes.Error, http.StatusText(res.status))
	}
	if x.mode == modeContinue && x.resume != nil && x.resume.cur != nil {
		s.SetAttributes(attrForm.String(x.resume.cur.form.String()))
	}
	s.End()
	t.attempt, t.attemptCtx = nil, nil
}

// gate records what the stream gate did with the attempt's stream.
func (t *requestTrace) gate(out streamgate.Result) {
	if t == nil || t.attempt == nil {
		return
	}
	what := "failed_before_commit"
	switch {
	case out.CommittedAtGate:
		what = "committed_at_gate_timeout"
	case out.Committed:
		what = "committed_on_content"
	case out.Outcome == streamgate.UpstreamError:
		what = "error_frame_before_content"
	case out.Outcome == streamgate.GateTimeout:
		what = "gate_timeout"
	}
	t.attempt.SetAttributes(attrGate.String(what))
}

// decided adds a journaled decision to the request's span as an event.
func (t *requestTrace) decided(d journal.Decision) {
	if t == nil {
		return
	}
	attrs := []attribute.KeyValue{attrChannel.String(d.Channel), attrAttempt.Int(d.Attempt), attrReason.String(d.Reason)}
	if d.Next != "" {
		attrs = append(attrs, attrNext.String(d.Next))
	}
	if d.UpstreamStatus != 0 {
		attrs = append(attrs, attrUpstreamStatus.Int(d.UpstreamStatus))
	}
	if d.DeliveredTokens != 0 {
		attrs = append(attrs, attrDeliveredTokens.Int64(d.DeliveredTokens))
	}
	if d.Form != "" {
		attrs = append(attrs, attrForm.String(d.Form))
	}
	if d.DeadlineKind != "" {
		attrs = append(attrs, attrDeadlineKind.String(d.DeadlineKind), attrDeadlineMs.Int64(d.Deadline.Milliseconds()))
	}
	if d.CostMicros != 0 {
		attrs = append(attrs, attrCostMicros.Int64(d.CostMicros))
	}
	t.span.AddEvent(decisionEvent, trace.WithAttributes(attrs...), trace.WithTimestamp(d.At))
}

// resumed notes that a continuation in form resumed the answer.
func (t *requestTrace) resumed(form string) {
	if t != nil {
		t.resumedForm = form
	}
}

// refusedWith notes the status of an answer the gateway gave itself.
func (t *requestTrace) refusedWith(status int) {
	if t != nil && t.refused == 0 {
		t.refused = status
	}
}

// brokeOff notes that the client's answer was committed and then broke
// off (res.verdict broken): the client read an answer ending in an error.
func (t *requestTrace) brokeOff(res attemptResult) {
	if t == nil || res.verdict != broken {
		return
	}
	t.cut = string(reasonTruncated)
	if res.fail != nil {
		t.cut = string(res.fail.reason)
	}
}

// adopt takes what an attempt of a hedged race, on its fork of the trace,
// noted of the request's answer: a refusal the gateway answered with.
func (t *requestTrace) adopt(f *requestTrace) {
	if t != nil && f != nil && f != t && f.refused != 0 {
		t.refusedWith(f.refused)
	}
}

// end records how the request ended, and ends its span.
func (t *requestTrace) end(x *exchange) {
	if t == nil {
		return
	}
	s := t.span
	s.SetAttributes(attrAttempts.Int(x.attempts))
	if x.servedBy != "" {
		s.SetAttributes(attrServedBy.String(x.servedBy), attrResumed.Bool(t.resumedForm != ""))
	}
	if t.resumedForm != "" {
		s.SetAttributes(attrForm.String(t.resumedForm))
	}
	if b := x.bill; b != nil {
		s.SetAttributes(attrReservedMicros.Int64(int64(b.res.Amount)), attrChargeMicros.Int64(int64(b.charge)))
	}
	if x.meter != nil && x.servedBy != "" {
		if u := x.meter.Usage(); u.InputKnown || u.OutputKnown {
			s.SetAttributes(attrInputTokens.Int64(u.Input), attrOutputTokens.Int64(u.Output))
		}
		if d := x.meter.Described(); d.Model != "" {
			// The client sees the model it asked for, whatever the
			// channel calls it.
			s.SetAttributes(attrResponseModel.String(x.req.Model))
		}
	}
	if t.refused != 0 {
		s.SetAttributes(attrHTTPStatus.Int(t.refused), attrErrorType.String(strconv.Itoa(t.refused)))
		s.SetStatus(codes.Error, fmt.Sprintf("answered %d", t.refused))
	} else if t.cut != "" {
		s.SetAttributes(attrErrorType.String(t.cut))
		s.SetStatus(codes.Error, "the answer broke off after it reached the client: "+t.cut)
	}
	s.End()
}

// traceparent sets the W3C traceparent of the attempt under way on h,
// and only it: never the client's tracestate or baggage.
func (t *requestTrace) traceparent(h http.Header) {
	if t == nil || t.attempt == nil {
		return
	}
	sc := t.attempt.SpanContext()
	h.Set("Traceparent", fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags()))
}

// errorType is an attempt's error.type: the upstream's status for a
// status failure or a passed-back error, the failure reason otherwise;
// "" when it succeeded.
func errorType(res attemptResult) string {
	switch f := res.fail; {
	case f != nil && f.reason == reasonStatus && f.status != 0:
		return strconv.Itoa(f.status)
	case f != nil:
		return string(f.reason)
	case res.verdict == passed:
		return strconv.Itoa(res.status)
	}
	return ""
}

// traceField names the request's trace in a log line, when it has one.
func traceField(x *exchange) zap.Field {
	if id := x.trace.traceID(); id != "" {
		return zap.String("trace_id", id)
	}
	return zap.Skip()
}
