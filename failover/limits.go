package failover

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// This file bounds what one request can hold of the gateway: the bytes of
// buffered answers across every in-flight request, the time a committed
// answer may stay silent, the time a client may take to read what it is
// sent or to send its body.

// overloadedFailure is the failure of an attempt the memory budget does
// not let start, or go on: it is nobody's fault but the load's, and a 503
// tells the client to come back.
func overloadedFailure() *failure {
	return &failure{reason: reasonOverloaded, status: http.StatusServiceUnavailable, message: provider.ErrMemoryBudget.Error()}
}

// overloaded reports the failure of an attempt that must not start while
// the process holds max_held_bytes.
func (e *Engine) overloaded() *failure {
	if !e.memory.Full() {
		return nil
	}
	return overloadedFailure()
}

// streamBase is what a stream waiting in the gate costs before it holds
// anything: its read buffer (2 KiB until a read fills it, then 16 KiB),
// and its parser's buffers for the event in progress (a few hundred bytes
// for a preamble; a large event is counted as held). It must be at least
// the largest read buffer: the chunk that crosses max_held_bytes is
// counted before the stream commits, and the base given back at commit
// is what keeps that chunk within the budget.
// At 20 KiB the default 256 MiB lets 13,107 streams wait for their first
// token at once (32 KiB let 8,192).
const streamBase = 20 << 10

// gateHold is the stream gate's Options.Hold: what it holds back before
// commit counts against the memory budget, and when the budget is spent
// the stream commits instead of holding more.
func (e *Engine) gateHold(n int64) bool {
	if n < 0 {
		e.memory.Release(-n)
		return true
	}
	return !e.memory.Hold(n)
}

// holdFrames reserves n bytes for a stream attempt (its base, streamBase),
// and returns their release, which runs once: at commit or when the
// attempt ends. Beyond max_held_bytes the attempt does not start.
func (e *Engine) holdFrames(n int64) (release func(), f *failure) {
	if !e.memory.Reserve(n) {
		return func() {}, overloadedFailure()
	}
	var once sync.Once
	return func() { once.Do(func() { e.memory.Release(n) }) }, nil
}

// heldReader counts what it reads as held until release, and fails once
// the budget is passed.
type heldReader struct {
	r      io.Reader
	memory *failoverapp.Memory
	held   int64
}

func (hr *heldReader) Read(p []byte) (int, error) {
	n, err := hr.r.Read(p)
	hr.held += int64(n)
	if hr.memory.Hold(int64(n)) {
		return n, provider.ErrMemoryBudget
	}
	return n, err
}

func (hr *heldReader) release() { hr.memory.Release(hr.held) }

// idleWriter is the client side of a committed answer: the writes up to
// and including each flush must finish within the idle timeout, so that a
// client that stops reading, TCP open, does not hold the upstream, the
// goroutine and the reservation.
type idleWriter struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	idle time.Duration
	// armed: the deadline is set for the writes since the last flush. A
	// stream writes and flushes each piece it reads, so one deadline a
	// piece, not one a call: setting it is a runtime timer update, a few
	// hundred nanoseconds each.
	armed bool
}

func (iw *idleWriter) arm() {
	if !iw.armed {
		_ = iw.rc.SetWriteDeadline(time.Now().Add(iw.idle))
		iw.armed = true
	}
}

func (iw *idleWriter) Write(p []byte) (int, error) {
	iw.arm()
	return iw.w.Write(p)
}

func (iw *idleWriter) Flush() error {
	iw.arm()
	err := iw.rc.Flush()
	iw.armed = false
	return err
}

// writePieces writes a whole answer, each piece of it within the idle
// timeout: a client must keep taking it, not take all of it in that time
// (a slow reader is not a stopped one).
func (iw *idleWriter) writePieces(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		n := min(len(p), answerPiece)
		iw.armed = false
		m, err := iw.Write(p[:n])
		written += m
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

// answerPiece is how much of a whole answer one write deadline covers.
const answerPiece = 64 << 10

// duplicateWriter is the client side of an idempotent duplicate, which is
// answered from what its call's first run sent: it must take each piece
// within the idle timeout, as a first run's client must. done clears the
// deadline.
type duplicateWriter struct {
	http.ResponseWriter
	out *idleWriter
}

func newDuplicateWriter(w http.ResponseWriter, idle time.Duration) *duplicateWriter {
	return &duplicateWriter{ResponseWriter: w, out: &idleWriter{w: w, rc: http.NewResponseController(w), idle: idle}}
}

func (d *duplicateWriter) Write(p []byte) (int, error) { return d.out.writePieces(p) }
func (d *duplicateWriter) FlushError() error           { return d.out.Flush() }
func (d *duplicateWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }
func (d *duplicateWriter) done()                       { d.out.done() }

// done clears the deadline, which would otherwise outlive this answer on
// a kept-alive connection.
func (iw *idleWriter) done() { _ = iw.rc.SetWriteDeadline(time.Time{}); iw.armed = false }

// idleReader cancels the attempt when the upstream sends nothing for the
// idle timeout, for committed answers the stream gate does not watch.
type idleReader struct {
	r     io.Reader
	timer *time.Timer
	idle  time.Duration
}

func newIdleReader(r io.Reader, idle time.Duration, cancel context.CancelCauseFunc) *idleReader {
	return &idleReader{r: r, idle: idle, timer: time.AfterFunc(idle, func() { cancel(errIdle) })}
}

var errIdle = fmt.Errorf("no upstream byte within stream_idle_timeout after commit")

func (ir *idleReader) Read(p []byte) (int, error) {
	n, err := ir.r.Read(p)
	ir.timer.Reset(ir.idle)
	return n, err
}

func (ir *idleReader) stop() { ir.timer.Stop() }

// readBodyBounded reads the request body within request_body_timeout, so
// that a client trickling its body cannot hold a connection and a
// goroutine for ever; the deadline is cleared before the answer.
func (e *Engine) readBodyBounded(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(e.opts.RequestBodyTimeout))
	defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	return readBody(w, r, e.opts.MaxRequestBody)
}

// Interface guard: the memory budget is what adapters count their
// buffers against.
var _ provider.Holder = (*failoverapp.Memory)(nil)
