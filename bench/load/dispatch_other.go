//go:build !linux

package main

import "time"

// clock sends the open loop's requests on time; off Linux it is Go's own
// timer (millisecond granularity: see dispatch_linux.go).
type clock struct{}

func newClock() *clock { return &clock{} }

func (*clock) sleepUntil(due time.Time) {
	if d := time.Until(due); d > 0 {
		time.Sleep(d)
	}
}

func (*clock) release() {}
