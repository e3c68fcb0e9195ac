package failover

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/idempotency"
	"github.com/llmfailover/caddy-llm-failover/idempotency/store"
	"github.com/llmfailover/caddy-llm-failover/internal/backoff"
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
// Stripe's name; the OpenAI SDKs send it when the client class names it,
// docs/errors.md).
const idempotencyKeyHeader = "Idempotency-Key"

var idempotentTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "llm_failover", Name: "idempotent_requests_total",
	Help: "Requests carrying an Idempotency-Key, by model and what became of them: ran, followed (a duplicate joined the run under way), replayed (answered from a kept answer), mismatch (422), unstored (409).",
}, []string{"model", "outcome"})

// idempotentRun is the first run of a call in this process: its flight,
// and how to end it. claimed is the store that has this instance run the
// call (nil: the store was not asked or did not answer, or the call's
// answer came from it), renewing the claim's lease until the run ends.
type idempotentRun struct {
	id, fingerprint string
	flight          *idempotency.Flight
	rec             *idempotency.Recorder
	cancel          context.CancelFunc
	stop            func() bool
	mu              sync.Mutex
	grace           *time.Timer
	claimed         *store.Store
	renewing        chan struct{}
	// release lets the claimed store close once the claim's end is
	// written (failoverapp.IdempotencyStore.Hold).
	release func()
}

// Bounds of the fleet's claims: how often a duplicate looks at a call
// another instance runs; how long one store statement may take. A claim's
// lease (idempotency lease) is renewed at a third of it while the run
// goes on, so a dead instance's call is taken over about a lease after
// it died.
const (
	idempotencyPoll = 200 * time.Millisecond
	idempotencyStmt = 5 * time.Second
)

// instanceID names this process as a claim's owner.
var instanceID = func() string {
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}()

// beginIdempotent handles a keyed request before anything is reserved:
// it answers a duplicate (answered), or makes x the call's first run in
// this process (run, to be finished when x ends, answered or not), or
// leaves x alone (neither: no key, or the model is not idempotent).
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
	x.client.account, x.client.keyID = account, keyID
	id, fp := idempotency.ID(e.wallet.w.Name()+"\x00"+account+"\x00"+keyID, key), idempotency.Fingerprint(x.r.Method+" "+x.r.URL.Path, x.body)
	table := e.app.Idempotency()
	// A duplicate's client, answered from the first run's answer, is cut
	// by write deadlines as the first run's is.
	dup := newDuplicateWriter(x.w, e.opts.StreamIdleTimeout)
	defer dup.done()
	var f *idempotency.Flight
	for f == nil {
		verdict, flight, answer := table.Begin(id, fp, time.Now())
		if verdict != idempotency.Run {
			idempotentTotal.WithLabelValues(x.req.Model, [...]string{"ran", "followed", "replayed", "mismatch", "unstored"}[verdict]).Inc()
		}
		switch verdict {
		case idempotency.Mismatch:
			e.refuseReusedKey(x)
			return true, nil
		case idempotency.Unstored:
			e.refuseUnstored(x)
			return true, nil
		case idempotency.Replay:
			idempotency.WriteAnswer(dup, answer)
			return true, nil
		case idempotency.Follow:
			started, err := flight.Follow(x.r.Context(), dup)
			switch {
			case errors.Is(err, idempotency.ErrNoAnswer):
				// The run ended without answering anyone (its client
				// left and its grace ran out first): nothing to share,
				// and nothing was kept. This request asks again, and
				// runs the call itself unless another did meanwhile.
				continue
			case err != nil:
				// The first run's answer outgrew max_answer after this
				// duplicate began following it: the rest was never kept.
				// A clean end would hand the client a truncated answer as
				// whole; the response is cut instead, so the client sees
				// the failure (and its retry gets 409).
				e.logger.Warn("idempotent duplicate cut: the answer it followed outgrew max_answer",
					zap.String("model", x.req.Model))
				panic(http.ErrAbortHandler)
			case !started:
				e.refuseUnstored(x)
			}
			return true, nil
		}
		f = flight
	}
	run = e.startRun(x, f)
	run.id, run.fingerprint = id, fp
	if answered = e.claim(x, run); !answered {
		idempotentTotal.WithLabelValues(x.req.Model, "ran").Inc()
	}
	return answered, run
}

// claim asks the fleet's store whether x's call runs here: claimed (x
// runs it), completed elsewhere (x answers from its answer), or running
// elsewhere (x waits for it, polling, as long as the request's deadline).
// A store that fails leaves the call to this process: it runs, answered
// once per instance. It reports whether x was answered.
func (e *Engine) claim(x *exchange, run *idempotentRun) bool {
	if e.idem == nil {
		return false
	}
	// Held before the store is asked, so that a reload releasing it
	// meanwhile cannot close it under the claim.
	hold := e.idem.Hold()
	defer func() {
		if run.release == nil {
			hold()
		}
	}()
	st, err := e.idem.Store()
	if err != nil {
		return false
	}
	lim := e.opts.Idempotency
	until := time.Now().Add(e.opts.Deadline)
	for {
		now := time.Now()
		ctx, cancel := context.WithTimeout(x.r.Context(), idempotencyStmt)
		c, err := st.Claim(ctx, run.id, run.fingerprint, instanceID, now.Add(lim.Lease), now.Add(lim.Retention), now)
		cancel()
		switch {
		case err != nil:
			e.logger.Warn("the idempotency store failed; this request runs as on one instance", zap.Error(err))
			return false
		case c.State == store.Claimed:
			run.claimed, run.renewing, run.release = st, make(chan struct{}), hold
			go renewClaim(st, run.id, lim.Lease, run.renewing)
			return false
		case c.Fingerprint != run.fingerprint:
			idempotentTotal.WithLabelValues(x.req.Model, "mismatch").Inc()
			e.refuseReusedKey(x)
			return true
		case c.State == store.Done && c.Answer == nil:
			idempotentTotal.WithLabelValues(x.req.Model, "unstored").Inc()
			e.refuseUnstored(x)
			return true
		case c.State == store.Done:
			idempotentTotal.WithLabelValues(x.req.Model, "replayed").Inc()
			// Through the run's recorder (x.w), so that this process's
			// duplicates get it too.
			dup := newDuplicateWriter(x.w, e.opts.StreamIdleTimeout)
			idempotency.WriteAnswer(dup, c.Answer)
			dup.done()
			return true
		}
		// Another instance runs it: wait for its answer.
		if now.After(until) || !backoff.Sleep(x.r.Context(), idempotencyPoll) {
			_ = e.refuse(x, provider.Error{Status: http.StatusConflict, Code: "idempotency_request_in_progress",
				Message: "the request with this Idempotency-Key is still running on another instance; retry later with the same key"})
			return true
		}
	}
}

// renewClaim renews the claim's lease every third of it until stop.
func renewClaim(st *store.Store, id string, lease time.Duration, stop chan struct{}) {
	t := time.NewTicker(lease / 3)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), idempotencyStmt)
			_ = st.Renew(ctx, id, instanceID, time.Now().Add(lease))
			cancel()
		}
	}
}

// refuseReusedKey answers a request whose Idempotency-Key named another
// request: another body, or another endpoint.
func (e *Engine) refuseReusedKey(x *exchange) {
	_ = e.refuse(x, provider.Error{Status: http.StatusUnprocessableEntity, Code: "idempotency_key_reused",
		Message: "this Idempotency-Key was used with a different request (another body, or another endpoint); a key names one request"})
}

// refuseUnstored answers a duplicate of a call whose answer was too large
// to keep: running it again would run it twice.
func (e *Engine) refuseUnstored(x *exchange) {
	// The official SDKs retry every 409 unless told not to; each retry
	// would get this answer again, after their backoff.
	x.w.Header().Set("X-Should-Retry", "false")
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
	if run.claimed != nil {
		close(run.renewing)
		e.settleClaim(run, keep)
		run.release()
	}
	e.memory.Release(run.flight.Held())
	e.app.Idempotency().Finish(run.flight, keep, idempotency.Limits{
		Retention: e.opts.Idempotency.Retention, MaxStored: e.opts.Idempotency.MaxStored,
	}, time.Now())
	if run.rec.ClientGone() {
		e.logger.Info("idempotent request finished after its client left; its answer is kept for the client's retry",
			zap.String("model", x.req.Model), zap.Int("status", status), zap.Bool("kept", keep))
	}
}

// settleClaim records the claimed call's end in the fleet's store: its
// answer (a tombstone when it outgrew max_answer), or, for a failure, no
// record, so that a retry anywhere runs again.
func (e *Engine) settleClaim(run *idempotentRun, keep bool) {
	ctx, cancel := context.WithTimeout(context.Background(), idempotencyStmt)
	defer cancel()
	var err error
	if keep {
		a, overflow := run.flight.Answer()
		if overflow {
			a = nil
		}
		err = run.claimed.Complete(ctx, run.id, instanceID, a, time.Now().Add(e.opts.Idempotency.Retention))
	} else {
		err = run.claimed.Abandon(ctx, run.id, instanceID)
	}
	if err != nil {
		// Other instances take the call over once its lease passes.
		e.logger.Error("recording an idempotent call's end failed", zap.Bool("kept", keep), zap.Error(err))
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
