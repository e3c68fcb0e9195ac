package breaker

import (
	"testing"
	"time"
)

// A channel a failed synthetic check opened (Trip, one failure in the
// window) must come back half-open after its cooldown: one trial at a
// time, and the open → half_open change reported to the first one. It
// came back closed instead, with every request sent to a channel whose
// last evidence is a failure, and no call reporting it left Open.
func TestTripByProbeEndsHalfOpen(t *testing.T) {
	b := New(Config{Cooldown: time.Minute})
	b.RecordFailure(at(0))
	if tr := b.Trip(at(0)); tr != (Transition{Closed, Open}) {
		t.Fatalf("Trip transition = %+v, want closed->open", tr)
	}
	now := at(time.Minute)
	wantState(t, b, now, HalfOpen)
	tk, ok := b.Admit(now)
	if !ok || !tk.Trial() || !tk.HalfOpened {
		t.Fatalf("first admission after the cooldown: ok %v trial %v half_opened %v; want a reported trial", ok, tk.Trial(), tk.HalfOpened)
	}
	if _, ok := b.Admit(now); ok {
		t.Fatal("a second request admitted while the only trial runs")
	}
	tk.Done()
}

// Failures spread over the window trip the breaker; when the oldest of
// them ages out during the cooldown, the channel still gets a half-open
// trial rather than the whole load at once.
func TestTripWhoseOldestFailureAgesOutDuringCooldownEndsHalfOpen(t *testing.T) {
	b := New(Config{})
	b.RecordFailure(at(0))
	b.RecordFailure(at(4*time.Minute + 30*time.Second))
	if tr := b.RecordFailure(at(4*time.Minute + 50*time.Second)); tr != (Transition{Closed, Open}) {
		t.Fatalf("third failure transition = %+v, want closed->open", tr)
	}
	now := at(5*time.Minute + 50*time.Second) // cooldown over; the failure at 0 is out of the window
	wantState(t, b, now, HalfOpen)
	tk, ok := b.Admit(now)
	if !ok || !tk.Trial() || !tk.HalfOpened {
		t.Fatalf("first admission after the cooldown: ok %v trial %v half_opened %v; want a reported trial", ok, tk.Trial(), tk.HalfOpened)
	}
	if _, ok := b.Admit(now); ok {
		t.Fatal("a second request admitted while the only trial runs")
	}
	tk.Done()
}
