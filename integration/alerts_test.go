package integration_test

import (
	"bytes"
	"fmt"
	"github.com/llmfailover/caddy-llm-failover/internal/codestrings"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// scrape is what Caddy's admin /metrics exposes: for each metric name,
// each label name and the values seen for it.
type scrape map[string]map[string]map[string]bool

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? `)
var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

func scrapeMetrics(t *testing.T, into scrape) {
	t.Helper()
	res, err := http.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, line := range strings.Split(string(body), "\n") {
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		name := m[1]
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			name = strings.TrimSuffix(name, suf)
		}
		if into[name] == nil {
			into[name] = map[string]map[string]bool{}
		}
		for _, p := range labelPair.FindAllStringSubmatch(m[2], -1) {
			if into[name][p[1]] == nil {
				into[name][p[1]] = map[string]bool{}
			}
			into[name][p[1]][p[2]] = true
		}
	}
}

type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Annotations map[string]string `yaml:"annotations"`
}

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	b, err := os.ReadFile("../docs/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	var out []alertRule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) < 5 {
		t.Fatalf("found %d alert rules in docs/alerts.yml: the harvest is broken", len(out))
	}
	return out
}

// pluginLiterals is every string literal of the plugin's non-test code.
func pluginLiterals(t *testing.T) map[string]bool {
	t.Helper()
	lits, err := codestrings.Of("..")
	if err != nil {
		t.Fatal(err)
	}
	return lits
}

// Every metric, label and label value docs/alerts.yml uses is one the
// plugin exports, as a real Caddy with the plugin exposes it after
// traffic with failures (a failing channel of three, a model whose only
// channel fails, a wallet, a probed channel). Label values an alert
// matches that this traffic does not produce (a wallet store error)
// must at least be values the code sets. No plugin series carries a label
// Prometheus sets on every scraped series (job, instance): the scrape
// would overwrite it, and an alert would name the scrape target instead.
func TestAlertRulesUseExportedMetrics(t *testing.T) {
	got := scrape{}

	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.OKNamed("b"))
	c := upstream(t, fu.OKNamed("c"))
	d := upstream(t, fu.Status(503, ""))
	db := filepath.Join(t.TempDir(), "w.db")
	ch := uniqueName("al")
	gatewayWith(t, walletOptions("sqlite "+db), fmt.Sprintf(`
		channel %[1]sa %%s
		channel %[1]sb %%s
		channel %[1]sc %%s
		channel %[1]sd %%s
		model m {
			route %[1]sa cost 1 1
			route %[1]sb cost 2 2
			route %[1]sc cost 3 3
		}
		model %[1]sdown {
			route %[1]sd cost 1 1
		}
		wallet
	`, ch), a.URL, b.URL, c.URL, d.URL)
	secret, _ := newWalletAccount(t, ch+"acct", "5")
	for range 5 {
		if res, body := post(t, "/v1/chat/completions", chatStreamBody(false), bearer(secret)...); res.StatusCode != 200 {
			t.Fatalf("model m: %d %s", res.StatusCode, body)
		}
	}
	down := bytes.Replace(fu.ChatRequest("x", false), []byte(`"x"`), []byte(strconv.Quote(ch+"down")), 1)
	for range 5 {
		post(t, "/v1/chat/completions", down, bearer(secret)...)
	}
	waitFor(t, 5*time.Second, "the sweeper's first run", func() bool {
		s := scrape{}
		scrapeMetrics(t, s)
		return len(s["caddy_llm_failover_job_last_success_timestamp_seconds"]) > 0
	})
	scrapeMetrics(t, got)

	// A probed channel, for the probe budget gauge.
	up := fu.New(fu.OK())
	defer up.Close()
	prefix := uniqueName("alPr")
	probeGateway(t, prefix, "http://"+up.Addr(), "interval 100ms")
	waitFor(t, 5*time.Second, "a probe", func() bool { return up.Hits() >= 1 })
	waitFor(t, 5*time.Second, "the probe budget gauge", func() bool {
		s := scrape{}
		scrapeMetrics(t, s)
		return len(s["caddy_llm_failover_probe_budget_spent"]) > 0
	})
	scrapeMetrics(t, got)

	for _, want := range []string{"served", "exhausted", "unavailable"} {
		if !got["caddy_llm_failover_requests_total"]["outcome"][want] {
			t.Errorf("requests_total has no outcome %q after the traffic: %v", want, got["caddy_llm_failover_requests_total"]["outcome"])
		}
	}
	if !got["caddy_llm_failover_breaker_state"]["channel"][ch+"a"] {
		t.Errorf("no breaker_state for %sa", ch)
	}

	lits := pluginLiterals(t)
	metricRe := regexp.MustCompile(`\b(caddy_llm_failover_[a-z_]+|gen_ai_[a-z_]+)\b`)
	selectorRe := regexp.MustCompile(`\b(caddy_llm_failover_[a-z_]+)\{([^}]*)\}`)
	matcherRe := regexp.MustCompile(`([a-zA-Z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	byRe := regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
	labelsRe := regexp.MustCompile(`\$labels\.([a-zA-Z_]+)`)
	// Target labels Prometheus adds to every series it scrapes.
	targetLabels := []string{"job", "instance"}
	for m, labels := range got {
		for _, l := range targetLabels {
			if labels[l] != nil {
				t.Errorf("%s has a label %q, which a scrape overwrites with the target's", m, l)
			}
		}
	}
	for _, r := range alertRules(t) {
		metrics := map[string]bool{}
		for _, m := range metricRe.FindAllString(r.Expr, -1) {
			metrics[m] = true
			if got[m] == nil {
				t.Errorf("%s: metric %s is not exported", r.Alert, m)
			}
		}
		hasLabel := func(l string) bool {
			for m := range metrics {
				if got[m][l] != nil {
					return true
				}
			}
			return false
		}
		for _, s := range selectorRe.FindAllStringSubmatch(r.Expr, -1) {
			for _, mt := range matcherRe.FindAllStringSubmatch(s[2], -1) {
				label, op, value := mt[1], mt[2], mt[3]
				if got[s[1]][label] == nil && !slices.Contains(targetLabels, label) {
					t.Errorf("%s: %s has no label %q (it has %v)", r.Alert, s[1], label, keys(got[s[1]]))
					continue
				}
				values := []string{value}
				if op == "=~" || op == "!~" {
					values = strings.Split(value, "|")
				}
				for _, v := range values {
					if !got[s[1]][label][v] && !lits[v] {
						t.Errorf("%s: %s{%s} is never %q: no scrape showed it and no code sets it", r.Alert, s[1], label, v)
					}
				}
			}
		}
		for _, by := range byRe.FindAllStringSubmatch(r.Expr, -1) {
			for _, l := range strings.Split(by[1], ",") {
				if l = strings.TrimSpace(l); l != "" && !hasLabel(l) {
					t.Errorf("%s: groups by %q, a label none of its metrics has", r.Alert, l)
				}
			}
		}
		for name, text := range r.Annotations {
			for _, l := range labelsRe.FindAllStringSubmatch(text, -1) {
				if !hasLabel(l[1]) && !slices.Contains(targetLabels, l[1]) {
					t.Errorf("%s: annotation %s reads $labels.%s, a label none of its metrics has", r.Alert, name, l[1])
				}
			}
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// The runbooks' `caddy llm-failover decisions ...` commands run as
// written against a gateway with failovers, and status.md's shows what it
// says it does: the upstream statuses of the `status` failovers, by
// channel.
func TestRunbookDecisionCommandsWork(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.OKNamed("backup"))
	prefix := uniqueName("rbc")
	statusGateway(t, prefix, a.URL, b.URL, "failures 50")
	for range 3 {
		if got := chatStatus(t, prefix+"m"); got != 200 {
			t.Fatalf("status %d, want 200 from the backup", got)
		}
	}
	cmdRe := regexp.MustCompile("`caddy llm-failover (decisions[^`]*)`")
	files, err := filepath.Glob("../docs/runbooks/*.md")
	if err != nil || len(files) < 10 {
		t.Fatalf("runbooks: %v %d", err, len(files))
	}
	ran := 0
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range cmdRe.FindAllStringSubmatch(string(text), -1) {
			var out bytes.Buffer
			if err := failoverapp.Command(&out, fmt.Sprintf("localhost:%d", adminPort), strings.Fields(m[1])...); err != nil {
				t.Errorf("%s: caddy llm-failover %s: %v\n%s", filepath.Base(f), m[1], err, out.String())
				continue
			}
			ran++
			if filepath.Base(f) == "status.md" && strings.Contains(m[1], "--reason status") {
				// "Look at upstream_status in <this command>": the
				// operator must see the statuses, per channel.
				if !strings.Contains(out.String(), "503") || !strings.Contains(out.String(), prefix+"A") {
					t.Errorf("status.md tells the operator to look at upstream_status in `caddy llm-failover %s`, which prints:\n%s", m[1], out.String())
				}
			}
		}
	}
	if ran < 5 {
		t.Fatalf("ran %d runbook commands: the harvest is broken", ran)
	}
}

// The premise of LLMFailoverChannelOpen (docs/alerts.yml, its unit test
// in docs/alerts_test.yml): a channel that is down does not read open
// (2) the whole time. Its cooldown ends by the clock and it reads
// half_open (1) for as long as its trial waits, here a stream header
// timeout against an upstream that hangs; then open again.
func TestBreakerStateOfAHangingChannelCycles(t *testing.T) {
	a := upstream(t, fu.NoHeaders())
	b := upstream(t, fu.OKNamed("b"))
	ch := uniqueName("hang")
	gateway(t, fmt.Sprintf(`
		channel %[1]sa %%s
		channel %[1]sb %%s
		model %[1]sm {
			route %[1]sa cost 1 1
			route %[1]sb cost 2 2
		}
		stream_header_timeout 1s
		breaker {
			failures 1
			cooldown 300ms
		}
	`, ch), a.URL, b.URL)
	body := bytes.Replace(fu.ChatRequest("x", true), []byte(`"x"`), []byte(strconv.Quote(ch+"m")), 1)
	state := func() string {
		res, err := http.Get(adminURL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		all, _ := io.ReadAll(res.Body)
		res.Body.Close()
		m := regexp.MustCompile(`caddy_llm_failover_breaker_state\{channel="` + ch + `a"\} (\d)`).FindSubmatch(all)
		if m == nil {
			t.Fatalf("no breaker_state for %sa", ch)
		}
		return string(m[1])
	}
	if res, _ := post(t, "/v1/chat/completions", body); res.StatusCode != 200 {
		t.Fatalf("first request: %d", res.StatusCode)
	}
	if got := state(); got != "2" {
		t.Fatalf("after the failed attempt: breaker_state %s, want 2 (open)", got)
	}
	time.Sleep(400 * time.Millisecond) // the cooldown ends
	done := make(chan int)
	go func() {
		res, err := http.Post(gatewayURL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			done <- 0
			return
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		done <- res.StatusCode
	}()
	time.Sleep(300 * time.Millisecond) // the trial is waiting on the hanging channel
	if got := state(); got != "1" {
		t.Errorf("during the trial: breaker_state %s, want 1 (half_open)", got)
	}
	if code := <-done; code != 200 {
		t.Fatalf("trial request: %d, want 200 from the backup", code)
	}
	if got := state(); got != "2" {
		t.Errorf("after the failed trial: breaker_state %s, want 2 (open)", got)
	}
}
