// Package expiry orders keys by when they expire: what a bounded table
// forgets first, and what its sweep takes, without reading every entry
// under the table's lock.
package expiry

import (
	"container/heap"
	"time"
)

// Queue is a set of keys, each with its expiry, soonest first; of two
// that expire at the same time, the one set earlier comes first. Adding,
// moving and removing a key cost O(log n). It is not safe for concurrent
// use: the table that owns it guards it.
type Queue[K comparable] struct {
	h     byExpiry[K]
	index map[K]int // a key's place in h
	seq   uint64
}

type item[K comparable] struct {
	key     K
	expires time.Time
	seq     uint64
}

// Set gives key the expiry at, adding it when it is not in q.
func (q *Queue[K]) Set(key K, at time.Time) {
	if q.index == nil {
		q.index = make(map[K]int)
		q.h.index = q.index
	}
	q.seq++
	if i, ok := q.index[key]; ok {
		q.h.items[i].expires, q.h.items[i].seq = at, q.seq
		heap.Fix(&q.h, i)
		return
	}
	heap.Push(&q.h, item[K]{key: key, expires: at, seq: q.seq})
}

// Remove takes key out of q, if it is there.
func (q *Queue[K]) Remove(key K) {
	if i, ok := q.index[key]; ok {
		heap.Remove(&q.h, i)
	}
}

// First is the key that expires soonest, and when; ok is false when q is
// empty.
func (q *Queue[K]) First() (key K, at time.Time, ok bool) {
	if len(q.h.items) == 0 {
		return key, at, false
	}
	return q.h.items[0].key, q.h.items[0].expires, true
}

// Len is how many keys q holds.
func (q *Queue[K]) Len() int { return len(q.h.items) }

// byExpiry is the heap (container/heap) under a Queue; it keeps index.
type byExpiry[K comparable] struct {
	items []item[K]
	index map[K]int
}

func (h byExpiry[K]) Len() int { return len(h.items) }
func (h byExpiry[K]) Less(i, j int) bool {
	a, b := &h.items[i], &h.items[j]
	if !a.expires.Equal(b.expires) {
		return a.expires.Before(b.expires)
	}
	return a.seq < b.seq
}
func (h byExpiry[K]) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.index[h.items[i].key], h.index[h.items[j].key] = i, j
}
func (h *byExpiry[K]) Push(x any) {
	it := x.(item[K])
	h.index[it.key] = len(h.items)
	h.items = append(h.items, it)
}
func (h *byExpiry[K]) Pop() any {
	last := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	delete(h.index, last.key)
	return last
}
