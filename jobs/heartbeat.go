package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Style is how a heartbeat receiver wants to be told about a run.
type Style string

// The receivers' conventions:
//
//	healthchecks  GET <url>/start?rid=<run>, POST <url>?rid=<run> (body: summary), POST <url>/fail?rid=<run>
//	uptime_kuma   GET <url>?status=up|down&msg=<summary>&ping=<ms>   (push monitors know no start)
//	cronitor      GET <url>?state=run|complete|fail&series=<run>&message=<summary>&duration=<s>
//	generic       POST <url> {"job","state","run_id","message","duration_ms"}
const (
	Healthchecks Style = "healthchecks"
	UptimeKuma   Style = "uptime_kuma"
	Cronitor     Style = "cronitor"
	Generic      Style = "generic"
)

// ParseStyle checks a style name; "" means healthchecks.
func ParseStyle(s string) (Style, error) {
	switch st := Style(s); st {
	case "":
		return Healthchecks, nil
	case Healthchecks, UptimeKuma, Cronitor, Generic:
		return st, nil
	}
	return "", fmt.Errorf("unknown heartbeat style %q (want healthchecks, uptime_kuma, cronitor or generic)", s)
}

// State is the moment of a run a ping reports.
type State string

const (
	Start   State = "start"
	Success State = "success"
	Fail    State = "fail"
)

// ParseState checks a state name.
func ParseState(s string) (State, error) {
	switch st := State(s); st {
	case Start, Success, Fail:
		return st, nil
	}
	return "", fmt.Errorf("unknown heartbeat state %q (want start, success or fail)", s)
}

// DefaultTimeout bounds one ping.
const DefaultTimeout = 10 * time.Second

// Heartbeat is one receiver attached to a job.
type Heartbeat struct {
	// URL is the receiver's ping URL. It is a secret.
	URL   string
	Style Style
	// States are the states to report; empty means success and fail
	// (and start too for healthchecks and cronitor, whose run ids pair
	// a start with its end and so measure the run's duration).
	States []State
	// Timeout bounds one ping; 0 means DefaultTimeout.
	Timeout time.Duration
}

func (h *Heartbeat) wants(s State) bool {
	if len(h.States) == 0 {
		return s != Start || h.Style == Healthchecks || h.Style == Cronitor
	}
	for _, w := range h.States {
		if w == s {
			return true
		}
	}
	return false
}

// Ping is one report about one run.
type Ping struct {
	Job      string
	Run      string // pairs a start with its success or fail
	State    State
	Message  string
	Duration time.Duration // of the finished run; 0 for start
}

// maxMessage caps the summary sent to a receiver (Healthchecks keeps 10 KB).
const maxMessage = 1000

// request builds the receiver's request for p in h's style.
func (h *Heartbeat) request(ctx context.Context, p Ping) (*http.Request, error) {
	base, err := url.Parse(h.URL)
	if err != nil {
		return nil, errors.New("the heartbeat URL does not parse")
	}
	msg := p.Message
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	q := base.Query()
	method, body := http.MethodGet, io.Reader(nil)
	ctype := ""
	switch h.Style {
	case Healthchecks, "":
		switch p.State {
		case Start:
			base.Path = strings.TrimSuffix(base.Path, "/") + "/start"
		case Fail:
			base.Path = strings.TrimSuffix(base.Path, "/") + "/fail"
		}
		q.Set("rid", p.Run)
		if p.State != Start {
			method, body, ctype = http.MethodPost, strings.NewReader(msg), "text/plain; charset=utf-8"
		}
	case UptimeKuma:
		status := "up"
		if p.State == Fail {
			status = "down"
		}
		q.Set("status", status)
		q.Set("msg", msg)
		q.Set("ping", strconv.FormatInt(p.Duration.Milliseconds(), 10))
	case Cronitor:
		state := map[State]string{Start: "run", Success: "complete", Fail: "fail"}[p.State]
		q.Set("state", state)
		q.Set("series", p.Run)
		if msg != "" {
			q.Set("message", msg)
		}
		if p.State != Start {
			q.Set("duration", strconv.FormatFloat(p.Duration.Seconds(), 'f', 3, 64))
		}
	case Generic:
		b, _ := json.Marshal(map[string]any{
			"job": p.Job, "state": p.State, "run_id": p.Run, "message": msg, "duration_ms": p.Duration.Milliseconds(),
		})
		method, body, ctype = http.MethodPost, bytes.NewReader(b), "application/json"
	default:
		return nil, fmt.Errorf("unknown heartbeat style %q", h.Style)
	}
	base.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, method, base.String(), body)
	if err != nil {
		return nil, errors.New("the heartbeat URL is not usable")
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	req.Header.Set("User-Agent", "caddy-llm-failover-heartbeat")
	return req, nil
}

// Pinger sends pings in the background, retrying failures with backoff.
// Each receiver has a queue and a sender of its own: pings to one
// receiver go out in the order they were sent, retries included (a run's
// start before its end: receivers pair them, and an end overtaken by its
// start would read as a run that never finished), and a receiver that is
// down or hangs holds up only its own pings, never another's. Send never
// blocks: when a receiver's queue is full the ping is dropped and
// reported. Failures are reported through Report with the job, style and
// a URL-free error; the URL is never passed on.
type Pinger struct {
	client  *http.Client
	queue   int // each receiver's queue size
	retries []time.Duration
	// Report is told about each ping that failed for good (dropped, or
	// every retry failed). It must not block.
	Report func(job string, style Style, state State, err error)

	mu      sync.Mutex
	senders map[string]chan pending // by receiver; a sender ends when idle
	closed  bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

type pending struct {
	hb Heartbeat
	p  Ping
}

// DefaultRetries are the waits before each retry of a failed ping.
var DefaultRetries = []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}

// senderIdle is how long a receiver's sender waits for another ping
// before it ends (a reload may have detached the receiver for good).
const senderIdle = time.Minute

// NewPinger returns a pinger whose receivers each have a queue of size
// queue. workers is kept for compatibility: every receiver has its own
// sender. Close stops it.
func NewPinger(client *http.Client, workers, queue int, retries []time.Duration) *Pinger {
	_ = workers
	if client == nil {
		client = &http.Client{}
	}
	// A redirect could send the secret URL's query to another host, and
	// receivers do not redirect pings.
	c := *client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Pinger{client: &c, queue: max(queue, 1), retries: retries, senders: map[string]chan pending{}, stop: make(chan struct{})}
}

// Send queues p for hb. It never blocks.
func (pg *Pinger) Send(hb Heartbeat, p Ping) {
	key := string(hb.Style) + " " + hb.URL
	pg.mu.Lock()
	if pg.closed {
		pg.mu.Unlock()
		return
	}
	q := pg.senders[key]
	if q == nil {
		q = make(chan pending, pg.queue)
		pg.senders[key] = q
		pg.wg.Add(1)
		go pg.send(key, q)
	}
	select {
	case q <- pending{hb: hb, p: p}:
		pg.mu.Unlock()
	default:
		pg.mu.Unlock()
		pg.report(p.Job, hb.Style, p.State, errors.New("heartbeat queue full; ping dropped"))
	}
}

// Close stops the senders; queued pings not yet sent are dropped.
func (pg *Pinger) Close() {
	pg.mu.Lock()
	if !pg.closed {
		pg.closed = true
		close(pg.stop)
	}
	pg.mu.Unlock()
	pg.wg.Wait()
}

// send delivers one receiver's pings in order, until it has had none for
// senderIdle (it then ends; the next Send starts another) or Close.
func (pg *Pinger) send(key string, q chan pending) {
	defer pg.wg.Done()
	idle := time.NewTimer(senderIdle)
	defer idle.Stop()
	for {
		select {
		case <-pg.stop:
			return
		case it := <-q:
			if !pg.deliver(it) {
				return
			}
			idle.Reset(senderIdle)
		case <-idle.C:
			pg.mu.Lock()
			if len(q) == 0 {
				// Under the lock: no Send can queue into q from now on.
				delete(pg.senders, key)
				pg.mu.Unlock()
				return
			}
			pg.mu.Unlock()
			idle.Reset(senderIdle)
		}
	}
}

// deliver sends one ping, retrying it after each wait of retries; the
// receiver's later pings wait behind it, so that they keep their order.
// It returns false when the pinger was closed meanwhile.
func (pg *Pinger) deliver(it pending) bool {
	for attempt := 0; ; attempt++ {
		err := pg.once(it)
		if err == nil {
			return true
		}
		if attempt == len(pg.retries) {
			pg.report(it.p.Job, it.hb.Style, it.p.State, err)
			return true
		}
		t := time.NewTimer(pg.retries[attempt])
		select {
		case <-pg.stop:
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

func (pg *Pinger) once(it pending) error {
	timeout := it.hb.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := it.hb.request(ctx, it.p)
	if err != nil {
		return err
	}
	res, err := pg.client.Do(req)
	if err != nil {
		// *url.Error quotes the URL, a secret: keep only its cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("sending ping: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	res.Body.Close()
	if res.StatusCode >= 300 {
		return fmt.Errorf("receiver answered %d", res.StatusCode)
	}
	return nil
}

func (pg *Pinger) report(job string, style Style, state State, err error) {
	if pg.Report != nil {
		pg.Report(job, style, state, err)
	}
}
