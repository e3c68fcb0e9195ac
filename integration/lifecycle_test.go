package integration_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// What one config starts belongs to it: a config that is refused, or
// replaced, leaves no job running and none behind in the jobs view or
// readiness.

// lifecycleConfig is a site with a status page and one channel of model
// m; probeOpts, when not empty, makes m probe with them, and globals go
// into the global llm_failover option.
func lifecycleConfig(upstream, channel, globals, probeOpts string) string {
	extra := ""
	if globals != "" {
		extra = failoverOption(globals)
	}
	probe := ""
	if probeOpts != "" {
		probe = "probe {\n\t\t\t\t" + probeOpts + "\n\t\t\t}"
	}
	return testGlobals(extra) + fmt.Sprintf(`http://localhost:%d {
	handle /status* {
		llm_status
	}
	llm_failover {
		channel %s %s
		model m {
			route %s
			%s
		}
		auth off
	}
}
`, httpPort, channel, upstream, channel, probe)
}

// jobNames lists the jobs in GET /llm_failover/jobs.
func jobNames(t *testing.T) []string {
	t.Helper()
	res, body := getBody(t, adminURL+"/llm_failover/jobs")
	if res.StatusCode != 200 {
		t.Fatalf("jobs: %d %s", res.StatusCode, body)
	}
	var jobs []struct {
		Job string `json:"job"`
	}
	if err := json.Unmarshal(body, &jobs); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, j := range jobs {
		names = append(names, j.Job)
	}
	return names
}

// A config whose history store cannot be opened is refused, and leaves
// no prober behind: the app started it before opening the store, Caddy
// never stops an app whose Start failed, and the orphan kept probing the
// upstream (and trips shared breakers) under every config after it.
func TestRefusedConfigLeavesNoProber(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	up := upstream(t, fu.OK())
	channel := uniqueName("orphan")
	caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort}).
		InitServer(lifecycleConfig(up.URL, channel, "", ""), "caddyfile")

	// A SQLite file under a regular file cannot be created when the
	// config starts. (A PostgreSQL store that does not answer is an outage
	// the app rides out, not a refusal.)
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, body := loadCaddyfile(t, lifecycleConfig(up.URL, channel, "history sqlite "+filepath.Join(notDir, "history.db"), "interval 50ms"))
	if code == http.StatusOK {
		t.Fatal("a config whose history store cannot be opened was loaded")
	}
	if !strings.Contains(body, "history store") {
		t.Errorf("the refusal does not name the history store: %s", body)
	}
	// The previous config runs on, without probes, as if nothing happened.
	if got := probesAfterSettling(t, up); got != 0 {
		t.Fatalf("the upstream got %d probes after the config that asked for them was refused", got)
	}
	if names := jobNames(t); strings.Contains(strings.Join(names, " "), "prober") {
		t.Fatalf("the refused config's prober is in the jobs view: %v", names)
	}
}

// A reload that removes probes or the history store retires their jobs:
// they leave the jobs view and never make readiness fail. They were
// process-wide and never retired, so a reload that dropped `probe`
// turned /ready into a 503 for good once the prober was two intervals
// late, and a load balancer dropped a healthy gateway.
func TestReloadRetiresTheJobsItRemoves(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	up := upstream(t, fu.OK())
	channel := uniqueName("retire")
	db := filepath.Join(t.TempDir(), "history.db")
	tc := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tc.InitServer(lifecycleConfig(up.URL, channel, "history sqlite "+db, "interval 50ms"), "caddyfile")
	eventually(t, 5*time.Second, "a probe", func() bool { return up.Hits() > 0 })
	names := strings.Join(jobNames(t), " ")
	if !strings.Contains(names, "prober") || !strings.Contains(names, "history_flush") {
		t.Fatalf("jobs view: %s", names)
	}

	tc.InitServer(lifecycleConfig(up.URL, channel, "", ""), "caddyfile")
	eventually(t, 5*time.Second, "the removed jobs to leave the jobs view", func() bool {
		names := strings.Join(jobNames(t), " ")
		return !strings.Contains(names, "prober") && !strings.Contains(names, "history_flush")
	})
	// Well past two of the prober's intervals: nothing is overdue.
	time.Sleep(300 * time.Millisecond)
	res, body := getBody(t, gatewayURL+"/status/ready")
	if res.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "ready" {
		t.Fatalf("/ready after the reload: %d %s", res.StatusCode, body)
	}
	if got := probesAfterSettling(t, up); got != 0 {
		t.Fatalf("%d probes after a reload that removed them", got)
	}
}

// probesAfterSettling counts what reaches up over 300ms once its count
// has settled. A probe that a prober's stop cancelled may still reach
// the upstream late (its request was written; a loaded machine runs the
// handler after), so the count first settles: a prober still running
// (every 50ms here) never lets it, and the test fails on that.
func probesAfterSettling(t *testing.T, up *fu.Server) int64 {
	t.Helper()
	settled := up.Hits()
	eventually(t, 5*time.Second, "the probes to stop", func() bool {
		time.Sleep(300 * time.Millisecond)
		n := up.Hits()
		defer func() { settled = n }()
		return n == settled
	})
	before := up.Hits()
	time.Sleep(300 * time.Millisecond)
	return up.Hits() - before
}

// A reload that is refused when the config starts leaves the running
// config's history store in place: what is recorded afterwards is still
// flushed to it and survives a restart. The refused config's app had
// started before the app that failed (Caddy starts apps in no set order,
// and stops, never restarts, the others): it had attached its own
// history (here: memory only) in the running config's place, dropping
// the changes not yet flushed, and the running config never flushed
// again, so its history stopped at the refused reload.
func TestRefusedReloadKeepsTheHistoryStore(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	up := upstream(t, fu.OK())
	channel := uniqueName("keepstore")
	db := filepath.Join(t.TempDir(), "history.db")
	running := lifecycleConfig(up.URL, channel, "history sqlite "+db, "")
	tc := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tc.InitServer(running, "caddyfile")
	chat := func(n int) {
		t.Helper()
		for range n {
			if res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false)); res.StatusCode != 200 {
				t.Fatalf("status %d: %s", res.StatusCode, body)
			}
		}
	}
	chat(2)

	// The wallet app of this config cannot open its SQLite file (under a
	// regular file), so the config fails when it starts. Loaded a few
	// times, the llm_failover app starts before the wallet app in some.
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// One without a history store, one with another.
	other := filepath.Join(t.TempDir(), "other.db")
	var refused []string
	for _, globals := range []string{"", "history sqlite " + other} {
		refused = append(refused, strings.Replace(lifecycleConfig(up.URL, channel, globals, ""), "\tgrace_period 1ns\n",
			"\tgrace_period 1ns\n"+walletOptions("sqlite "+filepath.Join(notDir, "w.db"))+"\n", 1))
	}
	for i := range 12 {
		if code, body := loadCaddyfile(t, refused[i%2]); code == http.StatusOK {
			t.Fatalf("a config whose wallet store cannot be opened was loaded: %s", body)
		}
	}
	chat(3)
	time.Sleep(6 * time.Second) // a flush (every 5 s)

	// "Restart": a config without llm_failover drops the in-memory
	// history; loaded again, the history is what the store kept.
	tc.InitServer(testGlobals("")+fmt.Sprintf("http://localhost:%d {\n\trespond \"down for maintenance\"\n}\n", httpPort), "caddyfile")
	tc.InitServer(running, "caddyfile")
	v := fetchStatus(t, adminURL+"/llm_failover/status")
	if w := channelWindow(t, v, channel, "5m"); w.Attempts != 5 || w.Successes != 5 {
		t.Fatalf("%s after the restart: %+v, want the 5 attempts, 2 before the refused reloads and 3 after", channel, w)
	}
}
