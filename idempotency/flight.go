package idempotency

import (
	"context"
	"errors"
	"net/http"
	"strconv"
)

// ErrIncomplete is Follow's report that the answer it was following
// outgrew what is held after it began: the rest can never be given, so
// the caller must cut the response (a clean end would pass a truncated
// answer off as whole).
var ErrIncomplete = errors.New("idempotency: the followed answer outgrew what is held; the rest cannot be given")

// ErrNoAnswer is Follow's report that the run it followed ended without
// answering at all (its client left, and its grace ran out first): w got
// nothing, and the call was not kept, so the caller may begin it again.
var ErrNoAnswer = errors.New("idempotency: the followed run ended without an answer")

// Recorder is the ResponseWriter the first run of a call writes to: it
// passes everything to the client while the client is there, and keeps
// what it sent (up to the bound hold allows) for the followers and the
// kept answer. A client that went away does not stop the run: writes to
// it fail silently, so the answer is still recorded for its retry.
type Recorder struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	f      *Flight
	max    int64
	hold   func(n int64) bool
	gone   bool
	wrote  bool
	header http.Header
}

// NewRecorder records into f what is written to w; hold reserves n more
// bytes of memory (false: none left), and max bounds what is kept.
func NewRecorder(w http.ResponseWriter, f *Flight, max int64, hold func(n int64) bool) *Recorder {
	return &Recorder{w: w, rc: http.NewResponseController(w), f: f, max: max, hold: hold}
}

// Header is the client's.
func (r *Recorder) Header() http.Header { return r.w.Header() }

// WriteHeader sends the status and keeps it, with the headers a replay
// repeats.
func (r *Recorder) WriteHeader(status int) {
	if r.wrote {
		return
	}
	r.wrote = true
	h := replayHeader(r.w.Header())
	r.f.mu.Lock()
	r.f.status, r.f.header = status, h
	r.f.notifyLocked()
	r.f.mu.Unlock()
	if !r.gone {
		r.w.WriteHeader(status)
	}
}

// Write sends p and keeps it. It fails only if the run itself must stop:
// never because the client left.
func (r *Recorder) Write(p []byte) (int, error) {
	if !r.wrote {
		r.WriteHeader(http.StatusOK)
	}
	r.keep(p)
	if !r.gone {
		if _, err := r.w.Write(p); err != nil {
			r.gone = true
		}
	}
	return len(p), nil
}

func (r *Recorder) keep(p []byte) {
	f := r.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.overflow {
		n := int64(len(p))
		if int64(len(f.body))+n > r.max || !r.hold(n) {
			f.overflow = true
		} else {
			f.held += n
			f.body = append(f.body, p...)
		}
	}
	f.notifyLocked()
}

// Flush flushes to the client while it is there.
func (r *Recorder) Flush() {
	if !r.gone {
		if err := r.rc.Flush(); err != nil {
			r.gone = true
		}
	}
}

// FlushError is Flush for http.ResponseController.
func (r *Recorder) FlushError() error { r.Flush(); return nil }

// Unwrap lets http.ResponseController reach the client's writer (write
// deadlines).
func (r *Recorder) Unwrap() http.ResponseWriter { return r.w }

// ClientGone reports whether a write to the client failed.
func (r *Recorder) ClientGone() bool { return r.gone }

// Held is the memory the flight holds, to give back when it is finished.
func (f *Flight) Held() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held
}

// Answer is what the first run sent, and whether it outgrew what is
// kept.
func (f *Flight) Answer() (a *Answer, overflow bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &Answer{Status: f.status, Header: f.header, Body: f.body}, f.overflow
}

// Status is the status the first run answered with so far (0: none yet).
func (f *Flight) Status() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status
}

// replayHeader is what a replay repeats of an answer's headers: the
// content's, and the gateway's own; never the connection's, a date, or a
// request's ID.
func replayHeader(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, v := range h {
		switch k {
		case "Date", "Content-Length", "Connection", "Keep-Alive", "Transfer-Encoding", "Trailer", "X-Request-Id", "Server":
			continue
		}
		out[k] = append([]string(nil), v...)
	}
	return out
}

// Follow answers w with f: the status and headers once the first run has
// them, what it sent so far, then what it sends, until it ends or ctx
// does. It reports false when it could not start: the first run's answer
// outgrew what is held before w joined (the caller answers 409), or
// with ErrNoAnswer, the run ended without answering; and ErrIncomplete
// when it outgrew it after w began (the caller cuts w's response: what
// w got is not the whole answer).
func (f *Flight) Follow(ctx context.Context, w http.ResponseWriter) (bool, error) {
	rc := http.NewResponseController(w)
	sent, started := 0, false
	for {
		f.mu.Lock()
		status, header, body, done, overflow, changed := f.status, f.header, f.body, f.done, f.overflow, f.changed
		f.watched = true
		f.mu.Unlock()
		if !started && overflow {
			return false, nil
		}
		if !started && (status != 0 && (len(body) > 0 || done)) {
			if done && !overflow {
				// Ended before this follower began: its length is known.
				header = header.Clone()
				header.Set("Content-Length", strconv.Itoa(len(body)))
			}
			writeHeader(w, status, header)
			started = true
		}
		if started && sent < len(body) {
			if _, err := w.Write(body[sent:]); err != nil {
				return true, nil
			}
			sent = len(body)
			_ = rc.Flush()
		}
		if started && overflow {
			// What was held is sent; the rest was never kept.
			return true, ErrIncomplete
		}
		if done {
			if !started {
				return false, ErrNoAnswer
			}
			return true, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return true, nil
		}
	}
}

// WriteAnswer answers w with a kept answer, marked as a replay.
func WriteAnswer(w http.ResponseWriter, a *Answer) {
	h := a.Header.Clone()
	h.Set("Content-Length", strconv.Itoa(len(a.Body)))
	writeHeader(w, a.Status, h)
	_, _ = w.Write(a.Body)
}

func writeHeader(w http.ResponseWriter, status int, h http.Header) {
	dst := w.Header()
	for k, v := range h {
		dst[k] = append([]string(nil), v...)
	}
	dst.Set(ReplayedHeader, "true")
	w.WriteHeader(status)
}
