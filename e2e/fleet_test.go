package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// The two instances of TestBinaryKill9PostgresRecovers.
var (
	portsFleetA = ports{19501, 19502}
	portsFleetB = ports{19503, 19504}
)

// fleetHoldTTL bounds how long what a dead instance held stays held: the
// survivor's sweeper releases it once it is this old and no longer
// extended.
const fleetHoldTTL = 2 * time.Second

// fleetWallet is the whole llm_wallet block of both instances of
// TestBinaryKill9PostgresRecovers: every wallet option the test depends on
// is here. A dead instance's money is held by its credit leases
// (lease_ttl) and, should any remain, reservation rows (reservation_ttl):
// both are fleetHoldTTL.
var fleetWallet = fmt.Sprintf("\t\tstore postgres {env.LLMF_E2E_DSN}\n\t\treservation_ttl %s\n\t\tlease_ttl %s", fleetHoldTTL, fleetHoldTTL)

// oneDollarModel is the llm_failover block of a billed channel and model
// whose every request reserves, and is charged, exactly $1: input is
// free, max_output_tokens is 10 at $0.10 per token, and the upstream
// (upstreamURL) must report 10 output tokens (WithUsage(n, 10)).
func oneDollarModel(channel, model, upstreamURL string) string {
	return fmt.Sprintf(`
		channel %[1]s %[3]s
		model %[2]s {
			route %[1]s
			price 0 100000
			max_output_tokens 10
		}
		wallet
`, channel, model, upstreamURL)
}

// fleetOutcome is what a client of the fleet saw of one request.
type fleetOutcome struct {
	instance   int // index into the instances
	stream     bool
	status     int
	requestID  string // the X-Request-Id the site adds ({http.request.uuid})
	complete   bool   // JSON read whole, or the stream ended with [DONE]
	sent, done time.Time
	err        string
}

// fleetLoad keeps requests in flight on each instance until that
// instance's stop channel closes, and records every outcome.
type fleetLoad struct {
	secret string
	urls   []string
	stops  []chan struct{}
	// midStream counts, per instance, the streams that have delivered
	// content and not yet ended: reservations in flight.
	midStream []atomic.Int64
	// served counts, per instance, the complete 200 answers.
	served []atomic.Int64

	wg       sync.WaitGroup
	mu       sync.Mutex
	outcomes []fleetOutcome
}

func newFleetLoad(secret string, ins []*instance) *fleetLoad {
	l := &fleetLoad{secret: secret, midStream: make([]atomic.Int64, len(ins)), served: make([]atomic.Int64, len(ins))}
	for _, in := range ins {
		l.urls = append(l.urls, in.gatewayURL()+"/v1/chat/completions")
		l.stops = append(l.stops, make(chan struct{}))
	}
	return l
}

// start runs, on every instance, streamers workers sending streamed
// requests and jsoners sending plain ones, each one request at a time.
func (l *fleetLoad) start(streamers, jsoners int) {
	for i := range l.urls {
		for w := 0; w < streamers+jsoners; w++ {
			l.wg.Add(1)
			go func(i int, stream bool) {
				defer l.wg.Done()
				for {
					select {
					case <-l.stops[i]:
						return
					default:
					}
					o := l.one(i, stream)
					l.mu.Lock()
					l.outcomes = append(l.outcomes, o)
					l.mu.Unlock()
					if o.status == 0 {
						// The instance is gone; wait to be told to stop
						// rather than spin on refused connections.
						<-l.stops[i]
						return
					}
				}
			}(i, w < streamers)
		}
	}
}

// stop stops the workers of instance i; they finish the request they are in.
func (l *fleetLoad) stop(i int) { close(l.stops[i]) }

// one sends one request to instance i.
func (l *fleetLoad) one(i int, stream bool) (o fleetOutcome) {
	o = fleetOutcome{instance: i, stream: stream, sent: time.Now()}
	defer func() { o.done = time.Now() }()
	req, _ := http.NewRequest(http.MethodPost, l.urls[i], strings.NewReader(string(fu.ChatRequest("gpt-fleet", stream))))
	req.Header.Set("Authorization", "Bearer "+l.secret)
	resp, err := gatewayClient.Do(req)
	if err != nil {
		o.err = err.Error()
		return o
	}
	defer resp.Body.Close()
	o.status, o.requestID = resp.StatusCode, resp.Header.Get("X-Request-Id")
	if resp.StatusCode != http.StatusOK || !stream {
		b, err := io.ReadAll(resp.Body)
		o.complete = err == nil && resp.StatusCode == http.StatusOK && strings.Contains(string(b), "Hello from fleet")
		if !o.complete {
			o.err = fmt.Sprintf("body %q, read error %v", b, err)
		}
	} else {
		counted := false
		events, err := readSSE(resp.Body, o.sent, func(ev sseEvent) {
			if !counted && strings.Contains(ev.Data, `"content":"Hello"`) {
				counted = true
				l.midStream[i].Add(1)
			}
		})
		if counted {
			l.midStream[i].Add(-1)
		}
		text, sawErr := chatText(events)
		o.complete = err == nil && len(events) > 0 && events[len(events)-1].Data == "[DONE]" && text == "Hello from fleet" && !sawErr
		if !o.complete {
			o.err = fmt.Sprintf("stream: %d events, text %q, error event %v, read error %v", len(events), text, sawErr, err)
		}
	}
	if o.complete {
		l.served[i].Add(1)
	}
	return o
}

// TestBinaryKill9PostgresRecovers runs two gateway processes on one
// PostgreSQL wallet under load, with streams held open by a slow upstream
// so that reservations are in flight, and kills one with SIGKILL
// mid-stream. The survivor keeps serving (its own streams outlive the hold
// TTL without being released); once the dead instance's holds expire, the
// survivor's sweeper releases them: nothing stays reserved, the books
// balance, every answer the survivor gave is charged exactly once, nothing
// the dead instance cut off is charged, and `caddy llm-wallet audit` is
// clean. The killed instance then restarts on the same config and serves.
func TestBinaryKill9PostgresRecovers(t *testing.T) {
	caddyBin(t)
	dsn := createDatabase(t, postgresDSN(t))

	// Every request reserves, and is charged, exactly $1. A stream lasts
	// about 3 s (7 events 500 ms apart), longer than the hold TTL; every
	// answer's headers wait 100 ms, which paces the plain requests.
	up := fu.New(fu.SlowHeaders(100*time.Millisecond, fu.OKNamed("fleet").WithUsage(11, 10).WithEventDelay(500*time.Millisecond)))
	defer up.Close()
	body := oneDollarModel("fleet", "gpt-fleet", up.URL)
	ins := make([]*instance, 2)
	for i, p := range []ports{portsFleetA, portsFleetB} {
		cfg := withWallet(globalOptions(p), fleetWallet) + site(p, body)
		// The client learns each request's ID, which the ledger records.
		cfg = strings.Replace(cfg, "\t\tdefer\n", "\t\tdefer\n\t\tX-Request-Id {http.request.uuid}\n", 1)
		ins[i] = newInstance(t, fmt.Sprintf("fleet-%c", 'a'+i), p, cfg, "LLMF_E2E_DSN="+dsn)
	}
	dead, survivor := ins[0], ins[1]
	const credit = "1000"
	secret := dead.newAccount("acme", credit)

	load := newFleetLoad(secret, ins)
	load.start(3, 1)
	if !waitFor(15*time.Second, func() bool {
		return load.midStream[0].Load() >= 2 && load.midStream[1].Load() >= 1 && load.served[0].Load() >= 3 && load.served[1].Load() >= 3
	}) {
		t.Fatalf("no streams in flight on both instances within 15s (mid-stream %d and %d, served %d and %d)",
			load.midStream[0].Load(), load.midStream[1].Load(), load.served[0].Load(), load.served[1].Load())
	}
	killed := time.Now()
	dead.kill9()
	load.stop(0)
	// The survivor serves on until its own holds have outlived the TTL, so
	// the dead instance's expire and are swept while it is loaded.
	servedAtKill := load.served[1].Load()
	if !waitFor(30*time.Second, func() bool {
		return time.Since(killed) > fleetHoldTTL+time.Second && load.served[1].Load() >= servedAtKill+5
	}) {
		t.Errorf("the survivor served %d requests in the 30s after the kill", load.served[1].Load()-servedAtKill)
	}
	load.stop(1)
	load.wg.Wait()

	var acct account
	if !waitFor(fleetHoldTTL+15*time.Second, func() bool { acct = survivor.account("acme"); return micros(t, acct.Reserved) == 0 }) {
		t.Fatalf("%v after the kill, money is still reserved: %+v", time.Since(killed).Round(time.Millisecond), acct)
	}

	charges := map[string]int{}
	var charged wallet.Micros
	for _, e := range survivor.ledger("acme") {
		if e.Kind != "charge" {
			continue
		}
		charges[e.RequestID]++
		charged += micros(t, e.Cost)
		if micros(t, e.Cost) != micros(t, "1") || e.TokensOut != 10 {
			t.Errorf("charge %+v, want 10 output tokens for $1", e)
		}
	}
	var (
		cut, uncharged, spanned int
		perInstance             [2]int
	)
	for _, o := range load.outcomes {
		perInstance[o.instance]++
		if o.instance == 1 {
			// The survivor: every request answered in full, charged once.
			if o.status != http.StatusOK || !o.complete {
				t.Errorf("survivor: request (stream %v, sent %v after the kill) got status %d: %s",
					o.stream, o.sent.Sub(killed).Round(time.Millisecond), o.status, o.err)
				continue
			}
			if o.requestID == "" || charges[o.requestID] != 1 {
				t.Errorf("survivor: answer %q has %d charge rows, want 1", o.requestID, charges[o.requestID])
			}
			if o.stream && o.sent.Before(killed.Add(fleetHoldTTL)) && o.done.After(killed.Add(fleetHoldTTL)) {
				spanned++
			}
			continue
		}
		switch {
		case o.status == http.StatusOK && o.complete:
			// Answered before the crash: charged at most once (a crash
			// between the answer and its settlement leaves it uncharged).
			if n := charges[o.requestID]; n > 1 {
				t.Errorf("dead instance: answer %q has %d charge rows", o.requestID, n)
			} else if n == 0 {
				uncharged++
			}
		case o.status == http.StatusOK:
			// Cut off by the kill: its hold is released, never charged.
			cut++
			if n := charges[o.requestID]; n != 0 {
				t.Errorf("dead instance: the stream %q the kill cut off has %d charge rows", o.requestID, n)
			}
		case o.status != 0 || o.done.Before(killed):
			t.Errorf("dead instance: status %d before the kill: %s", o.status, o.err)
		}
	}
	for id, n := range charges {
		if n != 1 {
			t.Errorf("request %q was charged %d times", id, n)
		}
	}
	t.Logf("requests per instance %v; the kill cut %d streams; %d of the dead instance's answers were uncharged; %d survivor streams spanned the hold TTL; %d charges",
		perInstance, cut, uncharged, spanned, len(charges))
	if cut == 0 {
		t.Errorf("the kill cut no stream: nothing was in flight on the dead instance")
	}
	if spanned == 0 {
		t.Errorf("no survivor stream was in flight across the hold TTL after the kill")
	}
	balance := micros(t, acct.Balance)
	if balance < 0 || balance != micros(t, credit)-charged {
		t.Errorf("balance %s, want credits %s minus the charges %s, and >= 0", acct.Balance, credit, charged)
	}
	fleetAudit(t, survivor)

	// The killed instance comes back on the same config and serves.
	dead.start()
	for _, stream := range []bool{false, true} {
		if o := load.one(0, stream); o.status != http.StatusOK || !o.complete {
			t.Fatalf("restarted instance: stream %v: status %d: %s", stream, o.status, o.err)
		}
	}
	if !waitFor(10*time.Second, func() bool { acct = dead.account("acme"); return micros(t, acct.Reserved) == 0 }) {
		t.Fatalf("after the restarted instance's two answers, money is still reserved: %+v", acct)
	}
	if want := balance - 2*micros(t, "1"); micros(t, acct.Balance) != want {
		t.Errorf("balance after the restarted instance's two answers %s, want %s", acct.Balance, want)
	}
	fleetAudit(t, dead)
}

// fleetAudit runs `caddy llm-wallet audit` against an instance, as an
// operator would after an incident.
func fleetAudit(t *testing.T, in *instance) {
	t.Helper()
	out, err := runCaddy(t, in.env, "llm-wallet", "--address", in.adminAddr(), "audit")
	if err != nil || !strings.HasPrefix(out, "clean:") {
		t.Errorf("%s: caddy llm-wallet audit: %v\n%s", in.name, err, out)
	}
}
