// Package backoff waits between tries: Until retries an attempt at
// growing intervals (how a store that could not be reached is tried again
// in the background, so that a database outage heals without a restart or
// a reload), and Sleep waits as long as a context lives.
package backoff

import (
	"context"
	"time"
)

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

// Sleep waits d unless ctx ends first, and reports whether all of d
// passed with ctx alive (for d <= 0: whether ctx is alive). Every wait
// that a request, a test server's Close or a departing client may cut
// short goes through it, rather than a bare time.Sleep.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
