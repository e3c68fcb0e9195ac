// Package streamgate decides when an upstream LLM event stream may be
// committed to the client, and relays it afterwards.
//
// An upstream can answer 200 OK and then report the failure inside the SSE
// stream. Relay therefore holds the opening bytes back until an event
// decides the matter: real content commits the response (status, headers,
// held bytes, then pass-through), an error frame or an early close leaves
// the client untouched so the caller can fail over to another channel.
// Once committed a stream cannot fail over, so Relay makes it fail honestly
// instead: a stall or a break-off before the stream's normal end gets an
// error event in the client's API format.
//
// Bytes reach the client in whole events, byte for byte and never
// re-encoded: a client never sees half an event that the upstream then
// cut off (which the official SDKs would throw on as bad JSON before they
// saw the error event), and an event is known for what it is (an error to
// scrub, an event to drop or hold back) before any of it is sent. Only an
// event too large to hold (Options.MaxHeld) goes on as it comes.
//
// The package knows server-sent events, not LLM APIs: what an event means
// (Options.Classify) and how an error event looks (Options.ErrorEvent) are
// the caller's, so no provider JSON lives here.
package streamgate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Causes Relay passes to cancel.
var (
	ErrGateTimeout = errors.New("streamgate: no decisive event before the gate timeout")
	ErrIdleTimeout = errors.New("streamgate: upstream idle after commit")
	// ErrContentStall is an upstream that, after commit, kept the
	// connection busy (pings, comments) but sent no content for longer
	// than Options.StallFloor allows.
	ErrContentStall = errors.New("streamgate: upstream content stalled after commit")
	ErrClientGone   = errors.New("streamgate: client went away")
)

// Defaults applied to zero Options fields.
const (
	DefaultGateTimeout = 30 * time.Second
	DefaultIdleTimeout = 60 * time.Second
	DefaultMaxHeld     = 1 << 20
	DefaultStallFactor = 8

	// DefaultMaxEvent bounds what the parser buffers of one line or one
	// event's data, before and after commit, so that an upstream sending
	// an endless line costs a bounded amount of memory per stream. An
	// event beyond it is still forwarded byte for byte; only its data is
	// not kept for classification (the event name still is, which is
	// what ends a Responses or Messages stream).
	DefaultMaxEvent = 1 << 20

	readBufSize = 16 << 10
	// firstReadSize is the buffer a stream reads with until a read fills
	// it: a stream waiting for its first token (or between tokens of a
	// slow answer) blocks in Read holding it, and thousands may wait at
	// once. A read that fills it moves the stream to readBufSize.
	firstReadSize = 2 << 10
)

// Error codes of the event appended to a committed stream that failed.
const (
	CodeTruncated = "stream_truncated"
	CodeStalled   = "stream_stalled"
)

var (
	readBufPool = sync.Pool{New: func() any {
		b := make([]byte, readBufSize)
		return &b
	}}
	firstReadPool = sync.Pool{New: func() any {
		b := make([]byte, firstReadSize)
		return &b
	}}
)

// Downstream is the client side of a relayed stream.
type Downstream interface {
	// Commit writes the status line and headers. Relay calls it at most
	// once, before any Write, and flushes after writing what it held: a
	// Commit need not flush, and should not, so that the headers and the
	// first event reach the client in one write (one wake-up of its
	// reader, not two).
	Commit() error
	Write(p []byte) (int, error)
	Flush() error
}

// Kind is what an event means for the commit decision.
type Kind uint8

const (
	// Preamble events (metadata, keep-alives, role-only deltas) say nothing
	// about whether the upstream will answer or fail.
	Preamble Kind = iota
	// Content is real output: the upstream is answering.
	Content
	// ErrorFrame is an in-stream error.
	ErrorFrame
	// Terminal is decisive like Content and also marks the stream's normal
	// end ([DONE], a finish_reason, response.completed, message_stop), so a
	// close after it is not a truncation.
	Terminal
)

func (k Kind) String() string {
	switch k {
	case Preamble:
		return "preamble"
	case Content:
		return "content"
	case ErrorFrame:
		return "error"
	case Terminal:
		return "terminal"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Options configure Relay.
type Options struct {
	// Classify tells what each event means; it is required. It runs on
	// the Relay goroutine and must not retain ev.Data.
	Classify func(ev Event) Kind
	// ErrorEvent renders the complete event (blank line included) appended
	// to a committed stream that broke off or stalled, so the client learns
	// its answer is incomplete. When nil, the stream just ends.
	ErrorEvent func(code, message string) []byte
	// EndsAtEOF makes a clean EOF at an event boundary a normal end, for
	// streams with no end marker of their own. Otherwise only a Terminal
	// or error event ends a stream normally.
	EndsAtEOF bool
	// GateTimeout bounds the wait for a decisive event; 0 means 30s.
	GateTimeout time.Duration
	// GateFailover makes gate expiry a failure (Outcome GateTimeout)
	// instead of committing, for callers that would rather try another
	// channel than wait on a slow one.
	GateFailover bool
	// IdleTimeout bounds the wait for upstream bytes after commit; 0 means
	// 60s. Time spent writing to a slow client does not count.
	IdleTimeout time.Duration
	// StallFloor, when > 0, bounds the wait for upstream content after
	// commit, for a caller that can continue a stalled stream elsewhere:
	// an upstream that keeps the connection alive with pings or comments
	// but has stopped answering never trips IdleTimeout. A committed
	// stream whose Content events (as Classify tells; never pings,
	// comments or preambles) stop for longer than max(StallFloor,
	// StallFactor × the longest gap between its Content events so far)
	// ends Stalled. The first gap runs from commit, or from the first
	// Content event when that committed the stream. Scaling by the
	// longest gap seen lets a model that has already paused to reason
	// pause again; the floor keeps an early, short gap from making the
	// limit hair-trigger. As for IdleTimeout, time spent writing to a
	// slow client does not count, and once the stream's normal end (or an
	// error event) has been seen no content is due: what trails it then
	// has IdleTimeout, pings or not, and a stream cut then has ended
	// (Complete). 0 turns it off, at no cost.
	StallFloor time.Duration
	// StallFactor scales the longest content gap seen into the stall
	// limit (see StallFloor); <= 0 means 8. It is unused when StallFloor
	// is 0.
	StallFactor int
	// MaxHeld bounds the bytes held before commit; 0 means 1 MiB. Reaching
	// it commits, so memory stays bounded.
	MaxHeld int
	// Hold, if set, is told by how much the bytes held back before commit
	// grow (n > 0) or shrink (n < 0): the caller's memory budget, so that
	// a stream waiting for its first token costs what it holds, not its
	// MaxHeld. It counts n either way and reports whether the budget
	// still holds; when it does not, the stream commits, as at MaxHeld.
	// Everything counted is given back at commit, or when Relay returns.
	Hold func(n int64) bool
	// Observe, if set, sees every dispatched event, before and after commit
	// (including events of an attempt that then fails over). It must not
	// retain ev.Data.
	Observe func(ev Event)
	// Drop, if set, hides the events for which it returns true from the
	// client, before as well as after commit (a held event that would be
	// dropped after commit is dropped too): whole events are cut out at
	// their boundaries.
	Drop func(ev Event) bool
	// DeferBreak is for a caller that may continue a broken stream from
	// elsewhere. When a committed stream breaks off or stalls, Relay writes
	// neither the unterminated tail nor the error event: it returns the
	// event in Result.Deferred, for the caller to write if it cannot
	// continue. An error event after commit is held back the same way
	// (Outcome UpstreamError, Committed), with every event after it. (An
	// event too large to hold was forwarded as it came; a break inside
	// one is appended to as without DeferBreak.)
	DeferBreak bool
	// Scrub, if set, rewrites what reaches the client, whole events at a
	// time (an event split across reads included): the operator's
	// credentials are masked in whatever an upstream echoes, content and
	// errors alike. It must return b itself when it changes nothing, as it
	// almost always does. The rewrite may change lengths; event boundaries
	// are the caller's to keep. (An event too large to hold goes on as it
	// comes, unscrubbed.)
	Scrub func(b []byte) []byte
}

func (o Options) withDefaults() Options {
	if o.GateTimeout <= 0 {
		o.GateTimeout = DefaultGateTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxHeld <= 0 {
		o.MaxHeld = DefaultMaxHeld
	}
	if o.StallFloor > 0 && o.StallFactor <= 0 {
		o.StallFactor = DefaultStallFactor
	}
	return o
}

// Outcome is how a relayed stream ended.
type Outcome uint8

const (
	// Complete: the stream reached its normal end.
	Complete Outcome = iota
	// UpstreamError: the upstream sent an error event. Before commit the
	// client saw nothing; after commit (Result.Committed) the error event
	// itself was forwarded and ended the stream.
	UpstreamError
	// ClosedEarly: the upstream closed before anything decisive.
	ClosedEarly
	// GateTimeout: nothing decisive within GateTimeout with GateFailover
	// set; nothing was written.
	GateTimeout
	// Truncated: after commit the upstream closed or failed before its
	// normal end; an error event was appended.
	Truncated
	// Stalled: after commit the upstream sent nothing for IdleTimeout,
	// or no content for the StallFloor limit; an error event was appended
	// (or deferred, with DeferBreak).
	Stalled
	// ClientGone: a write to the client failed.
	ClientGone
	// Oversized: before commit the upstream sent a line longer than
	// MaxHeld; nothing was written. No LLM API sends such a line before
	// its first content, so it is the channel's failure.
	Oversized
)

func (o Outcome) String() string {
	switch o {
	case Complete:
		return "complete"
	case UpstreamError:
		return "upstream_error"
	case ClosedEarly:
		return "closed_early"
	case GateTimeout:
		return "gate_timeout"
	case Truncated:
		return "truncated"
	case Stalled:
		return "stalled"
	case ClientGone:
		return "client_gone"
	case Oversized:
		return "oversized_line"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// Result reports what Relay did.
type Result struct {
	Outcome Outcome
	// Committed is true once Downstream.Commit was called: the client has
	// (or may have) seen the response, so it must not be retried.
	Committed bool
	// CommittedAtGate: the gate committed because GateTimeout passed with
	// nothing decisive, not because content came.
	CommittedAtGate bool
	// ErrorData is a copy of the error event's data (UpstreamError), for
	// logs and for the caller's error body.
	ErrorData []byte
	// ErrorName is the event name of the error event that ended a
	// committed stream ("" for a data-only event).
	ErrorName string
	// BytesSent counts body bytes written to the client, excluding an
	// appended error event.
	BytesSent int64
	// LongestGap is the longest pause between the committed stream's
	// Content events (the first from commit), measured only when
	// StallFloor > 0: what a caller learns a stall limit from.
	LongestGap time.Duration
	// Err is the underlying read or write error, if any. It can accompany
	// Complete when the connection broke after the stream's normal end.
	Err error
	// Deferred is the error event Relay did not append to a Truncated or
	// Stalled stream, or the upstream's own error event it held back from
	// a committed one (Options.DeferBreak): the client's stream so far
	// ends at an event boundary.
	Deferred []byte
}

// relay is the state of one Relay call. The Relay goroutine owns it, except
// that the gate timer may commit (or expire) concurrently before commit,
// and the idle and stall timers check for a stall after; mu serializes
// those with the Relay goroutine. After commit the Relay goroutine forwards
// without locking: the gate timer then only looks at committed/done, the
// idle timer only at done/stalled/idle and the atomic readSince, and the
// stall timer only at done/stalled/stall/committedAt and the atomics
// readSince, readWait and stallLimit.
type relay struct {
	src    io.Reader
	cancel context.CancelCauseFunc
	dst    Downstream
	opts   Options
	emit   func(Event)
	p      Parser
	start  time.Time

	// readSince is the time (ns since start, +1) the pending Read began,
	// or 0 when no Read is pending.
	readSince atomic.Int64

	// Content stall detection (StallFloor > 0). readWait is the time (ns)
	// the Relay goroutine spent blocked in completed Reads since commit or
	// the last Content event (or end marker, once the end was seen);
	// stallLimit is the current limit in ns. lastContent and maxGap (wall clock, ns
	// since start +1) belong to the Relay goroutine, or to whoever holds
	// mu before commit.
	readWait    atomic.Int64
	stallLimit  atomic.Int64
	lastContent int64
	maxGap      int64
	// endSeen: the stream's normal end (or an error event) was seen; the
	// stall limit is then IdleTimeout, for what trails it (contentEnded).
	// It belongs to the Relay goroutine (under mu before commit).
	endSeen bool

	mu          sync.Mutex
	committed   bool
	done        bool
	gateExpired bool
	// gateCommitted: onGate committed (GateFailover off).
	gateCommitted bool
	oversized     bool
	stalled       bool
	clientGone    bool
	gate          *time.Timer
	idle          *time.Timer
	stall         *time.Timer
	committedAt   int64         // ns since start +1; set with stall
	noContent     time.Duration // stalled for want of content, after this long
	held          []byte
	werr          error
	sent          int64
	// accounted is what opts.Hold was told is held.
	accounted int64

	decided  bool // a decisive event was seen; commit after this chunk
	failed   bool // error frame before commit
	sawEnd   bool // normal end (or in-band error) seen after/at commit
	errAfter bool // error frame after commit
	errData  []byte
	errName  string // the name of the error event after commit
	errEvent []byte // that error frame, held back (DeferBreak)

	// Bytes since the last clean boundary carried over from
	// earlier chunks, the chunk being fed, and the start of its unsunk part.
	pending []byte
	chunk   []byte
	ws      int
	wrote   bool
	skipLF  bool // a dropped event ended in a chunk-final CR; its LF comes next
	keep    bool // the event in progress was too large to hold: never dropped
}

// Relay holds src until an event decides the stream, then commits dst and
// copies. cancel cancels the context of the upstream request src belongs to
// (it may be nil); Relay calls it with ErrGateTimeout (failover mode),
// ErrIdleTimeout and ErrClientGone, and relies on it to make a blocked
// src.Read return. The caller owns closing src.
//
// Observe and Drop run on the calling goroutine only; Downstream methods may
// also run on the gate timer's goroutine (committing a slow stream while
// Relay is blocked in Read), never concurrently and never after Relay
// returns.
func Relay(src io.Reader, cancel context.CancelCauseFunc, dst Downstream, opts Options) Result {
	if opts.Classify == nil {
		panic("streamgate: Relay needs Options.Classify")
	}
	r := &relay{src: src, cancel: cancel, dst: dst, opts: opts.withDefaults(), start: time.Now()}
	r.p.MaxEvent = max(r.opts.MaxHeld, DefaultMaxEvent)
	r.emit = r.onEvent
	stallOn := r.opts.StallFloor > 0
	if stallOn {
		r.stallLimit.Store(int64(r.opts.StallFloor))
	}

	// Small until a read fills it (firstReadSize); both go back to their
	// pools when Relay returns.
	small := firstReadPool.Get().(*[]byte)
	defer firstReadPool.Put(small)
	var big *[]byte
	defer func() {
		if big != nil {
			readBufPool.Put(big)
		}
	}()
	buf := *small

	r.mu.Lock()
	r.gate = time.AfterFunc(r.opts.GateTimeout, r.onGate)
	r.mu.Unlock()
	defer func() {
		if p := recover(); p != nil {
			r.abandon()
			panic(p)
		}
	}()

	committed := false
	for {
		since := r.now()
		r.readSince.Store(since)
		n, err := src.Read(buf)
		r.readSince.Store(0)
		if stallOn && committed {
			r.readWait.Add(r.now() - since)
		}
		if n > 0 {
			var stop bool
			if committed {
				stop = r.forward(buf[:n])
			} else {
				stop, committed = r.holdRead(buf[:n], since, stallOn)
			}
			if stop {
				return r.finish(nil)
			}
			if n == len(buf) && big == nil {
				// More was waiting than the small buffer holds: a stream
				// in full flow reads in large pieces.
				big = readBufPool.Get().(*[]byte)
				buf = *big
			}
		}
		if err != nil {
			return r.finish(err)
		}
	}
}

func (r *relay) now() int64 { return int64(time.Since(r.start)) + 1 }

// holdRead handles a chunk read before commit, under r.mu (released
// however it ends, panics included); it reports whether the relay must
// stop and whether the stream is committed now.
func (r *relay) holdRead(c []byte, since int64, stallOn bool) (stop, committed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if stallOn && r.committed {
		// Committed by the gate timer during this Read: the wait since
		// commit counts towards a content stall.
		r.readWait.Add(r.now() - max(since, r.committedAt))
	}
	stop = r.hold(c)
	return stop, r.committed
}

// abandon ends the relay's hold on resources: the timers stopped, and
// what was counted against Options.Hold given back (the budget is the
// caller's and outlives this stream). finish runs it, and so does a panic
// on the Relay goroutine (a Downstream's, an Observe's).
func (r *relay) abandon() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done = true
	r.account() // gives back what was still held
	r.gate.Stop()
	if r.idle != nil {
		r.idle.Stop()
	}
	if r.stall != nil {
		r.stall.Stop()
	}
}

// hold handles a chunk read before commit; r.mu is held. It reports whether
// the relay must stop.
func (r *relay) hold(c []byte) bool {
	stop := r.holdChunk(c)
	if !stop && !r.committed && !r.account() {
		// The caller's memory budget is spent: commit what is held, as
		// at MaxHeld, rather than hold more.
		r.commitLocked(nil)
		stop = r.clientGone
	}
	return stop
}

// account tells opts.Hold what is held back now (nothing once committed);
// it reports whether the caller's budget still holds.
func (r *relay) account() bool {
	if r.opts.Hold == nil {
		return true
	}
	var now int64
	if !r.committed && !r.done {
		// The parser's copy of an unfinished line or event costs as much
		// as the bytes held for the client: both are counted.
		now = int64(len(r.held) + len(r.pending) + r.p.Buffered())
	}
	d := now - r.accounted
	if d == 0 {
		return true
	}
	r.accounted = now
	return r.opts.Hold(d) || d < 0
}

// holdChunk is hold's work on the chunk itself.
func (r *relay) holdChunk(c []byte) bool {
	if r.gateExpired || r.clientGone {
		return true
	}
	if r.committed { // by the gate timer while we were reading
		return r.forward(c)
	}
	r.feed(c)
	if r.failed || r.overlong() {
		return true
	}
	switch {
	case r.committed: // decided in c: feed committed and wrote
		r.flush()
	case r.decided || len(r.held)+len(r.pending) > r.opts.MaxHeld:
		r.commitLocked(nil)
	}
	return r.clientGone
}

// overlong reports whether, before a decisive event, the bytes held
// passed the hold cap with most of them in one unterminated line: no LLM
// API sends such a line before its first content, so the stream fails
// (Oversized) rather than commit unjudged bytes. Many small preamble
// events over the cap still commit, as a slow model's keep-alives would.
func (r *relay) overlong() bool {
	if !r.decided && len(r.held)+len(r.pending) > r.opts.MaxHeld && r.p.LineLen() > r.opts.MaxHeld/2 {
		r.oversized = true
	}
	return r.oversized
}

// forward handles a chunk read after commit. It reports whether the relay
// must stop.
func (r *relay) forward(c []byte) bool {
	if wrote, b := r.feed(c); wrote && b >= 0 {
		r.flush()
	}
	return r.clientGone
}

// feed feeds c, moving every byte either into held/the client (sink),
// into pending (an event not yet complete), or nowhere (a dropped event).
func (r *relay) feed(c []byte) (wrote bool, boundary int) {
	r.chunk, r.ws, r.wrote = c, 0, false
	if r.skipLF && c[0] == '\n' {
		r.ws = 1
	}
	r.skipLF = false
	b := r.p.Feed(c, r.emit)
	if b >= 0 {
		if r.decided && !r.committed {
			// Decided in this chunk: commit what is held now, so that the
			// chunk's events go to the client as they are rather than
			// through held (a copy of most of a first chunk, which often
			// holds the whole answer). holdChunk flushes it all at once.
			r.commitUnflushed()
		}
		r.sinkPending(c[r.ws:b])
		r.ws = b
	}
	if r.keep && len(r.pending) == 0 {
		// The rest of an event too large to hold, which goes on as it
		// comes: written from the chunk, not copied through pending (a
		// 50 MB line would churn a MiB buffer per MiB).
		r.sink(c[r.ws:])
	} else {
		r.pending = append(r.pending, c[r.ws:]...)
	}
	if len(r.pending) > r.p.MaxEvent {
		// An event this large is no usage report: it is kept whatever
		// Drop says (as an Overflow event would be), and its bytes go on
		// instead of piling up.
		r.sink(r.pending)
		r.pending = r.pending[:0]
		r.keep = true
	}
	if len(r.pending) == 0 && cap(r.pending) > shrinkAbove {
		r.pending = nil
	}
	r.chunk = nil
	return r.wrote, b
}

// dropEvent cuts the event being dispatched out of the byte stream. Its
// first line began at the last clean boundary, so everything before it is
// complete and can go out, and if it began in an earlier chunk its prefix is
// exactly pending.
func (r *relay) dropEvent() {
	if s := r.p.EventStart(); s >= 0 {
		r.sinkPending(r.chunk[r.ws:s])
	}
	r.pending = r.pending[:0]
	r.ws = r.p.EventEnd()
	r.skipLF = r.ws == len(r.chunk) && r.chunk[r.ws-1] == '\r'
}

// sinkPending sinks pending, then b, the rest of the chunk up to a clean
// boundary, and empties pending. The two may be one event split across
// reads: with Scrub they go out in one piece, so that Scrub sees all of it
// (a secret across the split included).
func (r *relay) sinkPending(b []byte) {
	if len(r.pending) > 0 && len(b) > 0 && r.opts.Scrub != nil {
		r.pending = append(r.pending, b...)
		r.sink(r.pending)
	} else {
		r.sink(r.pending)
		r.sink(b)
	}
	r.pending = r.pending[:0]
}

func (r *relay) sink(b []byte) {
	if len(b) == 0 {
		return
	}
	if r.committed {
		r.write(b)
		r.wrote = true
		return
	}
	r.held = append(r.held, b...)
}

func (r *relay) onEvent(ev Event) {
	if r.failed {
		return
	}
	if r.errEvent != nil && r.chunk != nil {
		r.dropEvent() // after a held-back error: the caller continues or ends it
		return
	}
	if r.opts.Observe != nil {
		r.opts.Observe(ev)
	}
	k := r.opts.Classify(ev)
	if r.committed || r.decided {
		switch k {
		case Content:
			if r.opts.StallFloor > 0 {
				r.sawContent()
			}
		case Terminal:
			r.sawEnd = true
			r.contentEnded()
		case ErrorFrame:
			// Forwarded (scrubbed, as everything is): the client is
			// told, so the stream ended honestly and needs no appended
			// error. Its chunk is written after this.
			r.sawEnd = true
			r.contentEnded()
			if !r.errAfter {
				r.errAfter = true
				r.errData, r.errName = append([]byte(nil), ev.Data...), ev.Name
			}
			if r.opts.DeferBreak && r.chunk != nil && !r.keep && !ev.Overflow {
				r.errEvent = AppendEvent(nil, ev.Name, ev.Data)
				r.dropEvent()
				return
			}
		}
	} else {
		switch k {
		case Content:
			r.decided = true
			if r.opts.StallFloor > 0 {
				r.sawContent()
			}
		case Terminal:
			r.decided, r.sawEnd = true, true
			r.contentEnded()
		case ErrorFrame:
			r.failed = true
			r.errData = append([]byte(nil), ev.Data...)
			return
		}
	}
	// An event too large to keep (Overflow) is no usage report either.
	if r.opts.Drop != nil && r.chunk != nil && !r.keep && !ev.Overflow && r.opts.Drop(ev) {
		r.dropEvent()
	}
	r.keep = false
}

// sawContent restarts the content clock at a Content event after (or
// deciding) commit, and raises the stall limit if the gap it ends is the
// longest yet. It runs on the Relay goroutine (under mu before commit).
func (r *relay) sawContent() {
	now := r.now()
	if r.lastContent != 0 {
		if gap := now - r.lastContent; gap > r.maxGap {
			r.maxGap = gap
			limit := int64(math.MaxInt64)
			if f := int64(r.opts.StallFactor); gap <= math.MaxInt64/f {
				limit = f * gap
			}
			if !r.endSeen { // not once no content is due
				r.stallLimit.Store(max(limit, int64(r.opts.StallFloor)))
			}
		}
	}
	r.lastContent = now
	r.readWait.Store(0)
}

// commitLocked commits and sends what was held plus extra, flushing once so
// the client gets the headers now. r.mu is held.
func (r *relay) commitLocked(extra []byte) {
	if r.commitUnflushed() && r.write(extra) {
		r.flush()
	}
}

// commitUnflushed commits and writes what was held, leaving the flush to
// the caller, which may have more to write first. It reports whether the
// client is still there. r.mu is held.
func (r *relay) commitUnflushed() bool {
	r.committed = true
	r.gate.Stop()
	if err := r.dst.Commit(); err != nil {
		r.werr = fmt.Errorf("streamgate: commit downstream: %w", err)
		r.clientGone = true
		return false
	}
	ok := r.write(r.held)
	r.held = nil
	r.account() // what was held is the client's now
	if !r.clientGone {
		r.idle = time.AfterFunc(r.opts.IdleTimeout, r.onIdle)
		if r.opts.StallFloor > 0 {
			// The content clock starts now, unless the Content event
			// that decided the stream already started it.
			r.committedAt = r.now()
			if r.lastContent == 0 {
				r.lastContent = r.committedAt
			}
			r.stall = time.AfterFunc(r.opts.StallFloor, r.onStall)
		}
	}
	return ok
}

func (r *relay) write(b []byte) bool {
	if r.clientGone {
		return false
	}
	if len(b) == 0 {
		return true
	}
	if r.opts.Scrub != nil {
		b = r.opts.Scrub(b)
	}
	n, err := r.dst.Write(b)
	r.sent += int64(n)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	if err != nil {
		r.werr = fmt.Errorf("streamgate: write downstream: %w", err)
		r.clientGone = true
		return false
	}
	return true
}

func (r *relay) flush() {
	if r.clientGone {
		return
	}
	if err := r.dst.Flush(); err != nil {
		r.werr = fmt.Errorf("streamgate: flush downstream: %w", err)
		r.clientGone = true
	}
}

func (r *relay) onGate() {
	r.mu.Lock()
	// A stream already judged (failed, or oversized) is about to end
	// uncommitted: the timer must not commit what it held.
	if r.done || r.committed || r.gateExpired || r.failed || r.oversized {
		r.mu.Unlock()
		return
	}
	if r.opts.GateFailover {
		r.gateExpired = true
		r.mu.Unlock()
		r.callCancel(ErrGateTimeout)
		return
	}
	// A slow model is not a broken one: let the client see the headers
	// while the Relay goroutine stays blocked in Read.
	r.gateCommitted = true
	r.commitLocked(nil)
	gone := r.clientGone
	r.mu.Unlock()
	if gone {
		r.callCancel(ErrClientGone)
	}
}

func (r *relay) onIdle() {
	r.mu.Lock()
	if r.done || r.stalled {
		r.mu.Unlock()
		return
	}
	wait := r.opts.IdleTimeout
	if since := r.readSince.Load(); since != 0 {
		wait -= time.Duration(r.now() - since)
	}
	// Not blocked in Read (busy writing to a slow client), or not for long
	// enough yet: look again later rather than blame the upstream.
	if wait > 0 {
		r.idle.Reset(wait)
		r.mu.Unlock()
		return
	}
	r.stalled = true
	r.mu.Unlock()
	r.callCancel(ErrIdleTimeout)
}

// onStall ends a committed stream whose content stopped for longer than
// the stall limit (Options.StallFloor). What counts is time the Relay
// goroutine spent blocked in Read since the last Content event (or
// commit): pings still arriving do not reset it, time spent writing to a
// slow client does not add to it.
func (r *relay) onStall() {
	r.mu.Lock()
	limit := time.Duration(r.stallLimit.Load())
	if r.done || r.stalled || limit < 0 {
		r.mu.Unlock()
		return // ended, or no content is due: stay stopped
	}
	waited := time.Duration(r.readWait.Load())
	since := r.readSince.Load()
	if since != 0 {
		// The pending Read may have begun before a commit made by the
		// gate timer; only the part after commit counts.
		waited += time.Duration(r.now() - max(since, r.committedAt))
	}
	wait := limit - waited
	if since == 0 || wait > 0 {
		// Not blocked in Read (busy with the client), or not for long
		// enough yet: look again later rather than blame the upstream.
		if wait <= 0 {
			wait = max(r.opts.StallFloor/16, time.Millisecond)
		}
		r.stall.Reset(wait)
		r.mu.Unlock()
		return
	}
	r.stalled = true
	r.noContent = limit
	r.mu.Unlock()
	r.callCancel(ErrContentStall)
}

// contentEnded stops the content clock: the stream's normal end or an
// error event was seen, so no more content is due.
//
// What trails the end (a usage chunk, [DONE], the close) may take its
// time, but not for ever: pings and comments reset IdleTimeout, so an
// upstream that ends its answer and then only keeps the connection alive
// would otherwise hold the stream, and the client, indefinitely. From the
// end on, the limit is IdleTimeout of waiting without another end marker
// or content; a stream cut by it has ended (Complete), nothing appended.
func (r *relay) contentEnded() {
	if r.opts.StallFloor > 0 {
		r.endSeen = true
		r.readWait.Store(0)
		r.stallLimit.Store(int64(r.opts.IdleTimeout))
	}
}

func (r *relay) callCancel(cause error) {
	if r.cancel != nil {
		r.cancel(cause)
	}
}

func (r *relay) finish(readErr error) Result {
	r.abandon() // done: the timers stopped, what was held given back

	res := Result{Committed: r.committed, CommittedAtGate: r.gateCommitted}
	var rerr error
	if readErr != nil && !errors.Is(readErr, io.EOF) {
		rerr = fmt.Errorf("streamgate: read upstream: %w", readErr)
	}

	if !r.committed {
		switch {
		case r.oversized:
			res.Outcome = Oversized
		case r.gateExpired:
			res.Outcome = GateTimeout
			res.Err = rerr
		case r.failed:
			res.Outcome = UpstreamError
			res.ErrorData = r.errData
		default:
			// An error frame cut off by the close still tells the caller
			// (and its logs) what went wrong.
			r.p.Finish(func(ev Event) {
				if r.opts.Classify(ev) == ErrorFrame {
					r.failed = true
					r.errData = append([]byte(nil), ev.Data...)
				}
			})
			res.Outcome, res.Err = ClosedEarly, rerr
			if r.failed {
				res.Outcome, res.ErrorData = UpstreamError, r.errData
			}
		}
		return res
	}

	ended := r.sawEnd
	midEvent := !r.p.AtBoundary()
	tailErr, tailJSON := false, false
	unterminated := r.p.Finish(func(ev Event) {
		tailJSON = json.Valid(ev.Data)
		switch r.opts.Classify(ev) {
		case Terminal:
			ended = true
		case ErrorFrame:
			ended, tailErr = true, true
			if !r.errAfter {
				r.errAfter = true
				r.errData, r.errName = append([]byte(nil), ev.Data...), ev.Name
			}
		}
	})
	r.mu.Lock()
	stalled, noContent := r.stalled, r.noContent
	r.mu.Unlock()
	if !ended && r.opts.EndsAtEOF && errors.Is(readErr, io.EOF) && !unterminated && !stalled {
		ended = true // an unknown API ends however it likes, but not mid-event
	}
	// A deferred break leaves the client at the last whole event: the
	// unterminated tail is dropped with the rest of the broken attempt.
	deferred := r.opts.DeferBreak && !ended && !(r.keep && midEvent)
	switch {
	case deferred:
		midEvent = false
	case r.clientGone || len(r.pending) == 0:
	case !ended && !tailJSON && !r.keep:
		// The upstream broke off inside an event whose data is not whole
		// (or that has none): ended with a blank line it would reach the
		// client as an event of its own, and the official SDKs, which
		// parse every event's data as JSON, would throw on it before
		// they saw the error event below. It is held, not yet sent:
		// the client stays at the last whole event.
		midEvent = false
	default:
		// The tail of an unterminated event: never lose upstream bytes.
		r.write(r.pending)
		r.flush()
	}
	if r.clientGone {
		res.Outcome, res.Err, res.BytesSent = ClientGone, r.werr, r.sent
		r.callCancel(ErrClientGone)
		return res
	}
	if tailErr {
		// The upstream's own error event ends the stream but lacks its
		// blank line, and a client discards an unterminated event: end it
		// so the client is told (see appendError for why two LFs).
		if _, err := r.dst.Write([]byte("\n\n")); err == nil {
			_ = r.dst.Flush()
		}
	}

	res.BytesSent = r.sent
	res.LongestGap = time.Duration(r.maxGap)
	switch {
	case ended && r.errAfter:
		res.Outcome, res.ErrorData, res.Err, res.Deferred = UpstreamError, r.errData, rerr, r.errEvent
		res.ErrorName = r.errName
		return res
	case ended:
		res.Outcome, res.Err = Complete, rerr
		return res
	case stalled && noContent > 0:
		res.Outcome = Stalled
		d := noContent.Round(time.Millisecond)
		res.Err = fmt.Errorf("streamgate: no upstream content for %v: %w", d, ErrContentStall)
		res.Deferred = r.appendError(deferred, midEvent, CodeStalled, "upstream stalled: no content for "+d.String()+"; the response is incomplete")
	case stalled:
		res.Outcome = Stalled
		res.Err = fmt.Errorf("streamgate: no upstream bytes for %v: %w", r.opts.IdleTimeout, ErrIdleTimeout)
		res.Deferred = r.appendError(deferred, midEvent, CodeStalled, "upstream stalled: no data for "+r.opts.IdleTimeout.String()+"; the response is incomplete")
	default:
		res.Outcome, res.Err = Truncated, rerr
		if res.Err == nil {
			res.Err = fmt.Errorf("streamgate: upstream closed before the end of the stream: %w", io.ErrUnexpectedEOF)
		}
		res.Deferred = r.appendError(deferred, midEvent, CodeTruncated, "upstream closed the stream before it was complete; the response is incomplete")
	}
	return res
}

// appendError tells the client, in its own API format, that what it got is not
// the whole answer. If the upstream broke off inside an event, a blank line
// first ends the half line and event; otherwise the client's parser would
// glue the error onto them and never see it. (One blank line is not enough
// after a lone CR: the client would take the LF as the rest of a CRLF.)
// A failure here changes nothing: the client is gone. A deferred event is
// returned instead of written.
func (r *relay) appendError(deferred, midEvent bool, code, msg string) []byte {
	if r.opts.ErrorEvent == nil {
		return nil
	}
	ev := r.opts.ErrorEvent(code, msg)
	if deferred {
		return ev
	}
	if midEvent {
		ev = append([]byte("\n\n"), ev...)
	}
	if _, err := r.dst.Write(ev); err == nil {
		_ = r.dst.Flush()
	}
	return nil
}

// AppendEvent appends a complete event named name (none when "") with
// data, one data line per line of it.
func AppendEvent(dst []byte, name string, data []byte) []byte {
	if name != "" {
		dst = append(append(append(dst, "event: "...), name...), '\n')
	}
	for _, line := range bytes.Split(data, []byte("\n")) {
		dst = append(append(append(dst, "data: "...), line...), '\n')
	}
	return append(dst, '\n')
}
