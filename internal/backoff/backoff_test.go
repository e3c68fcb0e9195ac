package backoff

import (
	"context"
	"testing"
	"time"
)

func TestUntilStopsWhenDone(t *testing.T) {
	n := 0
	start := time.Now()
	Until(nil, func() bool { n++; return n == 2 })
	// First, then 2×First: about three seconds.
	if n != 2 || time.Since(start) < 3*First {
		t.Errorf("%d attempts in %v", n, time.Since(start))
	}
}

func TestUntilStops(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	tries := 0
	go func() {
		defer close(done)
		Until(stop, func() bool { tries++; return false })
	}()
	close(stop)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Until did not return after stop")
	}
	if tries != 0 {
		t.Errorf("%d attempts after an immediate stop", tries)
	}
}

func TestConnectWaitsAtMostWait(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	start := time.Now()
	Connect(stop, 50*time.Millisecond, func() bool { return true })
	if d := time.Since(start); d > time.Second {
		t.Errorf("an attempt that succeeds at once took %v", d)
	}
	start = time.Now()
	release := make(chan struct{})
	Connect(stop, 50*time.Millisecond, func() bool { <-release; return true })
	if d := time.Since(start); d > time.Second {
		t.Errorf("Connect waited %v for a hanging attempt, want 50ms", d)
	}
	close(release)

	start = time.Now()
	tries := make(chan struct{}, 10)
	Connect(stop, time.Minute, func() bool { tries <- struct{}{}; return false })
	if d := time.Since(start); d > time.Second {
		t.Errorf("Connect waited %v after a first attempt that failed at once", d)
	}
	select {
	case <-tries:
	default:
		t.Error("no first attempt")
	}
	select {
	case <-tries:
	case <-time.After(First + time.Second):
		t.Error("no attempt after the first interval")
	}
}

func TestSleep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	if !Sleep(ctx, time.Millisecond) || !Sleep(ctx, 0) {
		t.Fatal("a wait with the context alive was cut short")
	}
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	start := time.Now()
	if Sleep(ctx, time.Hour) || time.Since(start) > time.Minute {
		t.Fatal("an ended context did not end the wait")
	}
	if Sleep(ctx, 0) || Sleep(ctx, time.Hour) {
		t.Fatal("a wait on an ended context passed")
	}
}
