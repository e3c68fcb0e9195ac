package failover

import (
	"context"
	"fmt"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/latency"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// Deadlines learned from each channel's own latency (adaptive_deadlines).
//
// A fixed timeout is either too short for a slow-but-healthy long prompt
// or so long that a hung channel eats the client's patience. With
// adaptive_deadlines, a candidate's wait for response headers and for its
// first content, and a committed stream's stall limit, are a bounded
// multiple of what that channel usually takes for requests of the same
// size class (package latency): never below a floor, never above the
// configured timeout, and the configured timeout while the channel has
// too few observations. What the channel did is learned from every
// answer it gave, client traffic and synthetic checks alike.

// reasonLearnedDeadline: a candidate's learned deadline passed before its
// response headers or its first content (the journal says which).
const reasonLearnedDeadline reason = "learned_deadline"

// learnedTimeout is the cause of an attempt cancelled by a learned
// deadline.
type learnedTimeout struct {
	kind     latency.Kind
	deadline latency.Deadline
}

func (t learnedTimeout) Error() string {
	what := "response headers"
	if t.kind == latency.FirstContent {
		what = "content"
	}
	return fmt.Sprintf("no %s within the channel's learned deadline of %s", what, t.deadline)
}

// attemptTiming is what one attempt took, for learning: its fields are
// reset as each attempt starts.
type attemptTiming struct {
	// headersAt is when the response headers came; zero when none did.
	headersAt time.Time
	// atGate: the stream gate committed at its timeout, not on content,
	// so committedAt is no time to first content.
	atGate bool
	// longestGap is a complete stream's longest pause between content
	// events.
	longestGap time.Duration
	// stall is the stream's learned stall limit, when it was learned.
	stall *latency.Deadline
}

// learning reports whether the engine observes its channels' latencies:
// for adaptive_deadlines or for a hedge_after given as a quantile.
func (e *Engine) learning() bool { return e.learn != nil }

// sizeClass is the request's size class, for the latencies learned per
// class: its body's size and the most output it may ask for, and whether
// it is answered whole (whose headers and content wait for all of its
// output) or streamed.
func (x *exchange) sizeClass() latency.Class {
	maxOut := x.req.MaxOutput
	if maxOut == 0 && x.model != nil {
		maxOut = x.model.MaxOutput
	}
	c := latency.ClassOf(len(x.body), maxOut)
	if !streaming(x) {
		c = c.Whole()
	}
	return c
}

// armLearned starts an attempt's learned deadlines: it returns the
// header timeout to use (learned, or the configured one), and starts the
// first-content timer when the channel's learned deadline is shorter than
// what the configured timeouts allow. stop stops that timer at commit.
func (e *Engine) armLearned(x *exchange, ch *Channel, cancel context.CancelCauseFunc) (header time.Duration, headerCause error, stop func()) {
	header, headerCause, stop = e.opts.HeaderTimeoutFor(streaming(x)), errHeaderTimeout, func() {}
	if e.opts.Adaptive == nil || x.mode == modeDoctor {
		return header, headerCause, stop
	}
	cfg, lat, class, now := *e.opts.Adaptive, ch.health.Latency, x.sizeClass(), time.Now()
	if d := lat.Deadline(latency.Header, class, cfg, header, now); d.Learned && d.Limit < header {
		header, headerCause = d.Limit, learnedTimeout{kind: latency.Header, deadline: d}
	}
	ceiling := e.firstContentCeiling(x)
	if d := lat.Deadline(latency.FirstContent, class, cfg, ceiling, now); d.Learned && d.Limit < ceiling {
		t := time.AfterFunc(d.Limit, func() { cancel(learnedTimeout{kind: latency.FirstContent, deadline: d}) })
		stop = func() { t.Stop() }
	}
	return header, headerCause, stop
}

// firstContentCeiling is the longest the configured timeouts let an
// attempt go without content: a stream's header timeout and stream gate
// (after which the gate commits anyway), or a whole answer's header
// timeout.
func (e *Engine) firstContentCeiling(x *exchange) time.Duration {
	if streaming(x) {
		return e.opts.HeaderTimeoutFor(true) + e.opts.StreamGate
	}
	return e.opts.HeaderTimeout
}

// learnStall sets a committed stream's stall limit from the channel's
// longest pauses, when adaptive_deadlines is on and a limit is learned;
// until then the stream keeps the stall detector it has (relayStream),
// which measures the pauses. (A hedge_after quantile needs only first
// contents: without adaptive_deadlines pauses are not measured.)
func (e *Engine) learnStall(x *exchange, ch *Channel, opts *streamgate.Options) {
	if e.opts.Adaptive == nil {
		return
	}
	d := ch.health.Latency.Deadline(latency.Gap, x.sizeClass(), *e.opts.Adaptive, e.opts.StreamIdleTimeout, time.Now())
	if d.Learned {
		opts.StallFloor = d.Limit
		x.timing.stall = &d
	}
}

// observe teaches the channel what an attempt that answered took: its
// headers, its first content (not a gate's commit without content) and a
// complete stream's longest pause. An attempt a learned deadline cut is
// not an observation: counted at its deadline, a channel that goes silent
// for a share of its requests would raise its own deadline with every
// silence, until it was no longer left early. Leaving the cuts out costs
// little: they lie beyond factor × the quantile, far in the tail. A
// channel that got slower for everyone fails over (and its breaker sees
// it) until the window forgets its old latency.
func (e *Engine) observe(x *exchange, ch *Channel, res attemptResult, began time.Time) {
	if !e.learning() || x.mode == modeDoctor || x.mode == modeDrill {
		return
	}
	lat, class, now, window := ch.health.Latency, x.sizeClass(), time.Now(), e.learn.Window
	if f := res.fail; f != nil && f.learned != nil {
		failoverapp.LearnedDeadlineFired(ch.Name, f.learned.kind.String())
	}
	if res.verdict != served && res.verdict != broken {
		return
	}
	if t := x.timing.headersAt; !t.IsZero() {
		lat.Observe(latency.Header, class, t.Sub(began), window, now)
	}
	if !x.committedAt.IsZero() && !x.timing.atGate {
		lat.Observe(latency.FirstContent, class, x.committedAt.Sub(began), window, now)
	}
	if res.verdict == served && x.timing.longestGap > 0 {
		lat.Observe(latency.Gap, class, x.timing.longestGap, window, now)
	}
}

// learnedStallFailure marks a stall found by a learned limit as such.
func (x *exchange) learnedStallFailure(f *failure) {
	if x.timing.stall != nil && f.reason == reasonStalled {
		f.learned = &learnedTimeout{kind: latency.Gap, deadline: *x.timing.stall}
	}
}
