package breaker_test

import (
	"fmt"
	"time"

	"github.com/llmfailover/caddy-llm-failover/breaker"
)

func Example() {
	start := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	b := breaker.New(breaker.Config{}) // 5m window, 3 failures, 60s cooldown

	for i := range 3 {
		t := b.RecordFailure(start.Add(time.Duration(i) * time.Second))
		if t.Changed() {
			fmt.Println(t.From, "->", t.To)
		}
	}
	now := start.Add(10 * time.Second)
	fmt.Println(b.Available(now), b.ReadyAt(now).Sub(start))

	now = start.Add(65 * time.Second)
	fmt.Println(b.State(now), b.RecordSuccess(now).To)
	// Output:
	// closed -> open
	// false 1m2s
	// half_open closed
}

func ExampleBreaker_Park() {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	b := breaker.New(breaker.Config{MaxPark: time.Minute})

	if d, ok := breaker.ParseRetryAfter("600", now); ok {
		until, t := b.Park(now, d)
		fmt.Println(until.Sub(now), t.To)
	}
	fmt.Println(b.Snapshot(now).FailuresInWindow)
	// Output:
	// 1m0s parked
	// 0
}
