// Package history owns what the status page shows about the past: per
// channel and per model counts of attempts by outcome class, rolled up in
// minutes (6 h), hours (48 h) and days (90 d), latency sketches, the last
// failure, and incidents derived from breaker-open periods and from models
// left with no working channel. Memory is bounded: fixed rings per series
// and a capped incident list.
//
// It must not know HTTP, Caddy, providers or how a failure was detected:
// callers classify each attempt (Class) and pass the time, so tests drive
// it with an injected clock.
package history

import (
	"time"
)

// Class is what an attempt's outcome says about its channel.
type Class int

const (
	// Success: the channel answered.
	Success Class = iota
	// Down: 5xx, network errors, timeouts, error frames, cut streams.
	Down
	// Limited: 429 and throttling; capacity, not an outage.
	Limited
	// Client: a 4xx the client caused; never held against the channel.
	Client
)

func (c Class) String() string {
	switch c {
	case Success:
		return "success"
	case Down:
		return "down"
	case Limited:
		return "limited"
	case Client:
		return "client"
	}
	return "unknown"
}

// Attempt is one upstream attempt's outcome (a channel's history) or one
// client request's (a model's), as history keeps it.
type Attempt struct {
	At      time.Time
	Model   string
	Channel string
	Class   Class
	// Reason is the failure reason ("" on success) and Status the upstream
	// status (0 when none), kept as the channel's last failure.
	Reason string
	Status int
	// TTFT is the time to first content; 0 when the attempt delivered none.
	TTFT         time.Duration
	OutputTokens int64
	// InputTokens is all the input the upstream reported, every cache
	// class included, and CacheReadTokens the part of it read from the
	// provider's prompt cache; both 0 when it reported none.
	InputTokens     int64
	CacheReadTokens int64
}

// Counts are the outcomes of some attempts.
type Counts struct {
	Attempts     int64
	Successes    int64
	Down         int64
	Limited      int64
	Client       int64
	OutputTokens int64
	// InputTokens and CacheReadTokens sum the attempts' (Attempt).
	InputTokens     int64
	CacheReadTokens int64
	TTFT            Sketch
}

func (c *Counts) add(a Attempt) {
	c.Attempts++
	switch a.Class {
	case Success:
		c.Successes++
	case Down:
		c.Down++
	case Limited:
		c.Limited++
	case Client:
		c.Client++
	}
	c.OutputTokens += a.OutputTokens
	c.InputTokens += a.InputTokens
	c.CacheReadTokens += a.CacheReadTokens
	if a.TTFT > 0 {
		c.TTFT.Observe(a.TTFT)
	}
}

// Merge adds o to c.
func (c *Counts) Merge(o *Counts) {
	c.Attempts += o.Attempts
	c.Successes += o.Successes
	c.Down += o.Down
	c.Limited += o.Limited
	c.Client += o.Client
	c.OutputTokens += o.OutputTokens
	c.InputTokens += o.InputTokens
	c.CacheReadTokens += o.CacheReadTokens
	c.TTFT.Merge(&o.TTFT)
}

// SuccessRate is successes over the attempts that say something about the
// channel (client errors excluded); false with no such attempts, where no
// rate is known (which is not 100 %).
func (c *Counts) SuccessRate() (float64, bool) {
	judged := c.Attempts - c.Client
	if judged <= 0 {
		return 0, false
	}
	return float64(c.Successes) / float64(judged), true
}

// CacheReadShare is the cache-read tokens over all input tokens, at most
// 1; false with no input tokens, where no share is known.
func (c *Counts) CacheReadShare() (float64, bool) {
	if c.InputTokens <= 0 {
		return 0, false
	}
	return min(float64(max(c.CacheReadTokens, 0))/float64(c.InputTokens), 1), true
}

// A channel's attempts, or a model's requests, are failing when at least
// FailingMin of them in the last FailingWindow said something about the
// upstream (client errors excluded) and fewer than FailingBelow of those
// succeeded: yellow before customers notice, not on one unlucky request.
const (
	FailingWindow = 5 * time.Minute
	FailingMin    = 5
	FailingBelow  = 0.95
)

// Failing applies the rule above to counts of the last FailingWindow.
func (c *Counts) Failing() bool {
	rate, _ := c.SuccessRate()
	return c.Attempts-c.Client >= FailingMin && rate < FailingBelow
}

// Rollup resolutions and how far back each reaches.
const (
	Minutes = 6 * 60 // one bucket per minute, 6 hours
	Hours   = 48     // one per hour, 48 hours
	Days    = 90     // one per day (UTC), 90 days
)

// bucket is one period's counts; start is the period's first instant in
// Unix seconds, 0 for a bucket never written.
type bucket struct {
	start int64
	Counts
}

// ring is fixed-size buckets of one width, indexed by period number modulo
// the ring size; a slot whose start is stale is reset when written.
type ring struct {
	width   int64 // seconds
	buckets []bucket
}

func newRing(width time.Duration, n int) ring {
	return ring{width: int64(width / time.Second), buckets: make([]bucket, n)}
}

func (r *ring) periodStart(t time.Time) int64 { return periodStart(t, r.width) }

// periodStart is the first instant, in Unix seconds, of the period of
// width seconds that holds t.
func periodStart(t time.Time, width int64) int64 {
	u := t.Unix()
	return u - ((u%width)+width)%width
}

func (r *ring) slot(start int64) *bucket {
	return &r.buckets[(start/r.width)%int64(len(r.buckets))]
}

func (r *ring) add(a Attempt) {
	if b := r.bucketAt(r.periodStart(a.At)); b != nil {
		b.add(a)
	}
}

// bucketAt is the bucket of the period starting at start, reset if its
// slot held an older period; nil when start is older than the ring
// reaches.
func (r *ring) bucketAt(start int64) *bucket {
	b := r.slot(start)
	if b.start != start {
		if b.start > start {
			return nil
		}
		*b = bucket{start: start}
	}
	return b
}

// sum merges the last d of buckets: the one holding now and the full ones
// before it, at least one.
func (r *ring) sum(now time.Time, d time.Duration) Counts {
	var c Counts
	r.each(now, d, func(b *bucket) { c.Merge(&b.Counts) })
	return c
}

// counts is sum without the latency sketches, cheap enough for every
// request, and when the first of those buckets that holds a failure
// began (zero when none does).
func (r *ring) counts(now time.Time, d time.Duration) (c Counts, firstFailure time.Time) {
	r.each(now, d, func(b *bucket) {
		c.Attempts += b.Attempts
		c.Successes += b.Successes
		c.Client += b.Client
		c.Down += b.Down
		c.Limited += b.Limited
		if firstFailure.IsZero() && b.Down+b.Limited > 0 {
			firstFailure = time.Unix(b.start, 0)
		}
	})
	return c, firstFailure
}

// each calls f with the written buckets of the last d, oldest first.
func (r *ring) each(now time.Time, d time.Duration, f func(*bucket)) {
	last := r.periodStart(now)
	first := last - (max(int64(d/time.Second)/r.width, 1)-1)*r.width
	for start := first; start <= last; start += r.width {
		if b := r.slot(start); b.start == start {
			f(b)
		}
	}
}

// bars returns the last n periods' counts, oldest first, ending with the
// period that holds now.
func (r *ring) bars(now time.Time, n int) []Bar {
	out := make([]Bar, n)
	last := r.periodStart(now)
	for i := range n {
		start := last - int64(n-1-i)*r.width
		out[i].Start = time.Unix(start, 0).UTC()
		if b := r.slot(start); b.start == start {
			out[i].Counts = b.Counts
		}
	}
	return out
}

// Bar is one period of a bar chart.
type Bar struct {
	Start time.Time
	Counts
}

// series is the history of one channel or one model.
type series struct {
	minutes, hours, days ring
	lastFailure          *Attempt
	// failingSince is when the current run of failing began (zero when
	// not failing), recovered when the last one ended: a model's status
	// and its since (noteFailing).
	failingSince, recovered time.Time
}

// noteFailing brings failingSince and recovered up to now. A run that
// aged out without traffic ended when its last failure left the window.
func (s *series) noteFailing(now time.Time) {
	w, first := s.minutes.counts(now, FailingWindow)
	switch failing := w.Failing(); {
	case failing && s.failingSince.IsZero():
		// From the first failure the window holds, to the minute.
		s.failingSince = now
		if !first.IsZero() && first.Before(now) {
			s.failingSince = first
		}
	case !failing && !s.failingSince.IsZero():
		s.failingSince, s.recovered = time.Time{}, now
		if s.lastFailure != nil {
			if aged := s.lastFailure.At.Add(FailingWindow); aged.Before(now) {
				s.recovered = aged
			}
		}
	}
}

func newSeries() *series {
	return &series{
		minutes: newRing(time.Minute, Minutes),
		hours:   newRing(time.Hour, Hours),
		days:    newRing(24*time.Hour, Days),
	}
}

func (s *series) add(a Attempt) {
	s.minutes.add(a)
	s.hours.add(a)
	s.days.add(a)
	if a.Class != Success && a.Class != Client && (s.lastFailure == nil || !a.At.Before(s.lastFailure.At)) {
		// Overwritten in place: a channel failing over every request
		// would otherwise allocate a copy each time. Readers copy it out.
		if s.lastFailure == nil {
			s.lastFailure = new(Attempt)
		}
		*s.lastFailure = a
	}
}

// window is the counts of the last d: from minutes up to 6 h, from hours
// beyond.
func (s *series) window(now time.Time, d time.Duration) Counts {
	if d <= Minutes*time.Minute {
		return s.minutes.sum(now, d)
	}
	if d <= Hours*time.Hour {
		return s.hours.sum(now, d)
	}
	return s.days.sum(now, d)
}
