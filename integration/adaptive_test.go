package integration_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// The latency replay (adaptive_deadlines). Two fake channels draw their
// timings from recorded-looking distributions:
//
//   - fast: time to first token log-normal around 120 ms (p99 about
//     0.4 s), except that in the replay some requests meet a channel gone
//     silent: no response headers at all, or headers and a preamble and
//     then nothing;
//   - slow: healthy, but its first token takes long for long prompts:
//     log-normal around 400 ms for short prompts, around 5 s (up to 9 s)
//     for prompts over 128 KiB (half of them over a fixed 5 s).
//
// Each model has an always-good backup. The same replay is sent at once to
// three handlers: adaptive_deadlines (defaults but min_samples 30), the
// fixed defaults, and fixed timeouts tightened to 5 s. With adaptive
// deadlines a silent channel must be left within max(3 × its p99, 5 s),
// and no slow-but-healthy request may be cut (served by the backup).

// replayFast serves the fast channel: silent when the prompt says so.
func replayFast(seed uint64) fu.Behavior {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 1))
	return fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, n int64) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		switch {
		case bytes.Contains(body, []byte("SILENT-HEADERS")):
			<-r.Context().Done()
			return
		case bytes.Contains(body, []byte("SILENT-CONTENT")):
			fu.SlowFirstToken(time.Hour).Named("fast").Serve(w, r, n)
			return
		}
		mu.Lock()
		d := logNormal(rng, 120*time.Millisecond, 0.5, 2*time.Second)
		mu.Unlock()
		fu.SlowFirstToken(d).Named("fast").Serve(w, r, n)
	})
}

// replaySlow serves the slow channel: long prompts take seconds.
func replaySlow(seed uint64) fu.Behavior {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 2))
	return fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, n int64) {
		mu.Lock()
		d := logNormal(rng, 400*time.Millisecond, 0.4, 2*time.Second)
		if r.ContentLength > 128<<10 {
			d = logNormal(rng, 5*time.Second, 0.25, 9*time.Second)
		}
		mu.Unlock()
		fu.SlowFirstToken(d).Named("slow").Serve(w, r, n)
	})
}

// logNormal draws from a log-normal distribution of the given median and
// sigma, capped.
func logNormal(rng *rand.Rand, median time.Duration, sigma float64, capAt time.Duration) time.Duration {
	return min(time.Duration(float64(median)*math.Exp(sigma*rng.NormFloat64())), capAt)
}

// replayHandler is one handler of the replay under prefix, its channels
// named with suffix (so that each handler's channels keep their own
// breakers and latencies), with more options.
func replayHandler(prefix, suffix, fast, slow, backup, options string) string {
	return fmt.Sprintf(`
	handle_path /%[1]s/* {
		llm_failover {
			channel fast-%[2]s %[3]s
			channel slow-%[2]s %[4]s
			channel backup-%[2]s %[5]s
			model fastm-%[2]s {
				route fast-%[2]s cost 1 1
				route backup-%[2]s cost 2 2
			}
			model slowm-%[2]s {
				route slow-%[2]s cost 1 1
				route backup-%[2]s cost 2 2
			}
			breaker {
				failures 64
			}
			%[6]s
		}
	}`, prefix, suffix, fast, slow, backup, options)
}

// replayRequest is one request of the replay.
type replayRequest struct {
	model  string // fastm or slowm
	long   bool   // a prompt over 128 KiB
	silent string // "", SILENT-HEADERS or SILENT-CONTENT (fast only)
}

func (q replayRequest) body(suffix string) []byte {
	prompt := "hello " + q.silent
	if q.long {
		prompt += strings.Repeat("lorem ipsum ", 140<<10/12)
	}
	return []byte(fmt.Sprintf(`{"model":"%s-%s","messages":[{"role":"user","content":%q}],"stream":true,"max_tokens":256}`, q.model, suffix, prompt))
}

// replayResult is what the client of one request saw.
type replayResult struct {
	q        replayRequest
	took     time.Duration // until the answer ended (or the client gave up)
	servedBy string
	ok       bool // a complete answer
}

// replayInFlight is the most requests one handler's replay has open at
// once. Sending all of them at once (480 over the three handlers, 60 of
// each handler's with 140 KiB prompts) made a race-instrumented Caddy on a
// busy CI machine queue them for seconds, so the "fast" channel's learned
// times measured the test's own burst (median 2.7 s to its headers where
// the fake answers in 120 ms), not the channel.
const replayInFlight = 24

// replay sends reqs in order to the handler under prefix, at most
// replayInFlight at once, and waits for every answer, giving up on one
// after giveUp.
func replay(t *testing.T, prefix, suffix string, reqs []replayRequest, giveUp time.Duration) []replayResult {
	out := make([]replayResult, len(reqs))
	var wg sync.WaitGroup
	slots := make(chan struct{}, replayInFlight)
	for i, q := range reqs {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			ctx, cancel := context.WithTimeout(context.Background(), giveUp)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gatewayURL+"/"+prefix+"/v1/chat/completions", bytes.NewReader(q.body(suffix)))
			req.Header.Set("Content-Type", "application/json")
			began := time.Now()
			res, err := http.DefaultClient.Do(req)
			r := replayResult{q: q}
			if err == nil {
				body, rerr := io.ReadAll(res.Body)
				res.Body.Close()
				r.servedBy = res.Header.Get("X-Served-By")
				r.ok = rerr == nil && res.StatusCode == 200 && bytes.Contains(body, []byte("[DONE]")) && !bytes.Contains(body, []byte(`"error"`))
			}
			r.took = time.Since(began)
			out[i] = r
		}()
	}
	wg.Wait()
	return out
}

// replaySummary is what a handler did with the replay's silent and slow
// requests.
type replaySummary struct {
	silentLeftMax  time.Duration // the longest a silent request took to be answered by the backup
	silentUnserved int           // silent requests not answered (within the client's patience)
	slowCut        int           // slow-but-healthy requests the slow channel did not serve
	slowMax        time.Duration
}

func summarize(t *testing.T, results []replayResult, suffix string) replaySummary {
	var s replaySummary
	for _, r := range results {
		switch {
		case r.q.silent != "":
			if !r.ok || r.servedBy != "backup-"+suffix {
				s.silentUnserved++
				continue
			}
			s.silentLeftMax = max(s.silentLeftMax, r.took)
		case r.q.model == "slowm":
			if !r.ok || r.servedBy != "slow-"+suffix {
				s.slowCut++
			}
			s.slowMax = max(s.slowMax, r.took)
		default:
			if !r.ok {
				t.Errorf("%s: a plain fast request failed: %+v", suffix, r)
			}
		}
	}
	return s
}

func TestAdaptiveDeadlinesReplay(t *testing.T) {
	fast := upstream(t, replayFast(1))
	slow := upstream(t, replaySlow(2))
	backup := upstream(t, fu.OKNamed("backup"))
	cfg := testGlobals("") + fmt.Sprintf("http://localhost:%d {\n\theader {\n\t\tdefer\n\t\tX-Served-By {http.llm_failover.channel}\n\t}", httpPort) +
		replayHandler("adaptive", "ad", fast.URL, slow.URL, backup.URL, "adaptive_deadlines {\n\t\t\t\tmin_samples 30\n\t\t\t}") +
		replayHandler("fixed", "fx", fast.URL, slow.URL, backup.URL, "") +
		replayHandler("tight", "ti", fast.URL, slow.URL, backup.URL, "stream_header_timeout 5s\n\t\t\tstream_gate 5s failover") +
		"\n}\n"
	caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort}).InitServer(cfg, "caddyfile")
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()

	// Learning: the traffic a channel sees before it goes silent.
	var learn []replayRequest
	for range 60 {
		learn = append(learn, replayRequest{model: "fastm"}, replayRequest{model: "slowm"})
	}
	for range 40 {
		learn = append(learn, replayRequest{model: "slowm", long: true})
	}
	// The replay: the fast channel goes silent for some requests, the
	// slow one keeps serving long prompts slowly.
	var reqs []replayRequest
	for i := range 40 {
		q := replayRequest{model: "fastm"}
		switch {
		case i%10 == 3:
			q.silent = "SILENT-HEADERS"
		case i%10 == 7:
			q.silent = "SILENT-CONTENT"
		}
		reqs = append(reqs, q, replayRequest{model: "slowm"})
	}
	for range 20 {
		reqs = append(reqs, replayRequest{model: "slowm", long: true})
	}
	const giveUp = 35 * time.Second
	handlers := []struct{ prefix, suffix string }{{"adaptive", "ad"}, {"fixed", "fx"}, {"tight", "ti"}}
	sums := make([]replaySummary, len(handlers))
	var wg sync.WaitGroup
	for i, h := range handlers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replay(t, h.prefix, h.suffix, learn, giveUp)
			sums[i] = summarize(t, replay(t, h.prefix, h.suffix, reqs, giveUp), h.suffix)
		}()
	}
	wg.Wait()

	// The fast channel's own p99 time to first content, as the gateway
	// learned it, for the bound the issue sets.
	var status statusJSON
	if err := adminGet(t, "/llm_failover/status", &status); err != nil {
		t.Fatal(err)
	}
	var fastP99 time.Duration
	var learned []failoverapp.LearnedDeadlineView
	for _, m := range status.Models {
		for _, c := range m.Channels {
			if c.Name == "fast-ad" {
				learned = c.LearnedDeadlines
				for _, d := range c.LearnedDeadlines {
					if d.Kind == "first_content" && d.Class == "s/s" {
						fastP99 = time.Duration(d.QuantileMs) * time.Millisecond
					}
				}
			}
		}
	}
	// The bound each silent request was held to is its deadline when it
	// was sent, max(3 × the p99 then, 5 s), as journaled; the p99 moves
	// with the load while the replay runs.
	bound := max(3*fastP99, 5*time.Second)
	for _, d := range decisionsOf(t, "fastm-ad", "learned_deadline") {
		bound = max(bound, d.Deadline)
	}
	silent := 0
	for _, q := range reqs {
		if q.silent != "" {
			silent++
		}
	}
	for i, h := range handlers {
		s := sums[i]
		t.Logf("%-8s silent requests (%d): longest until served by the backup %s, unserved within %s: %d; slow-but-healthy cut: %d of %d (slowest %s)",
			h.prefix, silent, s.silentLeftMax.Round(100*time.Millisecond), giveUp, s.silentUnserved, s.slowCut, 60, s.slowMax.Round(100*time.Millisecond))
	}
	t.Logf("fast channel's learned p99 to first content %s at the end: bound max(3 × p99, 5 s), or the longest deadline journaled, %s; learned deadlines %+v", fastP99, bound, learned)
	ad, fx, ti := sums[0], sums[1], sums[2]
	if fastP99 == 0 {
		t.Fatal("the fast channel's first-content quantile was not learned")
	}
	// Timer and scheduling slack on a busy two-core machine, on top of the
	// bound; the backup answers in milliseconds.
	const slack = 1500 * time.Millisecond
	if bound > 15*time.Second {
		t.Errorf("a learned deadline of %s: not much better than the fixed 30 s", bound)
	}
	if ad.silentUnserved != 0 || ad.silentLeftMax > bound+slack {
		t.Errorf("adaptive: %d silent requests unserved, the slowest left after %s (bound %s)", ad.silentUnserved, ad.silentLeftMax, bound)
	}
	if ad.slowCut != 0 {
		t.Errorf("adaptive: %d slow-but-healthy requests cut", ad.slowCut)
	}
	// What the fixed numbers do with the same replay: the defaults wait
	// 30 s for a silent channel's headers and never leave one that sent
	// them; 5 s leaves silent channels as fast but cuts long prompts.
	if fx.silentUnserved == 0 && fx.silentLeftMax < 25*time.Second {
		t.Errorf("fixed defaults left the silent channel after %s: the replay proves nothing", fx.silentLeftMax)
	}
	if ti.slowCut == 0 {
		t.Errorf("5 s fixed timeouts cut no slow request: the replay's slow channel is not slow enough to prove anything")
	}
	if got := decisionsOf(t, "fastm-ad", "learned_deadline"); len(got) < silent {
		t.Errorf("%d learned_deadline decisions for %d silent requests", len(got), silent)
	} else {
		kinds := map[string]int{}
		for _, d := range got {
			kinds[d.DeadlineKind]++
		}
		if kinds["header"] == 0 || kinds["first_content"] == 0 {
			t.Errorf("learned deadlines fired by kind: %v, want header and first_content", kinds)
		}
	}
}

// A committed stream's stall limit is learned from the channel's pauses:
// a channel whose streams pause 20 ms between tokens is stalled after the
// stall floor (500 ms here), not after stream_idle_timeout's 60 s, and the
// journal says the learned limit fired.
func TestAdaptiveStallLimitIsLearned(t *testing.T) {
	pieces := strings.Split(strings.Repeat("tok ", 10), " ")
	a := upstream(t, fu.OKNamed("a").WithPieces(pieces...).WithEventDelay(20*time.Millisecond))
	gateway(t, `
		channel a %s
		model stall-m {
			route a
		}
		adaptive_deadlines {
			min_samples 5
			stall_floor 500ms
		}`, a.URL)
	for range 8 {
		res, body := post(t, "/v1/chat/completions", fu.ChatRequest("stall-m", true))
		if res.StatusCode != 200 || !bytes.Contains(body, []byte("[DONE]")) {
			t.Fatalf("learning: status %d: %s", res.StatusCode, body)
		}
	}
	a.Set(fu.StallMidStream(10 * time.Second))
	began := time.Now()
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("stall-m", true))
	took := time.Since(began)
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	mustContain(t, body, "stream_stalled")
	if took > 5*time.Second {
		t.Errorf("the stall was cut after %s, not after the learned limit", took)
	}
	got := decisionsOf(t, "stall-m", "stalled")
	if len(got) != 1 || got[0].DeadlineKind != "gap" || got[0].Deadline != 500*time.Millisecond {
		t.Errorf("stalled decisions %+v, want one naming the learned gap limit of 500ms", got)
	}
}

// A reload that turns adaptive_deadlines off stops showing learned
// deadlines for the channel: the metric and the status page no longer
// claim deadlines the gateway does not apply. The channel kept the last
// learning config any handler had given it, so after the reload they
// went on reporting the old config's learned limits while every request
// waited the configured timeouts.
func TestReloadWithoutAdaptiveDeadlinesStopsReportingThem(t *testing.T) {
	a := upstream(t, fu.OKNamed("a"))
	channel := uniqueName("adoff")
	body := `
		channel ` + channel + ` %s
		model adoff-m {
			route ` + channel + `
		}
		%s`
	gateway(t, body, a.URL, "adaptive_deadlines {\n\t\t\tmin_samples 5\n\t\t}")
	for range 8 {
		if res, b := post(t, "/v1/chat/completions", fu.ChatRequest("adoff-m", true)); res.StatusCode != 200 {
			t.Fatalf("learning: status %d: %s", res.StatusCode, b)
		}
	}
	metric := `caddy_llm_failover_learned_deadline_seconds{channel="` + channel + `"`
	metrics := func() string {
		t.Helper()
		_, b := getBody(t, adminURL+"/metrics")
		return string(b)
	}
	if !strings.Contains(metrics(), metric) {
		t.Fatalf("no learned deadline for %s with adaptive_deadlines on", channel)
	}

	gateway(t, body, a.URL, "")
	if m := metrics(); strings.Contains(m, metric) {
		t.Errorf("with adaptive_deadlines off, /metrics still reports learned deadlines of %s", channel)
	}
	_, st := getBody(t, adminURL+"/llm_failover/status")
	if strings.Contains(string(st), `"learned_deadlines"`) && strings.Contains(string(st), `"learned":true`) {
		t.Errorf("with adaptive_deadlines off, the status still shows learned deadlines: %s", st)
	}
}

// The learned deadline the metric (and the status page) reports is the
// one the gateway applies. A whole (non-streaming) answer's first content
// is bounded by header_timeout, not by a stream's stream_header_timeout
// plus stream_gate: reporting it capped at the stream's bound claims a
// deadline shorter than the one every such request is given, and an
// operator reading it is misled about when the channel is left.
func TestLearnedDeadlineMetricIsTheAppliedOne(t *testing.T) {
	a := upstream(t, fu.SlowFirstToken(150*time.Millisecond).Named("a"))
	channel := uniqueName("adwhole")
	gateway(t, `
		channel `+channel+` %s
		model adwhole-m {
			route `+channel+`
		}
		stream_header_timeout 200ms
		stream_gate 100ms
		adaptive_deadlines {
			min_samples 5
			floor 50ms
		}`, a.URL)
	for range 8 {
		if res, b := post(t, "/v1/chat/completions", fu.ChatRequest("adwhole-m", false)); res.StatusCode != 200 {
			t.Fatalf("learning: status %d: %s", res.StatusCode, b)
		}
	}
	// The learned first-content deadline of the channel's (only) class.
	reported := -1.0
	_, b := getBody(t, adminURL+"/metrics")
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, `caddy_llm_failover_learned_deadline_seconds{channel="`+channel+`"`) &&
			strings.Contains(line, `kind="first_content"`) {
			_, v, _ := strings.Cut(line, "} ")
			fmt.Sscan(v, &reported)
		}
	}
	if reported < 0 {
		t.Fatalf("no learned first_content deadline reported for %s:\n%s", channel, b)
	}
	// A whole answer that takes 400 ms is within the deadline applied
	// (3 × the channel's p99 of about 170 ms): it is served.
	a.Set(fu.SlowFirstToken(400 * time.Millisecond).Named("a"))
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("adwhole-m", false))
	if res.StatusCode != 200 {
		t.Fatalf("a 400 ms whole answer: status %d: %s", res.StatusCode, body)
	}
	if reported < 0.4 {
		t.Errorf("the metric reports a learned first_content deadline of %.3fs, yet a whole answer that took 0.4s was served within the deadline applied", reported)
	}
}
