package latency

import (
	"testing"
	"time"
)

var cfg = Config{}.WithDefaults()

func TestClassOf(t *testing.T) {
	for _, tc := range []struct {
		prompt int
		out    int64
		want   string
	}{
		{100, 256, "s/s"}, {100, 0, "s/l"}, {20 << 10, 4000, "m/m"}, {1 << 20, 100000, "l/l"}, {8<<10 - 1, 1024, "s/s"}, {8 << 10, 1025, "m/m"},
	} {
		if got := ClassOf(tc.prompt, tc.out).String(); got != tc.want {
			t.Errorf("ClassOf(%d, %d) = %s, want %s", tc.prompt, tc.out, got, tc.want)
		}
	}
}

// A whole answer's class is learned apart from the same size's streams.
func TestWholeClassIsLearnedApart(t *testing.T) {
	l := NewLearner()
	now := time.Now()
	streamed := ClassOf(100, 256)
	whole := streamed.Whole()
	if whole == streamed || whole.Whole() != whole || whole.String() != "s/s whole" {
		t.Fatalf("ClassOf(100, 256).Whole() = %v (%s)", whole, whole)
	}
	for range cfg.MinSamples {
		l.Observe(Header, streamed, 100*time.Millisecond, cfg.Window, now)
	}
	if d := l.Deadline(Header, whole, cfg, time.Minute, now); d.Learned {
		t.Errorf("whole answers' header deadline learned from streams: %s", d)
	}
}

func TestDeadlineNeedsSamples(t *testing.T) {
	l := NewLearner()
	now := time.Now()
	c := ClassOf(100, 100)
	for range cfg.MinSamples - 1 {
		l.Observe(Header, c, 100*time.Millisecond, cfg.Window, now)
	}
	if d := l.Deadline(Header, c, cfg, 30*time.Second, now); d.Learned || d.Limit != 30*time.Second {
		t.Fatalf("with too few samples: %+v, want the ceiling unlearned", d)
	}
	l.Observe(Header, c, 100*time.Millisecond, cfg.Window, now)
	if d := l.Deadline(Header, c, cfg, 30*time.Second, now); !d.Learned || d.Limit != cfg.Floor {
		t.Fatalf("a fast channel: %+v, want the floor, learned", d)
	}
	// Another class has learned nothing.
	if d := l.Deadline(Header, ClassOf(1<<20, 100), cfg, 30*time.Second, now); d.Learned {
		t.Fatalf("another class: %+v", d)
	}
}

func TestDeadlineIsFactorTimesQuantileWithinBounds(t *testing.T) {
	l := NewLearner()
	now := time.Now()
	c := ClassOf(1<<20, 100)
	for i := range 1000 {
		// 1..10 s, uniform: p99 about 9.9 s.
		l.Observe(FirstContent, c, time.Second+time.Duration(i)*9*time.Millisecond, cfg.Window, now)
	}
	d := l.Deadline(FirstContent, c, cfg, 240*time.Second, now)
	if !d.Learned || d.Quantile < 9900*time.Millisecond || d.Quantile > 11*time.Second {
		t.Fatalf("p99 of 1..10 s: %+v", d)
	}
	if d.Limit != time.Duration(3*float64(d.Quantile)) {
		t.Fatalf("limit %s, want 3 × %s", d.Limit, d.Quantile)
	}
	if d := l.Deadline(FirstContent, c, cfg, 20*time.Second, now); d.Limit != 20*time.Second || !d.Learned {
		t.Fatalf("above the ceiling: %+v", d)
	}
	if d := l.Deadline(FirstContent, c, cfg, 0, now); d.Limit < 29*time.Second {
		t.Fatalf("no ceiling: %+v", d)
	}
}

func TestGapUsesTheStallFloor(t *testing.T) {
	l := NewLearner()
	now := time.Now()
	for range 100 {
		l.Observe(Gap, 0, 300*time.Millisecond, cfg.Window, now)
	}
	if d := l.Deadline(Gap, 0, cfg, time.Minute, now); d.Limit != cfg.StallFloor {
		t.Fatalf("gap deadline %+v, want the stall floor %s", d, cfg.StallFloor)
	}
}

func TestWindowForgets(t *testing.T) {
	l := NewLearner()
	now := time.Now()
	for range 100 {
		l.Observe(Header, 0, 20*time.Second, cfg.Window, now)
	}
	if _, n := l.Quantile(Header, 0, 0.99, cfg.Window, now.Add(cfg.Window/2+time.Second)); n != 100 {
		t.Fatalf("half a window later: %d samples, want 100", n)
	}
	if _, n := l.Quantile(Header, 0, 0.99, cfg.Window, now.Add(cfg.Window+time.Second)); n != 0 {
		t.Fatalf("a window later: %d samples, want 0", n)
	}
}

func TestSlowdown(t *testing.T) {
	l := NewLearner()
	start := time.Now()
	for i := range 1000 {
		l.Observe(FirstContent, 0, 200*time.Millisecond, cfg.Window, start.Add(time.Duration(i)*time.Second))
	}
	now := start.Add(1000 * time.Second)
	if s := l.Slowdown(cfg, now); s != 1 {
		t.Fatalf("as usual: slowdown %v, want 1", s)
	}
	for range 200 {
		l.Observe(FirstContent, 0, 2*time.Second, cfg.Window, now)
	}
	if s := l.Slowdown(cfg, now); s < 5 {
		t.Fatalf("ten times slower lately: slowdown %v", s)
	}
	if s := l.Slowdown(cfg, now.Add(5*time.Minute)); s != 1 {
		t.Fatalf("once the slow spell is over two minutes: %v", s)
	}
}

func TestSketchQuantileError(t *testing.T) {
	var s sketch
	for d := time.Millisecond; d < 10*time.Minute; d = d * 11 / 10 {
		s = sketch{}
		s.observe(d)
		if q := s.quantile(0.99); q < d || float64(q) > float64(d)*1.11 {
			t.Fatalf("one value %s: quantile %s", d, q)
		}
	}
}

func BenchmarkObserve(b *testing.B) {
	l := NewLearner()
	now := time.Now()
	for i := range b.N {
		l.Observe(FirstContent, Class(i%NumClasses), time.Duration(i%5000)*time.Millisecond, cfg.Window, now)
	}
}

// A factor large enough that factor × quantile overflows a Duration (the
// config allows any factor of at least 1) gives the longest deadline, the
// ceiling, never the floor: the float-to-int conversion of an overflowing
// product is not a large number.
func TestHugeFactorSaturatesAtTheCeiling(t *testing.T) {
	l := NewLearner()
	now := time.Now()
	c := ClassOf(1<<20, 100)
	for range 100 {
		l.Observe(FirstContent, c, 2*time.Second, cfg.Window, now)
	}
	huge := cfg
	huge.Factor = 1e300
	if d := l.Deadline(FirstContent, c, huge, 240*time.Second, now); d.Limit != 240*time.Second {
		t.Fatalf("factor 1e300: limit %s, want the 240s ceiling", d.Limit)
	}
	if d := l.Deadline(FirstContent, c, huge, 0, now); d.Limit < time.Hour {
		t.Fatalf("factor 1e300, no ceiling: limit %s", d.Limit)
	}
}
