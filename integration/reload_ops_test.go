package integration_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// What the operator reads (metrics, admin API, status page) across
// reloads: it describes the running config, never one a reload removed
// or refused.

// metricsText is the admin endpoint's /metrics.
func metricsText(t *testing.T) string {
	t.Helper()
	code, body := brkAdmin(t, http.MethodGet, "/metrics")
	if code != 200 {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	return string(body)
}

// forceReload posts cfg to /load even when it is the running config, as
// `caddy reload --force` does.
func forceReload(t *testing.T, cfg string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, adminURL+"/load", strings.NewReader(cfg))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "text/caddyfile")
	req.Header.Set("Cache-Control", "must-revalidate")
	req.Close = true
	res, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("forced reload: %d %s", res.StatusCode, b)
	}
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}

// A reload that Caddy refuses leaves /metrics as it was: the running
// config's series go on being reported. Caddy puts the new config's admin
// endpoint (and its fresh metrics registry) in place before it provisions
// the apps, and keeps it when the config is then refused; a refusal that
// came before the gateway's modules registered their collectors (here a
// broken reverse_proxy ahead of it) left every llm_failover series out of
// /metrics until the next good reload, while the gateway kept serving
// and its channel stayed open.
func TestRefusedReloadKeepsTheMetrics(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, twoChannels, a.URL, b.URL, "")
	brkFailOver(t, 3)
	brkServedBy(t, "b")

	series := []string{
		`caddy_llm_failover_breaker_state{channel="a"}`,
		`caddy_llm_failover_requests_total{model="m",outcome="served"}`,
		`caddy_llm_failover_attempts_total{channel="b",model="m",outcome="ok"}`,
	}
	before := map[string]float64{}
	for _, s := range series {
		v, ok := brkMetric(t, s)
		if !ok {
			t.Fatalf("%s not reported before the reload", s)
		}
		before[s] = v
	}

	refused := testGlobals("") + fmt.Sprintf(`http://localhost:%d {
	route {
		reverse_proxy https://127.0.0.1:1 {
			transport http {
				tls_trusted_ca_certs /nonexistent/llmf-ca.pem
			}
		}
		llm_failover {
`, httpPort) + fmt.Sprintf(twoChannels, a.URL, b.URL, "") + `
		}
	}
}
`
	// A refusal by the gateway's own handler: a key from an unset
	// environment variable.
	unset := gatewayConfig(`
		channel a %s {
			header Authorization "Bearer {env.LLMF_TEST_UNSET_KEY}"
		}
		channel b %s
		model m {
			route a cost 1 1
			route b cost 2 2
		}`, a.URL, b.URL)
	for _, c := range []struct{ name, cfg string }{{"an unset key", unset}, {"a broken reverse_proxy", refused}} {
		name, cfg := c.name, c.cfg
		// Each refusal follows a good load, forced: after a refusal
		// Caddy takes the running config for unchanged.
		forceReload(t, gatewayConfig(twoChannels, a.URL, b.URL, ""))
		if code, body := loadCaddyfile(t, cfg); code == 200 {
			t.Fatalf("the broken config loaded: %s", body)
		}
		brkServedBy(t, "b") // the running config still serves
		for _, s := range series {
			v, ok := brkMetric(t, s)
			switch {
			case !ok:
				t.Errorf("%s left /metrics after a reload refused for %s", s, name)
			case v < before[s]:
				t.Errorf("%s went from %v to %v after a reload refused for %s", s, before[s], v, name)
			}
		}
	}
}

// onlyChannelConfig is a site with only the channel and a model of its
// own, for a reload that removes the others.
func onlyChannelConfig(prefix, channel, url string) string {
	return testGlobals("") + fmt.Sprintf(`http://localhost:%d {
	handle /status* {
		llm_status
	}
	llm_failover {
		channel %s %s
		model %s {
			route %s cost 1 1
		}
	}
}
`, httpPort, prefix+channel, url, prefix+"other", prefix+channel)
}

// A reload that removes an open channel, or a model with no working
// channel, ends their incidents: the status page may keep them as
// history, but must not go on saying "channel X open: ongoing" or "model Y
// had no working channel: ongoing" for something the gateway no longer
// has. Nothing ended them (no breaker of the running config would ever
// close them), so they stayed ongoing until the process restarted.
func TestReloadRemovingAChannelOrModelEndsItsIncidents(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.Status(503, ""))
	c := upstream(t, fu.OKNamed("c"))
	prefix := uniqueName("rmInc")
	statusGateway(t, prefix, a.URL, b.URL, "failures 2\n\t\t\tcooldown 1h")
	for range 4 {
		if got := chatStatus(t, prefix+"m"); got < 500 {
			t.Fatalf("status %d, want the chain's 5xx", got)
		}
	}
	ongoing := func() []string {
		t.Helper()
		var out []string
		for _, in := range fetchStatus(t, adminURL+"/llm_failover/status").Incidents {
			if in.Ongoing && strings.HasPrefix(in.Subject, prefix) {
				out = append(out, in.Kind+" "+in.Subject)
			}
		}
		return out
	}
	got := strings.Join(ongoing(), ", ")
	for _, want := range []string{"channel " + prefix + "A", "channel " + prefix + "B", "model " + prefix + "m"} {
		if !strings.Contains(got, want) {
			t.Fatalf("before the reload, ongoing incidents %q lack %q", got, want)
		}
	}

	// A and B, and the model m, are gone; only C serves.
	gatewayCaddyfile(t, onlyChannelConfig(prefix, "C", c.URL))
	if got := ongoing(); len(got) != 0 {
		t.Errorf("after a reload that removed them, incidents still ongoing: %v", got)
	}
	_, page := getBody(t, gatewayURL+"/status")
	if strings.Contains(string(page), "<strong>ongoing</strong>") && strings.Contains(string(page), prefix+"m had no working channel") {
		t.Errorf("the page shows the removed model's incident as ongoing")
	}
	v := fetchStatus(t, adminURL+"/llm_failover/status")
	for _, m := range v.Models {
		if m.Name == prefix+"m" {
			t.Errorf("the removed model is listed: %+v", m)
		}
	}
}

// gatewayCaddyfile loads a whole Caddyfile, failing the test if it does
// not load.
func gatewayCaddyfile(t *testing.T, cfg string) {
	t.Helper()
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	if code, body := loadCaddyfile(t, cfg); code != 200 {
		t.Fatalf("load: %d %s", code, body)
	}
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}

// A reload that removes a probed channel whose day's budget was spent
// stops reporting it as spent: probe_budget_spent was a gauge set to 1
// when the budget ran out and back to 0 only by that channel's next probe
// on a new day, which a removed channel never gets, so the
// LLMFailoverProbeBudgetSpent alert fired for it for ever.
func TestReloadRemovingAProbedChannelDropsItsBudgetGauge(t *testing.T) {
	up := fu.New(fu.OK())
	defer up.Close()
	prefix := uniqueName("rmBudget")
	probeGateway(t, prefix, "http://"+up.Addr(), "interval 100ms\n\t\t\t\tbudget 0.00001")
	waitFor(t, 3*time.Second, "the budget stop shown", func() bool {
		_, p := probedChannel(t, prefix+"A")
		return p["budget_stopped"] == true
	})
	series := `caddy_llm_failover_probe_budget_spent{channel="` + prefix + `A"}`
	if v, ok := brkMetric(t, series); !ok || v != 1 {
		t.Fatalf("%s = %v (present %v), want 1 while the budget is spent", series, v, ok)
	}

	other := uniqueName("rmBudgetNew")
	probeGateway(t, other, "http://"+up.Addr(), "interval 1h")
	if v, ok := brkMetric(t, series); ok && v != 0 {
		t.Errorf("after a reload that removed the channel, %s = %v", series, v)
	}
}

// What a reload that removes or renames a channel does to the series
// computed at scrape time and to the admin API: only the running
// config's channels, the new identity fresh.
func TestReloadRemovingAChannelDropsItsGauges(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.OKNamed("backup"))
	prefix := uniqueName("rmGauge")
	statusGateway(t, prefix, a.URL, b.URL, "failures 2\n\t\t\tcooldown 1h")
	for range 3 {
		if got := chatStatus(t, prefix+"m"); got != 200 {
			t.Fatalf("status %d", got)
		}
	}
	open := `caddy_llm_failover_breaker_state{channel="` + prefix + `A"}`
	if v, ok := brkMetric(t, open); !ok || v != 2 {
		t.Fatalf("%s = %v (present %v), want 2", open, v, ok)
	}
	gatewayCaddyfile(t, onlyChannelConfig(prefix, "B", b.URL))
	if v, ok := brkMetric(t, open); ok {
		t.Errorf("removed channel still reported: %s %v", open, v)
	}
	if _, ok := brkChannels(t)[prefix+"A"]; ok {
		t.Errorf("removed channel still in /llm_failover/channels")
	}
	// The same name at a new URL is a new channel: closed.
	c := upstream(t, fu.OKNamed("c"))
	gatewayCaddyfile(t, onlyChannelConfig(prefix, "A", c.URL))
	if v, ok := brkMetric(t, open); !ok || v != 0 {
		t.Errorf("renamed-URL channel: %s = %v (present %v), want 0", open, v, ok)
	}
}

// A forced reload of the identical config keeps everything the operator
// reads: the open breaker, the ongoing incident, the history, the counters.
func TestIdenticalReloadKeepsEverything(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.OKNamed("backup"))
	prefix := uniqueName("same")
	statusGateway(t, prefix, a.URL, b.URL, "failures 2\n\t\t\tcooldown 1h")
	for range 3 {
		if got := chatStatus(t, prefix+"m"); got != 200 {
			t.Fatalf("status %d", got)
		}
	}
	served := `caddy_llm_failover_requests_total{model="` + prefix + `m",outcome="served"}`
	before := fetchStatus(t, adminURL+"/llm_failover/status")
	vBefore, _ := brkMetric(t, served)
	forceReload(t, statusConfig(prefix, a.URL, b.URL, "failures 2\n\t\t\tcooldown 1h"))
	after := fetchStatus(t, adminURL+"/llm_failover/status")
	if st := brkState(t, prefix+"A"); st.State != "open" {
		t.Errorf("after an identical reload the breaker is %s", st.State)
	}
	if v, _ := brkMetric(t, served); v != vBefore {
		t.Errorf("%s went from %v to %v", served, vBefore, v)
	}
	if cw, bw := channelWindow(t, after, prefix+"A", "24h"), channelWindow(t, before, prefix+"A", "24h"); cw.Attempts != bw.Attempts {
		t.Errorf("history: %d attempts before, %d after", bw.Attempts, cw.Attempts)
	}
	found := false
	for _, in := range after.Incidents {
		if in.Subject == prefix+"A" && in.Ongoing {
			found = true
		}
	}
	if !found {
		t.Errorf("the ongoing incident of %sA was lost: %+v", prefix, after.Incidents)
	}
}

// A reload that gives a model with no working channel a working one ends
// the model's incident: the page said the model operational while its
// incident read "had no working channel: ongoing" until a client request
// happened to be served.
func TestReloadGivingAModelAWorkingChannelEndsItsIncident(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.Status(503, ""))
	c := upstream(t, fu.OKNamed("c"))
	prefix := uniqueName("fixInc")
	statusGateway(t, prefix, a.URL, b.URL, "failures 2\n\t\t\tcooldown 1h")
	for range 4 {
		if got := chatStatus(t, prefix+"m"); got < 500 {
			t.Fatalf("status %d, want the chain's 5xx", got)
		}
	}
	modelOngoing := func() bool {
		for _, in := range fetchStatus(t, adminURL+"/llm_failover/status").Incidents {
			if in.Kind == "model" && in.Subject == prefix+"m" && in.Ongoing {
				return true
			}
		}
		return false
	}
	if !modelOngoing() {
		t.Fatalf("no ongoing incident for the model before the reload")
	}
	gatewayCaddyfile(t, testGlobals("")+fmt.Sprintf(`http://localhost:%d {
	llm_failover {
		channel %sC %s
		model %sm {
			route %sC cost 1 1
		}
	}
}
`, httpPort, prefix, c.URL, prefix, prefix))
	v := fetchStatus(t, adminURL+"/llm_failover/status")
	for _, m := range v.Models {
		if m.Name == prefix+"m" && m.Status != "operational" {
			t.Fatalf("model %s after the reload, want operational", m.Status)
		}
	}
	if modelOngoing() {
		t.Errorf("the model is operational, yet its incident 'had no working channel' is still ongoing")
	}
}
