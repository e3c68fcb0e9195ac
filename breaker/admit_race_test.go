package breaker

import (
	"testing"
	"time"
)

// Admit reads the published deadline without the mutex, then decides
// under it. When the channel re-trips (its trial failed) or is parked (its
// trial got a 429) between the two, the decision under the mutex must
// refuse: the channel is open or parked by then. It admitted the request
// instead, as a non-trial, past the trial limit.
func TestAdmitRefusesAChannelThatOpenedWhileItWaitedForTheLock(t *testing.T) {
	for _, c := range []struct {
		name  string
		block func(b *Breaker, n int64)
		want  State
	}{
		{"re-tripped", func(b *Breaker, n int64) { b.tripLocked(n) }, Open},
		{"parked", func(b *Breaker, n int64) {
			b.parkedUntil, b.parkedAt = n+int64(30*time.Second), n
			b.publishLocked()
		}, Parked},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := New(Config{Cooldown: time.Minute})
			failN(b, at(0), 3)
			now := at(time.Minute) // half-open: recovering, nothing blocked
			type result struct {
				tk Ticket
				ok bool
			}
			done := make(chan result, 1)
			avail := make(chan bool, 1)
			b.mu.Lock()
			go func() {
				tk, ok := b.Admit(now)
				done <- result{tk, ok}
			}()
			go func() { avail <- b.Available(now) }()
			// Let Admit pass its lock-free checks and wait for the mutex.
			time.Sleep(100 * time.Millisecond)
			c.block(b, now.UnixNano())
			b.mu.Unlock()
			r := <-done
			if st := b.State(now); st != c.want {
				t.Fatalf("state %s, want %s", st, c.want)
			}
			if r.ok {
				r.tk.Done()
				t.Errorf("admitted to a %s channel (trial %v)", c.want, r.tk.Trial())
			}
			if <-avail {
				t.Errorf("Available reported a %s channel available", c.want)
			}
		})
	}
}
