package history

import (
	"runtime"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 23, 58, 30, 0, time.UTC)

func TestClassesNeverMix(t *testing.T) {
	r := NewRecorder()
	mix := []struct {
		class Class
		n     int
	}{{Success, 5}, {Down, 3}, {Limited, 4}, {Client, 2}}
	for _, m := range mix {
		for range m.n {
			a := Attempt{At: t0, Model: "m", Channel: "a", Class: m.class, Reason: "status", Status: 500}
			r.Record(a)
			r.Served(a)
		}
	}
	for _, v := range []View{r.Channel("a", t0, 5*time.Minute), r.Model("m", t0, 5*time.Minute)} {
		c := v.Windows[5*time.Minute]
		if c.Attempts != 14 || c.Successes != 5 || c.Down != 3 || c.Limited != 4 || c.Client != 2 {
			t.Fatalf("%s: %+v", v.Name, c)
		}
		// Client errors are not held against the channel: 5 of 12.
		if got, ok := c.SuccessRate(); !ok || got != 5.0/12 {
			t.Fatalf("success rate %v, %v", got, ok)
		}
		var clientOnly Counts
		clientOnly.Attempts, clientOnly.Client = 3, 3
		if got, ok := clientOnly.SuccessRate(); ok {
			t.Fatalf("client errors only: success rate %v, want none known", got)
		}
	}
}

// Rollups across minute, hour and day boundaries with an injected clock.
func TestRollupsAcrossBoundaries(t *testing.T) {
	r := NewRecorder()
	// t0 is 23:58:30 on 1 March; one success per minute for 4 minutes
	// crosses the minute, hour and day boundaries at midnight.
	for i := range 4 {
		r.Record(Attempt{At: t0.Add(time.Duration(i) * time.Minute), Model: "m", Channel: "a", Class: Success})
	}
	now := t0.Add(3 * time.Minute) // 00:01:30 on 2 March
	v := r.Channel("a", now, time.Minute, 5*time.Minute, time.Hour, 24*time.Hour)
	if got := v.Windows[time.Minute].Attempts; got != 1 {
		t.Errorf("last minute: %d attempts, want 1", got)
	}
	if got := v.Windows[5*time.Minute].Attempts; got != 4 {
		t.Errorf("5m: %d, want 4", got)
	}
	if got := v.Windows[24*time.Hour].Attempts; got != 4 {
		t.Errorf("24h: %d, want 4", got)
	}
	last, prev := v.Hourly[Hours-1], v.Hourly[Hours-2]
	if last.Attempts != 2 || prev.Attempts != 2 || !last.Start.Equal(time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("hour bars: prev %d, last %d at %s", prev.Attempts, last.Attempts, last.Start)
	}
	if d := v.Daily[Days-1]; d.Attempts != 2 || v.Daily[Days-2].Attempts != 2 {
		t.Errorf("day bars: %d, %d", v.Daily[Days-2].Attempts, d.Attempts)
	}

	// Seven hours later the minutes are gone, the hours and days remain.
	later := now.Add(7 * time.Hour)
	v = r.Channel("a", later, 5*time.Minute, 24*time.Hour)
	if v.Windows[5*time.Minute].Attempts != 0 || v.Windows[24*time.Hour].Attempts != 4 {
		t.Errorf("7h later: %+v", v.Windows)
	}
	// A slot reused by a later period starts from zero.
	r.Record(Attempt{At: now.Add(6 * time.Hour), Model: "m", Channel: "a", Class: Down})
	v = r.Channel("a", now.Add(6*time.Hour), 5*time.Minute)
	if c := v.Windows[5*time.Minute]; c.Attempts != 1 || c.Down != 1 {
		t.Errorf("reused minute slot: %+v", c)
	}
	// 91 days later nothing is left in the day bars.
	v = r.Channel("a", now.Add(91*24*time.Hour))
	for _, d := range v.Daily {
		if d.Attempts != 0 {
			t.Fatalf("day bar %s still has %d", d.Start, d.Attempts)
		}
	}
}

func TestLastFailureAndIncidents(t *testing.T) {
	r := NewRecorder()
	r.Record(Attempt{At: t0.Add(-2 * time.Second), Model: "m", Channel: "a", Class: Down, Reason: "status", Status: 502})
	r.Record(Attempt{At: t0, Model: "m", Channel: "a", Class: Down, Reason: "status", Status: 503})
	r.ChannelOpened("a", "status", t0)
	r.ModelAvailable("m", false, t0.Add(time.Second))
	r.Served(Attempt{At: t0.Add(time.Second), Model: "m", Class: Down, Reason: "no_working_channel", Status: 503})
	r.Record(Attempt{At: t0.Add(2 * time.Second), Model: "m", Channel: "a", Class: Down, Reason: "header_timeout"})
	r.Served(Attempt{At: t0.Add(3 * time.Second), Model: "m", Class: Client, Reason: "status", Status: 400})
	r.Record(Attempt{At: t0.Add(3 * time.Second), Model: "m", Channel: "a", Class: Client, Reason: "status", Status: 400})
	r.ModelAvailable("m", true, t0.Add(4*time.Second))
	r.ChannelClosed("a", t0.Add(5*time.Second))
	r.ChannelClosed("a", t0.Add(6*time.Second)) // no incident: nothing changes

	lf := r.Channel("a", t0).LastFailure
	if lf == nil || lf.Reason != "header_timeout" {
		t.Fatalf("last failure %+v (a client error is not a failure)", lf)
	}
	in := r.Incidents()
	if len(in) != 2 {
		t.Fatalf("%d incidents", len(in))
	}
	model, ch := in[0], in[1]
	// The model's incident counts the requests its clients made during it.
	if model.Kind != "model" || model.Subject != "m" || model.Attempts != 2 || model.Failures != 1 || !model.End.Equal(t0.Add(4*time.Second)) {
		t.Errorf("model incident %+v", model)
	}
	// The channel's counts the two failures that opened it and those
	// during it: an outage is never "0 failures".
	if ch.Kind != "channel" || ch.Reasons["status"] != 2 || ch.Reasons["header_timeout"] != 1 || ch.Failures != 3 || ch.Attempts != 4 || ch.Ongoing() {
		t.Errorf("channel incident %+v", ch)
	}
	// What a reader got is its own: the recorder keeps the last failure
	// in one place and overwrites it.
	r.Record(Attempt{At: t0.Add(7 * time.Second), Model: "m", Channel: "a", Class: Down, Reason: "reset"})
	if lf.Reason != "header_timeout" {
		t.Fatalf("an earlier read of the last failure changed to %+v", lf)
	}
	if now := r.LastChannelFailure("a"); now == nil || now.Reason != "reset" {
		t.Fatalf("last failure %+v after a newer one", now)
	}
	r.Record(Attempt{At: t0.Add(6 * time.Second), Model: "m", Channel: "a", Class: Down, Reason: "late"})
	if now := r.LastChannelFailure("a"); now.Reason != "reset" {
		t.Fatalf("an older failure recorded late replaced the last one: %+v", now)
	}
}

// A model's history is what its clients got, a channel's its attempts:
// channel a failing every request while b serves them all leaves the
// model with no failure, and its status operational.
func TestModelIsWhatClientsGot(t *testing.T) {
	r := NewRecorder()
	for i := range 5 {
		at := t0.Add(time.Duration(i) * time.Second)
		r.Record(Attempt{At: at, Model: "m", Channel: "a", Class: Down, Reason: "status", Status: 500})
		r.Record(Attempt{At: at, Model: "m", Channel: "b", Class: Success})
		r.Served(Attempt{At: at, Model: "m", Channel: "b", Class: Success})
	}
	now := t0.Add(5 * time.Second)
	if c := r.Channel("a", now, 5*time.Minute).Windows[5*time.Minute]; c.Down != 5 || !c.Failing() {
		t.Errorf("channel a: %+v, failing %v", c, c.Failing())
	}
	if c := r.Model("m", now, 5*time.Minute).Windows[5*time.Minute]; c.Attempts != 5 || c.Successes != 5 || c.Failing() {
		t.Errorf("model m: %+v", c)
	}
	if failing, since := r.ModelFailing("m", now); failing || !since.IsZero() {
		t.Errorf("model failing %v since %v", failing, since)
	}
}

// Input and cache-read tokens add up like output tokens: per series, in
// every rollup, and through a store's deltas; the share is only known
// with input.
func TestInputAndCacheReadTokensSum(t *testing.T) {
	r := NewRecorder()
	r.Track(true)
	for i, a := range []Attempt{
		{Model: "m", Channel: "a", Class: Success, InputTokens: 1000, CacheReadTokens: 600, OutputTokens: 10},
		{Model: "m", Channel: "a", Class: Success, InputTokens: 500, CacheReadTokens: 0, OutputTokens: 5},
		{Model: "m", Channel: "a", Class: Down, Reason: "status", Status: 500},
		{Model: "m", Channel: "b", Class: Success},
	} {
		a.At = t0.Add(time.Duration(i) * time.Minute) // across midnight
		r.Record(a)
		r.Served(a)
	}
	now := t0.Add(3 * time.Minute)
	check := func(what string, c Counts) {
		t.Helper()
		if c.InputTokens != 1500 || c.CacheReadTokens != 600 || c.OutputTokens != 15 {
			t.Errorf("%s: input %d, cache read %d, output %d; want 1500, 600, 15", what, c.InputTokens, c.CacheReadTokens, c.OutputTokens)
		}
		if share, ok := c.CacheReadShare(); !ok || share != 0.4 {
			t.Errorf("%s: share %v %v, want 0.4", what, share, ok)
		}
	}
	for _, d := range []time.Duration{5 * time.Minute, 24 * time.Hour, 7 * 24 * time.Hour} {
		check("channel a "+d.String(), r.Channel("a", now, d).Windows[d])
		check("model m "+d.String(), r.Model("m", now, d).Windows[d])
	}
	if c := r.Channel("b", now, time.Hour).Windows[time.Hour]; c.InputTokens != 0 || c.CacheReadTokens != 0 {
		t.Errorf("channel b: %+v", c)
	} else if share, ok := c.CacheReadShare(); ok || share != 0 {
		t.Errorf("channel b: share %v %v with no input, want none", share, ok)
	}
	// Through a store: the deltas, added to another recorder, keep them.
	other := NewRecorder()
	for _, d := range r.TakeChanges() {
		other.AddDelta(d)
	}
	check("from deltas", other.Channel("a", now, time.Hour).Windows[time.Hour])
	var sum Counts
	for _, b := range other.Channel("a", now).Hourly {
		sum.Merge(&b.Counts)
	}
	check("hour bars", sum)
	// Inconsistent reports never make a share above 1.
	odd := Counts{InputTokens: 10, CacheReadTokens: 15}
	if share, ok := odd.CacheReadShare(); !ok || share != 1 {
		t.Errorf("share %v %v, want 1", share, ok)
	}
}

// A model's clients failing: since the first failure the window holds
// (to the minute), and recovered when the failures left the window.
func TestModelFailingSinceAndRecovered(t *testing.T) {
	r := NewRecorder()
	start := time.Date(2026, 3, 1, 10, 0, 10, 0, time.UTC)
	for i := range 6 {
		r.Served(Attempt{At: start.Add(time.Duration(i) * 10 * time.Second), Model: "m", Class: Down, Reason: "status", Status: 503})
	}
	now := start.Add(time.Minute)
	failing, since := r.ModelFailing("m", now)
	if !failing || !since.Equal(time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)) {
		t.Fatalf("failing %v since %v, want since 10:00:00 (the minute of the first failure)", failing, since)
	}
	// No traffic: the failures age out of the window, and recovery is
	// dated when the last one left it, not when someone looked.
	later := start.Add(20 * time.Minute)
	failing, since = r.ModelFailing("m", later)
	if want := start.Add(50 * time.Second).Add(FailingWindow); failing || !since.Equal(want) {
		t.Fatalf("failing %v since %v, want recovered at %v", failing, since, want)
	}
	// Successes bring the rate back above the bar while failures remain.
	r2 := NewRecorder()
	for i := range 5 {
		r2.Served(Attempt{At: start.Add(time.Duration(i) * time.Second), Model: "m", Class: Down})
	}
	var at time.Time
	for i := range 200 {
		at = start.Add(10*time.Second + time.Duration(i)*100*time.Millisecond)
		r2.Served(Attempt{At: at, Model: "m", Class: Success})
	}
	if failing, since := r2.ModelFailing("m", at); failing || since.IsZero() || since.After(at) {
		t.Fatalf("after 200 successes: failing %v since %v", failing, since)
	}
}

func TestIncidentsBounded(t *testing.T) {
	r := NewRecorder()
	for i := range 3 * MaxIncidents {
		at := t0.Add(time.Duration(i) * time.Minute)
		r.ChannelOpened("a", "status", at)
		r.ChannelClosed("a", at.Add(time.Second))
	}
	if n := len(r.Incidents()); n > MaxIncidents+1 {
		t.Fatalf("%d incidents kept", n)
	}
}

func TestSketchQuantiles(t *testing.T) {
	var s Sketch
	for i := 1; i <= 100; i++ {
		s.Observe(time.Duration(i) * 10 * time.Millisecond) // 10 ms … 1 s
	}
	p50, p95 := s.Quantile(0.5), s.Quantile(0.95)
	if p50 < 500*time.Millisecond || p50 > 760*time.Millisecond {
		t.Errorf("p50 %s", p50)
	}
	if p95 < 950*time.Millisecond || p95 > 1450*time.Millisecond {
		t.Errorf("p95 %s", p95)
	}
	if (&Sketch{}).Quantile(0.5) != 0 {
		t.Error("empty sketch")
	}
}

// heapFor50Channels90Days fills the history of 50 channels and 10 models
// with traffic in every minute of 6 h, every hour of 48 h and every day of
// 90 days, and returns the heap it holds.
func heapFor50Channels90Days() (uint64, *Recorder) {
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	r := NewRecorder()
	now := t0
	for c := range 50 {
		ch, m := "channel-"+string(rune('A'+c%26))+string(rune('a'+c/26)), "model-"+string(rune('a'+c%10))
		for d := range Days {
			r.Record(Attempt{At: now.Add(-time.Duration(d) * 24 * time.Hour), Model: m, Channel: ch, Class: Down, TTFT: time.Second})
		}
		for h := range Hours {
			r.Record(Attempt{At: now.Add(-time.Duration(h) * time.Hour), Model: m, Channel: ch, Class: Success, TTFT: time.Second})
		}
		for i := range Minutes {
			r.Record(Attempt{At: now.Add(-time.Duration(i) * time.Minute), Model: m, Channel: ch, Class: Limited})
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	return after.HeapAlloc - before.HeapAlloc, r
}

// MemoryBound is the stated bound for 50 channels and 10 models over 90
// days: every ring allocated in full, whatever the traffic.
const memoryBound = 8 << 20

func TestMemoryBound50Channels90Days(t *testing.T) {
	heap, r := heapFor50Channels90Days()
	runtime.KeepAlive(r)
	t.Logf("history of 50 channels + 10 models over 90 days: %d KiB", heap>>10)
	if heap > memoryBound {
		t.Fatalf("history holds %d bytes, bound %d", heap, memoryBound)
	}
}

func BenchmarkMemory50Channels90Days(b *testing.B) {
	var heap uint64
	for b.Loop() {
		var r *Recorder
		heap, r = heapFor50Channels90Days()
		runtime.KeepAlive(r)
	}
	b.ReportMetric(float64(heap), "heap-bytes")
}

func BenchmarkRecord(b *testing.B) {
	r := NewRecorder()
	a := Attempt{At: t0, Model: "m", Channel: "a", Class: Success, TTFT: 300 * time.Millisecond}
	b.ReportAllocs()
	for b.Loop() {
		r.Record(a)
	}
}

// EndUnless ends the ongoing incidents the running config leaves nothing
// to end, and only those; one that began after the instant ends when it
// began.
func TestEndUnless(t *testing.T) {
	r := NewRecorder()
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	r.ChannelOpened("kept", "status", t0)
	r.ChannelOpened("removed", "status", t0)
	r.ModelAvailable("gone", false, t0)
	r.ChannelOpened("later", "status", t0.Add(2*time.Minute))
	at := t0.Add(time.Minute)
	n := r.EndUnless(func(kind, subject string) bool { return kind == ScopeChannel && subject == "kept" }, at)
	if n != 3 {
		t.Fatalf("ended %d, want 3", n)
	}
	for _, in := range r.Incidents() {
		switch in.Subject {
		case "kept":
			if !in.Ongoing() {
				t.Errorf("kept incident ended")
			}
		case "later":
			if !in.End.Equal(in.Start) {
				t.Errorf("later incident ended at %v, want its start %v", in.End, in.Start)
			}
		default:
			if !in.End.Equal(at) {
				t.Errorf("%s %s ended at %v, want %v", in.Kind, in.Subject, in.End, at)
			}
		}
	}
	// Ended is ended: a new opening is a new incident.
	r.ChannelOpened("removed", "status", at.Add(time.Minute))
	if got := len(r.Incidents()); got != 5 {
		t.Errorf("%d incidents, want 5", got)
	}
}

// The first store a history is given gets what it recorded before (a
// reload that adds a store to a running gateway): the page reads the
// store from then on, and must not lose the history it showed. A store
// given later gets only what came after: the rest went to a store
// already.
func TestFirstTrackHandsOverThePast(t *testing.T) {
	r := NewRecorder()
	r.Record(Attempt{At: t0, Model: "m", Channel: "a", Class: Success})
	r.Record(Attempt{At: t0, Model: "m", Channel: "a", Class: Down, Reason: "status"})
	r.Served(Attempt{At: t0, Model: "m", Class: Success})
	r.Track(true)
	got := map[string]int64{}
	for _, d := range r.TakeChanges() {
		got[d.Scope+"/"+string(d.Res)] += d.Attempts
	}
	want := map[string]int64{"channel/m": 2, "channel/h": 2, "channel/d": 2, "model/m": 1, "model/h": 1, "model/d": 1}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("pending %s: %d attempts, want %d (all: %v)", k, got[k], w, got)
		}
	}
	r.Track(false)
	r.Track(true)
	if ds := r.TakeChanges(); len(ds) != 0 {
		t.Errorf("a second store is handed the past again: %+v", ds)
	}
}
