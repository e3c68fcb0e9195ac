package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/jobs"
	"github.com/llmfailover/caddy-llm-failover/probe"
)

// In-process tests of the synthetic checks through a real Caddy and real
// loopback upstreams. Each test has its own channel names: the probe
// records and the history outlive configs.

func probeConfig(prefix, upstream, probeOpts string) string {
	return strings.NewReplacer("prA", prefix+"A", "prm", prefix+"m").Replace(testGlobals("") + fmt.Sprintf(`http://localhost:%d {
	handle /status* {
		llm_status
	}
	llm_failover {
		channel prA %s
		model prm {
			route prA cost 1 1
			probe {
				%s
			}
		}
		breaker {
			cooldown 300ms
		}
	}
}
`, httpPort, upstream, probeOpts))
}

func probeGateway(t *testing.T, prefix, upstream, probeOpts string) {
	t.Helper()
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	tc := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tc.InitServer(probeConfig(prefix, upstream, probeOpts), "caddyfile")
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}

func probedChannel(t *testing.T, name string) (state string, probes map[string]any) {
	t.Helper()
	return probedChannelAt(t, fmt.Sprintf("http://localhost:%d/status?format=json", httpPort), name)
}

// probedChannelAt reads the channel from the status JSON at url.
func probedChannelAt(t *testing.T, url, name string) (state string, probes map[string]any) {
	t.Helper()
	_, body := getBody(t, url)
	var v struct {
		Models []struct {
			Channels []struct {
				Name   string         `json:"name"`
				State  string         `json:"state"`
				Probes map[string]any `json:"probes"`
			} `json:"channels"`
		} `json:"models"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, body)
	}
	for _, m := range v.Models {
		for _, c := range m.Channels {
			if c.Name == name {
				return c.State, c.Probes
			}
		}
	}
	t.Fatalf("channel %s not on the status page: %s", name, body)
	return "", nil
}

func waitFor(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An idle channel that goes down shows as down within one probe interval,
// with no client traffic, and comes back once it recovers; a passing
// probe is what closes the half-open channel. The probe is a stream with
// max_tokens as configured.
func TestProbeIdleChannelDownAndBack(t *testing.T) {
	up := fu.New(fu.OK())
	defer up.Close()
	prefix := uniqueName("prIdle") // the last probe's record outlives the test
	probeGateway(t, prefix, "http://"+up.Addr(), "interval 200ms\n\t\t\t\tmax_tokens 17")

	waitFor(t, 2*time.Second, "a first probe", func() bool { return up.Hits() > 0 })
	var sent struct {
		Stream    bool `json:"stream"`
		MaxTokens int  `json:"max_tokens"`
	}
	if err := json.Unmarshal(up.LastRequest().Body, &sent); err != nil || !sent.Stream || sent.MaxTokens != 17 {
		t.Fatalf("probe request = %s (%v), want stream with max_tokens 17", up.LastRequest().Body, err)
	}
	// A probe is recorded once its answer is in: wait for the record.
	waitFor(t, 2*time.Second, "a passing probe recorded", func() bool {
		st, p := probedChannel(t, prefix+"A")
		return st == "closed" && p["last_result"] == string(probe.Passed)
	})

	// Down within one probe interval: the first failing probe opens the
	// channel (counted in probes, not in wall-clock time, which a loaded
	// machine blurs).
	before := up.Hits()
	up.Set(fu.Status(500, ""))
	waitFor(t, 3*time.Second, "the channel shown open", func() bool { st, _ := probedChannel(t, prefix+"A"); return st == "open" })
	if n := up.Hits() - before; n > 2 {
		t.Errorf("%d probes before the channel showed open; want the first failing one (one more may be in flight)", n)
	}

	up.Set(fu.OK())
	// The breaker closes a moment before the probe's record is written.
	waitFor(t, 3*time.Second, "the channel closed again by a passing probe", func() bool {
		st, p := probedChannel(t, prefix+"A")
		return st == "closed" && p["last_result"] == string(probe.Passed)
	})
}

// A channel with real traffic in every interval is never probed.
func TestProbeBusyChannelNotProbed(t *testing.T) {
	up := fu.New(fu.OK())
	defer up.Close()
	probeGateway(t, "prBusy", "http://"+up.Addr(), "interval 400ms")
	url := fmt.Sprintf("http://localhost:%d/v1/chat/completions", httpPort)
	// Traffic from the start, every 100ms, for 1.5s.
	probesBefore := up.Hits()
	clients := int64(0)
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		res, err := http.Post(url, "application/json", strings.NewReader(string(fu.ChatRequest("prBusym", false))))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("client request: %d", res.StatusCode)
		}
		clients++
	}
	// The first round may run before the first client request.
	if probes := up.Hits() - probesBefore - clients; probes > 1 {
		t.Fatalf("%d probes of a busy channel", probes)
	}
}

// Probe spend never exceeds the budget: the route costs $1 per million
// tokens, so one probe may cost more than the $0.00001 budget (its
// prompt's bytes and max_tokens bound it above $0.0001), and none is sent;
// the page says the budget stopped them.
func TestProbeBudgetStops(t *testing.T) {
	up := fu.New(fu.OK())
	defer up.Close()
	prefix := uniqueName("prBudget") // the day's spend outlives the test
	probeGateway(t, prefix, "http://"+up.Addr(), "interval 100ms\n\t\t\t\tbudget 0.00001")
	waitFor(t, 2*time.Second, "the budget stop shown", func() bool {
		_, p := probedChannel(t, prefix+"A")
		return p["budget_stopped"] == true
	})
	time.Sleep(500 * time.Millisecond)
	if n := up.Hits(); n != 0 {
		t.Fatalf("%d probes sent although one may cost more than the whole budget", n)
	}
	if _, p := probedChannel(t, prefix+"A"); p["spent_today"] != "0" && p["spent_today"] != "$0.00" && p["spent_today"] != nil {
		t.Fatalf("spend shown: %v", p)
	}
}

// Readiness answers 200 while nothing is wrong, and 503 with the reason
// when a job is overdue.
func TestReadiness(t *testing.T) {
	up := fu.New(fu.OK())
	defer up.Close()
	probeGateway(t, "prReady", "http://"+up.Addr(), "interval 1h")
	url := fmt.Sprintf("http://localhost:%d/status/ready", httpPort)
	if res, body := getBody(t, url); res.StatusCode != 200 || string(body) != "ready\n" {
		t.Fatalf("ready: %d %q", res.StatusCode, body)
	}
	// A job that last succeeded long ago is overdue.
	job := caddykit.Jobs.Job("ready_test_overdue", time.Millisecond)
	succeed := func(context.Context) (jobs.Summary, error) { return "", nil }
	_ = job.Run(t.Context(), succeed)
	// The registry is process-wide: leave the job on time, or the next
	// run of any readiness test finds it overdue.
	t.Cleanup(func() { _ = caddykit.Jobs.Job(job.Name(), time.Hour).Run(context.Background(), succeed) })
	time.Sleep(10 * time.Millisecond)
	res, body := getBody(t, url)
	if res.StatusCode != 503 || !strings.Contains(string(body), "job ready_test_overdue is overdue") {
		t.Fatalf("overdue job: %d %q", res.StatusCode, body)
	}
	// A job hung in a run is late too, but what it waits on (a database
	// that never answers) is shared: degraded, not unready.
	hung := caddykit.Jobs.Job("ready_test_hung", time.Millisecond)
	_ = hung.Run(t.Context(), succeed)
	release, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		_ = hung.Run(context.Background(), func(context.Context) (jobs.Summary, error) { <-release; return "", nil })
	}()
	t.Cleanup(func() {
		close(release)
		<-done
		_ = caddykit.Jobs.Job(hung.Name(), time.Hour).Run(context.Background(), succeed)
	})
	time.Sleep(30 * time.Millisecond)
	_, body = getBody(t, url)
	i := strings.Index(string(body), "degraded:")
	if i < 0 || !strings.Contains(string(body)[i:], "job ready_test_hung is hung in a run") ||
		strings.Contains(string(body), "ready_test_hung is overdue") {
		t.Fatalf("hung job: %q", body)
	}
}

// The prober's job reports the schedule it keeps: it runs a round every
// quarter of the shortest probe interval, and says so (it said the whole
// interval, so "overdue" was judged against four times its period).
func TestProberJobReportsItsSchedule(t *testing.T) {
	up := fu.New(fu.OK())
	defer up.Close()
	probeGateway(t, uniqueName("prSched"), "http://"+up.Addr(), "interval 400ms")
	prober := func() failoverapp.JobView {
		t.Helper()
		var jobs []failoverapp.JobView
		if err := adminGet(t, "/llm_failover/jobs", &jobs); err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs {
			if j.Job == failoverapp.ProberJob {
				return j
			}
		}
		t.Fatalf("no prober job in %+v", jobs)
		return failoverapp.JobView{}
	}
	before := prober()
	if before.Every != "100ms" {
		t.Fatalf("the prober says it runs every %s; its rounds are every 100ms", before.Every)
	}
	time.Sleep(time.Second)
	// About ten rounds; a loaded machine may run fewer, never many more.
	if runs := prober().Runs - before.Runs; runs < 3 || runs > 15 {
		t.Errorf("%d rounds in a second, at a reported 100ms", runs)
	}
}

// A reload does not probe again a channel probed less than an interval
// ago: the interval is how often an idle channel is probed, whatever the
// number of reloads. Each config's scheduler started without knowing
// when the routes were last probed, so every reload probed every quiet
// channel at once: a config manager that reloads every minute turned a
// one-hour interval into a probe a minute, each paid at the route's
// price.
func TestReloadKeepsTheProbeInterval(t *testing.T) {
	up := fu.New(fu.OK())
	defer up.Close()
	prefix := uniqueName("prReload")
	probeGateway(t, prefix, "http://"+up.Addr(), "interval 1h")
	waitFor(t, 3*time.Second, "a first probe", func() bool { return up.Hits() > 0 })
	time.Sleep(300 * time.Millisecond) // its record

	// Another config with the same model, channel and probe: only an
	// unrelated route changed.
	cfg := strings.Replace(probeConfig(prefix, "http://"+up.Addr(), "interval 1h"),
		"\thandle /status* {", "\thandle /elsewhere* {\n\t\trespond \"elsewhere\"\n\t}\n\thandle /status* {", 1)
	tc := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	for range 3 {
		tc.InitServer(cfg, "caddyfile")
		tc.InitServer(probeConfig(prefix, "http://"+up.Addr(), "interval 1h"), "caddyfile")
	}
	time.Sleep(time.Second) // many rounds of the last config's prober
	if n := up.Hits(); n != 1 {
		t.Fatalf("%d probes within the interval (1h) across 6 reloads; want the first one only", n)
	}
}

// A channel whose base URL changes in a reload is a new channel, with
// fresh health (docs/configuration.md): its upstream has never been
// checked, so the reload must not hand it the old channel's last probe.
// Here the old upstream passed its probe (interval 1h); the reload points
// the channel at an upstream that is down. The new channel must be probed
// (and found down) within the prober's first rounds, not an hour later,
// while the status page says its synthetic check passed.
func TestReloadChangingAChannelsURLProbesTheNewChannel(t *testing.T) {
	up := fu.New(fu.OK())
	defer up.Close()
	down := fu.New(fu.Status(503, ""))
	defer down.Close()
	prefix := uniqueName("prMoved")
	probeGateway(t, prefix, "http://"+up.Addr(), "interval 1h")
	waitFor(t, 3*time.Second, "a first probe", func() bool { return up.Hits() > 0 })
	time.Sleep(300 * time.Millisecond) // its record

	probeGateway(t, prefix, "http://"+down.Addr(), "interval 1h")
	deadline := time.Now().Add(3 * time.Second)
	for down.Hits() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if down.Hits() == 0 {
		_, p := probedChannel(t, prefix+"A")
		t.Fatalf("the channel's new upstream was never probed after the reload (the old URL's last probe "+
			"counted for it); the status page shows its probes as %v", p)
	}
}
