package history

import (
	"math"
	"time"
)

// sketchBuckets is the number of latency buckets. Bucket i holds values up
// to sketchBase·sketchGrowth^i, so 32 buckets reach from 1 ms to about
// 7 minutes with at most 35% error on a quantile: enough to tell a 300 ms
// first token from a 3 s one, in 128 bytes per sketch.
const (
	sketchBuckets = 32
	sketchBase    = time.Millisecond
	sketchGrowth  = 1.5
)

// Sketch is a bounded latency histogram with log-spaced buckets. Sketches
// add up, so a window's quantile is exact up to bucket width however many
// minutes it merges.
type Sketch struct {
	counts [sketchBuckets]uint32
}

// bucketOf is the bucket holding d.
func bucketOf(d time.Duration) int {
	if d <= sketchBase {
		return 0
	}
	i := int(math.Ceil(math.Log(float64(d)/float64(sketchBase)) / math.Log(sketchGrowth)))
	return min(i, sketchBuckets-1)
}

// bucketBound is the largest value bucket i holds.
func bucketBound(i int) time.Duration {
	return time.Duration(float64(sketchBase) * math.Pow(sketchGrowth, float64(i)))
}

// Observe adds one value.
func (s *Sketch) Observe(d time.Duration) {
	if s.counts[bucketOf(d)] < math.MaxUint32 {
		s.counts[bucketOf(d)]++
	}
}

// SketchBuckets is how many buckets a Sketch has, for stores that keep
// them one per column.
const SketchBuckets = sketchBuckets

// Bucket is how many values bucket i holds.
func (s *Sketch) Bucket(i int) uint32 { return s.counts[i] }

// AddBucket adds n values to bucket i, as a store reads them back.
func (s *Sketch) AddBucket(i int, n uint32) {
	s.counts[i] = uint32(min(uint64(s.counts[i])+uint64(n), math.MaxUint32))
}

// Merge adds o's values to s.
func (s *Sketch) Merge(o *Sketch) {
	for i, n := range o.counts {
		s.AddBucket(i, n)
	}
}

// Count is how many values the sketch holds.
func (s *Sketch) Count() uint64 {
	var n uint64
	for _, c := range s.counts {
		n += uint64(c)
	}
	return n
}

// Quantile is the upper bound of the bucket that holds the q-th value
// (0 < q ≤ 1); 0 when the sketch is empty.
func (s *Sketch) Quantile(q float64) time.Duration {
	total := s.Count()
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for i, c := range s.counts {
		seen += uint64(c)
		if seen >= rank {
			return bucketBound(i)
		}
	}
	return bucketBound(sketchBuckets - 1)
}
