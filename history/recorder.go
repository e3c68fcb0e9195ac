package history

import (
	"sort"
	"sync"
	"time"
)

// MaxIncidents bounds the incident list; the oldest go first, and none
// older than the day rollup is kept.
const MaxIncidents = 200

// Incident is a period a channel's breaker was open (Kind ScopeChannel)
// or a model had no working channel (Kind ScopeModel). End is zero while
// it lasts.
type Incident struct {
	Kind    string
	Subject string // the channel's or the model's name
	Start   time.Time
	End     time.Time
	// Reasons counts the failure reasons recorded against the subject
	// while the incident lasted (the reason that opened it included).
	Reasons map[string]int64
	// Attempts and Failures are the attempts made while it lasted.
	Attempts int64
	Failures int64
}

// Ongoing reports whether the incident has not ended.
func (i *Incident) Ongoing() bool { return i.End.IsZero() }

// Recorder is the history of every channel and model of a gateway: a
// channel's is its upstream attempts (Record), a model's what its clients
// got (Served), so that a model whose first channel fails while the next
// serves every request shows no outage its clients never had. It is safe
// for concurrent use; Record and Served are a map lookup and a few
// additions under one mutex.
type Recorder struct {
	mu        sync.Mutex
	channels  map[string]*series
	models    map[string]*series
	incidents []*Incident // oldest first
	open      map[string]*Incident
	// streaks are each channel's failures since its last success (within
	// FailingWindow): what an incident that opens counts as its cause.
	streaks map[string]*streak
	// changes is what each bucket gained since a store last took them;
	// nil unless Track.
	changes map[deltaKey]*Counts
	// tracked: Track was ever on, so what was recorded before went to a
	// store (or had its chance to).
	tracked bool
}

// streak is a channel's run of failed attempts.
type streak struct {
	last     time.Time
	failures int64
	reasons  map[string]int64
}

// NewRecorder returns an empty history.
func NewRecorder() *Recorder {
	return &Recorder{channels: map[string]*series{}, models: map[string]*series{}, open: map[string]*Incident{},
		streaks: map[string]*streak{}}
}

func seriesOf(m map[string]*series, name string) *series {
	s := m[name]
	if s == nil {
		s = newSeries()
		m[name] = s
	}
	return s
}

// Record adds one upstream attempt to its channel's history and to the
// channel's ongoing incident.
func (r *Recorder) Record(a Attempt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	seriesOf(r.channels, a.Channel).add(a)
	r.track(ScopeChannel, a.Channel, a)
	r.count(incidentKey(ScopeChannel, a.Channel), a)
	failed := a.Class == Down || a.Class == Limited
	st := r.streaks[a.Channel]
	switch {
	case !failed && a.Class != Success:
	case !failed:
		delete(r.streaks, a.Channel)
	default:
		if st == nil || a.At.Sub(st.last) > FailingWindow {
			st = &streak{reasons: map[string]int64{}}
			r.streaks[a.Channel] = st
		}
		st.last = a.At
		st.failures++
		st.reasons[a.Reason]++
	}
}

// Served adds one client request's outcome to its model's history and to
// the model's ongoing incident. Class is what the client got: Success a
// complete answer, Down an error or a stream cut after its commit,
// Limited a 429, Client a 4xx of its own making; Channel is the one that
// answered, "" when none did.
func (r *Recorder) Served(a Attempt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := seriesOf(r.models, a.Model)
	s.add(a)
	r.track(ScopeModel, a.Model, a)
	r.count(incidentKey(ScopeModel, a.Model), a)
	s.noteFailing(a.At)
}

// count adds an outcome to the ongoing incident under key, if any.
func (r *Recorder) count(key string, a Attempt) {
	if in := r.open[key]; in != nil {
		in.Attempts++
		if a.Class == Down || a.Class == Limited {
			in.Failures++
			in.Reasons[a.Reason]++
		}
	}
}

// ModelFailing reports whether the model's clients are failing now (see
// Counts.Failing), this instance's view, and since when: the first failed
// request of the run while they are, when they stopped otherwise (zero
// when they never failed).
func (r *Recorder) ModelFailing(model string, now time.Time) (failing bool, since time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.models[model]
	if s == nil {
		return false, time.Time{}
	}
	s.noteFailing(now)
	if !s.failingSince.IsZero() {
		return true, s.failingSince
	}
	return false, s.recovered
}

func incidentKey(kind, subject string) string { return kind + "\x00" + subject }

// ChannelOpened starts an incident for the channel unless one is ongoing;
// reason is what opened the breaker.
func (r *Recorder) ChannelOpened(channel, reason string, at time.Time) {
	r.begin(ScopeChannel, channel, reason, at)
}

// ChannelClosed ends the channel's ongoing incident, if any.
func (r *Recorder) ChannelClosed(channel string, at time.Time) {
	r.end(ScopeChannel, channel, at)
}

// ChannelSeenClosed ends the channel's ongoing incident when its breaker
// was seen closed at at, a close no transition reported (the clock's);
// an incident that began after at is left alone. It reports whether it
// ended one.
func (r *Recorder) ChannelSeenClosed(channel string, at time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := incidentKey(ScopeChannel, channel)
	in := r.open[key]
	if in == nil || in.Start.After(at) {
		return false
	}
	in.End = at
	delete(r.open, key)
	return true
}

// EndUnless ends, at at, every ongoing incident that keep does not keep:
// the running config says it is over, although no transition ended it (a
// reload removed its channel or model, whose breakers no config consults
// any more, or gave its model a working channel). An incident that began
// after at ends when it began. It reports how many it ended.
func (r *Recorder) EndUnless(keep func(kind, subject string) bool, at time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for key, in := range r.open {
		if keep(in.Kind, in.Subject) {
			continue
		}
		in.End = at
		if in.Start.After(at) {
			in.End = in.Start
		}
		delete(r.open, key)
		n++
	}
	return n
}

// NoWorkingChannel is the reason of a model's incident: none of its
// channels could be sent anything.
const NoWorkingChannel = "no_working_channel"

// ModelAvailable starts (ok false) or ends (ok true) the incident of a
// model with no working channel.
func (r *Recorder) ModelAvailable(model string, ok bool, at time.Time) {
	if ok {
		r.end(ScopeModel, model, at)
		return
	}
	r.begin(ScopeModel, model, NoWorkingChannel, at)
}

func (r *Recorder) begin(kind, subject, reason string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := incidentKey(kind, subject)
	if r.open[key] != nil {
		return
	}
	in := &Incident{Kind: kind, Subject: subject, Start: at, Reasons: map[string]int64{}}
	if st := r.streaks[subject]; kind == ScopeChannel && st != nil && at.Sub(st.last) <= FailingWindow {
		// The failures that opened the breaker are the incident's own:
		// an outage of three failures does not read "0 failures".
		in.Attempts, in.Failures = st.failures, st.failures
		for k, v := range st.reasons {
			in.Reasons[k] += v
		}
	} else if reason != "" {
		in.Reasons[reason]++
	}
	r.open[key] = in
	r.incidents = append(r.incidents, in)
	r.trim(at)
}

func (r *Recorder) end(kind, subject string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := incidentKey(kind, subject)
	if in := r.open[key]; in != nil {
		in.End = at
		delete(r.open, key)
	}
}

// trim drops ended incidents beyond MaxIncidents or older than the days
// the rollup keeps.
func (r *Recorder) trim(now time.Time) {
	horizon := now.Add(-Days * 24 * time.Hour)
	keep := r.incidents[:0]
	excess := len(r.incidents) - MaxIncidents
	for _, in := range r.incidents {
		if !in.Ongoing() && (excess > 0 || in.End.Before(horizon)) {
			excess--
			continue
		}
		keep = append(keep, in)
	}
	clear(r.incidents[len(keep):])
	r.incidents = keep
}

// View is one channel's or model's history as of one instant.
type View struct {
	Name string
	// Windows are keyed by the durations asked for.
	Windows     map[time.Duration]Counts
	Hourly      []Bar // Hours bars, oldest first
	Daily       []Bar // Days bars, oldest first
	LastFailure *Attempt
}

// Channel is the named channel's history at now (empty for a name never
// recorded).
func (r *Recorder) Channel(name string, now time.Time, windows ...time.Duration) View {
	return r.view(r.channels, name, now, windows)
}

// Model is the named model's history at now.
func (r *Recorder) Model(name string, now time.Time, windows ...time.Duration) View {
	return r.view(r.models, name, now, windows)
}

func (r *Recorder) view(m map[string]*series, name string, now time.Time, windows []time.Duration) View {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := m[name]
	if s == nil {
		s = newSeries() // read-only: not stored
	}
	v := View{Name: name, Windows: make(map[time.Duration]Counts, len(windows)),
		Hourly: s.hours.bars(now, Hours), Daily: s.days.bars(now, Days)}
	for _, d := range windows {
		v.Windows[d] = s.window(now, d)
	}
	if s.lastFailure != nil {
		f := *s.lastFailure
		v.LastFailure = &f
	}
	return v
}

// LastChannelFailure is the named channel's last failure, nil when none.
func (r *Recorder) LastChannelFailure(name string) *Attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.channels[name]; s != nil && s.lastFailure != nil {
		f := *s.lastFailure
		return &f
	}
	return nil
}

// Incidents returns copies of the incidents, newest first.
func (r *Recorder) Incidents() []Incident {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Incident, 0, len(r.incidents))
	for _, in := range r.incidents {
		c := *in
		c.Reasons = make(map[string]int64, len(in.Reasons))
		for k, v := range in.Reasons {
			c.Reasons[k] = v
		}
		out = append(out, c)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start.After(out[j].Start) })
	return out
}
