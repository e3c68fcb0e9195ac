package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// receiver records every ping it gets.
type receiver struct {
	mu    sync.Mutex
	got   []received
	fail  bool
	delay time.Duration
	srv   *httptest.Server
}

type received struct {
	method, path string
	query        map[string]string
	body         string
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		q := map[string]string{}
		for k, v := range r.URL.Query() {
			q[k] = v[0]
		}
		rc.mu.Lock()
		rc.got = append(rc.got, received{r.Method, r.URL.Path, q, string(b)})
		fail, delay := rc.fail, rc.delay
		rc.mu.Unlock()
		time.Sleep(delay)
		if fail {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) wait(t *testing.T, n int) []received {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		rc.mu.Lock()
		if len(rc.got) >= n {
			out := append([]received(nil), rc.got...)
			rc.mu.Unlock()
			return out
		}
		rc.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("receiver got %d pings, want %d", len(rc.got), n)
	return nil
}

func TestHeartbeatStyles(t *testing.T) {
	p := NewPinger(nil, 1, 16, nil)
	defer p.Close()
	reg := NewRegistry(p)
	cases := []struct {
		style Style
		check func(t *testing.T, got []received)
		pings int
	}{
		{Healthchecks, func(t *testing.T, got []received) {
			if got[0].path != "/hc/start" || got[1].path != "/hc/fail" || got[2].path != "/hc/start" || got[3].path != "/hc" {
				t.Fatalf("paths: %+v", got)
			}
			if got[0].query["rid"] == "" || got[0].query["rid"] != got[1].query["rid"] || got[2].query["rid"] == got[0].query["rid"] {
				t.Fatalf("run ids do not pair: %+v", got)
			}
			if got[1].method != http.MethodPost || !strings.Contains(got[1].body, "store down") || got[3].body != "released 2" {
				t.Fatalf("bodies: %+v", got)
			}
		}, 4},
		{UptimeKuma, func(t *testing.T, got []received) {
			if got[0].query["status"] != "down" || got[1].query["status"] != "up" || got[1].query["msg"] != "released 2" || got[1].query["ping"] == "" {
				t.Fatalf("uptime kuma: %+v", got)
			}
		}, 2},
		{Cronitor, func(t *testing.T, got []received) {
			want := []string{"run", "fail", "run", "complete"}
			for i, w := range want {
				if got[i].query["state"] != w {
					t.Fatalf("cronitor states: %+v", got)
				}
			}
			if got[0].query["series"] != got[1].query["series"] || got[3].query["duration"] == "" {
				t.Fatalf("cronitor series/duration: %+v", got)
			}
		}, 4},
		{Generic, func(t *testing.T, got []received) {
			var a, b map[string]any
			if json.Unmarshal([]byte(got[0].body), &a) != nil || json.Unmarshal([]byte(got[1].body), &b) != nil {
				t.Fatalf("generic bodies: %+v", got)
			}
			if a["state"] != "fail" || b["state"] != "success" || a["job"] != string(Generic) || b["message"] != "released 2" {
				t.Fatalf("generic: %v %v", a, b)
			}
		}, 2},
	}
	for _, tc := range cases {
		t.Run(string(tc.style), func(t *testing.T) {
			rc := newReceiver(t)
			job := reg.Job(string(tc.style), time.Minute)
			detach := reg.Attach(job.Name(), Heartbeat{URL: rc.srv.URL + "/hc", Style: tc.style})
			defer detach()
			err := job.Run(context.Background(), func(context.Context) (Summary, error) { return "", errors.New("store down") })
			if err == nil {
				t.Fatal("the job's error was lost")
			}
			rc.wait(t, tc.pings/2)
			_ = job.Run(context.Background(), func(context.Context) (Summary, error) { return "released 2", nil })
			tc.check(t, rc.wait(t, tc.pings))
			st := job.Status(time.Now())
			if st.Runs != 2 || st.Failures != 1 || st.LastError != "store down" || st.LastSuccess.IsZero() || st.Heartbeats != 1 {
				t.Fatalf("status: %+v", st)
			}
		})
	}
}

// A receiver that fails or hangs never delays the job, and its failure is
// reported without the URL (a secret).
func TestFailingHeartbeatNeverDelaysTheJob(t *testing.T) {
	rc := newReceiver(t)
	rc.fail, rc.delay = true, 300*time.Millisecond
	var mu sync.Mutex
	var reports []string
	p := NewPinger(nil, 1, 4, []time.Duration{10 * time.Millisecond})
	p.Report = func(job string, style Style, state State, err error) {
		mu.Lock()
		reports = append(reports, job+" "+string(state)+" "+err.Error())
		mu.Unlock()
	}
	defer p.Close()
	reg := NewRegistry(p)
	secret := rc.srv.URL + "/ping/0f1e2d3c-secret-uuid"
	reg.Attach("sweep", Heartbeat{URL: secret, Style: Healthchecks})
	job := reg.Job("sweep", time.Minute)
	began := time.Now()
	for range 20 { // more than the queue holds
		_ = job.Run(context.Background(), func(context.Context) (Summary, error) { return "ok", nil })
	}
	if took := time.Since(began); took > 100*time.Millisecond {
		t.Fatalf("20 runs with a hanging receiver took %v", took)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(reports)
		mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reports) == 0 {
		t.Fatal("no failed ping was reported")
	}
	for _, r := range reports {
		if strings.Contains(r, "secret-uuid") || strings.Contains(r, rc.srv.URL) {
			t.Fatalf("a report quotes the heartbeat URL: %q", r)
		}
	}
}

func TestOverdue(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	reg := NewRegistry(nil)
	reg.now = func() time.Time { return now }
	job := reg.Job("sweep", time.Minute)
	_ = job.Run(context.Background(), func(context.Context) (Summary, error) { return "", nil })
	if st := job.Status(now.Add(90 * time.Second)); st.Overdue || !st.NextDue.Equal(now.Add(time.Minute)) {
		t.Fatalf("one interval late is not overdue: %+v", st)
	}
	if st := job.Status(now.Add(3 * time.Minute)); !st.Overdue {
		t.Fatalf("three intervals without a success is overdue: %+v", st)
	}
	// A job that fails every run is overdue too: success is what counts.
	now = now.Add(3 * time.Minute)
	_ = job.Run(context.Background(), func(context.Context) (Summary, error) { return "", errors.New("x") })
	if st := job.Status(now); !st.Overdue {
		t.Fatalf("a failing job is overdue: %+v", st)
	}
}

// A job whose loops all stopped (its wallet store closed at a reload) is
// retired: never overdue, not listed; acquired again, its interval
// starts afresh.
func TestRetiredJobIsNeverOverdue(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	reg := NewRegistry(nil)
	reg.now = func() time.Time { return now }
	job := reg.Job("leases", time.Second)
	job.Acquire()
	job.Acquire() // two configs overlapping during a reload
	_ = job.Run(context.Background(), func(context.Context) (Summary, error) { return "", nil })
	job.Release()
	now = now.Add(time.Minute)
	if st := reg.Statuses(); len(st) != 1 || !st[0].Overdue {
		t.Fatalf("a job one owner still runs and that stopped succeeding: %+v", st)
	}
	job.Release()
	if st := reg.Statuses(); len(st) != 0 {
		t.Fatalf("a retired job is listed: %+v", st)
	}
	if job.Status(now).Overdue {
		t.Fatal("a retired job is overdue")
	}
	job.Acquire()
	if st := reg.Statuses(); len(st) != 1 || st[0].Overdue {
		t.Fatalf("acquired again, the job gets a fresh interval: %+v", st)
	}
	now = now.Add(3 * time.Second)
	if st := reg.Statuses(); !st[0].Overdue {
		t.Fatalf("acquired again and not succeeding: %+v", st)
	}
	// Jobs never acquired are listed as before.
	reg.Job("prober", time.Minute)
	if st := reg.Statuses(); len(st) != 2 {
		t.Fatalf("statuses %+v", st)
	}
}

func TestPanicIsRecordedAndReraised(t *testing.T) {
	reg := NewRegistry(nil)
	job := reg.Job("p", 0)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic was swallowed")
			}
		}()
		_ = job.Run(context.Background(), func(context.Context) (Summary, error) { panic("boom") })
	}()
	if st := job.Status(time.Now()); st.Running || st.Failures != 1 || !strings.Contains(st.LastError, "boom") {
		t.Fatalf("status after panic: %+v", st)
	}
}

// A receiver that is down does not hold up the pings of another that
// shares its worker: a failed ping waits for its retry outside the
// worker (it used to hold the worker through every retry wait).
func TestDeadReceiverDoesNotDelayOthers(t *testing.T) {
	dead := newReceiver(t)
	dead.fail = true
	live := newReceiver(t)
	p := NewPinger(nil, 1, 16, []time.Duration{time.Hour})
	defer p.Close()
	p.Send(Heartbeat{URL: dead.srv.URL + "/ping/dead", Style: Healthchecks}, Ping{Job: "a", State: Success})
	dead.wait(t, 1)
	began := time.Now()
	p.Send(Heartbeat{URL: live.srv.URL + "/ping/live", Style: Healthchecks}, Ping{Job: "b", State: Success})
	live.wait(t, 1)
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("the live receiver's ping took %v behind a dead one", took)
	}
}

// A run that hangs is as late as a job that stopped running: its last
// success ages past two intervals while it is "running", and the jobs
// view, the overdue gauge and readiness must say so.
func TestHungRunIsOverdue(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	reg := NewRegistry(nil)
	reg.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	job := reg.Job("history_flush", 5*time.Second)
	_ = job.Run(context.Background(), func(context.Context) (Summary, error) { return "", nil })
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = job.Run(context.Background(), func(context.Context) (Summary, error) {
			close(started)
			<-release
			return "", nil
		})
	}()
	<-started
	defer func() { close(release); <-done }()
	if st := job.Status(now.Add(time.Second)); !st.Running || st.Overdue || st.Hung {
		t.Fatalf("a run under way within its interval: %+v", st)
	}
	// A run may last a few intervals (a prober round waits for probes
	// each bounded by four of its ticks): not late yet.
	if st := job.Status(now.Add(45 * time.Second)); st.Overdue || st.Hung {
		t.Fatalf("a run under way for nine intervals: %+v", st)
	}
	mu.Lock()
	now = now.Add(time.Hour)
	mu.Unlock()
	if st := reg.Statuses(); len(st) != 1 || !st[0].Overdue || !st[0].Hung {
		t.Fatalf("a run hung for an hour, no success in 720 intervals, is not overdue: %+v", st)
	}
}

// A receiver that hangs (accepts the ping and answers only at its
// timeout) must not hold up the pings of another receiver: the pinger
// says different receivers do not wait for each other. It did: the two
// share a worker, which waits out the hanging ping's timeout before it
// sends the next one (ten seconds per ping by default; a job pinging
// every second, as wallet_leases does, fills the worker's queue and the
// other receiver's pings are dropped).
func TestHangingReceiverDoesNotDelayOthers(t *testing.T) {
	slow := newReceiver(t)
	slow.delay = 3 * time.Second
	live := newReceiver(t)
	p := NewPinger(nil, 1, 16, nil)
	defer p.Close()
	p.Send(Heartbeat{URL: slow.srv.URL + "/ping/slow", Style: Healthchecks, Timeout: 5 * time.Second}, Ping{Job: "a", State: Success})
	slow.wait(t, 1) // the slow receiver holds the ping now
	began := time.Now()
	p.Send(Heartbeat{URL: live.srv.URL + "/ping/live", Style: Healthchecks}, Ping{Job: "b", State: Success})
	live.wait(t, 1)
	if took := time.Since(began); took > time.Second {
		t.Errorf("the live receiver's ping took %v behind a hanging one", took)
	}
}

// Pings to one receiver arrive in the order they were sent, retries
// included: a start whose first send failed must not reach the receiver
// after its run's success (Healthchecks and Cronitor would read a run
// that started and never finished, and alert on it).
func TestRetriedPingKeepsOrder(t *testing.T) {
	var mu sync.Mutex
	var got []string
	first := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if first {
			// One transient failure, as any receiver has now and then.
			first = false
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		got = append(got, r.URL.Path)
	}))
	defer srv.Close()
	p := NewPinger(nil, 1, 16, []time.Duration{20 * time.Millisecond})
	defer p.Close()
	hb := Heartbeat{URL: srv.URL + "/ping/abc", Style: Healthchecks}
	p.Send(hb, Ping{Job: "a", Run: "r1", State: Start})
	p.Send(hb, Ping{Job: "a", Run: "r1", State: Success})
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0] != "/ping/abc/start" || got[1] != "/ping/abc" {
		t.Fatalf("the receiver got %q, want the start then the success", got)
	}
}
