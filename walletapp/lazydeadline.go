package walletapp

import (
	"context"
	"sync"
	"time"
)

// lazyDeadline is context.WithDeadline whose timer is started only when
// something waits on Done. Most admissions are served from memory (the
// key cache, the credit lease) and only ask Err, so they need no timer; a
// timer armed and stopped on every request was about 3 % of a billed
// request's CPU. Anything that does wait (a write, a database round trip,
// a context derived from this one) gets a real deadline.
type lazyDeadline struct {
	context.Context // the parent, for Value
	deadline        time.Time

	mu      sync.Mutex
	real    context.Context // made by the first Done before stop
	cancel  context.CancelFunc
	stopped bool // stop ran before any Done: nothing to stop, Done is closed
}

// closed is the Done of a lazyDeadline stopped before anything waited.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

var _ context.Context = (*lazyDeadline)(nil)

func withLazyDeadline(parent context.Context, d time.Time) (context.Context, context.CancelFunc) {
	if pd, ok := parent.Deadline(); ok && pd.Before(d) {
		d = pd
	}
	c := &lazyDeadline{Context: parent, deadline: d}
	return c, c.stop
}

func (c *lazyDeadline) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *lazyDeadline) Done() <-chan struct{} {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return closed
	}
	if c.real == nil {
		c.real, c.cancel = context.WithDeadline(c.Context, c.deadline)
	}
	r := c.real
	c.mu.Unlock()
	return r.Done()
}

func (c *lazyDeadline) Err() error {
	c.mu.Lock()
	r, stopped := c.real, c.stopped
	c.mu.Unlock()
	if r != nil {
		return r.Err()
	}
	if stopped {
		return context.Canceled
	}
	if err := c.Context.Err(); err != nil {
		return err
	}
	if !time.Now().Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// stop is the CancelFunc: whatever waits on Done afterwards finds it
// closed.
func (c *lazyDeadline) stop() {
	c.mu.Lock()
	if c.real == nil {
		c.stopped = true
		c.mu.Unlock()
		return
	}
	cancel := c.cancel
	c.mu.Unlock()
	cancel()
}
