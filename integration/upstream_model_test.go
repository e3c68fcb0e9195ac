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

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// renamedChannels serve model m under their own names; c keeps the
// client's.
const renamedChannels = `
		channel a %s
		channel b %s
		model m {
			route a cost 1 1 upstream_model m-at-a
			route b cost 2 2 upstream_model m-at-b
			price 2 8
		}
`

// The ledger records the name the channel knows the model by, on the
// failed attempt's row and on the charge, while the answer names the
// client's model.
func TestWalletRecordsUpstreamModel(t *testing.T) {
	eachWalletStore(t, func(t *testing.T, s walletStore) {
		a := upstream(t, fu.Status(503, ""))
		b := upstream(t, fu.OKNamed("b").WithUsage(100, 20))
		gatewayWith(t, walletOptions(s.option), renamedChannels+"\t\twallet\n", a.URL, b.URL)
		secret, _ := newWalletAccount(t, "acct", "1")
		res, got := postSettled(t, "acct", "/v1/chat/completions", chatStreamBody(false), bearer(secret)...)
		if res.StatusCode != 200 || res.Header.Get("X-Served-By") != "b" {
			t.Fatalf("status %d served by %q: %s", res.StatusCode, res.Header.Get("X-Served-By"), got)
		}
		mustContain(t, got, `"model":"m"`)
		mustNotContain(t, got, "m-at-b")
		rows := attemptsFirst(t, "acct", 2)
		for _, e := range rows {
			switch e.Kind {
			case wallet.KindFailedAttempt:
				if e.Channel != "a" || e.Model != "m" || e.UpstreamModel != "m-at-a" {
					t.Errorf("failed attempt row %+v", e)
				}
			case wallet.KindCharge:
				if e.Channel != "b" || e.Model != "m" || e.UpstreamModel != "m-at-b" {
					t.Errorf("charge row %+v", e)
				}
			}
		}
		if settledOnce(t, rows) == 0 {
			t.Errorf("nothing charged: %s", kinds(rows))
		}
	})
}

// The failover log line and the attempt event name the upstream's model
// next to the client's; without a rename both are the client's.
func TestUpstreamModelInFailoverLogAndAttemptEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.OKNamed("b"))
	logPath := filepath.Join(t.TempDir(), "plugin.log")
	globals := fmt.Sprintf("\tlog llmf {\n\t\toutput file %s\n\t\tlevel WARN\n\t\tinclude http.handlers.llm_failover\n\t}", logPath)
	body := renamedChannels + `
		model plain {
			route a cost 1 1
			route b cost 2 2
		}
`
	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(gatewayConfigWith(globals, body, a.URL, b.URL)), nil)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["apps"].(map[string]any)["events"] = map[string]any{"subscriptions": []any{map[string]any{
		"events":   []string{failoverapp.EventAttempt},
		"handlers": []any{map[string]any{"handler": "llmf_test_recorder"}},
	}}}
	js, _ := json.Marshal(cfg)
	recordedEvents.mu.Lock()
	recordedEvents.events = nil
	recordedEvents.mu.Unlock()
	caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort}).InitServer(string(js), "json")
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()

	for _, model := range []string{"m", "plain"} {
		if res, got := post(t, "/v1/chat/completions", fu.ChatRequest(model, false)); res.StatusCode != 200 {
			t.Fatalf("%s: status %d: %s", model, res.StatusCode, got)
		}
	}

	want := map[string]string{"m/a": "m-at-a", "m/b": "m-at-b", "plain/a": "plain", "plain/b": "plain"}
	recordedEvents.mu.Lock()
	seen := map[string]string{}
	for _, e := range recordedEvents.events {
		if e.Name() == failoverapp.EventAttempt {
			seen[fmt.Sprintf("%s/%s", e.Data["model"], e.Data["channel"])] = fmt.Sprint(e.Data["upstream_model"])
		}
	}
	recordedEvents.mu.Unlock()
	for k, v := range want {
		if seen[k] != v {
			t.Errorf("attempt event %s: upstream_model %q, want %q (all: %v)", k, seen[k], v, seen)
		}
	}

	var lines []map[string]any
	eventually(t, 5*time.Second, "two failover log lines", func() bool {
		lines = nil
		raw, _ := os.ReadFile(logPath)
		for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "failover" {
				lines = append(lines, m)
			}
		}
		return len(lines) >= 2
	})
	got := map[string]any{}
	for _, l := range lines {
		got[fmt.Sprint(l["model"])] = l["upstream_model"]
	}
	if got["m"] != "m-at-a" || got["plain"] != "plain" {
		t.Errorf("failover lines' upstream_model by model: %v", got)
	}
}
