// Package idempotency answers a retried request once: a request carrying
// an Idempotency-Key is one logical call of its client, and a duplicate
// of it (same client, same key) either follows the first while it runs or
// is answered from what the first got, for a retention window. Nothing is
// sent upstream twice and nothing is charged twice.
//
// A Table is the process's: its flights (keyed requests under way here)
// and the answers it keeps (Stored). It knows HTTP answers as status,
// headers and bytes; it must not know LLM APIs, money or SQL. A Store
// shares answers and running claims with a fleet (store.go).
package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"sync"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/expiry"
)

// ReplayedHeader marks an answer served from a duplicate's first run, as
// Stripe's API does.
const ReplayedHeader = "Idempotent-Replayed"

// MaxKeyLen bounds a client's key.
const MaxKeyLen = 255

// ID identifies a logical call: the client's identity and its key, hashed
// so that neither is kept.
func ID(identity, key string) string {
	sum := sha256.Sum256([]byte(identity + "\x00" + key))
	return hex.EncodeToString(sum[:])
}

// Fingerprint identifies a request: its endpoint (method and path) and
// its body. A key reused with another body is a client's mistake, never a
// replay; so is the same body sent to another endpoint (chat and legacy
// completions, messages and count_tokens), whose answer has another shape.
func Fingerprint(endpoint string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(endpoint))
	h.Write([]byte{0})
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Answer is what a client got: status, the headers the gateway passed,
// and the body (a stream's events as sent).
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
}

// Verdict is what Begin decided for a keyed request.
type Verdict int

const (
	// Run: nobody runs this call; the caller does, recording into the
	// Flight, and ends it with Finish.
	Run Verdict = iota
	// Follow: the call runs in this process; the caller follows its
	// Flight (Follow).
	Follow
	// Replay: the call completed; the caller answers with the Answer.
	Replay
	// Mismatch: the key was used with another body (422).
	Mismatch
	// Unstored: the call completed with an answer too large to keep;
	// running it again would run it twice (409).
	Unstored
)

// Flight is one keyed request under way in this process: what its client
// got so far, for the duplicates that follow it.
type Flight struct {
	id, fingerprint string

	mu sync.Mutex
	// changed is closed, and replaced, whenever the flight gains bytes,
	// its status, or ends, and a follower waits on it (watched): a run
	// nobody follows allocates nothing per write.
	changed chan struct{}
	watched bool
	status  int
	header  http.Header
	body    []byte
	done    bool
	// overflow: the answer outgrew what may be held; followers that
	// joined before keep what they read, later ones cannot start.
	overflow bool
	held     int64
}

// stored is a completed call's answer, or its tombstone when the answer
// was too large to keep.
type stored struct {
	id, fingerprint string
	answer          *Answer // nil: unstored (too large)
	expires         time.Time
	size            int64 // counted against MaxStored: the body, the headers and keptOverhead
}

// keptOverhead is what a kept call holds besides its answer's body: its
// map entry, its two hex digests and this record. MaxStored counts it,
// so that calls kept without a body (tombstones) are bounded too: a
// client sending unique keys at a high rate cannot grow the table past
// MaxStored within the retention window.
const keptOverhead = 256

// Limits bound a Table.
type Limits struct {
	// Retention is how long a completed call's answer is kept.
	Retention time.Duration
	// MaxStored bounds the memory of every call kept together: their
	// answers' bytes (headers and body) and keptOverhead each.
	MaxStored int64
}

// Table is the process's flights and kept answers.
type Table struct {
	mu      sync.Mutex
	flights map[string]*Flight
	answers map[string]*stored
	// expiry is the kept calls, soonest to expire first: a sweep takes
	// the expired off its front, and a full table forgets from it,
	// without reading every kept call under mu.
	expiry expiry.Queue[string]
	bytes  int64
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{flights: make(map[string]*Flight), answers: make(map[string]*stored)}
}

// Begin decides what a keyed request does: run, follow the flight under
// way, or be answered from the kept answer.
func (t *Table) Begin(id, fingerprint string, now time.Time) (Verdict, *Flight, *Answer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f, ok := t.flights[id]; ok {
		if f.fingerprint != fingerprint {
			return Mismatch, nil, nil
		}
		return Follow, f, nil
	}
	if s, ok := t.answers[id]; ok {
		switch {
		case !now.Before(s.expires):
			t.drop(s)
		case s.fingerprint != fingerprint:
			return Mismatch, nil, nil
		case s.answer == nil:
			return Unstored, nil, nil
		default:
			return Replay, nil, s.answer
		}
	}
	f := &Flight{id: id, fingerprint: fingerprint, changed: make(chan struct{})}
	t.flights[id] = f
	return Run, f, nil
}

// keepLocked keeps a completed call for the retention window. When it
// does not fit in MaxStored once the expired are swept, the calls that
// expire soonest are forgotten here until it does: the newest call's
// duplicates are the likeliest to come, and the idempotency store (which
// every table has behind it, see package failoverapp) still answers an
// older one's, once, from its own copy.
func (t *Table) keepLocked(id, fingerprint string, a *Answer, lim Limits, now time.Time) {
	if old, ok := t.answers[id]; ok {
		t.drop(old)
	}
	s := &stored{id: id, fingerprint: fingerprint, answer: a, expires: now.Add(lim.Retention), size: keptOverhead}
	if a != nil {
		s.size += int64(len(a.Body)) + headerSize(a.Header)
	}
	if t.bytes+s.size > lim.MaxStored {
		t.sweepLocked(now)
	}
	if s.size > lim.MaxStored && a != nil {
		// Larger than the whole table (an answer near max_answer when
		// max_answer is near max_stored): kept as a tombstone, so a
		// duplicate is refused (409), never run twice.
		s.answer, s.size = nil, keptOverhead
	}
	for t.bytes+s.size > lim.MaxStored && t.expiry.Len() > 0 {
		first, _, _ := t.expiry.First()
		t.drop(t.answers[first])
	}
	t.answers[id] = s
	t.expiry.Set(id, s.expires)
	t.bytes += s.size
}

// headerSize is what an answer's headers hold: the upstream chose them
// (up to its transport's bound), so a kept answer counts them like its
// body.
func headerSize(h http.Header) int64 {
	var n int64
	for k, vs := range h {
		n += int64(len(k))
		for _, v := range vs {
			n += int64(len(v))
		}
	}
	return n
}

func (t *Table) drop(s *stored) {
	delete(t.answers, s.id)
	t.expiry.Remove(s.id)
	t.bytes -= s.size
}

// Sweep drops the kept answers expired at now.
func (t *Table) Sweep(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sweepLocked(now)
}

func (t *Table) sweepLocked(now time.Time) int {
	n := 0
	for first, at, ok := t.expiry.First(); ok && !now.Before(at); first, at, ok = t.expiry.First() {
		t.drop(t.answers[first])
		n++
	}
	return n
}

// Finish ends f. With keep, its answer is kept for the retention window
// (a tombstone when it overflowed); without, the call is forgotten and a
// duplicate runs it again (a failure is not kept). Followers see the end.
func (t *Table) Finish(f *Flight, keep bool, lim Limits, now time.Time) {
	// Under t.mu, so that a follower woken by the end finds the flight
	// gone (and the answer kept) when it asks again.
	t.mu.Lock()
	defer t.mu.Unlock()
	f.mu.Lock()
	f.done = true
	a := &Answer{Status: f.status, Header: f.header, Body: f.body}
	overflow := f.overflow
	f.notifyLocked()
	f.mu.Unlock()
	if t.flights[f.id] == f {
		delete(t.flights, f.id)
	}
	if !keep {
		return
	}
	if overflow || a.Status == 0 {
		a = nil
	}
	t.keepLocked(f.id, f.fingerprint, a, lim, now)
}

func (f *Flight) notifyLocked() {
	if !f.watched {
		return
	}
	close(f.changed)
	f.changed, f.watched = make(chan struct{}), false
}
