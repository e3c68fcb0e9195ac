// Package journal owns the decision journal: a bounded in-memory ring of
// failover decisions (which channel failed, why, what came next), queried
// with filters and counted by channel, reason or model. It answers "show
// me the failovers with reason=X grouped by channel in this hour".
//
// It must not know HTTP, Caddy or why a channel failed: callers fill in
// each Decision.
package journal

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// DefaultSize is how many decisions a journal keeps when asked for none.
const DefaultSize = 10000

// Decision is one failover decision: an attempt failed and the gateway
// moved on (or ran out of candidates: Next is "").
type Decision struct {
	At        time.Time `json:"at"`
	RequestID string    `json:"request_id,omitempty"`
	// TraceID is the request's OpenTelemetry trace, when it was traced.
	TraceID        string        `json:"trace_id,omitempty"`
	Model          string        `json:"model"`
	Channel        string        `json:"channel"`
	Attempt        int           `json:"attempt"`
	Reason         string        `json:"reason"`
	UpstreamStatus int           `json:"upstream_status,omitempty"`
	Elapsed        time.Duration `json:"elapsed_ns"`
	Remaining      time.Duration `json:"remaining_budget_ns"`
	Next           string        `json:"next_channel,omitempty"`
	// DeliveredTokens is how much of the answer the client already had
	// when its stream broke (reason "resumed"; the gateway's estimate).
	DeliveredTokens int64 `json:"delivered_tokens,omitempty"`
	// Form is how the continuation was asked for (reason "resumed":
	// prefill or instructed).
	Form string `json:"form,omitempty"`
	// DeadlineKind and Deadline are the learned deadline that ended the
	// attempt (adaptive_deadlines): which wait (header, first_content or
	// gap) and how long it was.
	DeadlineKind string        `json:"deadline_kind,omitempty"`
	Deadline     time.Duration `json:"deadline_ns,omitempty"`
	// CostMicros is what a hedge's losing attempt cost upstream (reason
	// hedge_lost), in millionths of a dollar.
	CostMicros int64 `json:"cost_micros,omitempty"`
}

// Journal is a fixed-size ring of decisions, safe for concurrent use.
type Journal struct {
	mu   sync.Mutex
	ring []Decision
	next int  // where the next decision goes
	full bool // the ring has wrapped
	// pending are the decisions added since a store last took them, at
	// most len(ring); nil unless Track.
	pending []Decision
	track   bool
}

// New returns a journal that keeps the last size decisions.
func New(size int) *Journal {
	if size <= 0 {
		size = DefaultSize
	}
	return &Journal{ring: make([]Decision, size)}
}

// Add records one decision, dropping the oldest when full.
func (j *Journal) Add(d Decision) {
	j.mu.Lock()
	j.ring[j.next] = d
	j.next++
	if j.next == len(j.ring) {
		j.next, j.full = 0, true
	}
	if j.track {
		j.keep(d)
	}
	j.mu.Unlock()
}

// keep adds d to the pending decisions, dropping the oldest beyond the
// ring's size; j.mu is held.
func (j *Journal) keep(ds ...Decision) {
	j.pending = append(j.pending, ds...)
	if over := len(j.pending) - len(j.ring); over > 0 {
		j.pending = append(j.pending[:0], j.pending[over:]...)
	}
}

// Track makes the journal keep the decisions added from now on for a
// store to take (TakeChanges); off forgets them.
func (j *Journal) Track(on bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.track = on
	if !on {
		j.pending = nil
	}
}

// TakeChanges returns the pending decisions, oldest first, and forgets
// them.
func (j *Journal) TakeChanges() []Decision {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := j.pending
	j.pending = nil
	return out
}

// Changes returns a copy of the pending decisions, oldest first.
func (j *Journal) Changes() []Decision {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]Decision(nil), j.pending...)
}

// PutBack returns decisions a store failed to write to the pending ones,
// ahead of those added since.
func (j *Journal) PutBack(ds []Decision) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.track {
		return
	}
	later := j.pending
	j.pending = nil
	j.keep(ds...)
	j.keep(later...)
}

// Filter selects decisions; empty fields match all.
type Filter struct {
	Reason, Channel, Model string
	Since                  time.Time
}

func (f Filter) match(d *Decision) bool {
	return (f.Reason == "" || d.Reason == f.Reason) &&
		(f.Channel == "" || d.Channel == f.Channel) &&
		(f.Model == "" || d.Model == f.Model) &&
		!d.At.Before(f.Since)
}

// Query returns the matching decisions, newest first, at most limit of
// them (all when limit ≤ 0).
func (j *Journal) Query(f Filter, limit int) []Decision {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []Decision
	n := j.next
	if j.full {
		n = len(j.ring)
	}
	for i := 1; i <= n; i++ {
		d := &j.ring[(j.next-i+len(j.ring))%len(j.ring)]
		if f.match(d) {
			out = append(out, *d)
			if limit > 0 && len(out) == limit {
				break
			}
		}
	}
	return out
}

// Count is how many decisions share one key.
type Count struct {
	Key   string `json:"key"`
	Count int    `json:"count"`
}

// GroupBy names the field Group counts by.
type GroupBy string

const (
	ByChannel GroupBy = "channel"
	ByReason  GroupBy = "reason"
	ByModel   GroupBy = "model"
)

// ParseGroupBy accepts channel, reason or model.
func ParseGroupBy(s string) (GroupBy, error) {
	switch g := GroupBy(s); g {
	case ByChannel, ByReason, ByModel:
		return g, nil
	}
	return "", fmt.Errorf("cannot group by %q: use channel, reason or model", s)
}

// Group counts decisions by one field, most frequent first (ties by key).
func Group(ds []Decision, by GroupBy) []Count {
	counts := map[string]int{}
	for i := range ds {
		switch by {
		case ByChannel:
			counts[ds[i].Channel]++
		case ByReason:
			counts[ds[i].Reason]++
		case ByModel:
			counts[ds[i].Model]++
		}
	}
	out := make([]Count, 0, len(counts))
	for k, n := range counts {
		out = append(out, Count{Key: k, Count: n})
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].Count != out[b].Count {
			return out[a].Count > out[b].Count
		}
		return out[a].Key < out[b].Key
	})
	return out
}
