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

// Recorder is the history of every channel and model of a gateway. It is
// safe for concurrent use; Record is a map lookup and a few additions
// under one mutex.
type Recorder struct {
	mu        sync.Mutex
	channels  map[string]*series
	models    map[string]*series
	incidents []*Incident // oldest first
	open      map[string]*Incident
	// changes is what each bucket gained since a store last took them;
	// nil unless Track.
	changes map[deltaKey]*Counts
}

// NewRecorder returns an empty history.
func NewRecorder() *Recorder {
	return &Recorder{channels: map[string]*series{}, models: map[string]*series{}, open: map[string]*Incident{}}
}

func seriesOf(m map[string]*series, name string) *series {
	s := m[name]
	if s == nil {
		s = newSeries()
		m[name] = s
	}
	return s
}

// Record adds one attempt to its channel's and its model's history, and to
// the ongoing incidents of either.
func (r *Recorder) Record(a Attempt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	seriesOf(r.channels, a.Channel).add(a)
	seriesOf(r.models, a.Model).add(a)
	r.track(a)
	for _, key := range [...]string{incidentKey(ScopeChannel, a.Channel), incidentKey(ScopeModel, a.Model)} {
		if in := r.open[key]; in != nil {
			in.Attempts++
			if a.Class == Down || a.Class == Limited {
				in.Failures++
				in.Reasons[a.Reason]++
			}
		}
	}
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
	if reason != "" {
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
