// Package backoff retries an attempt at growing intervals: how a store
// that could not be reached is tried again in the background, so that a
// database outage heals without a restart or a reload.
package backoff

import "time"

// Bounds of the interval between two attempts.
const (
	First = time.Second
	Max   = 5 * time.Second
)

// Until calls try after First, then at doubling intervals capped at Max,
// until try reports that it is done or stop is closed.
func Until(stop <-chan struct{}, try func() (done bool)) {
	wait := First
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if try() {
			return
		}
		wait = min(2*wait, Max)
		t.Reset(wait)
	}
}

// Connect runs try at once and then as Until does, in the background.
// It returns once the first attempt has ended, or after wait if that
// attempt takes longer: a start waits briefly for a database that
// answers, and not for the whole connect timeout of one that drops
// packets.
func Connect(stop <-chan struct{}, wait time.Duration, try func() (done bool)) {
	first := make(chan struct{})
	go func() {
		done := try()
		close(first)
		if !done {
			Until(stop, try)
		}
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-first:
	case <-t.C:
	}
}
