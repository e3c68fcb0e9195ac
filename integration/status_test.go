package integration_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// In-process tests of the status page, its JSON, the admin status and
// the decision journal, fed by real attempts through a real Caddy. The
// channels have names no other test uses: the history outlives configs.

// statusConfig is a site with a full status page at /status, a public one
// (hide_channels) at /public, and a gateway with the channels <prefix>A
// (primary) and <prefix>B (backup) for the model <prefix>m. Each test has
// its own prefix: the history outlives configs.
func statusConfig(prefix, primary, backup, breakerOpts string) string {
	return strings.NewReplacer("stA", prefix+"A", "stB", prefix+"B", "stm", prefix+"m").Replace(testGlobals("") + fmt.Sprintf(`http://localhost:%d {
	header {
		defer
		X-Served-By {http.llm_failover.channel}
	}
	handle /status* {
		llm_status {
			title Example gateway
		}
	}
	handle /public* {
		llm_status {
			title Example public status
			hide_channels
		}
	}
	llm_failover {
		channel stA %s {
			header Authorization "Bearer status-secret-a"
		}
		channel stB %s {
			header Authorization "Bearer status-secret-b"
		}
		model stm {
			route stA cost 1 1
			route stB cost 2 2
		}
		breaker {
			%s
		}
	}
}
`, httpPort, primary, backup, breakerOpts))
}

func statusGateway(t *testing.T, prefix, primary, backup, breakerOpts string) {
	t.Helper()
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	tc := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tc.InitServer(statusConfig(prefix, primary, backup, breakerOpts), "caddyfile")
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}

func getBody(t *testing.T, url string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := adminClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, b
}

// statusJSON is the documented schema, decoded strictly enough to fail
// when a field is renamed.
type statusJSON struct {
	Title       string    `json:"title"`
	GeneratedAt time.Time `json:"generated_at"`
	Status      string    `json:"status"`
	Models      []struct {
		Name     string                            `json:"name"`
		Status   string                            `json:"status"`
		Since    time.Time                         `json:"since"`
		Counts   string                            `json:"counts"`
		Windows  map[string]failoverapp.WindowView `json:"windows"`
		Hourly   []failoverapp.BarView             `json:"hourly"`
		Daily    []failoverapp.BarView             `json:"daily"`
		Channels []struct {
			Name        string                            `json:"name"`
			State       string                            `json:"state"`
			Status      string                            `json:"status"`
			Since       time.Time                         `json:"since"`
			Counts      string                            `json:"counts"`
			Doing       string                            `json:"doing"`
			Windows     map[string]failoverapp.WindowView `json:"windows"`
			LastFailure *failoverapp.FailureView          `json:"last_failure"`
			Hourly      []failoverapp.BarView             `json:"hourly"`
			Daily       []failoverapp.BarView             `json:"daily"`
			Decisions   []failoverapp.DecisionView        `json:"recent_decisions"`
			// LearnedDeadlines: with adaptive_deadlines only.
			LearnedDeadlines []failoverapp.LearnedDeadlineView `json:"learned_deadlines"`
		} `json:"channels"`
	} `json:"models"`
	Incidents []failoverapp.IncidentView `json:"incidents"`
}

func fetchStatus(t *testing.T, url string, hdr ...string) statusJSON {
	t.Helper()
	res, body := getBody(t, url, hdr...)
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("GET %s: %d %s: %s", url, res.StatusCode, res.Header.Get("Content-Type"), body)
	}
	var v statusJSON
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, body)
	}
	return v
}

func chatStatus(t *testing.T, model string) int {
	t.Helper()
	res, _ := post(t, "/v1/chat/completions", fu.ChatRequest(model, false))
	return res.StatusCode
}

// The scripted mix: 3 successes, 2 × 503, 2 × 429 and 2 × 400 on the
// primary. 429s land in limited, 400s in client, never in down; the
// backup's successes are its own; the failovers are journaled; and all of
// it survives a reload.
func TestStatusHistoryFromScriptedMix(t *testing.T) {
	a := upstream(t, fu.OKNamed("primary"))
	b := upstream(t, fu.OKNamed("backup"))
	statusGateway(t, "st", a.URL, b.URL, "failures 60")
	before := fetchStatus(t, adminURL+"/llm_failover/status")
	baseA := channelWindow(t, before, "stA", "24h")

	send := func(n, want int) {
		for range n {
			if got := chatStatus(t, "stm"); got != want {
				t.Fatalf("status %d, want %d", got, want)
			}
		}
	}
	send(3, 200)
	a.Set(fu.Status(503, ""))
	send(2, 200)
	// A 429 parks stA (a rate limit is no outage): the next request goes
	// straight to stB; the operator's reset un-parks it.
	a.Set(fu.Status(429, ""))
	send(2, 200)
	if code, body := brkAdmin(t, http.MethodPost, "/llm_failover/channels/stA/reset"); code != 200 {
		t.Fatalf("reset: %d %s", code, body)
	}
	a.Set(fu.Status(400, fu.OpenAIErrorBody("bad request", "invalid_request_error", "")))
	send(2, 400)
	// An attempt is recorded once its answer is written: the client can
	// read the last answer a moment before the history counts it.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if channelWindow(t, fetchStatus(t, adminURL+"/llm_failover/status"), "stA", "5m").Attempts >= 8 {
			break
		}
	}

	check := func(v statusJSON) {
		t.Helper()
		for _, key := range []string{"5m", "1h", "24h"} {
			w := channelWindow(t, v, "stA", key)
			got := [5]int64{w.Attempts - baseA.Attempts, w.Successes - baseA.Successes, w.Down - baseA.Down, w.Limited - baseA.Limited, w.Client - baseA.Client}
			if key != "24h" {
				got = [5]int64{w.Attempts, w.Successes, w.Down, w.Limited, w.Client}
			}
			if got != [5]int64{8, 3, 2, 1, 2} {
				t.Errorf("stA %s: attempts, successes, down, limited, client = %v", key, got)
			}
		}
		if w := channelWindow(t, v, "stB", "5m"); w.Attempts != 4 || w.Successes != 4 {
			t.Errorf("stB 5m: %+v", w)
		}
		// The model counts what its 9 clients got: 7 answers (the
		// failovers invisible to them) and the 2 × 400 they caused.
		m := v.Models[0]
		if w := m.Windows["5m"]; w.Attempts != 9 || w.Successes != 7 || w.Client != 2 || w.Down != 0 || len(m.Hourly) != 48 || len(m.Daily) != 90 {
			t.Errorf("model stm: %+v, %d hourly, %d daily", m.Windows["5m"], len(m.Hourly), len(m.Daily))
		}
		if h := m.Hourly[47]; h.Attempts < 9 {
			t.Errorf("current hour bar %+v", h)
		}
		c := m.Channels[0]
		if c.LastFailure == nil || c.LastFailure.Reason != "status" || c.LastFailure.Status != 429 || c.LastFailure.Runbook != "runbooks/status" {
			t.Errorf("last failure %+v (a 400 is the client's, not the channel's)", c.LastFailure)
		}
		if len(c.Decisions) != 3 || c.Decisions[0].UpstreamStatus != 429 || c.Decisions[0].Next != "stB" {
			t.Errorf("recent decisions %+v", c.Decisions)
		}
		if c.Windows["5m"].TTFTp50 <= 0 {
			t.Errorf("no time to first content: %+v", c.Windows["5m"])
		}
	}
	check(fetchStatus(t, adminURL+"/llm_failover/status"))
	check(fetchStatus(t, gatewayURL+"/status?format=json"))
	check(fetchStatus(t, gatewayURL+"/status", "Accept", "application/json"))

	// The journal: filters and grouping on the admin API.
	var grouped failoverapp.DecisionsAnswer
	if err := adminGet(t, "/llm_failover/decisions?channel=stA&since=1h&group_by=reason", &grouped); err != nil {
		t.Fatal(err)
	}
	if grouped.Total != 3 || len(grouped.Counts) != 1 || grouped.Counts[0] != (struct {
		Key   string `json:"key"`
		Count int    `json:"count"`
	}{"status", 3}) {
		t.Errorf("grouped: %+v", grouped)
	}
	var rows failoverapp.DecisionsAnswer
	if err := adminGet(t, "/llm_failover/decisions?model=stm&reason=status", &rows); err != nil {
		t.Fatal(err)
	}
	if rows.Total != 3 || rows.Decisions[0].RequestID == "" || rows.Decisions[0].Remaining <= 0 {
		t.Errorf("rows: %+v", rows)
	}
	if res, body := getBody(t, adminURL+"/llm_failover/decisions?group_by=upstream"); res.StatusCode != 400 {
		t.Errorf("bad group_by: %d %s", res.StatusCode, body)
	}
	// The CLI prints the same as a table.
	var out bytes.Buffer
	if err := failoverapp.Command(&out, fmt.Sprintf("localhost:%d", adminPort), "decisions", "--channel", "stA", "--by", "reason"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "status  3") {
		t.Errorf("CLI table:\n%s", out.String())
	}

	// A reload keeps the history.
	statusGateway(t, "st", a.URL, b.URL, "failures 50")
	check(fetchStatus(t, adminURL+"/llm_failover/status"))
}

// A model's status is what its clients got, a channel's what its
// attempts got: the primary fails until its breaker opens while the
// backup serves every request, so the model stays operational (no
// outage on a public page that no client had) while the primary shows
// down, with an incident that counts the failures that opened it; and
// after the primary recovers the model is operational with no "since
// the recovery". Clients that do fail make the model degraded.
func TestStatusModelIsWhatClientsGot(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.OKNamed("backup"))
	statusGateway(t, "sc", a.URL, b.URL, "failures 3\n\t\t\tcooldown 300ms")
	for range 5 {
		if got := chatStatus(t, "scm"); got != 200 {
			t.Fatalf("status %d, want 200 from the backup", got)
		}
	}
	var v statusJSON
	waitFor(t, 5*time.Second, "five requests in the model's history", func() bool {
		v = fetchStatus(t, gatewayURL+"/status?format=json")
		return v.Models[0].Windows["5m"].Attempts >= 5
	})
	m := v.Models[0]
	if m.Status != "operational" || m.Counts != "requests" || v.Status != "operational" {
		t.Errorf("model %s (%s), page %s; want operational: its clients were all served", m.Status, m.Counts, v.Status)
	}
	if w := m.Windows["5m"]; w.Attempts != 5 || w.Successes != 5 || w.Down != 0 || w.SuccessRate == nil || *w.SuccessRate != 1 {
		t.Errorf("model window %+v, want 5 requests, all ok", w)
	}
	for _, bar := range m.Hourly {
		if bar.Down > 0 {
			t.Errorf("a model bar counts failures its clients never had: %+v", bar)
		}
	}
	ca := m.Channels[0]
	if ca.Name != "scA" || ca.State != "open" || ca.Status != "down" || ca.Counts != "attempts" || ca.Windows["5m"].Down != 3 {
		t.Errorf("channel scA: %s %s (%s) %+v, want open, down, 3 failed attempts", ca.State, ca.Status, ca.Counts, ca.Windows["5m"])
	}
	var incident *failoverapp.IncidentView
	for i, in := range v.Incidents {
		if in.Kind == "model" && in.Subject == "scm" {
			t.Errorf("a model incident its clients never had: %+v", in)
		}
		if in.Kind == "channel" && in.Subject == "scA" {
			incident = &v.Incidents[i]
		}
	}
	if incident == nil || incident.Failures < 3 || incident.Attempts < 3 || incident.Reasons["status"] < 3 {
		t.Errorf("channel incident %+v, want the 3 failures that opened it", incident)
	}
	_, html := getBody(t, gatewayURL+"/status")
	for _, want := range []string{"What clients got", "requests ok 5m", "attempts ok 5m", "by upstream attempt", "those that opened it included"} {
		if !bytes.Contains(html, []byte(want)) {
			t.Errorf("the page does not say %q", want)
		}
	}

	// The primary recovers; its trial closes the breaker.
	a.Set(fu.OKNamed("primary"))
	time.Sleep(400 * time.Millisecond) // past the cooldown
	waitFor(t, 5*time.Second, "the primary serving again", func() bool {
		res, _ := post(t, "/v1/chat/completions", fu.ChatRequest("scm", false))
		return res.StatusCode == 200 && res.Header.Get("X-Served-By") == "scA"
	})
	v = fetchStatus(t, gatewayURL+"/status?format=json")
	if m := v.Models[0]; m.Status != "operational" || m.Channels[0].State != "closed" {
		t.Errorf("after recovery: model %s, scA %s", m.Status, m.Channels[0].State)
	}

	// Clients that get errors make the model degraded, since the run's
	// first failure.
	a.Set(fu.Status(400, fu.OpenAIErrorBody("bad request", "invalid_request_error", "")))
	b.Set(fu.Status(500, ""))
	statusGateway(t, "sc", a.URL, b.URL, "failures 60")
	a.Set(fu.Status(500, ""))
	began := time.Now().Truncate(time.Minute)
	for range 5 {
		if got := chatStatus(t, "scm"); got < 500 {
			t.Fatalf("status %d, want the chain's 5xx", got)
		}
	}
	waitFor(t, 5*time.Second, "the failed requests in the model's history", func() bool {
		v = fetchStatus(t, gatewayURL+"/status?format=json")
		return v.Models[0].Windows["5m"].Down >= 5
	})
	if m := v.Models[0]; m.Status != "degraded" || m.Since.Before(began) || m.Since.After(time.Now()) {
		t.Errorf("model %s since %v; want degraded since the minute of the first failed request (%v)", m.Status, m.Since, began)
	}
}

func adminGet(t *testing.T, path string, out any) error {
	t.Helper()
	res, body := getBody(t, adminURL+path)
	if res.StatusCode != 200 {
		return fmt.Errorf("GET %s: %d %s", path, res.StatusCode, body)
	}
	return json.Unmarshal(body, out)
}

func channelWindow(t *testing.T, v statusJSON, channel, window string) failoverapp.WindowView {
	t.Helper()
	for _, m := range v.Models {
		for _, c := range m.Channels {
			if c.Name == channel {
				return c.Windows[window]
			}
		}
	}
	t.Fatalf("no channel %q in the status", channel)
	return failoverapp.WindowView{}
}

// The HTML page, and the public page that names no channel or URL. An
// open breaker shows as down with an incident on the full page; the
// public page, whose model's clients were all served, is operational.
func TestStatusPageHTMLAndHiddenChannels(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.OKNamed("backup"))
	statusGateway(t, "hp", a.URL, b.URL, "failures 2\n\t\t\tcooldown 1m")
	for range 3 {
		if got := chatStatus(t, "hpm"); got != 200 {
			t.Fatalf("status %d", got)
		}
	}
	res, page := getBody(t, gatewayURL+"/status")
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("%d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	mustContain(t, page, "Example gateway", "hpA", "hpB", "Down", "skipping it (breaker open) until", "channel hpA open", "ongoing", `<base href="/status/">`, `href="runbooks/status"`, `href="runbooks/state-open"`)
	mustNotContain(t, page, "<script", "status-secret", "http://")

	_, public := getBody(t, gatewayURL+"/public")
	// The model's clients were all served: the public page shows no
	// outage they never had.
	mustContain(t, public, "Example public status", "hpm", "All models operational")
	mustNotContain(t, public, "Degraded", "Down")
	mustNotContain(t, public, "hpA", "hpB", a.Addr(), b.Addr(), "status-secret")
	_, publicJSON := getBody(t, gatewayURL+"/public?format=json")
	mustContain(t, publicJSON, `"hpm"`)
	mustNotContain(t, publicJSON, "hpA", "hpB", a.Addr(), b.Addr(), "status-secret")

	if res, _ := post(t, "/status", []byte("{}")); res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /status: %d", res.StatusCode)
	}
}
