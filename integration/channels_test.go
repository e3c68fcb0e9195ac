package integration_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// In-process tests of the channel registry: breaker admission as clients
// see it (exact upstream hits), channel identity, and the Caddy events.

// concurrently sends n requests for model m at once and returns, for each,
// the status, the channel that answered, the Retry-After and how long it took.
type sent struct {
	status     int
	servedBy   string
	retryAfter string
	took       time.Duration
}

func concurrently(t *testing.T, n int) []sent {
	t.Helper()
	out := make([]sent, n)
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	for i := range n {
		wg.Go(func() {
			req := newPost(t, context.Background(), "/v1/chat/completions", fu.ChatRequest("m", false))
			began := time.Now()
			res, err := client.Do(req)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			res.Body.Close()
			out[i] = sent{res.StatusCode, res.Header.Get("X-Served-By"), res.Header.Get("Retry-After"), time.Since(began)}
		})
	}
	wg.Wait()
	return out
}

// Half-open with a hanging upstream: of 20 concurrent requests, one is the
// trial (it waits for the hanging channel); every other is answered by the
// backup at once. Before admission control all 20 waited on the channel.
func TestRegistryHalfOpenAdmitsOneTrial(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, twoChannels, a.URL, b.URL, "header_timeout 2s\n\t\t"+brkBlock("cooldown 300ms"))
	brkFailOver(t, 3)
	a.Set(fu.Status(503, "").After(10 * time.Second))
	eventually(t, 3*time.Second, "the cooldown to end", func() bool {
		return brkState(t, "a").State == "half_open"
	})

	results := concurrently(t, 20)
	fast := 0
	for i, r := range results {
		if r.status != 200 || r.servedBy != "b" {
			t.Errorf("request %d: status %d served by %q", i, r.status, r.servedBy)
		}
		if r.took < time.Second {
			fast++
		}
	}
	if got := a.Hits() - 3; got < 1 || got > 2 {
		t.Errorf("the half-open channel was sent %d of 20 concurrent requests, want 1 (at most 2)", got)
	}
	if fast < 18 {
		t.Errorf("only %d of 20 requests were answered at once; the rest waited on the trial", fast)
	}
	// The hanging trial failed (header timeout): open again, slot freed.
	if st := brkState(t, "a"); st.State != "open" || st.TimesOpened != 2 {
		t.Errorf("after the failed trial: %+v", st)
	}
	var trials struct {
		TrialsInFlight *int `json:"trials_in_flight"`
	}
	_, body := brkAdmin(t, http.MethodGet, "/llm_failover/channels")
	var list []json.RawMessage
	if err := json.Unmarshal(body, &list); err != nil || len(list) == 0 || json.Unmarshal(list[0], &trials) != nil || trials.TrialsInFlight == nil || *trials.TrialsInFlight != 0 {
		t.Errorf("trials_in_flight missing or not 0 after the trial ended: %s", body)
	}
}

// Every channel open: each is probed at most once per cooldown, every
// other request gets a fast 503 with Retry-After in the API's own format,
// and the log has lines per state change, not per request.
func TestRegistryAllOpenFastRetryAfter(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.Status(503, ""))
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	// auth off: the unauthenticated-server warning is not what this test counts.
	cfg := strings.Replace(gatewayConfig(twoChannels, a.URL, b.URL, brkBlock("cooldown 30s")+"\n\t\tauth off"),
		"\tlog {\n\t\tlevel ERROR\n\t}", fmt.Sprintf("\tlog {\n\t\toutput file %s\n\t\tformat json\n\t\tlevel WARN\n\t}", logFile), 1)
	caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort}).InitServer(cfg, "caddyfile")
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()

	for i := range 3 {
		if res, body := brkChat(t); res.StatusCode != 503 {
			t.Fatalf("opening request %d: %d %s", i+1, res.StatusCode, body)
		}
	}
	hits(t, a, 3)
	hits(t, b, 3)

	results := concurrently(t, 50)
	refused := 0
	for i, r := range results {
		if r.status != 503 {
			t.Errorf("request %d: status %d", i, r.status)
		}
		if r.retryAfter != "" {
			refused++
			if ra, err := strconv.Atoi(r.retryAfter); err != nil || ra < 25 || ra > 30 {
				t.Errorf("request %d: Retry-After %q, want the ~30s to the soonest recovery", i, r.retryAfter)
			}
			if r.took > time.Second {
				t.Errorf("request %d: refused after %s, not at once", i, r.took)
			}
		}
	}
	if probes := a.Hits() + b.Hits() - 6; probes > 2 || refused != 50-int(probes) {
		t.Errorf("%d probes (a %d, b %d) and %d fast refusals of 50, want at most one probe per channel", probes, a.Hits()-3, b.Hits()-3, refused)
	}
	// Later requests in the same cooldown touch nothing.
	res, body := brkChat(t)
	if _, err := strconv.Atoi(res.Header.Get("X-Attempts")); res.StatusCode != 503 || res.Header.Get("Retry-After") == "" || err == nil {
		t.Fatalf("all probed: status %d, Retry-After %q, attempts %q", res.StatusCode, res.Header.Get("Retry-After"), res.Header.Get("X-Attempts"))
	}
	brkRefusedInBothFormats(t, body, "open after failures")
	if n := a.Hits() + b.Hits(); n > 8 {
		t.Errorf("upstreams were sent %d requests, want at most 8", n)
	}

	// Lines: 3 opening requests (two failover lines and an all-failed line
	// each), two state changes, at most two probes (a probe line, a
	// failover and an all-failed line each). Nothing per refused request.
	f, err := os.Open(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "llm_failover") {
			lines++
		}
	}
	if lines > 3*3+2+2*3 {
		t.Errorf("%d log lines for 3 failing requests and 52 refused ones", lines)
	}
}

// Answers over max_response_body are the request's doing: they fail over
// but never open the channel.
func TestRegistryTooLargeAnswersDoNotOpen(t *testing.T) {
	a := upstream(t, fu.OKNamed("primary").WithPieces(strings.Repeat("x", 4000)))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, twoChannels, a.URL, b.URL, "max_response_body 2KB")

	brkFailOver(t, 5)
	if st := brkState(t, "a"); st.State != "closed" || *st.Failures != 0 {
		t.Fatalf("after five too-large answers: %+v", st)
	}
	brkFailOver(t, 1) // still tried first
	hits(t, a, 6)
}

// Two sites declare a channel with the same name and URL but different
// keys: two accounts, two breakers, each with its site's settings.
func TestRegistryIdentityIncludesCredentials(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.OKNamed("backup"))
	site := func(host, key, failures string) string {
		return fmt.Sprintf(`
http://%s:%d {
	header {
		defer
		X-Served-By {http.llm_failover.channel}
		X-Attempts {http.llm_failover.attempts}
	}
	llm_failover {
		channel a %s {
			header Authorization "Bearer %s"
		}
		channel b %s {
			header Authorization "Bearer %s-b"
		}
		model m {
			route a cost 1 1
			route b cost 2 2
		}
		breaker {
			failures %s
		}
	}
}`, host, httpPort, a.URL, key, b.URL, key, failures)
	}
	global := gatewayConfig("")
	cfg := global[:strings.Index(global, "http://")] + site("localhost", "key-one", "3") + site("127.0.0.1", "key-two", "5")
	caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort}).InitServer(cfg, "caddyfile")
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()

	brkFailOver(t, 3) // opens a for the first site's key
	hits(t, a, 3)
	brkServedBy(t, "b")
	hits(t, a, 3)

	// The second site's a has its own, closed breaker with its own
	// settings: it is still tried, and opens after five failures, not three.
	other := func() {
		t.Helper()
		req := newPost(t, context.Background(), "/v1/chat/completions", fu.ChatRequest("m", false))
		req.URL.Host = fmt.Sprintf("127.0.0.1:%d", httpPort)
		req.Host = req.URL.Host
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 || res.Header.Get("X-Served-By") != "b" {
			t.Fatalf("second site: status %d by %q", res.StatusCode, res.Header.Get("X-Served-By"))
		}
	}
	for i := range 5 {
		other()
		hits(t, a, int64(4+i))
	}
	other()
	hits(t, a, 8)

	var list []brkChannel
	_, body := brkAdmin(t, http.MethodGet, "/llm_failover/channels")
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	var as []string
	for _, c := range list {
		if c.Name == "a" {
			as = append(as, c.State)
		}
	}
	if len(as) != 2 || as[0] != "open" || as[1] != "open" {
		t.Errorf("channels named a: %v, want two, both open by now", as)
	}
	mustNotContain(t, body, "key-one", "key-two")
}

// recordedEvents collects what eventRecorder receives.
var recordedEvents struct {
	mu     sync.Mutex
	events []caddy.Event
}

// eventRecorder is a test-only events.handlers module that records every
// event it is sent, so the test sees the real caddyevents path.
type eventRecorder struct{}

func (eventRecorder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "events.handlers.llmf_test_recorder", New: func() caddy.Module { return new(eventRecorder) }}
}

func (eventRecorder) Handle(_ context.Context, e caddy.Event) error {
	recordedEvents.mu.Lock()
	recordedEvents.events = append(recordedEvents.events, e)
	recordedEvents.mu.Unlock()
	return nil
}

func init() { caddy.RegisterModule(eventRecorder{}) }

// A subscriber gets both kinds of event: attempts, and breaker state
// changes including the clock-driven open → half_open.
func TestRegistryEmitsEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.OKNamed("backup"))
	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(gatewayConfig(twoChannels, a.URL, b.URL, brkBlock("cooldown 200ms"))), nil)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["apps"].(map[string]any)["events"] = map[string]any{"subscriptions": []any{map[string]any{
		"events":   []string{failoverapp.EventChannelState, failoverapp.EventAttempt},
		"handlers": []any{map[string]any{"handler": "llmf_test_recorder"}},
	}}}
	js, _ := json.Marshal(cfg)
	recordedEvents.mu.Lock()
	recordedEvents.events = nil
	recordedEvents.mu.Unlock()
	caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort}).InitServer(string(js), "json")
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()

	brkFailOver(t, 3)
	a.Set(fu.OKNamed("primary"))
	eventually(t, 3*time.Second, "the primary to serve again", func() bool {
		res, _ := brkChat(t)
		return res.Header.Get("X-Served-By") == "a"
	})

	recordedEvents.mu.Lock()
	defer recordedEvents.mu.Unlock()
	var changes []string
	attempts := map[string]int{}
	for _, e := range recordedEvents.events {
		switch e.Name() {
		case failoverapp.EventChannelState:
			if e.Data["channel"] != "a" || e.Data["base_url"] != a.URL {
				t.Errorf("state event for %v at %v", e.Data["channel"], e.Data["base_url"])
			}
			changes = append(changes, fmt.Sprintf("%s>%s:%s", e.Data["from"], e.Data["to"], e.Data["reason"]))
		case failoverapp.EventAttempt:
			key := fmt.Sprintf("%s/%s/%v", e.Data["channel"], e.Data["outcome"], e.Data["upstream_status"])
			attempts[key]++
			if _, ok := e.Data["duration_ms"].(int64); !ok || e.Data["model"] != "m" {
				t.Errorf("attempt event data %v", e.Data)
			}
		}
	}
	if got := strings.Join(changes, " "); got != "closed>open:status open>half_open:cooldown_elapsed half_open>closed:ok" {
		t.Errorf("state changes %q", got)
	}
	if attempts["a/status/503"] != 3 || attempts["b/ok/0"] < 3 || attempts["a/ok/0"] != 1 {
		t.Errorf("attempt events %v", attempts)
	}
}

// Interface guards
var _ caddyevents.Handler = eventRecorder{}

// A channel two handlers declare alike (same name, URL and credentials)
// has one breaker, so the handlers must give it the same settings: a
// config where they differ is refused, naming both handlers, instead of
// the last one's settings winning silently.
func TestRegistryOneChannelTwoBreakerSettingsIsRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	a := upstream(t, fu.OK())
	site := func(host, model, failures string) string {
		return fmt.Sprintf(`
http://%s:%d {
	llm_failover {
		channel shared %s {
			header Authorization "Bearer same-key"
		}
		model %s {
			route shared
		}
		breaker {
			failures %s
		}
		auth off
	}
}`, host, httpPort, a.URL, model, failures)
	}
	global := gatewayConfig("")
	prefix := global[:strings.Index(global, "http://")]
	code, body := loadCaddyfile(t, prefix+site("localhost", "first-model", "3")+site("127.0.0.1", "second-model", "5"))
	if code == http.StatusOK {
		t.Fatal("a config giving one channel two breaker settings was loaded")
	}
	for _, want := range []string{`channel \"shared\"`, "different breaker settings", "handler #1 (serving ", "handler #2 (serving ", "first-model", "second-model", "failures 3", "failures 5"} {
		if !strings.Contains(body, want) {
			t.Errorf("the refusal does not say %q: %s", want, body)
		}
	}
	// The same settings in both: one channel, one breaker, loaded.
	if code, body := loadCaddyfile(t, prefix+site("localhost", "first-model", "4")+site("127.0.0.1", "second-model", "4")); code != http.StatusOK {
		t.Fatalf("alike settings refused: %d %s", code, body)
	}
}
