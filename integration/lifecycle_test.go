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
	before := up.Hits()
	time.Sleep(500 * time.Millisecond) // ten intervals
	if got := up.Hits() - before; got != 0 {
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
	before := up.Hits()
	time.Sleep(200 * time.Millisecond)
	if got := up.Hits() - before; got != 0 {
		t.Fatalf("%d probes after a reload that removed them", got)
	}
}
