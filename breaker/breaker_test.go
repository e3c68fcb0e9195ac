package breaker

import (
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func wantState(t *testing.T, b *Breaker, now time.Time, want State) {
	t.Helper()
	if got := b.State(now); got != want {
		t.Fatalf("State(t0+%s) = %s, want %s", now.Sub(t0), got, want)
	}
	if got, wantAvail := b.Available(now), want == Closed || want == HalfOpen; got != wantAvail {
		t.Fatalf("Available(t0+%s) = %v, want %v (state %s)", now.Sub(t0), got, wantAvail, want)
	}
}

func failN(b *Breaker, now time.Time, n int) Transition {
	var tr Transition
	for range n {
		tr = b.RecordFailure(now)
	}
	return tr
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{Closed: "closed", HalfOpen: "half_open", Open: "open", Parked: "parked", State(9): "State(9)"} {
		if got := s.String(); got != want {
			t.Errorf("State(%d).String() = %q, want %q", s, got, want)
		}
	}
}

func TestConfigDefaultsAndValidate(t *testing.T) {
	d := Config{}.WithDefaults()
	want := Config{Window: 5 * time.Minute, Failures: 3, Cooldown: 60 * time.Second, MaxPark: 5 * time.Minute, Park: 10 * time.Second, Trials: 1}
	if d != want {
		t.Fatalf("WithDefaults = %+v, want %+v", d, want)
	}
	if got := New(Config{}).Config(); got != want {
		t.Fatalf("New(Config{}).Config() = %+v, want %+v", got, want)
	}

	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero", Config{}, true},
		{"ratio", Config{MinCalls: 20, FailureRatio: 0.5}, true},
		{"ratio one", Config{MinCalls: 100, FailureRatio: 1}, true},
		{"ratio ignored without min calls", Config{FailureRatio: 7}, true},
		{"max failures", Config{Failures: MaxFailures}, true},
		{"too many failures", Config{Failures: MaxFailures + 1}, false},
		{"negative failures", Config{Failures: -1}, false},
		{"negative window", Config{Window: -time.Second}, false},
		{"negative cooldown", Config{Cooldown: -time.Second}, false},
		{"negative max park", Config{MaxPark: -time.Second}, false},
		{"negative park", Config{Park: -time.Second}, false},
		{"negative trials", Config{Trials: -1}, false},
		{"several trials", Config{Trials: 4}, true},
		{"min calls over ring", Config{MinCalls: 101, FailureRatio: 0.5}, false},
		{"negative min calls", Config{MinCalls: -1}, false},
		{"ratio zero", Config{MinCalls: 10}, false},
		{"ratio above one", Config{MinCalls: 10, FailureRatio: 1.01}, false},
		{"ratio NaN", Config{MinCalls: 10, FailureRatio: math.NaN()}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, does not wrap ErrInvalidConfig", err)
			}
		})
	}
}

func TestNewClampsInvalidConfig(t *testing.T) {
	got := New(Config{Failures: 500, Window: -1, MinCalls: 10, FailureRatio: 2}).Config()
	if got.Failures != MaxFailures || got.Window != DefaultWindow || got.MinCalls != 0 {
		t.Fatalf("sanitized config = %+v, want Failures=%d Window=%s MinCalls=0", got, MaxFailures, DefaultWindow)
	}
}

func TestWindowForgetsOldFailures(t *testing.T) {
	b := New(Config{})
	failN(b, at(0), 2)
	tr := b.RecordFailure(at(5*time.Minute + time.Second))
	if tr != (Transition{Closed, Closed}) {
		t.Fatalf("transition = %+v, want closed->closed", tr)
	}
	wantState(t, b, at(5*time.Minute+time.Second), Closed)
	if s := b.Snapshot(at(5*time.Minute + time.Second)); s.FailuresInWindow != 1 {
		t.Fatalf("FailuresInWindow = %d, want 1", s.FailuresInWindow)
	}
}

func TestWindowBoundary(t *testing.T) {
	b := New(Config{})
	failN(b, at(0), 2)
	// A failure exactly Window old has left the window.
	if tr := b.RecordFailure(at(5 * time.Minute)); tr.Changed() {
		t.Fatalf("transition = %+v, want no change", tr)
	}
	b = New(Config{})
	failN(b, at(0), 2)
	if tr := b.RecordFailure(at(5*time.Minute - time.Nanosecond)); tr != (Transition{Closed, Open}) {
		t.Fatalf("transition = %+v, want closed->open", tr)
	}
}

func TestThresholdOpens(t *testing.T) {
	b := New(Config{})
	if tr := b.RecordFailure(at(0)); tr.Changed() {
		t.Fatalf("first failure changed state: %+v", tr)
	}
	b.RecordFailure(at(time.Minute))
	wantState(t, b, at(time.Minute), Closed)
	tr := b.RecordFailure(at(2 * time.Minute))
	if tr != (Transition{Closed, Open}) || !tr.Changed() {
		t.Fatalf("third failure transition = %+v, want closed->open", tr)
	}
	wantState(t, b, at(2*time.Minute), Open)
	if got, want := b.ReadyAt(at(2*time.Minute)), at(3*time.Minute); !got.Equal(want) {
		t.Fatalf("ReadyAt = %s, want %s", got, want)
	}
	s := b.Snapshot(at(2*time.Minute + 10*time.Second))
	if s.State != Open || s.FailuresInWindow != 3 || s.Opened != 1 ||
		!s.OpenUntil.Equal(at(3*time.Minute)) || s.RetryIn != 50*time.Second || !s.ParkedUntil.IsZero() {
		t.Fatalf("snapshot = %+v", s)
	}
}

func TestFailureWhileOpenKeepsDeadline(t *testing.T) {
	b := New(Config{})
	failN(b, at(0), 3)
	if tr := b.RecordFailure(at(30 * time.Second)); tr != (Transition{Open, Open}) {
		t.Fatalf("late failure transition = %+v", tr)
	}
	if got := b.ReadyAt(at(30 * time.Second)); !got.Equal(at(time.Minute)) {
		t.Fatalf("ReadyAt after late failure = %s, want t0+1m", got.Sub(t0))
	}
	if s := b.Snapshot(at(30 * time.Second)); s.Opened != 1 {
		t.Fatalf("Opened = %d, want 1", s.Opened)
	}
}

func TestCooldownEndsHalfOpen(t *testing.T) {
	b := New(Config{})
	failN(b, at(0), 3)
	wantState(t, b, at(59*time.Second), Open)
	wantState(t, b, at(60*time.Second), HalfOpen)
	if got := b.ReadyAt(at(61 * time.Second)); !got.Equal(at(61 * time.Second)) {
		t.Fatalf("ReadyAt when available = %s, want now", got.Sub(t0))
	}
	if s := b.Snapshot(at(61 * time.Second)); s.RetryIn != 0 || !s.OpenUntil.IsZero() || s.State != HalfOpen {
		t.Fatalf("snapshot = %+v", s)
	}
	// Once the failures age out the breaker is closed with no trial pending.
	wantState(t, b, at(5*time.Minute+time.Second), Closed)
}

func TestHalfOpenFailureReopensWithFreshDeadline(t *testing.T) {
	b := New(Config{})
	failN(b, at(0), 3)
	reopenAt := at(90 * time.Second)
	tr := b.RecordFailure(reopenAt)
	if tr != (Transition{HalfOpen, Open}) {
		t.Fatalf("transition = %+v, want half_open->open", tr)
	}
	want := reopenAt.Add(60 * time.Second)
	if got := b.ReadyAt(reopenAt); !got.Equal(want) {
		t.Fatalf("ReadyAt = t0+%s, want t0+%s", got.Sub(t0), want.Sub(t0))
	}
	wantState(t, b, at(149*time.Second), Open)
	wantState(t, b, at(150*time.Second), HalfOpen)
	if s := b.Snapshot(reopenAt); s.Opened != 2 {
		t.Fatalf("Opened = %d, want 2", s.Opened)
	}
}

func TestHalfOpenSuccessCloses(t *testing.T) {
	b := New(Config{})
	failN(b, at(0), 3)
	tr := b.RecordSuccess(at(61 * time.Second))
	if tr != (Transition{HalfOpen, Closed}) {
		t.Fatalf("transition = %+v, want half_open->closed", tr)
	}
	if s := b.Snapshot(at(61 * time.Second)); s.FailuresInWindow != 0 {
		t.Fatalf("FailuresInWindow = %d, want 0", s.FailuresInWindow)
	}
	// The old failures are gone, so two new ones inside the window must
	// not trip it; the third does.
	failN(b, at(62*time.Second), 2)
	wantState(t, b, at(62*time.Second), Closed)
	if tr := b.RecordFailure(at(63 * time.Second)); tr != (Transition{Closed, Open}) {
		t.Fatalf("transition = %+v, want closed->open", tr)
	}
}

func TestSuccessWhileOpenDoesNotClose(t *testing.T) {
	b := New(Config{})
	failN(b, at(0), 3)
	if tr := b.RecordSuccess(at(10 * time.Second)); tr != (Transition{Open, Open}) {
		t.Fatalf("transition = %+v, want open->open", tr)
	}
	wantState(t, b, at(60*time.Second), HalfOpen)
}

func TestRatioMode(t *testing.T) {
	cfg := Config{MinCalls: 20, FailureRatio: 0.5}

	t.Run("noise on busy channel", func(t *testing.T) {
		b := New(cfg)
		now := at(0)
		for i := range 203 {
			now = now.Add(time.Millisecond)
			if i%67 == 66 {
				b.RecordFailure(now)
			} else {
				b.RecordSuccess(now)
			}
		}
		s := b.Snapshot(now)
		if s.State != Closed || s.FailuresInWindow != 3 || s.Opened != 0 {
			t.Fatalf("snapshot = %+v, want closed with 3 failures in window", s)
		}
		// The same history in count mode would have opened.
		c := New(Config{})
		failN(c, now, 3)
		if c.State(now) != Open {
			t.Fatal("count mode control did not open")
		}
	})

	t.Run("sixty percent failing opens", func(t *testing.T) {
		b := New(cfg)
		now := at(0)
		var opened Transition
		for i := range 100 {
			now = now.Add(time.Millisecond)
			if i%5 < 3 {
				if tr := b.RecordFailure(now); tr.Changed() && opened == (Transition{}) {
					opened = tr
				}
			} else {
				b.RecordSuccess(now)
			}
		}
		if opened != (Transition{Closed, Open}) {
			t.Fatalf("never opened, last transition %+v", opened)
		}
		rate, calls := b.SuccessRate()
		if calls != 100 || math.Abs(rate-0.4) > 1e-9 {
			t.Fatalf("SuccessRate = %v, %d; want 0.4, 100", rate, calls)
		}
	})

	t.Run("waits for min calls", func(t *testing.T) {
		b := New(cfg)
		failN(b, at(0), 19)
		wantState(t, b, at(0), Closed)
		if tr := b.RecordFailure(at(0)); tr != (Transition{Closed, Open}) {
			t.Fatalf("20th failure transition = %+v, want closed->open", tr)
		}
	})

	t.Run("exact ratio opens", func(t *testing.T) {
		// 0.28*25 is just above 7 in float64, so a multiply-based
		// comparison would wrongly stay closed here.
		b := New(Config{MinCalls: 25, FailureRatio: 0.28})
		for range 18 {
			b.RecordSuccess(at(0))
		}
		failN(b, at(0), 6)
		wantState(t, b, at(0), Closed)
		if tr := b.RecordFailure(at(0)); tr != (Transition{Closed, Open}) {
			t.Fatalf("7/25 failures at ratio 0.28: transition = %+v, want closed->open", tr)
		}
	})

	t.Run("half-open failure reopens regardless of ratio", func(t *testing.T) {
		b := New(cfg)
		failN(b, at(0), 20)
		for range 80 {
			b.RecordSuccess(at(time.Second))
		}
		// Ring is now 20% failures, under the ratio, but this is a
		// failed trial.
		if tr := b.RecordFailure(at(61 * time.Second)); tr != (Transition{HalfOpen, Open}) {
			t.Fatalf("transition = %+v, want half_open->open", tr)
		}
	})
}

func TestRatioModeStaleTripIsForgotten(t *testing.T) {
	b := New(Config{MinCalls: 10, FailureRatio: 0.5})
	failN(b, at(0), 10)
	wantState(t, b, at(0), Open)
	// Failures age out without any trial, then new noise arrives under
	// the ratio: it must be judged as closed, not as a failed trial.
	later := at(6 * time.Minute)
	for range 100 {
		b.RecordSuccess(later)
	}
	failN(b, later, 4)
	wantState(t, b, later, Closed)
}

func TestPark(t *testing.T) {
	b := New(Config{MaxPark: 2 * time.Minute})
	until, tr := b.Park(at(0), 30*time.Second)
	if !until.Equal(at(30*time.Second)) || tr != (Transition{Closed, Parked}) {
		t.Fatalf("Park = %s, %+v; want t0+30s, closed->parked", until.Sub(t0), tr)
	}
	wantState(t, b, at(10*time.Second), Parked)
	if got := b.ReadyAt(at(10 * time.Second)); !got.Equal(at(30 * time.Second)) {
		t.Fatalf("ReadyAt = t0+%s, want t0+30s", got.Sub(t0))
	}
	s := b.Snapshot(at(10 * time.Second))
	if s.FailuresInWindow != 0 || s.Calls != 0 || s.RetryIn != 20*time.Second || !s.ParkedUntil.Equal(at(30*time.Second)) {
		t.Fatalf("snapshot = %+v: parking must not count as a failure or an outcome", s)
	}

	// A shorter Retry-After never shortens the park.
	until, tr = b.Park(at(5*time.Second), 5*time.Second)
	if !until.Equal(at(30*time.Second)) || tr.Changed() {
		t.Fatalf("shorter park = t0+%s, %+v; want t0+30s unchanged", until.Sub(t0), tr)
	}

	// Capped by MaxPark.
	until, _ = b.Park(at(10*time.Second), time.Hour)
	if !until.Equal(at(130 * time.Second)) {
		t.Fatalf("capped park until t0+%s, want t0+130s", until.Sub(t0))
	}
	wantState(t, b, at(129*time.Second), Parked)
	wantState(t, b, at(130*time.Second), Closed)

	// Zero Retry-After with no park in force parks nothing.
	until, tr = b.Park(at(200*time.Second), 0)
	if !until.IsZero() || tr != (Transition{Closed, Closed}) {
		t.Fatalf("zero park = %v, %+v", until, tr)
	}
}

func TestParkAndOpenTogether(t *testing.T) {
	b := New(Config{})
	b.Park(at(0), 3*time.Minute)
	failN(b, at(0), 3)
	wantState(t, b, at(30*time.Second), Open)
	wantState(t, b, at(90*time.Second), Parked)
	if got := b.ReadyAt(at(30 * time.Second)); !got.Equal(at(3 * time.Minute)) {
		t.Fatalf("ReadyAt = t0+%s, want the later park deadline t0+3m", got.Sub(t0))
	}
	// A half-open trial is pending underneath the park.
	wantState(t, b, at(3*time.Minute), HalfOpen)
}

func TestReset(t *testing.T) {
	b := New(Config{})
	failN(b, at(0), 3)
	b.Park(at(0), time.Minute)
	b.RecordSuccess(at(0))
	tr := b.Reset(at(time.Second))
	if tr != (Transition{Open, Closed}) {
		t.Fatalf("Reset transition = %+v, want open->closed", tr)
	}
	wantState(t, b, at(time.Second), Closed)
	s := b.Snapshot(at(time.Second))
	if s.FailuresInWindow != 0 || !s.OpenUntil.IsZero() || !s.ParkedUntil.IsZero() || s.Opened != 1 || s.Calls != 4 {
		t.Fatalf("snapshot after reset = %+v", s)
	}
	failN(b, at(2*time.Second), 2)
	wantState(t, b, at(2*time.Second), Closed)
}

func TestSetConfigAppliesToSurvivingState(t *testing.T) {
	t.Run("higher threshold", func(t *testing.T) {
		b := New(Config{})
		failN(b, at(0), 2)
		b.SetConfig(Config{Failures: 5})
		failN(b, at(time.Second), 2)
		wantState(t, b, at(time.Second), Closed)
		if tr := b.RecordFailure(at(2 * time.Second)); tr != (Transition{Closed, Open}) {
			t.Fatalf("5th failure transition = %+v, want closed->open", tr)
		}
	})
	t.Run("shorter window", func(t *testing.T) {
		b := New(Config{})
		failN(b, at(0), 2)
		b.SetConfig(Config{Window: 30 * time.Second})
		if tr := b.RecordFailure(at(time.Minute)); tr.Changed() {
			t.Fatalf("transition = %+v; old failures should be outside the new window", tr)
		}
		if s := b.Snapshot(at(time.Minute)); s.FailuresInWindow != 1 {
			t.Fatalf("FailuresInWindow = %d, want 1", s.FailuresInWindow)
		}
	})
	t.Run("shorter cooldown cuts running deadline", func(t *testing.T) {
		b := New(Config{})
		failN(b, at(0), 3)
		b.SetConfig(Config{Cooldown: 10 * time.Second})
		if got := b.ReadyAt(at(time.Second)); !got.Equal(at(10 * time.Second)) {
			t.Fatalf("ReadyAt = t0+%s, want t0+10s", got.Sub(t0))
		}
		wantState(t, b, at(10*time.Second), HalfOpen)
	})
	t.Run("longer cooldown does not reopen", func(t *testing.T) {
		b := New(Config{})
		failN(b, at(0), 3)
		b.SetConfig(Config{Cooldown: 10 * time.Minute})
		wantState(t, b, at(61*time.Second), HalfOpen)
		tr := b.RecordFailure(at(62 * time.Second))
		if tr != (Transition{HalfOpen, Open}) || !b.ReadyAt(at(62*time.Second)).Equal(at(62*time.Second+10*time.Minute)) {
			t.Fatalf("re-trip = %+v ready t0+%s, want new 10m cooldown", tr, b.ReadyAt(at(62*time.Second)).Sub(t0))
		}
	})
	t.Run("shorter max park cuts running park", func(t *testing.T) {
		b := New(Config{})
		b.Park(at(0), 4*time.Minute)
		b.SetConfig(Config{MaxPark: time.Minute})
		if got := b.ReadyAt(at(time.Second)); !got.Equal(at(time.Minute)) {
			t.Fatalf("ReadyAt = t0+%s, want t0+1m", got.Sub(t0))
		}
	})
	t.Run("ratio mode enabled on reload", func(t *testing.T) {
		b := New(Config{})
		for range 50 {
			b.RecordSuccess(at(0))
		}
		failN(b, at(0), 2)
		b.SetConfig(Config{MinCalls: 20, FailureRatio: 0.5})
		if tr := b.RecordFailure(at(time.Second)); tr.Changed() {
			t.Fatalf("transition = %+v; 3/53 failures is under the new ratio", tr)
		}
	})
}

func TestSuccessRateRing(t *testing.T) {
	b := New(Config{Failures: MaxFailures})
	if rate, calls := b.SuccessRate(); rate != 1 || calls != 0 {
		t.Fatalf("empty SuccessRate = %v, %d; want 1, 0", rate, calls)
	}
	for range 30 {
		b.RecordFailure(at(0))
	}
	for range 70 {
		b.RecordSuccess(at(0))
	}
	if rate, calls := b.SuccessRate(); calls != 100 || math.Abs(rate-0.7) > 1e-12 {
		t.Fatalf("SuccessRate = %v, %d; want 0.7, 100", rate, calls)
	}
	// Wrapping overwrites the oldest 30 failures first.
	for range 30 {
		b.RecordSuccess(at(0))
	}
	if rate, calls := b.SuccessRate(); calls != 100 || rate != 1 {
		t.Fatalf("after wrap SuccessRate = %v, %d; want 1, 100", rate, calls)
	}
	for range 25 {
		b.RecordFailure(at(0))
	}
	if rate, calls := b.SuccessRate(); calls != 100 || math.Abs(rate-0.75) > 1e-12 {
		t.Fatalf("after failures SuccessRate = %v, %d; want 0.75, 100", rate, calls)
	}
}

func TestOutcomeRingAgainstModel(t *testing.T) {
	var r outcomeRing
	var model []bool
	for i := range 1000 {
		failed := (i*7+i/13)%5 < 2
		r.add(failed)
		model = append(model, failed)
		if len(model) > ringSize {
			model = model[1:]
		}
		fails := 0
		for _, f := range model {
			if f {
				fails++
			}
		}
		if calls, got := r.counts(); calls != len(model) || got != fails {
			t.Fatalf("step %d: counts = %d, %d; want %d, %d", i, calls, got, len(model), fails)
		}
	}
}

func TestFailuresInWindowIsBounded(t *testing.T) {
	b := New(Config{Failures: 3})
	failN(b, at(0), 200)
	if s := b.Snapshot(at(0)); s.FailuresInWindow != MaxFailures {
		t.Fatalf("FailuresInWindow = %d, want cap %d", s.FailuresInWindow, MaxFailures)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"120", 2 * time.Minute, true},
		{" 0 ", 0, true},
		{"Sat, 01 Mar 2025 12:00:30 GMT", 30 * time.Second, true},
		{"Saturday, 01-Mar-25 12:01:00 GMT", time.Minute, true},
		{"Sat Mar  1 12:00:05 2025", 5 * time.Second, true},
		{"Sat, 01 Mar 2025 11:00:00 GMT", 0, true},
		{"99999999999999999999", time.Duration(math.MaxInt64), true},
		{"", 0, false},
		{"-5", 0, false},
		{"1.5", 0, false},
		{"+5", 0, false},
		{"soon", 0, false},
		{"2025-03-01T12:00:30Z", 0, false},
	}
	for _, tt := range tests {
		got, ok := ParseRetryAfter(tt.in, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseRetryAfter(%q) = %s, %v; want %s, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestConcurrent(t *testing.T) {
	b := New(Config{Cooldown: time.Millisecond, Window: 10 * time.Millisecond})
	const workers, iters = 8, 2000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range iters {
				now := at(time.Duration(i) * 100 * time.Microsecond)
				switch (w + i) % 6 {
				case 0:
					b.RecordFailure(now)
				case 1:
					b.RecordSuccess(now)
				case 2:
					b.Park(now, time.Millisecond)
				case 3:
					b.Available(now)
					b.ReadyAt(now)
				case 4:
					b.Snapshot(now)
					b.SuccessRate()
				case 5:
					if i%500 == 0 {
						b.SetConfig(Config{Cooldown: 2 * time.Millisecond, Window: 10 * time.Millisecond})
					}
					b.State(now)
				}
			}
		}()
	}
	wg.Wait()
	_, calls := b.SuccessRate()
	if calls != ringSize {
		t.Fatalf("calls = %d, want %d", calls, ringSize)
	}
	end := at(time.Hour)
	b.Reset(end)
	if !b.Available(end) || b.State(end) != Closed {
		t.Fatalf("after Reset state = %s available = %v", b.State(end), b.Available(end))
	}
}

func TestHotPathDoesNotAllocate(t *testing.T) {
	b := New(Config{MinCalls: 10, FailureRatio: 0.5})
	now := at(0)
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond)
		b.Available(now)
		b.RecordFailure(now)
		b.RecordSuccess(now)
		b.ReadyAt(now)
		b.State(now)
		b.Park(now, time.Millisecond)
		b.Snapshot(now)
	})
	if allocs != 0 {
		t.Fatalf("hot path allocs = %v, want 0", allocs)
	}
}

func TestHalfOpenedReportedOncePerTrip(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	b := New(Config{Cooldown: time.Minute, Trials: 5})
	if tk, ok := b.Admit(now); !ok || tk.HalfOpened || tk.Trial() {
		t.Fatalf("closed breaker: admitted %v, ticket %+v", ok, tk)
	}
	for range 3 {
		b.RecordFailure(now)
	}
	if _, ok := b.Admit(now.Add(30 * time.Second)); ok {
		t.Fatal("admitted during the cooldown")
	}
	after := now.Add(61 * time.Second)
	first, ok := b.Admit(after)
	if !ok || !first.HalfOpened || !first.Trial() {
		t.Fatalf("first admission after the cooldown: %v %+v", ok, first)
	}
	second, ok := b.Admit(after)
	if !ok || second.HalfOpened {
		t.Fatalf("second trial: admitted %v, half-opened reported again %v", ok, second.HalfOpened)
	}
	first.Done()
	second.Done()
	// A re-trip announces its own half-open change.
	b.RecordFailure(after)
	if b.State(after) != Open {
		t.Fatalf("state %s after a failed trial", b.State(after))
	}
	if tk, ok := b.Admit(after.Add(61 * time.Second)); !ok || !tk.HalfOpened {
		t.Fatal("no half-open change reported after the second cooldown")
	}
}

// Half-open admits at most Trials requests at once, however many arrive
// together; a finished trial frees its slot.
func TestHalfOpenAdmitsBoundedTrials(t *testing.T) {
	for _, trials := range []int{1, 3} {
		b := New(Config{Cooldown: time.Minute, Trials: trials})
		failN(b, t0, 3)
		now := at(time.Minute)
		var admitted atomic.Int64
		tickets := make(chan Ticket, 1000)
		var wg sync.WaitGroup
		for range 1000 {
			wg.Go(func() {
				if tk, ok := b.Admit(now); ok {
					admitted.Add(1)
					tickets <- tk
				}
			})
		}
		wg.Wait()
		close(tickets)
		if got := admitted.Load(); got != int64(trials) {
			t.Fatalf("trials %d: %d of 1000 concurrent requests admitted", trials, got)
		}
		if b.Available(now) {
			t.Fatalf("trials %d: Available with every trial slot taken", trials)
		}
		if s := b.Snapshot(now); s.State != HalfOpen || s.TrialsInFlight != trials {
			t.Fatalf("trials %d: snapshot %+v", trials, s)
		}
		tk := <-tickets
		tk.Done()
		if _, ok := b.Admit(now); !ok {
			t.Fatalf("trials %d: a freed slot was not reused", trials)
		}
	}
}

// A trial that ends without an outcome (client gone) frees its slot and
// leaves the breaker half-open; one that succeeds closes it for everyone.
func TestTrialOutcomes(t *testing.T) {
	b := New(Config{Cooldown: time.Minute})
	failN(b, t0, 3)
	now := at(time.Minute)
	tk, ok := b.Admit(now)
	if !ok {
		t.Fatal("no trial admitted")
	}
	tk.Done()
	wantState(t, b, now, HalfOpen)
	tk, _ = b.Admit(now)
	b.RecordSuccess(now)
	tk.Done()
	wantState(t, b, now, Closed)
	for range 10 {
		if tk, ok := b.Admit(now); !ok || tk.Trial() {
			t.Fatalf("closed breaker: admitted %v, trial %v", ok, tk.Trial())
		}
	}
}

// An open channel lets exactly one last resort through per trip: not a
// second one while it runs, not after it failed, and not while parked. A
// re-trip allows the next.
func TestAdmitLastResortOncePerTrip(t *testing.T) {
	b := New(Config{Cooldown: time.Minute})
	if _, ok := b.AdmitLastResort(t0); ok {
		t.Fatal("last resort of a closed channel admitted")
	}
	failN(b, t0, 3)
	var admitted atomic.Int64
	lastResorts := make(chan Ticket, 100)
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			if tk, ok := b.AdmitLastResort(at(time.Second)); ok {
				admitted.Add(1)
				lastResorts <- tk
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 1 {
		t.Fatalf("%d last resorts admitted, want 1", admitted.Load())
	}
	if s := b.Snapshot(at(time.Second)); s.TrialsInFlight != 1 {
		t.Fatalf("last resort in flight not counted: %+v", s)
	}
	// The last resort failed: same outage, same deadline, no second one.
	b.RecordFailure(at(2 * time.Second))
	(<-lastResorts).Done()
	if _, ok := b.AdmitLastResort(at(3 * time.Second)); ok {
		t.Fatal("second last resort admitted in one cooldown")
	}
	if s := b.Snapshot(at(3 * time.Second)); !s.OpenUntil.Equal(at(time.Minute)) || s.TrialsInFlight != 0 {
		t.Fatalf("after a failed last resort: %+v", s)
	}

	// After the cooldown a failed trial re-trips: the new trip gets one
	// last resort more.
	now := at(time.Minute)
	tk, ok := b.Admit(now)
	if !ok || !tk.Trial() {
		t.Fatal("no trial after the cooldown")
	}
	b.RecordFailure(now)
	tk.Done()
	if _, ok := b.AdmitLastResort(now.Add(time.Second)); !ok {
		t.Fatal("no last resort admitted for a new trip")
	}

	p := New(Config{Cooldown: time.Minute})
	failN(p, t0, 3)
	p.Park(t0, 2*time.Minute)
	if _, ok := p.AdmitLastResort(at(time.Second)); ok {
		t.Fatal("last resort of a parked channel admitted")
	}
}

// A rate limit parks for what the upstream asked, or for Park when it
// named no wait; never counted as a failure either way.
func TestParkFor(t *testing.T) {
	b := New(Config{Park: 7 * time.Second})
	if d := b.ParkFor(3*time.Second, true); d != 3*time.Second {
		t.Errorf("hinted: %s", d)
	}
	if d := b.ParkFor(0, false); d != 7*time.Second {
		t.Errorf("no hint: %s, want the configured park", d)
	}
	if d := New(Config{}).ParkFor(0, false); d != DefaultPark {
		t.Errorf("default: %s", d)
	}
	until, tr := b.Park(t0, b.ParkFor(0, false))
	if !until.Equal(at(7*time.Second)) || tr.To != Parked || b.Snapshot(t0).FailuresInWindow != 0 {
		t.Fatalf("parked until %v (%v), %+v", until, tr, b.Snapshot(t0))
	}
}
