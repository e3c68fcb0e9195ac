package history

import (
	"sort"
	"time"
)

// Resolution names one rollup, as a store keys its buckets.
type Resolution string

const (
	ByMinute Resolution = "m"
	ByHour   Resolution = "h"
	ByDay    Resolution = "d"
)

// Resolutions are every rollup, finest first.
var Resolutions = [...]Resolution{ByMinute, ByHour, ByDay}

// Width is the period one bucket of the resolution covers.
func (res Resolution) Width() time.Duration {
	switch res {
	case ByHour:
		return time.Hour
	case ByDay:
		return 24 * time.Hour
	}
	return time.Minute
}

// Reach is how far back the resolution's rollup goes; a store may drop
// older buckets.
func (res Resolution) Reach() time.Duration {
	switch res {
	case ByHour:
		return Hours * time.Hour
	case ByDay:
		return Days * 24 * time.Hour
	}
	return Minutes * time.Minute
}

// Scopes of a series.
const (
	ScopeChannel = "channel"
	ScopeModel   = "model"
)

// Delta is what one bucket of one series gained: the unit a store adds up
// (several instances' deltas to one bucket sum to the fleet's counts).
type Delta struct {
	Scope string // ScopeChannel or ScopeModel
	Name  string
	Res   Resolution
	Start int64 // the period's first instant, Unix seconds
	Counts
}

type deltaKey struct {
	scope, name string
	res         Resolution
	start       int64
}

func (s *series) ring(res Resolution) *ring {
	switch res {
	case ByHour:
		return &s.hours
	case ByDay:
		return &s.days
	}
	return &s.minutes
}

// Track makes the recorder keep, besides its rollups, what each bucket
// gained since the last TakeChanges, for a store to flush. Without Track
// nothing is kept.
//
// The first Track(true) also makes pending what was recorded before: a
// reload that gives a running gateway its first store hands the store
// the history the page showed, which the page reads from the store from
// then on. (A later one does not: that history went to a store already.)
func (r *Recorder) Track(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !on {
		r.changes = nil
		return
	}
	if r.changes != nil {
		return
	}
	r.changes = map[deltaKey]*Counts{}
	if r.tracked {
		return
	}
	r.tracked = true
	for _, sc := range []struct {
		scope  string
		series map[string]*series
	}{{ScopeChannel, r.channels}, {ScopeModel, r.models}} {
		for name, s := range sc.series {
			for _, res := range Resolutions {
				rg := s.ring(res)
				for i := range rg.buckets {
					if b := &rg.buckets[i]; b.start != 0 {
						c := b.Counts
						r.changes[deltaKey{sc.scope, name, res, b.start}] = &c
					}
				}
			}
		}
	}
}

// track adds one outcome to the pending changes of its series' buckets;
// r.mu is held.
func (r *Recorder) track(scope, name string, a Attempt) {
	if r.changes == nil {
		return
	}
	for _, res := range Resolutions {
		k := deltaKey{scope, name, res, periodStart(a.At, int64(res.Width()/time.Second))}
		c := r.changes[k]
		if c == nil {
			c = new(Counts)
			r.changes[k] = c
		}
		c.add(a)
	}
}

// TakeChanges returns the pending changes, in key order (so that writers
// lock a store's rows in one order), and forgets them.
func (r *Recorder) TakeChanges() []Delta {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.pendingLocked()
	if r.changes != nil {
		clear(r.changes)
	}
	return out
}

// Changes returns a copy of the pending changes without forgetting them:
// what a reader of the store adds to see this instance's latest attempts.
func (r *Recorder) Changes() []Delta {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pendingLocked()
}

func (r *Recorder) pendingLocked() []Delta {
	out := make([]Delta, 0, len(r.changes))
	for k, c := range r.changes {
		out = append(out, Delta{Scope: k.scope, Name: k.name, Res: k.res, Start: k.start, Counts: *c})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Res != b.Res {
			return a.Res < b.Res
		}
		if a.Start != b.Start {
			return a.Start < b.Start
		}
		if a.Scope != b.Scope {
			return a.Scope < b.Scope
		}
		return a.Name < b.Name
	})
	return out
}

// PutBack returns changes a store failed to write to the pending ones,
// dropping those older than their rollup reaches at now, so a store that
// stays down costs at most one entry per bucket of every series.
func (r *Recorder) PutBack(ds []Delta, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.changes == nil {
		return
	}
	for _, d := range ds {
		if d.Start < now.Add(-d.Res.Reach()).Unix() {
			continue
		}
		k := deltaKey{d.Scope, d.Name, d.Res, d.Start}
		c := r.changes[k]
		if c == nil {
			c = new(Counts)
			r.changes[k] = c
		}
		c.Merge(&d.Counts)
	}
}

// AddDelta adds a bucket's counts read from a store to the rollups (not
// to the pending changes); a bucket older than its ring reaches is
// dropped.
func (r *Recorder) AddDelta(d Delta) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.channels
	if d.Scope == ScopeModel {
		m = r.models
	}
	if b := seriesOf(m, d.Name).ring(d.Res).bucketAt(d.Start); b != nil {
		b.Merge(&d.Counts)
	}
}
