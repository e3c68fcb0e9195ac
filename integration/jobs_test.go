package integration_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// The wallet's sweeper is a job: it runs when the store opens, its
// heartbeat receiver gets start and success paired by one run id, and the
// jobs view and the metrics show it without the receiver's URL.
func TestSweeperHeartbeatAndJobsView(t *testing.T) {
	var mu sync.Mutex
	var pings []*http.Request
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		pings = append(pings, r)
		mu.Unlock()
	}))
	defer recv.Close()
	secret := recv.URL + "/ping/5bf66975-d4c7-4bf5-bcc8-b8d8a82238e3"
	up := upstream(t, fu.OK())
	db := filepath.Join(t.TempDir(), "w.db")
	// A short reservation_ttl makes the sweeper run every second: its
	// first run may come before the heartbeat is attached (the apps start
	// in no set order), and the test must not wait a minute for the next.
	gatewayWith(t, walletOptions("sqlite "+db, "\t\treservation_ttl 3s")+"\n"+failoverOption("heartbeat wallet_sweep.default "+secret), `
		channel a %s
		model m {
			route a
		}
		wallet
	`, up.URL)

	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(pings)
		mu.Unlock()
		if n >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	got := append([]*http.Request(nil), pings...)
	mu.Unlock()
	if len(got) < 2 {
		t.Fatalf("heartbeat receiver got %d pings, want start and success", len(got))
	}
	start, done := got[0], got[1]
	if !strings.HasSuffix(start.URL.Path, "/start") || strings.HasSuffix(done.URL.Path, "/fail") ||
		start.URL.Query().Get("rid") == "" || start.URL.Query().Get("rid") != done.URL.Query().Get("rid") {
		t.Fatalf("pings: %s %s then %s %s", start.Method, start.URL, done.Method, done.URL)
	}

	res, err := http.Get(adminURL + "/llm_failover/jobs")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var jobs []failoverapp.JobView
	if err := json.Unmarshal(body, &jobs); err != nil {
		t.Fatalf("jobs view: %v: %s", err, body)
	}
	var sweep *failoverapp.JobView
	for i := range jobs {
		if jobs[i].Job == "wallet_sweep.default" {
			sweep = &jobs[i]
		}
	}
	if sweep == nil || sweep.Runs == 0 || sweep.LastSuccess.IsZero() || sweep.Every != "1s" || sweep.Heartbeats != 1 || sweep.Overdue {
		t.Fatalf("sweeper job: %+v in %s", sweep, body)
	}
	res, err = http.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(metrics), `caddy_llm_failover_job_last_success_timestamp_seconds{job_name="wallet_sweep.default"}`) {
		t.Fatal("no job_last_success metric for the sweeper")
	}
	if !strings.Contains(string(metrics), "\ncaddy_llm_failover_wallet_settlements_pending ") {
		t.Fatal("no wallet_settlements_pending gauge in Caddy's registry")
	}
	for _, where := range [][]byte{body, metrics} {
		if strings.Contains(string(where), "5bf66975") {
			t.Fatal("the heartbeat URL leaked into an admin answer")
		}
	}
}

// A heartbeat of a job the config does not run is a config error naming
// the jobs it does: its receiver would never be pinged, and a
// Healthchecks-style receiver never alerts on a check it was never
// pinged on. A misspelt job is refused while the config provisions (so
// `caddy validate` says so, see e2e); a job of a feature the config does
// not use, once its handlers have registered (at start).
func TestHeartbeatOfAJobThatDoesNotRun(t *testing.T) {
	up := upstream(t, fu.OK())
	db := filepath.Join(t.TempDir(), "w.db")
	const hook = "http://127.0.0.1:1/ping/x"
	billed := `
		channel a %s
		model m {
			route a
		}
		wallet
	`
	unbilled := `
		channel a %s
		model m {
			route a
		}
	`
	for _, c := range []struct {
		name, globals, body string
		want                []string
	}{
		{"misspelt wallet job", walletOptions("sqlite "+db) + "\n" + failoverOption("heartbeat wallet_sweep.typo "+hook), billed,
			[]string{`heartbeat "wallet_sweep.typo": no such job`, "wallet_sweep.default", "wallet_leases.default", "prober"}},
		{"misspelt job", failoverOption("heartbeat probes " + hook), unbilled,
			[]string{`heartbeat "probes": no such job`, "prober"}},
		{"prober without probes", failoverOption("heartbeat prober " + hook), unbilled,
			[]string{`heartbeat "prober": the job does not run`, "no model of this config has a probe block"}},
		{"history_flush without history", failoverOption("heartbeat history_flush " + hook), unbilled,
			[]string{`heartbeat "history_flush": the job does not run`, "no history store"}},
		{"wallet job without a billed handler", failoverOption("heartbeat wallet_sweep.default " + hook), unbilled,
			[]string{`heartbeat "wallet_sweep.default": the job does not run`, "bills to that wallet"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, body := tryLoadWith(t, c.globals, c.body, up.URL)
			if code == http.StatusOK {
				t.Fatal("the config was loaded")
			}
			body = strings.ReplaceAll(body, `\"`, `"`) // the admin API's JSON
			for _, w := range c.want {
				if !strings.Contains(body, w) {
					t.Errorf("the refusal does not say %q: %s", w, body)
				}
			}
		})
	}
}

// A config that reads a secret from an unset environment variable is
// refused with a message that names the variable and says what to do,
// wherever the secret is (a channel header, a heartbeat URL, a DSN), and
// never shows a resolved secret.
func TestUnsetEnvironmentVariableIsNamed(t *testing.T) {
	up := upstream(t, fu.OK())
	for name, c := range map[string]struct{ globals, body string }{
		"channel header": {"", `
			channel a %s {
				header Authorization "Bearer {env.LLMF_TEST_UNSET_KEY}"
			}
			model m {
				route a
			}`},
		"heartbeat url": {failoverOption("heartbeat prober {env.LLMF_TEST_UNSET_KEY}"), `
			channel a %s
			model m {
				route a
			}`},
		"wallet dsn": {walletOptions("postgres {env.LLMF_TEST_UNSET_KEY}"), `
			channel a %s
			model m {
				route a
			}
			wallet`},
	} {
		t.Run(name, func(t *testing.T) {
			code, body := tryLoadWith(t, c.globals, c.body, up.URL)
			if code == http.StatusOK {
				t.Fatal("the config was loaded")
			}
			if !strings.Contains(body, "the environment variable LLMF_TEST_UNSET_KEY is not set or empty: set it in the environment caddy runs in") {
				t.Errorf("the refusal does not name the variable: %s", body)
			}
		})
	}
}

// A reload that renames a wallet on the same database (llm_wallet {...}
// becomes llm_wallet main {...}) keeps the open store, and its jobs go by
// the new name: the heartbeat of wallet_sweep.main, which the config
// accepts, is pinged, and the jobs view shows no job of the wallet the
// reload removed. The store's jobs kept the name of the wallet that had
// opened it, so the renamed wallet's receiver was never pinged (a
// Healthchecks-style check then alerts on a healthy sweeper) while the
// jobs view went on listing wallet_sweep.default.
func TestReloadRenamingAWalletRenamesItsJobs(t *testing.T) {
	var mu sync.Mutex
	var pings []string
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		pings = append(pings, r.URL.Path)
		mu.Unlock()
	}))
	defer recv.Close()
	up := upstream(t, fu.OK())
	db := filepath.Join(t.TempDir(), "w.db")
	gatewayWith(t, walletOptions("sqlite "+db, "\t\treservation_ttl 3s"), `
		channel a %s
		model m {
			route a
		}
		wallet
	`, up.URL)
	renamed := "\tllm_wallet main {\n\t\tstore sqlite " + db + "\n\t\treservation_ttl 3s\n\t}\n" +
		failoverOption("heartbeat wallet_sweep.main "+recv.URL+"/ping/main")
	gatewayWith(t, renamed, `
		channel a %s
		model m {
			route a
		}
		wallet main
	`, up.URL)

	// The sweeper runs every second (a third of reservation_ttl).
	eventually(t, 5*time.Second, "a ping of the renamed wallet's sweeper heartbeat", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(pings) > 0
	})
	names := strings.Join(jobNames(t), " ")
	if strings.Contains(names, "wallet_sweep.default") || strings.Contains(names, "wallet_leases.default") {
		t.Fatalf("the jobs view lists the jobs of the wallet the reload removed: %s", names)
	}
	if !strings.Contains(names, "wallet_sweep.main") || !strings.Contains(names, "wallet_leases.main") {
		t.Fatalf("the jobs view misses the renamed wallet's jobs: %s", names)
	}
}
