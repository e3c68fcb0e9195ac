// Package jobs runs the gateway's background jobs under observation: every
// run of a job (the wallet's reservation sweeper, the prober, history
// rollups, token refreshes) is recorded (last start, last success, last
// error, duration, next due) and reported to the heartbeat receivers the
// operator configured, so that a job that stops running is noticed by
// its silence, not by the outage it causes.
//
// A heartbeat never blocks or fails its job: pings are queued and sent in
// the background, retried with backoff, and dropped (logged) when the
// queue is full. Heartbeat URLs are secrets: they appear in no log line
// and no status view.
//
// The package knows HTTP and time; it knows nothing of Caddy, LLM APIs or
// money.
package jobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Registry is a set of named jobs and the heartbeats attached to them. It
// is safe for concurrent use.
type Registry struct {
	mu     sync.Mutex
	jobs   map[string]*Job
	pinger *Pinger
	now    func() time.Time
}

// NewRegistry returns an empty registry whose pings go through p.
func NewRegistry(p *Pinger) *Registry {
	return &Registry{jobs: map[string]*Job{}, pinger: p, now: time.Now}
}

// Job returns the job called name, creating it on first use. every is how
// often it is meant to run (0 when it runs on demand); the latest non-zero
// value wins.
func (r *Registry) Job(name string, every time.Duration) *Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	j, ok := r.jobs[name]
	if !ok {
		j = &Job{name: name, reg: r}
		r.jobs[name] = j
	}
	if every > 0 {
		j.mu.Lock()
		j.every = every
		j.mu.Unlock()
	}
	return j
}

// SetEvery changes how often the job is meant to run, for a job whose
// period follows its configuration (the wallet sweeper's follows the
// shortest reservation TTL): the period it reports and is judged overdue
// against is always the one it keeps.
func (j *Job) SetEvery(every time.Duration) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.every = every
}

// Attach adds a heartbeat to the job called name until detach is called.
// A config attaches its heartbeats when it starts and detaches them when
// it is unloaded; while two configs overlap during a reload, a receiver
// attached by both is pinged once.
func (r *Registry) Attach(name string, hb Heartbeat) (detach func()) {
	j := r.Job(name, 0)
	h := &hb
	j.mu.Lock()
	j.beats = append(j.beats, h)
	j.mu.Unlock()
	return func() {
		j.mu.Lock()
		defer j.mu.Unlock()
		for i, b := range j.beats {
			if b == h {
				j.beats = append(j.beats[:i:i], j.beats[i+1:]...)
				return
			}
		}
	}
}

// Status is one job's record, for the jobs view and metrics.
type Status struct {
	Name        string
	Every       time.Duration // 0: runs on demand
	Running     bool
	LastStart   time.Time
	LastSuccess time.Time
	LastError   string
	LastErrorAt time.Time
	Duration    time.Duration // of the last finished run
	Runs        uint64
	Failures    uint64
	// NextDue is when the next run is expected (last start + every),
	// zero for on-demand jobs and jobs that never ran.
	NextDue time.Time
	// Overdue is set when the job is more than one interval late: its
	// last success (or, if none, its first registration) is older than
	// twice its interval, and it is not running, or its run has lasted
	// more than hungAfter intervals (Hung).
	Overdue bool
	// Hung is set when the run under way has lasted more than hungAfter
	// intervals.
	Hung bool
	// Heartbeats counts the receivers attached (never their URLs).
	Heartbeats int
}

// Statuses returns every job's status, sorted by name.
func (r *Registry) Statuses() []Status {
	r.mu.Lock()
	jobs := make([]*Job, 0, len(r.jobs))
	for _, j := range r.jobs {
		jobs = append(jobs, j)
	}
	now := r.now()
	r.mu.Unlock()
	out := make([]Status, 0, len(jobs))
	for _, j := range jobs {
		if !j.retired() {
			out = append(out, j.Status(now))
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out
}

// Job is one background job. Run it with Run.
type Job struct {
	name string
	reg  *Registry

	mu      sync.Mutex
	every   time.Duration
	beats   []*Heartbeat
	created time.Time
	running bool
	st      Status
	// owners counts the loops running the job (Acquire); acquired is set
	// once one has, so that a job whose last owner released it is
	// retired, and since is when the current owners started.
	owners   int
	acquired bool
	since    time.Time
}

// Name is the job's name.
func (j *Job) Name() string { return j.name }

// Acquire records that one more loop runs the job (a wallet store's
// sweeper, say), until its Release. A job that was acquired and whose
// every owner has released it is retired: its store closed, so it is
// never overdue and Statuses leaves it out, until it is acquired again
// (a later config opening the same wallet), which starts its interval
// afresh. Jobs never acquired are always listed.
func (j *Job) Acquire() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.owners == 0 {
		j.since = j.reg.now()
	}
	j.owners++
	j.acquired = true
}

// Release ends one Acquire.
func (j *Job) Release() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.owners > 0 {
		j.owners--
	}
}

func (j *Job) retired() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.acquired && j.owners == 0
}

// Summary describes one run for the heartbeat receivers: counts and
// anything an operator reading the receiver's log wants to see. It must
// hold no secret.
type Summary string

// Run runs fn once as a run of the job: it records the run, pings the
// attached heartbeats (start, then success or fail, paired by a run id)
// and returns fn's error. A panic in fn is recovered and recorded as a
// failure, then re-raised for the caller's own recovery.
func (j *Job) Run(ctx context.Context, fn func(context.Context) (Summary, error)) (err error) {
	now := j.reg.now()
	run := newRunID()
	j.mu.Lock()
	if j.created.IsZero() {
		j.created = now
	}
	j.running = true
	j.st.LastStart = now
	beats := append([]*Heartbeat(nil), j.beats...)
	j.mu.Unlock()
	j.ping(beats, Ping{Job: j.name, Run: run, State: Start})

	var summary Summary
	defer func() {
		p := recover()
		if p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
		took := j.reg.now().Sub(now)
		j.mu.Lock()
		j.running = false
		j.st.Runs++
		j.st.Duration = took
		state := Success
		if err != nil {
			state = Fail
			j.st.Failures++
			j.st.LastError, j.st.LastErrorAt = err.Error(), j.reg.now()
		} else {
			j.st.LastSuccess = j.reg.now()
		}
		j.mu.Unlock()
		msg := string(summary)
		if err != nil {
			msg = err.Error()
			if summary != "" {
				msg = string(summary) + "; " + msg
			}
		}
		j.ping(beats, Ping{Job: j.name, Run: run, State: state, Message: msg, Duration: took})
		if p != nil {
			panic(p)
		}
	}()
	summary, err = fn(ctx)
	return err
}

// hungAfter is how many intervals a run may last before it counts as hung.
// A run may well last longer than one: the prober ticks four times a
// route's interval and waits for its probes, each bounded by that
// interval. One that lasts ten is stuck on something, and the job is as
// late as one that stopped.
const hungAfter = 10

// Status returns the job's record at now.
func (j *Job) Status(now time.Time) Status {
	j.mu.Lock()
	defer j.mu.Unlock()
	s := j.st
	s.Name, s.Every, s.Running, s.Heartbeats = j.name, j.every, j.running, len(j.beats)
	if j.every > 0 && !s.LastStart.IsZero() {
		s.NextDue = s.LastStart.Add(j.every)
	}
	s.Hung = j.every > 0 && j.running && now.Sub(s.LastStart) > hungAfter*j.every
	if j.every > 0 && (!j.running || s.Hung) && !(j.acquired && j.owners == 0) {
		since := s.LastSuccess
		if since.IsZero() {
			since = j.created
		}
		if j.since.After(since) {
			since = j.since // acquired again after a pause
		}
		s.Overdue = !since.IsZero() && now.Sub(since) > 2*j.every
	}
	return s
}

// ping queues one ping per distinct receiver that wants this state.
func (j *Job) ping(beats []*Heartbeat, p Ping) {
	if j.reg.pinger == nil {
		return
	}
	seen := make(map[string]bool, len(beats))
	for _, b := range beats {
		key := string(b.Style) + " " + b.URL
		if seen[key] || !b.wants(p.State) {
			continue
		}
		seen[key] = true
		j.reg.pinger.Send(*b, p)
	}
}

func newRunID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	// A UUID v4 layout: Healthchecks.io accepts only UUIDs as rid.
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
