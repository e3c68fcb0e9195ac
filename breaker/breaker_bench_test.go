package breaker

import (
	"testing"
	"time"
)

func BenchmarkAvailable(b *testing.B) {
	br := New(Config{})
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		br.Available(now)
	}
}

func BenchmarkAvailableParallel(b *testing.B) {
	br := New(Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			br.Available(t0)
		}
	})
}

func BenchmarkRecordFailure(b *testing.B) {
	// Clock advances so the breaker cycles through open, half-open and
	// re-open instead of measuring only the already-open branch.
	br := New(Config{Window: time.Second, Cooldown: 10 * time.Millisecond})
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		br.RecordFailure(now)
	}
}

func BenchmarkRecordFailureRatio(b *testing.B) {
	br := New(Config{Window: time.Second, Cooldown: 10 * time.Millisecond, MinCalls: 20, FailureRatio: 0.5})
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		br.RecordFailure(now)
	}
}

func BenchmarkRecordSuccess(b *testing.B) {
	br := New(Config{})
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		br.RecordSuccess(now)
	}
}

func BenchmarkMixed(b *testing.B) {
	br := New(Config{Window: time.Second, Cooldown: 10 * time.Millisecond})
	now := t0
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		if br.Available(now) {
			if i%4 == 0 {
				br.RecordFailure(now)
			} else {
				br.RecordSuccess(now)
			}
		}
		i++
	}
}
