package failover

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/idempotency"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// Idempotent requests: a request of an idempotent model carrying an
// Idempotency-Key is one logical call of its client. The first request
// runs it, recording what its client gets; a duplicate (same client,
// same key, same body) follows that run while it goes on, or is answered
// from its kept answer for the retention window. A run whose client went
// away keeps going for the grace period, so the client's retry finds it.
// Nothing is sent upstream twice, nothing is charged twice; a failure is
// not kept, so a retry of it runs again.

// idempotencyKeyHeader is the header clients send (the IETF draft's and
// Stripe's name; the OpenAI SDKs send it with their idempotency option).
const idempotencyKeyHeader = "Idempotency-Key"

var idempotentTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "llm_failover", Name: "idempotent_requests_total",
	Help: "Requests carrying an Idempotency-Key, by model and what became of them: ran, followed (a duplicate joined the run under way), replayed (answered from a kept answer), mismatch (422), unstored (409).",
}, []string{"model", "outcome"})

// idempotentRun is the first run of a call: its flight, and how to end it.
type idempotentRun struct {
	flight *idempotency.Flight
	rec    *idempotency.Recorder
	cancel context.CancelFunc
	stop   func() bool
	mu     sync.Mutex
	grace  *time.Timer
}

// beginIdempotent handles a keyed request before anything is reserved:
// it answers a duplicate (answered), or makes x the call's first run
// (run, to be finished when x ends), or leaves x alone (neither: no key,
// or the model is not idempotent).
func (e *Engine) beginIdempotent(x *exchange) (answered bool, run *idempotentRun) {
	key := x.r.Header.Get(idempotencyKeyHeader)
	if key == "" || !x.model.Idempotent || e.wallet == nil {
		return false, nil
	}
	if len(key) > idempotency.MaxKeyLen || !printable(key) {
		_ = e.refuse(x, provider.Error{Status: http.StatusBadRequest, Code: "invalid_idempotency_key",
			Message: "Idempotency-Key must be 1 to 255 printable ASCII characters"})
		return true, nil
	}
	ctx, cancel := e.wallet.w.AdmissionContext(x.r.Context())
	account, keyID, refusal := e.wallet.authenticate(ctx, x)
	cancel()
	if refusal != nil {
		_ = e.refuse(x, *refusal)
		return true, nil
	}
	if account == "" {
		// The store failed and on_store_error allow serves unbilled: the
		// client is not known, so its key cannot be scoped to it.
		return false, nil
	}
	id := idempotency.ID(e.wallet.w.Name()+"\x00"+account+"\x00"+keyID, key)
	table := e.app.Idempotency()
	verdict, f, answer := table.Begin(id, idempotency.Fingerprint(x.body), time.Now())
	idempotentTotal.WithLabelValues(x.req.Model, [...]string{"ran", "followed", "replayed", "mismatch", "unstored"}[verdict]).Inc()
	switch verdict {
	case idempotency.Mismatch:
		_ = e.refuse(x, provider.Error{Status: http.StatusUnprocessableEntity, Code: "idempotency_key_reused",
			Message: "this Idempotency-Key was used with a different request body; a key names one request"})
		return true, nil
	case idempotency.Unstored:
		e.refuseUnstored(x)
		return true, nil
	case idempotency.Replay:
		idempotency.WriteAnswer(x.w, answer)
		return true, nil
	case idempotency.Follow:
		if !f.Follow(x.r.Context(), x.w) {
			e.refuseUnstored(x)
		}
		return true, nil
	}
	return false, e.startRun(x, f)
}

// refuseUnstored answers a duplicate of a call whose answer was too large
// to keep: running it again would run it twice.
func (e *Engine) refuseUnstored(x *exchange) {
	_ = e.refuse(x, provider.Error{Status: http.StatusConflict, Code: "idempotency_answer_not_kept",
		Message: "the request with this Idempotency-Key already ran, and its answer was larger than this gateway keeps (idempotency max_answer); it is not run again: send a new key to run it again"})
}

// startRun makes x the first run of f's call: its answer is recorded, and
// it no longer ends when its client leaves, only the grace period after.
func (e *Engine) startRun(x *exchange, f *idempotency.Flight) *idempotentRun {
	lim := e.opts.Idempotency
	run := &idempotentRun{flight: f}
	run.rec = idempotency.NewRecorder(x.w, f, lim.MaxAnswer, e.memory.Reserve)
	x.w = run.rec
	client := x.r.Context()
	ctx, cancel := context.WithCancel(context.WithoutCancel(client))
	run.cancel = cancel
	run.stop = context.AfterFunc(client, func() {
		run.mu.Lock()
		defer run.mu.Unlock()
		run.grace = time.AfterFunc(lim.Grace, cancel)
	})
	x.r = x.r.WithContext(ctx)
	if x.trace != nil {
		x.trace.ctx = trace.ContextWithSpan(ctx, x.trace.span)
	}
	return run
}

// finish ends the run: a 2xx answer (a stream that broke after content
// included, as delivered) is kept for the retention window; any other is
// forgotten, so a retry runs again.
func (e *Engine) finishRun(x *exchange, run *idempotentRun) {
	run.stop()
	run.mu.Lock()
	if run.grace != nil {
		run.grace.Stop()
	}
	run.mu.Unlock()
	run.cancel()
	status := run.flight.Status()
	keep := status >= 200 && status < 300
	e.memory.Release(run.flight.Held())
	e.app.Idempotency().Finish(run.flight, keep, idempotency.Limits{
		Retention: e.opts.Idempotency.Retention, MaxAnswer: e.opts.Idempotency.MaxAnswer, MaxStored: e.opts.Idempotency.MaxStored,
	}, time.Now())
	if run.rec.ClientGone() {
		e.logger.Info("idempotent request finished after its client left; its answer is kept for the client's retry",
			zap.String("model", x.req.Model), zap.Int("status", status), zap.Bool("kept", keep))
	}
}

// printable reports whether s is printable ASCII.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
