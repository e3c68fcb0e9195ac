package expiry

import (
	"math/rand/v2"
	"testing"
	"time"
)

// Against a plain map: after any mix of Set and Remove, First is the
// soonest expiry (the earliest set among equals) and Len the count.
func TestQueueAgreesWithAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	base := time.Unix(1_800_000_000, 0)
	var q Queue[int]
	type want struct {
		at  time.Time
		seq int
	}
	m := map[int]want{}
	for step := range 20000 {
		k := rng.IntN(300)
		if rng.IntN(4) == 0 {
			q.Remove(k)
			delete(m, k)
		} else {
			at := base.Add(time.Duration(rng.IntN(50)) * time.Second) // many ties
			q.Set(k, at)
			m[k] = want{at, step}
		}
		if q.Len() != len(m) {
			t.Fatalf("step %d: %d keys, want %d", step, q.Len(), len(m))
		}
		k, at, ok := q.First()
		if !ok {
			if len(m) != 0 {
				t.Fatalf("step %d: empty with %d keys", step, len(m))
			}
			continue
		}
		for other, w := range m {
			if w.at.Before(at) || w.at.Equal(at) && w.seq < m[k].seq {
				t.Fatalf("step %d: first is %d at %v, but %d expires at %v (set at %d, not %d)", step, k, at, other, w.at, w.seq, m[k].seq)
			}
		}
		if !m[k].at.Equal(at) {
			t.Fatalf("step %d: %d's expiry %v, want %v", step, k, at, m[k].at)
		}
	}
}

func TestQueueEmpty(t *testing.T) {
	var q Queue[string]
	q.Remove("absent")
	if _, _, ok := q.First(); ok || q.Len() != 0 {
		t.Fatal("an empty queue has a first key")
	}
}
