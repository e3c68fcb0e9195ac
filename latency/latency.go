// Package latency learns how long each channel usually takes, so that a
// candidate's deadlines can be its own: a bounded multiple of a high
// quantile of what the channel did lately for requests of the same size,
// never below a floor and never above the configured timeout.
//
// A Learner keeps, per kind of wait (response headers, first content, a
// committed stream's longest pause) and per size class of request, a
// rolling latency sketch. It knows durations and classes, never requests
// or providers; the engine decides what to observe and what to do with a
// deadline.
package latency

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// Kind is which wait a duration measures.
type Kind uint8

const (
	// Header: from sending the request to its response headers.
	Header Kind = iota
	// FirstContent: from sending the request to the first content the
	// client could be given (a stream's first token; a whole JSON answer).
	FirstContent
	// Gap: a committed stream's longest pause between content events.
	Gap
	// NumKinds is how many kinds there are.
	NumKinds
)

var kindNames = [NumKinds]string{"header", "first_content", "gap"}

func (k Kind) String() string {
	if k < NumKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// Kinds lists every kind, for views and metrics.
var Kinds = []Kind{Header, FirstContent, Gap}

// Class is a request's size class: how long its prompt is and how much
// output it may ask for. A long prompt takes longer to its first token,
// and a non-streaming answer's headers wait for all of its output, so a
// deadline learned from short requests must not cut a long one.
type Class uint8

// Size bounds of the classes: prompts under 8 KiB are small and under
// 128 KiB medium; output bounds up to 1,024 tokens are small and up to
// 8,192 medium. Everything above is large.
const (
	smallPrompt  = 8 << 10
	mediumPrompt = 128 << 10
	smallOutput  = 1024
	mediumOutput = 8192
	numSizes     = 3
	numSized     = numSizes * numSizes
	// NumClasses is how many classes there are: each size class of a
	// streamed answer, and the same of a whole (non-streamed) one.
	NumClasses = 2 * numSized
)

var sizeNames = [numSizes]string{"s", "m", "l"}

// ClassOf is the class of a request of promptBytes bytes that may
// generate up to maxOutput tokens (0: unknown, counted as large).
func ClassOf(promptBytes int, maxOutput int64) Class {
	p := 2
	switch {
	case promptBytes < smallPrompt:
		p = 0
	case promptBytes < mediumPrompt:
		p = 1
	}
	o := 2
	switch {
	case maxOutput <= 0:
	case maxOutput <= smallOutput:
		o = 0
	case maxOutput <= mediumOutput:
		o = 1
	}
	return Class(p*numSizes + o)
}

// Whole is c's class for a request answered whole rather than streamed.
// A stream's headers come before anything is generated and its first
// content with the first token; a whole answer's headers and content come
// when all of its output is generated. Their waits are learned apart, or
// a channel that mostly streams would cut its own healthy whole answers.
func (c Class) Whole() Class {
	if c < numSized {
		return c + numSized
	}
	return c
}

// String names the class as prompt/output sizes, e.g. "s/m", and
// "s/m whole" for a whole answer's.
func (c Class) String() string {
	if c >= NumClasses {
		return fmt.Sprintf("class(%d)", c)
	}
	s := c % numSized
	name := sizeNames[s/numSizes] + "/" + sizeNames[s%numSizes]
	if c >= numSized {
		name += " whole"
	}
	return name
}

// Config is how deadlines are learned. The zero value of a field takes
// its default (WithDefaults).
type Config struct {
	// Quantile is the high quantile a deadline multiplies (0.99).
	Quantile float64
	// Factor multiplies it (3).
	Factor float64
	// Floor is the least header or first-content deadline (5 s): a fast
	// channel's p99 of 200 ms must not make one slow answer a failure.
	Floor time.Duration
	// StallFloor is the least stall limit of a committed stream (20 s): a
	// reasoning model may pause for long, and a stall cut mid-answer
	// costs more than a slow start.
	StallFloor time.Duration
	// MinSamples is how many observations of a kind and class a channel
	// needs before its deadline is learned (50); with fewer, the
	// configured timeout holds.
	MinSamples int
	// Window is how far back observations count (30 min): long enough for
	// MinSamples at modest traffic, short enough to follow a channel
	// that got slower.
	Window time.Duration
}

// Defaults of Config.
const (
	DefaultQuantile   = 0.99
	DefaultFactor     = 3
	DefaultFloor      = 5 * time.Second
	DefaultStallFloor = 20 * time.Second
	DefaultMinSamples = 50
	DefaultWindow     = 30 * time.Minute
)

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	if c.Quantile <= 0 || c.Quantile >= 1 {
		c.Quantile = DefaultQuantile
	}
	if c.Factor <= 0 {
		c.Factor = DefaultFactor
	}
	if c.Floor <= 0 {
		c.Floor = DefaultFloor
	}
	if c.StallFloor <= 0 {
		c.StallFloor = DefaultStallFloor
	}
	if c.MinSamples <= 0 {
		c.MinSamples = DefaultMinSamples
	}
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	return c
}

// Deadline is a learned bound on one wait.
type Deadline struct {
	// Limit is the deadline: Factor × Quantile, within [floor, ceiling].
	Limit time.Duration
	// Learned: the channel had MinSamples observations; otherwise Limit
	// is the ceiling (the configured timeout).
	Learned bool
	// Quantile and Samples are what it was learned from.
	Quantile time.Duration
	Samples  int
}

// String says how a deadline was found, for logs and the journal.
func (d Deadline) String() string {
	if !d.Learned {
		return fmt.Sprintf("%s (configured; %d samples)", d.Limit, d.Samples)
	}
	return fmt.Sprintf("%s (learned from a quantile of %s over %d samples)", d.Limit, d.Quantile, d.Samples)
}

// recentSpan is the window Slowdown compares with the usual: two minutes
// of traffic, in two halves.
const recentSpan = 2 * time.Minute

// Learner is one channel's latencies. It is safe for concurrent use.
type Learner struct {
	mu     sync.Mutex
	usual  [NumKinds][NumClasses]rolling
	recent [NumClasses]rolling // first content, over recentSpan
}

// NewLearner returns an empty learner.
func NewLearner() *Learner { return &Learner{} }

// Observe adds one duration of kind k for a request of class c.
func (l *Learner) Observe(k Kind, c Class, d time.Duration, window time.Duration, now time.Time) {
	if k >= NumKinds || c >= NumClasses || d < 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.usual[k][c].observe(d, window, now)
	if k == FirstContent {
		l.recent[c].observe(d, recentSpan, now)
	}
}

// Deadline is the deadline of a wait of kind k for a request of class c:
// Factor × the channel's Quantile, within [floor, ceiling], or ceiling
// when the channel has too few observations. A ceiling of 0 or less
// leaves the limit unbounded above.
func (l *Learner) Deadline(k Kind, c Class, cfg Config, ceiling time.Duration, now time.Time) Deadline {
	if k >= NumKinds || c >= NumClasses {
		return Deadline{Limit: ceiling}
	}
	l.mu.Lock()
	s, n := l.usual[k][c].merged(cfg.Window, now)
	l.mu.Unlock()
	d := Deadline{Limit: ceiling, Samples: int(n)}
	if int(n) < cfg.MinSamples {
		return d
	}
	d.Quantile = s.quantile(cfg.Quantile)
	floor := cfg.Floor
	if k == Gap {
		floor = cfg.StallFloor
	}
	// A product beyond a Duration saturates: converting it would not.
	limit := time.Duration(math.MaxInt64)
	if p := float64(d.Quantile) * cfg.Factor; p < math.MaxInt64 {
		limit = max(time.Duration(p), floor)
	}
	if ceiling > 0 {
		limit = min(limit, ceiling)
	}
	d.Limit, d.Learned = limit, true
	return d
}

// Quantile is the channel's q-quantile of kind k for class c over the
// window, and how many observations it is taken from; 0 when none.
func (l *Learner) Quantile(k Kind, c Class, q float64, window time.Duration, now time.Time) (time.Duration, int) {
	if k >= NumKinds || c >= NumClasses {
		return 0, 0
	}
	l.mu.Lock()
	s, n := l.usual[k][c].merged(window, now)
	l.mu.Unlock()
	if n == 0 {
		return 0, 0
	}
	return s.quantile(q), int(n)
}

// slowSamples is how many first contents of the last two minutes a class
// needs before Slowdown compares it with the usual.
const slowSamples = 10

// Slowdown is how much slower than its usual the channel has been over
// the last two minutes: the largest ratio, over the classes with enough
// observations both lately and in the window, of the recent median time
// to first content to the usual one; 1 when it is not slower, or cannot
// tell.
func (l *Learner) Slowdown(cfg Config, now time.Time) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	worst := 1.0
	for c := range Class(NumClasses) {
		recent, rn := l.recent[c].merged(recentSpan, now)
		if rn < slowSamples {
			continue
		}
		usual, un := l.usual[FirstContent][c].merged(cfg.Window, now)
		if int(un) < cfg.MinSamples {
			continue
		}
		if u := usual.quantile(0.5); u > 0 {
			worst = max(worst, float64(recent.quantile(0.5))/float64(u))
		}
	}
	return worst
}

// Learned is one kind and class of a channel's deadlines, for views.
type Learned struct {
	Kind     Kind
	Class    Class
	Deadline Deadline
	// Median is the class's median, for a view to show next to it.
	Median time.Duration
}

// Snapshot lists the kinds and classes the channel has observations of,
// with their deadlines under cfg (ceilings[k] is kind k's configured
// timeout for a streamed answer, whole[k] for a whole one: Class.Whole).
func (l *Learner) Snapshot(cfg Config, ceilings, whole [NumKinds]time.Duration, now time.Time) []Learned {
	var out []Learned
	for _, k := range Kinds {
		for c := range Class(NumClasses) {
			l.mu.Lock()
			s, n := l.usual[k][c].merged(cfg.Window, now)
			l.mu.Unlock()
			if n == 0 {
				continue
			}
			ceiling := ceilings[k]
			if c >= numSized {
				ceiling = whole[k]
			}
			out = append(out, Learned{Kind: k, Class: c, Deadline: l.Deadline(k, c, cfg, ceiling, now), Median: s.quantile(0.5)})
		}
	}
	return out
}

// rolling is a sketch over a sliding window, kept as two halves: the
// current one and the one before it. A quantile merges both, so it
// covers between half the window and all of it.
type rolling struct {
	cur, prev sketch
	curStart  int64 // Unix ns when cur began; 0: never used
}

func (r *rolling) rotate(window time.Duration, now time.Time) {
	half := int64(window / 2)
	t := now.UnixNano()
	switch {
	case r.curStart == 0:
		r.curStart = t
	case t-r.curStart >= 2*half:
		// Both halves are older than the window.
		r.cur, r.prev, r.curStart = sketch{}, sketch{}, t
	case t-r.curStart >= half:
		r.prev, r.cur, r.curStart = r.cur, sketch{}, r.curStart+half
	}
}

func (r *rolling) observe(d, window time.Duration, now time.Time) {
	r.rotate(window, now)
	r.cur.observe(d)
}

func (r *rolling) merged(window time.Duration, now time.Time) (sketch, uint64) {
	r.rotate(window, now)
	s := r.cur
	s.merge(&r.prev)
	return s, s.count()
}

// The sketch's buckets grow by 10 %, from 1 ms to about 10 minutes:
// a quantile is at most 10 % above the true one, so a learned deadline
// errs on the long side by no more than that. It is not history.Sketch,
// whose 50 % buckets (35 % error) suit a status page and are a store's
// column layout, but would stretch a deadline by up to a third.
// Nothing here is stored, so its layout is free.
const (
	numBuckets = 140
	base       = float64(time.Millisecond)
	growth     = 1.1
)

var logGrowth = math.Log(growth)

type sketch struct {
	counts [numBuckets]uint32
	n      uint64
}

func bucketOf(d time.Duration) int {
	if float64(d) <= base {
		return 0
	}
	return min(int(math.Ceil(math.Log(float64(d)/base)/logGrowth)), numBuckets-1)
}

func bucketBound(i int) time.Duration {
	return time.Duration(base * math.Pow(growth, float64(i)))
}

func (s *sketch) observe(d time.Duration) {
	if i := bucketOf(d); s.counts[i] < math.MaxUint32 {
		s.counts[i]++
		s.n++
	}
}

func (s *sketch) merge(o *sketch) {
	for i, c := range o.counts {
		add := uint32(min(uint64(c), uint64(math.MaxUint32-s.counts[i])))
		s.counts[i] += add
		s.n += uint64(add)
	}
}

func (s *sketch) count() uint64 { return s.n }

// quantile is the upper bound of the bucket holding the q-th value.
func (s *sketch) quantile(q float64) time.Duration {
	if s.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(s.n)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range s.counts {
		seen += uint64(c)
		if seen >= rank {
			return bucketBound(i)
		}
	}
	return bucketBound(numBuckets - 1)
}
