package integration_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// withHistory adds the global option `llm_failover { history <store...> }`
// to statusConfig.
func withHistory(cfg, store string) string {
	return strings.Replace(cfg, "\tgrace_period 1ns\n", "\tgrace_period 1ns\n"+failoverOption("history "+store)+"\n", 1)
}

// History and decisions survive a restart with a SQLite store: the config
// is unloaded (its llm_failover app and the in-memory history with it)
// and loaded again, and the page shows what was recorded before. `caddy
// validate` of the same config creates no file.
func TestStatusHistorySurvivesRestartSQLite(t *testing.T) {
	a := upstream(t, fu.OKNamed("primary"))
	b := upstream(t, fu.OKNamed("backup"))
	db := filepath.Join(t.TempDir(), "history", "h.db")
	cfg := withHistory(statusConfig("sq", a.URL, b.URL, "failures 60"), "sqlite "+db)

	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
	if err != nil {
		t.Fatal(err)
	}
	var parsed caddy.Config
	if err := json.Unmarshal(adapted, &parsed); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Validate(&parsed); err != nil {
		t.Fatalf("validate: %v", err)
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Fatalf("validating created %s (err=%v): validation must not touch the disk", db, err)
	}

	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	tc := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tc.InitServer(cfg, "caddyfile")
	for range 3 {
		if got := chatStatus(t, "sqm"); got != 200 {
			t.Fatalf("status %d", got)
		}
	}
	a.Set(fu.Status(503, ""))
	if got := chatStatus(t, "sqm"); got != 200 {
		t.Fatalf("failover: status %d", got)
	}
	if _, err := os.Stat(db); err != nil {
		t.Fatalf("the store was not opened at Start: %v", err)
	}

	// "Restart": a config without any llm_failover handler drops the
	// in-memory history; its store flushes once more as it closes.
	tc.InitServer(fmt.Sprintf(`{
	skip_install_trust
	admin localhost:%d
	http_port %d
	https_port %d
}
http://localhost:%d {
	respond "down for maintenance"
}`, adminPort, httpPort, 9443+portOffset, httpPort), "caddyfile")
	tc.InitServer(cfg, "caddyfile")

	v := fetchStatus(t, adminURL+"/llm_failover/status")
	if w := channelWindow(t, v, "sqA", "5m"); w.Attempts != 4 || w.Successes != 3 || w.Down != 1 {
		t.Fatalf("sqA after the restart: %+v", w)
	}
	if w := channelWindow(t, v, "sqB", "5m"); w.Attempts != 1 || w.Successes != 1 {
		t.Fatalf("sqB after the restart: %+v", w)
	}
	// The model counts its 4 client requests, all served (one after a
	// failover), not its 5 attempts.
	if m := v.Models[0]; m.Windows["24h"].Attempts != 4 || m.Windows["24h"].Successes != 4 || m.Daily[len(m.Daily)-1].Attempts != 4 {
		t.Fatalf("model after the restart: %+v", m.Windows["24h"])
	}
	var ans failoverapp.DecisionsAnswer
	res, body := getBody(t, adminURL+"/llm_failover/decisions?channel=sqA")
	if res.StatusCode != 200 || json.Unmarshal(body, &ans) != nil || len(ans.Decisions) != 1 || ans.Decisions[0].Next != "sqB" {
		t.Fatalf("decisions after the restart: %d %s", res.StatusCode, body)
	}
	// The flush job is observable.
	res, body = getBody(t, adminURL+"/llm_failover/jobs")
	if res.StatusCode != 200 || !strings.Contains(string(body), `"history_flush"`) {
		t.Fatalf("jobs: %s", body)
	}
	// New attempts show at once (this instance's unflushed changes are
	// read with the store's), before the next flush.
	a.Set(fu.OKNamed("primary"))
	time.Sleep(2 * time.Second) // the history read cache
	chatStatus(t, "sqm")
	if w := channelWindow(t, fetchStatus(t, adminURL+"/llm_failover/status"), "sqA", "5m"); w.Attempts != 5 {
		t.Fatalf("sqA with one more attempt: %+v", w)
	}
}

// A reload that gives a running gateway a history store keeps what the
// page showed: the requests this instance served before are its history
// still (docs/operations.md: the history "survives caddy reload"), not
// gone from every window and bar because the page now reads the store,
// which holds only what was recorded after the reload.
func TestStatusHistoryKeptWhenAReloadAddsAStore(t *testing.T) {
	a := upstream(t, fu.OKNamed("primary"))
	b := upstream(t, fu.OKNamed("backup"))
	prefix := uniqueName("hs")
	// A gateway that never had a store: a config without llm_failover
	// first drops the history the earlier tests' configs (and stores)
	// kept in this process.
	tc := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tc.InitServer(testGlobals("")+fmt.Sprintf("http://localhost:%d {\n\trespond \"down for maintenance\"\n}\n", httpPort), "caddyfile")
	statusGateway(t, prefix, a.URL, b.URL, "failures 60")
	for range 3 {
		if got := chatStatus(t, prefix+"m"); got != 200 {
			t.Fatalf("status %d", got)
		}
	}
	waitFor(t, 5*time.Second, "three attempts on the page", func() bool {
		return channelWindow(t, fetchStatus(t, adminURL+"/llm_failover/status"), prefix+"A", "5m").Attempts == 3
	})

	db := filepath.Join(t.TempDir(), "h.db")
	tc.InitServer(withHistory(statusConfig(prefix, a.URL, b.URL, "failures 60"), "sqlite "+db), "caddyfile")
	v := fetchStatus(t, adminURL+"/llm_failover/status")
	if w := channelWindow(t, v, prefix+"A", "5m"); w.Attempts != 3 || w.Successes != 3 {
		t.Errorf("%sA after the reload that added a store: %+v, want the 3 attempts it had", prefix, w)
	}
	if _, w := statusModel(t, v, prefix+"m"); w["24h"].Attempts != 3 {
		t.Errorf("model after the reload that added a store: %+v, want its 3 requests", w["24h"])
	}
}
